"""NaN in, NaN out, as in torch (``_compiler.nan_forms``): ``maximum`` / ``minimum`` /
``clamp`` / ``relu6`` / ``hardtanh`` keep a NaN operand's NaN, ``argmax`` / ``argmin`` and
``max.dim`` / ``min.dim``'s indices point at the first NaN. torch-mlir's lowering drops it on
every backend (pinned); ``sort`` / ``topk`` / ``adaptive_max_pool1d`` still do (pinned)."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import compile_copy_asm

from turbine_aot import export
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.targets import TargetError
from turbine_aot.runtime import load_module

F = torch.nn.functional
NAN, INF = float("nan"), float("inf")
#: rows with a NaN first, in the middle, last, twice, none; infinities and a negative zero
X = torch.tensor(
    [
        [NAN, 1.0, 3.0, -2.0, 0.5],
        [1.0, NAN, 3.0, -2.0, 0.5],
        [INF, -0.0, -INF, 7.0, NAN],
        [2.0, NAN, -1.0, NAN, 4.0],
        [0.5, 2.0, -1.0, 4.0, -3.0],
    ]
)


class _Op(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


CASES = {
    "maximum": lambda x: torch.maximum(x, torch.zeros_like(x)),
    "maximum_broadcast": lambda x: torch.maximum(x, x[4:5].flip(-1)),
    "minimum": lambda x: torch.minimum(torch.zeros_like(x), x),
    "max_other": lambda x: torch.max(x, torch.ones_like(x)),
    "min_other": lambda x: torch.min(x, torch.ones_like(x)),
    "clamp": lambda x: torch.clamp(x, -1.0, 1.0),
    "clamp_min": lambda x: torch.clamp_min(x, 0.5),
    "clamp_max": lambda x: torch.clamp_max(x, 0.5),
    "clamp_tensor": lambda x: torch.clamp(x, torch.zeros_like(x), torch.ones_like(x)),
    "clamp_nan_bound": lambda x: torch.clamp(torch.ones_like(x), min=x),
    "relu6": F.relu6,
    "hardtanh": F.hardtanh,
    "hardtanh_f16": lambda x: F.hardtanh(x.half(), -2.0, 2.0).float(),
    "argmax": lambda x: torch.argmax(x, dim=-1),
    "argmax_keepdim": lambda x: torch.argmax(x, dim=0, keepdim=True),
    "argmax_all": lambda x: torch.argmax(x),
    "argmin_all_keepdim": lambda x: torch.argmin(x, keepdim=True),
    "argmin": lambda x: torch.argmin(x, dim=1),
    "max_dim": lambda x: tuple(torch.max(x, dim=-1)),
    "min_dim": lambda x: tuple(torch.min(x, dim=0, keepdim=True)),
}


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal (-0.0 == 0.0: ``relu6(-0.0)`` is -0.0 in eager, 0.0 here), NaN where the other is
    NaN, infinities as they are."""
    if got.dtype.is_floating_point:
        if not torch.equal(got.isnan(), want.isnan()):
            return False
        return torch.equal(got.nan_to_num(0.0, INF, -INF), want.nan_to_num(0.0, INF, -INF))
    return torch.equal(got, want)


def _run(iree_device, fn, x: torch.Tensor):
    eo = export(_Op(fn), args=(x,))
    vmfb = eo.compile(None, target_backends=None, extra_args=iree_device.compile_args)
    return load_module(vmfb, device=iree_device.driver).main(x)


@pytest.mark.parametrize("name", sorted(CASES))
def test_nan_reaches_the_result_as_in_eager(iree_device, name):
    fn = CASES[name]
    if name.endswith("_f16") and iree_device.name == "vmvx":
        pytest.skip("IREE 3.13's vmvx has no f16 arithmetic (failed to legalize arith.truncf)")
    if name.endswith("_f16") and iree_device.name == "vulkan-spirv":
        with pytest.raises(TargetError, match="float16"):  # baseline Vulkan has no fp16
            _run(iree_device, fn, X)
        return
    got, want = _run(iree_device, fn, X), fn(X)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and _same(g, w), f"{name}: got {g}, eager {w}"


def test_the_compile_copy_keeps_the_op_and_adds_the_nan_checks():
    flags = default_compile_flags("llvm-cpu", use_env=False)
    asm = compile_copy_asm(export(_Op(CASES["clamp"]), args=(X,)), flags)
    assert "torch.aten.clamp " in asm and "torch.aten.isnan" in asm and "where.self" in asm
    asm = compile_copy_asm(export(_Op(CASES["argmax"]), args=(X,)), flags)
    assert asm.count("torch.aten.argmax") == 2 and "torch.aten.any.dim" in asm
    # integer tensors have no NaN: left as they are (the copy is the export itself)
    ints = export(_Op(lambda x: torch.clamp(x, -1, 1)), args=(torch.arange(5),))
    assert "torch.aten.isnan" not in compile_copy_asm(ints, flags)


@pytest.mark.parametrize("name", ["clamp", "relu6", "maximum", "argmax"])
def test_iree_still_drops_nan_in_these_ops(iree_device, name, tmp_path):
    """Why they are rewritten: compiled as exported, torch-mlir's ordered compares lose the NaN
    (``clamp(nan)`` is -1, ``relu6(nan)`` 6, ``maximum(nan, 0)`` 0, ``argmax`` skips it). When
    this fails for every op here, drop ``_compiler.nan_forms`` from
    ``rewrites.module_for_compile`` (bump ``REVISION``) and this test."""
    fn = CASES[name]
    eo = export(_Op(fn), args=(X,))
    eo.save_mlir(str(tmp_path / "op.mlir"))
    got = iree_device.load(iree_device.compile((tmp_path / "op.mlir").read_text())).main(X)
    got = torch.from_numpy(got.to_host()) if hasattr(got, "to_host") else torch.as_tensor(got)
    assert not _same(got, fn(X))


@pytest.mark.parametrize(
    "name, fn",
    [
        ("sort", lambda x: torch.sort(x, dim=-1).values),
        ("topk", lambda x: torch.topk(x, 2, dim=-1).values),
        ("adaptive_max_pool1d", lambda x: F.adaptive_max_pool1d(x.unsqueeze(0), 1).squeeze(0)),
    ],
)
def test_ops_that_still_misplace_nan(iree_device, name, fn):
    """Left as IREE 3.13 computes them (docs/performance.md, section 27, "NaN"): torch sorts a
    NaN above everything and pools it through; IREE's sort leaves it where it was, its
    adaptive max pooling drops it. Rows without NaN agree. When this fails, the NaN is right
    there too: update the docs and this test."""
    got, want = _run(iree_device, fn, X), fn(X)
    assert _same(got[4], want[4])  # the row without NaN
    assert not _same(got, want)
