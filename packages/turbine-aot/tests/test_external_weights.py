"""Tensors carrying an ExternalTensorTrait stay external parameters, whatever their size and kind.

Regression for issue 14: a trait-tagged plain tensor of <= 1024 elements was inlined as a
``dense_resource`` (so the compiled module ignored the archive it was run with), and larger ones
were named after torch.export's constant name instead of ``__auto.<external_name>``.
"""

from __future__ import annotations

import re

import torch
from torch import nn

import turbine_aot as aot
from turbine_aot.runtime import load_module
from turbine_params import ExternalTensorTrait, ParameterArchiveBuilder

FAST = ["--iree-opt-data-tiling=false", "--iree-llvmcpu-enable-ukernels=none"]


def _tag(t: torch.Tensor, name: str, scope: str = "model") -> torch.Tensor:
    ExternalTensorTrait(external_scope=scope, external_name=name).set(t)
    return t


def test_small_trait_tagged_plain_tensor_is_an_external_global():
    # The repro: a plain (not registered) 8-element tensor captured by forward.
    w = _tag(torch.randn(8), "norm.w")

    class Norm(nn.Module):
        def forward(self, x):
            return x * w

    ir = str(aot.export(Norm(), args=(torch.randn(8),)).mlir_module)
    assert (
        'util.global private @__auto.norm.w = #flow.parameter.named<"model"::"norm.w"> '
        ": tensor<8xf32>" in ir
    )
    assert "util.global.load @__auto.norm.w : tensor<8xf32>" in ir
    assert "torch.vtensor.literal" not in ir
    assert "dense_resource" not in ir


def test_trait_tagged_tensors_of_every_kind_are_named_after_their_external_name():
    big = _tag(torch.randn(4096), "big.b", scope="other")

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.randn(4))  # registered parameter, small
            self.register_buffer("s", torch.randn(4))  # registered buffer, small
            _tag(self.p, "layer.p")
            _tag(self.s, "layer.s")

        def forward(self, x):
            return x * self.p + self.s + big[:4]

    ir = str(aot.export(M(), args=(torch.randn(4),)).mlir_module)
    globals_ = re.findall(r"^\s*util\.global private (?:mutable )?(@\S+) = (.*)$", ir, re.M)
    assert sorted(globals_) == [
        ("@__auto.big.b", '#flow.parameter.named<"other"::"big.b"> : tensor<4096xf32>'),
        ("@__auto.layer.p", '#flow.parameter.named<"model"::"layer.p"> : tensor<4xf32>'),
        ("@__auto.layer.s", '#flow.parameter.named<"model"::"layer.s"> : tensor<4xf32>'),
    ]
    assert "G____" not in ir and "dense_resource" not in ir


class _Block(nn.Module):
    """A small norm + projection whose weights are plain tensors, as a model library builds them."""

    def __init__(self, norm_w: torch.Tensor, proj_w: torch.Tensor, bias: torch.Tensor):
        super().__init__()
        self.norm_w = norm_w  # plain attributes: torch.export captures them as constants
        self.proj_w = proj_w
        self.register_buffer("bias", bias)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm_w
        return h @ self.proj_w + self.bias


def _weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "blk.norm.w": torch.randn(16, generator=g),  # 16 elements: small
        "blk.proj.w": torch.randn(16, 8, generator=g),  # 128 elements: small
        "blk.bias": torch.randn(8, generator=g),
    }


def _save(path, weights: dict[str, torch.Tensor]):
    builder = ParameterArchiveBuilder()
    for key, t in weights.items():
        builder.add_tensor(key, t)
    builder.save(path)
    return path


def test_compiled_module_run_with_another_archive_gives_that_archives_results(tmp_path):
    a, b = _weights(1), _weights(2)
    tagged = {k: _tag(v.clone(), k) for k, v in a.items()}
    model = _Block(tagged["blk.norm.w"], tagged["blk.proj.w"], tagged["blk.bias"])
    x = torch.randn(3, 16)
    out = aot.export(model, args=(x,))
    ir = str(out.mlir_module)
    for key in a:
        assert f'#flow.parameter.named<"model"::"{key}">' in ir
    vmfb = out.compile(None, extra_args=FAST)

    for weights, name in ((a, "a.irpa"), (b, "b.irpa")):
        loaded = load_module(vmfb, parameters=_save(tmp_path / name, weights))
        eager = _Block(weights["blk.norm.w"], weights["blk.proj.w"], weights["blk.bias"])
        torch.testing.assert_close(loaded.main(x), eager(x), rtol=1e-5, atol=1e-5)
    # The two archives really give different results (the test would be vacuous otherwise).
    assert not torch.allclose(
        _Block(a["blk.norm.w"], a["blk.proj.w"], a["blk.bias"])(x),
        _Block(b["blk.norm.w"], b["blk.proj.w"], b["blk.bias"])(x),
    )
