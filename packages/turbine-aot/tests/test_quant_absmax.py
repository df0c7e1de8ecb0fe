"""torchao's activation scale ``max(-min(amin(x), 0), max(amax(x), 0))`` is handed to IREE as
``amax(|x|)`` on CPUs: one reduction instead of two, with bitwise the same results."""

from __future__ import annotations

import pytest
import torch

from turbine_aot import export
from turbine_aot._compiler import quant_absmax, rewrites
from turbine_aot._compiler.quant_absmax import abs_max_patterns, rewrite_abs_max
from turbine_aot.runtime import load_module

tq = pytest.importorskip(
    "torchao.quantization", reason="torchao is a dev requirement (tools/requirements-dev.txt)"
)


def _w8a8() -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.SiLU(), torch.nn.Linear(256, 128, bias=False)
    ).eval()
    tq.quantize_(m, tq.Int8DynamicActivationInt8WeightConfig(set_inductor_config=False))
    return m


def test_the_scale_is_one_reduction_in_the_copy_handed_to_iree():
    eo = export(_w8a8(), args=(torch.randn(4, 256),))
    op = eo.mlir_module.operation
    assert len(abs_max_patterns(op)) == 2  # one per quantized linear
    copy = op.clone()
    try:
        assert rewrite_abs_max(copy) == 2
        assert copy.verify()
        ir = str(copy)
        assert "torch.aten.amin" not in ir and "torch.aten.neg" not in ir
        assert ir.count("torch.aten.abs") == 2 and ir.count("torch.aten.amax") == 2
        assert not abs_max_patterns(copy)
    finally:
        copy.erase()
    assert len(abs_max_patterns(op)) == 2  # the export itself is left as it was


@pytest.mark.parametrize("rows", [1, 5])
def test_results_are_bitwise_those_of_the_two_reductions(monkeypatch, rows):
    """Compiled with and without the rewrite (inputs with a zero row, an all-positive and an
    all-negative row: each side of the clamps to 0): the same bits; both match torchao eager."""
    m = _w8a8()
    x = torch.randn(rows, 256)
    x[0] = 0.0
    if rows > 2:
        x[1] = x[1].abs()
        x[2] = -x[2].abs()
    eo = export(m, args=(x,))
    with_rewrite = load_module(eo.compile(save_to=None)).main(x)
    monkeypatch.setattr(rewrites, "abs_max_patterns", lambda op: [])
    monkeypatch.setattr(quant_absmax, "abs_max_patterns", lambda op: [])
    without = load_module(eo.compile(save_to=None)).main(x)
    assert torch.equal(with_rewrite, without)
    with torch.no_grad():
        torch.testing.assert_close(with_rewrite, m(x), rtol=1e-5, atol=1e-5)


def test_other_min_max_expressions_are_left_alone():
    class NotAScale(torch.nn.Module):
        def forward(self, x):  # amin and amax over different dims
            lo = x.amin(dim=0, keepdim=True).clamp(max=0)
            hi = x.amax(dim=1, keepdim=True).clamp(min=0)
            return torch.maximum(-lo, hi)

    eo = export(NotAScale(), args=(torch.randn(4, 4),))
    assert not abs_max_patterns(eo.mlir_module.operation)
