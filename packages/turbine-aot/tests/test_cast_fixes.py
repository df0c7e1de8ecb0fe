"""float -> integer casts give eager's values on every backend (``_compiler.casts``).

IREE 3.13 computes two of them wrongly, silently: float -> uint8 saturates at 127 on llvm-cpu
(``200.7 -> 127``), and vmvx rounds every float -> integer cast to nearest (``2.5 -> 3``,
``-3.7 -> -4``). The compile path rewrites a copy of the module; the exported IR stays the
reference's.
"""

from __future__ import annotations

import pytest
import torch
from ir_check import check_ir

from turbine_aot import export
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.rewrites import module_for_compile
from turbine_aot.runtime import load_module

# every value a uint8 holds, fractions on both sides of .5, negatives (eager wraps them on x86)
_FRACTIONS = [0.0, 0.2, 0.5, 0.7, 1.5, 2.5, 3.7, 127.9, 128.5, 200.7, 254.5, 255.2]
VALUES = torch.tensor([*_FRACTIONS, -0.4, -0.5, -1.5, -2.5, -3.7, -37.2])
INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


class Casts(torch.nn.Module):
    def forward(self, x):
        u8 = x.abs().to(torch.uint8)  # in range: defined in torch
        signed = [x.to(d) for d in INT_DTYPES[2:]]
        small = (x.clamp(-128, 127)).to(torch.int8)
        half = (x.half() * 0.5).to(torch.int32)  # from f16, rounding of x/2 at .25 steps
        return (u8, small, *signed, half, x.to(torch.bool))


def _compile_copy_asm(out, flags) -> str:
    copy, owned = module_for_compile(out.mlir_module, flags)
    try:
        return str(copy)
    finally:
        if owned:
            copy.operation.erase()


def test_exported_ir_keeps_plain_casts_and_the_compiled_copy_is_rewritten():
    out = export(Casts(), args=(VALUES,))
    exported = str(out.mlir_module)
    assert "torch.aten.trunc" not in exported
    check_ir(
        exported,
        r"torch.aten.to.dtype %\w+, %int0\w*, .* -> !torch.vtensor<\[18\],ui8>",
    )
    cpu = _compile_copy_asm(out, default_compile_flags("llvm-cpu", use_env=False))
    assert "torch.aten.trunc" not in cpu  # llvm-cpu truncates: only the uint8/int8 casts change
    check_ir(
        cpu,
        r"= torch.prims.convert_element_type %\w+, %int3\w* : !torch.vtensor<\[18\],f32>, "
        r"!torch.int -> !torch.vtensor<\[18\],si32>",
        r"torch.aten.to.dtype %\w+, %int0\w*, .* : !torch.vtensor<\[18\],si32>.* -> "
        r"!torch.vtensor<\[18\],ui8>",
    )
    vmvx = _compile_copy_asm(out, default_compile_flags("vmvx", use_env=False))
    check_ir(
        vmvx,
        r"= torch.aten.trunc %\w+ : !torch.vtensor<\[18\],f32> -> !torch.vtensor<\[18\],f32>",
        r"= torch.prims.convert_element_type %\w+, %int3",
    )
    # int32/int64 casts and the f16 one are truncated too on vmvx; bool casts never change
    assert vmvx.count("torch.aten.trunc") == 6
    assert str(out.mlir_module) == exported  # the exported module was not touched


def test_casts_match_eager_on_backend(iree_device):
    m = Casts()
    out = export(m, args=(VALUES,))
    if iree_device.name in ("vmvx", "vulkan-spirv"):
        pytest.skip(
            f"this program computes in float16: IREE 3.13's vmvx has no f16 arithmetic and its "
            f"default Vulkan target is refused for f16 (TargetError, test_targets); on "
            f"{iree_device.name} the f32 casts run in test_casts_f32_on_backend"
        )
    vmfb = out.compile(None, target_backends=None, extra_args=iree_device.compile_args)
    got = load_module(vmfb, device=iree_device.driver).main(VALUES)
    want = m(VALUES)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype  # uint8 comes back as uint8 (IREE's views are signless)
        assert torch.equal(g, w), (g, w)


class F32Casts(torch.nn.Module):
    def forward(self, x):
        return x.abs().to(torch.uint8), x.to(torch.int32), x.clamp(-128, 127).to(torch.int8)


def test_casts_f32_on_backend(iree_device):
    m = F32Casts()
    out = export(m, args=(VALUES,))
    vmfb = out.compile(None, target_backends=None, extra_args=iree_device.compile_args)
    got = load_module(vmfb, device=iree_device.driver).main(VALUES)
    for g, w in zip(got, m(VALUES)):
        assert g.dtype == w.dtype and torch.equal(g, w), (g, w)
