"""Test helpers shared by the tests of turbine's own CPU kernels (the AVX-512 matmul, quantized,
convolution and pooling rewrites): the skip marks for CPUs without AVX-512 and without AVX2, the
host's compile flags, the text of the module the compile path hands IREE, the export of a quantized model with its archive, what
a ``precision="bf16"`` module computes, and the attention programs whose softmax IREE 3.13
miscomputes in one spelling (``tests/test_cpu_softmax.py``; ``benchmarks/
dynamic_softmax_prebuilt.py`` builds the same programs for another CPU)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from turbine_aot import export
from turbine_aot._compiler.avx512 import host_avx512_missing
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot._compiler.isa import host_isa
from turbine_aot._compiler.rewrites import module_for_compile

#: The AVX-512 features this CPU lacks (empty on an AVX-512 CPU).
AVX512_MISSING = host_avx512_missing()
needs_avx512 = pytest.mark.skipif(
    bool(AVX512_MISSING), reason=f"this CPU has no AVX-512 (lacks {', '.join(AVX512_MISSING)})"
)
#: For running the kernels' AVX2 blocking (an AVX-512 CPU runs it too).
needs_avx2 = pytest.mark.skipif(
    not host_isa(), reason="this CPU has neither AVX-512 nor AVX2 with FMA"
)


def host_flags(*extra: str) -> list[str]:
    """This host's llvm-cpu compile defaults (the environment left out), then ``extra``."""
    return [*default_compile_flags("llvm-cpu", use_env=False), *extra]


def compile_copy_asm(eo, flags: Sequence[str]) -> str:
    """The text of the copy of ``eo``'s module that the compile path hands IREE for ``flags``."""
    copy, owned = module_for_compile(eo.mlir_module, list(flags))
    try:
        return str(copy)
    finally:
        if owned:
            copy.operation.erase()


def export_with_archive(
    m, tmp_path, name: str, external: bool = True, rows: int = 4, dynamic: bool = True
):
    """``(exported, archive path or None)`` of a (torchao-quantized) model whose first layer is
    a linear one, called on ``rows`` random rows: its weights externalized into
    ``tmp_path / name`` (``external``; else inline), the rows dynamic (1..64) unless not
    ``dynamic``."""
    import torch

    from turbine_params import externalize_module_parameters, save_module_parameters

    parameters = None
    if external:
        externalize_module_parameters(m)
        parameters = tmp_path / name
        save_module_parameters(parameters, m)
    shapes = {"input": {0: torch.export.Dim("rows", min=1, max=64)}} if dynamic else None
    k = next(mod.in_features for mod in m.modules() if hasattr(mod, "in_features"))
    return export(m, args=(torch.randn(rows, k),), dynamic_shapes=shapes), parameters


def bf16_reference(model, *args, layer: type | None = None):
    """What a ``precision="bf16"`` module computes, in eager: each ``layer`` (default
    ``torch.nn.Linear``; ``torch.nn.Conv2d`` for convolutions) on its input and weight rounded to
    bf16, the products accumulated in fp32, everything else fp32 (a deep copy of ``model``)."""
    import copy

    import torch

    layer = layer or torch.nn.Linear
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for m in ref.modules():
            if isinstance(m, layer):
                m.weight.copy_(m.weight.bfloat16().float())
                m.register_forward_pre_hook(
                    lambda _m, inputs: tuple(t.bfloat16().float() for t in inputs)
                )
        return ref(*args)


def spelled_softmax(s: torch.Tensor, spelling: str) -> torch.Tensor:
    """``softmax(s, -1)``, or ``exp(s - max) * reciprocal(sum)`` for ``"reciprocal"``."""
    if spelling == "reciprocal":
        e = torch.exp(s - s.amax(-1, keepdim=True))
        return e * torch.reciprocal(e.sum(-1, keepdim=True))
    return torch.softmax(s, -1)


class DynamicBatchAttention(torch.nn.Module):
    """Causal attention over ``[batch, 2, 24, 32]`` (exported with the batch dynamic) with its
    softmax spelled ``spelling``."""

    def __init__(self, spelling: str):
        super().__init__()
        self.spelling = spelling

    def forward(self, q, k, v):
        s = (q @ k.transpose(-1, -2)) * 0.125
        keep = torch.ones(24, 24, dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
        return spelled_softmax(s, self.spelling) @ v


class DynamicSelfAttention(torch.nn.Module):
    """``softmax(x x^T / 4) x`` (exported with the sequence dynamic: the reduced size) with its
    softmax spelled ``spelling``."""

    def __init__(self, spelling: str):
        super().__init__()
        self.spelling = spelling

    def forward(self, x):
        s = x @ x.transpose(-1, -2) / 4.0
        return spelled_softmax(s, self.spelling) @ x
