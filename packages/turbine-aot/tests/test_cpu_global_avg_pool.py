"""Global average poolings (``adaptive_avg_pool2d`` to 1 x 1) handed to IREE as ``mean.dim`` on
llvm-cpu (``_compiler.pools``): when the compile copy rewrites them, and that the compiled
modules give eager's values (squeeze-excitation blocks, classifier heads, odd sizes, a dynamic
batch)."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import compile_copy_asm

from turbine_aot import export
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.pools import global_avg_pools
from turbine_aot.runtime import load_module

_ADAPTIVE = "torch.aten.adaptive_avg_pool2d"
_MEAN = "torch.aten.mean.dim"


@pytest.fixture(autouse=True)
def _default_choices(monkeypatch):
    monkeypatch.delenv("TURBINE_CPU_POOLS", raising=False)


class _SqueezeExcitation(torch.nn.Module):
    """MobileNetV3's block: a depthwise convolution, hardswish, then the gate of a global
    average pooling through two 1x1 convolutions and a hard sigmoid, multiplied back."""

    def __init__(self, c: int = 24, squeeze: int = 8):
        super().__init__()
        torch.manual_seed(0)
        self.dw = torch.nn.Conv2d(c, c, 3, 1, 1, groups=c)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc1 = torch.nn.Conv2d(c, squeeze, 1)
        self.fc2 = torch.nn.Conv2d(squeeze, c, 1)

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.dw(x))
        s = torch.nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(self.pool(y)))))
        return y * s


class _Head(torch.nn.Module):
    """A classifier head: the pooling to 1 x 1 (as a tuple), flattened, a linear layer."""

    def __init__(self, c: int = 32):
        super().__init__()
        torch.manual_seed(1)
        self.pool = torch.nn.AdaptiveAvgPool2d((1, 1))
        self.fc = torch.nn.Linear(c, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(x), 1))


def _ops(asm: str) -> tuple[int, int]:
    return asm.count(f"{_ADAPTIVE} "), asm.count(f"{_MEAN} ")


def test_the_compile_copy_has_means_and_the_export_is_unchanged(monkeypatch):
    eo = export(_SqueezeExcitation().eval(), args=(torch.randn(1, 24, 16, 16),))
    assert _ops(str(eo.mlir_module)) == (1, 0)  # the export keeps torch's op
    asm = compile_copy_asm(eo, default_compile_flags("llvm-cpu", use_env=False))
    assert _ops(asm) == (0, 1)
    assert "torch.aten.mean.dim %" in asm and "!torch.vtensor<[1,24,1,1],f32>" in asm
    # any llvm-cpu build (portable too); not other targets; TURBINE_CPU_POOLS=keep keeps it
    portable = default_compile_flags("llvm-cpu", host=False, use_env=False)
    assert _ops(compile_copy_asm(eo, portable)) == (0, 1)
    assert _ops(compile_copy_asm(eo, default_compile_flags("vmvx", use_env=False))) == (1, 0)
    monkeypatch.setenv("TURBINE_CPU_POOLS", "keep")
    asm = compile_copy_asm(eo, default_compile_flags("llvm-cpu", use_env=False))
    assert _ops(asm) == (1, 0)


def test_what_the_rewrite_takes():
    def found(pool: torch.nn.Module, x: torch.Tensor) -> int:
        return len(global_avg_pools(export(pool.eval(), args=(x,)).mlir_module.operation))

    x = torch.randn(2, 8, 7, 5)
    assert found(torch.nn.AdaptiveAvgPool2d(1), x) == 1
    assert found(torch.nn.AdaptiveAvgPool2d((1, 1)), x) == 1
    assert found(torch.nn.AdaptiveAvgPool2d(1), torch.randn(8, 7, 5)) == 1  # unbatched
    assert found(torch.nn.AdaptiveAvgPool2d(1), x.to(torch.float16)) == 1
    assert found(torch.nn.AdaptiveAvgPool2d(2), x) == 0  # not global: torch-mlir's
    assert found(torch.nn.AdaptiveAvgPool2d((1, 2)), x) == 0
    assert found(torch.nn.AdaptiveMaxPool2d(1), x) == 0


@pytest.mark.parametrize(
    ("model", "shape"),
    [
        (_SqueezeExcitation(), (1, 24, 16, 16)),
        (_SqueezeExcitation(40, 16), (2, 40, 7, 9)),
        (_Head(), (3, 32, 7, 7)),
        (_Head(), (1, 32, 1, 1)),
        (torch.nn.AdaptiveAvgPool2d(1), (6, 13, 5)),  # unbatched
    ],
    ids=["se-16x16", "se-odd-batch2", "head-7x7", "head-1x1", "unbatched"],
)
def test_the_rewritten_module_matches_eager(model, shape, tmp_path):
    model = model.eval()
    torch.manual_seed(2)
    x = torch.randn(*shape) * 3.0 + 1.0  # through hardswish's and hard sigmoid's bends
    eo = export(model, args=(x,))
    assert _ops(compile_copy_asm(eo, default_compile_flags("llvm-cpu", use_env=False)))[0] == 0
    eo.compile(save_to=tmp_path / "m.vmfb")
    m = load_module(tmp_path / "m.vmfb", device="local-sync")
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(m.main(x), expected, rtol=1e-5, atol=1e-5)


def test_a_dynamic_batch(tmp_path):
    model = _SqueezeExcitation().eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    eo = export(model, args=(torch.randn(2, 24, 8, 8),), dynamic_shapes=({0: batch},))
    eo.compile(save_to=tmp_path / "m.vmfb")
    m = load_module(tmp_path / "m.vmfb", device="local-sync")
    for n in (1, 5):
        x = torch.randn(n, 24, 8, 8)
        with torch.no_grad():
            expected = model(x)
        torch.testing.assert_close(m.main(x), expected, rtol=1e-5, atol=1e-5)
