"""Custom ops: a torch.library op with an MLIR expansion survives export as torch.operator, is
expanded by the custom_op_expansion phase, compiles with IREE and matches eager."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from turbine_aot import CompiledModule, export
from turbine_aot.custom_ops import (
    CustomOpExpansionError,
    CustomOpSignature,
    custom_op_expansion,
    register_custom_op_expansion,
    registered_custom_ops,
    unregister_custom_op_expansion,
)
from turbine_aot.runtime import load_module

# Compile flags for tests that check behaviour, not turbine's default optimization flags
# (data tiling + ukernels triple compile time); the defaults are compiled in test_export.py.
FAST = ["--iree-opt-data-tiling=false", "--iree-llvmcpu-enable-ukernels=none"]


@torch.library.custom_op("turbine_test::silu_mul", mutates_args=())
def silu_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Fused SwiGLU activation: silu(x) * y (eager implementation)."""
    return nn.functional.silu(x) * y


@silu_mul.register_fake
def _(x, y):
    return torch.empty_like(x)


@custom_op_expansion(silu_mul)
def _expand_silu_mul(sig: CustomOpSignature) -> str:
    t, e = sig.arg_types[0], sig.element_type(0)
    rank = sig.rank(0)
    dims = ", ".join(f"d{i}" for i in range(rank))
    dyn = [i for i, d in enumerate(t[len("tensor<") :].split("x")[:rank]) if d == "?"]
    dim_ops = "\n".join(
        f"  %c{i} = arith.constant {i} : index\n  %dim{i} = tensor.dim %x, %c{i} : {t}" for i in dyn
    )
    dyn_args = ", ".join(f"%dim{i}" for i in dyn)
    return f"""
#map = affine_map<({dims}) -> ({dims})>
func.func private @{sig.func_name}(%x: {t}, %y: {t}) -> {t} {{
{dim_ops}
  %empty = tensor.empty({dyn_args}) : {t}
  %r = linalg.generic {{indexing_maps = [#map, #map, #map],
                        iterator_types = [{", ".join(['"parallel"'] * rank)}]}}
      ins(%x, %y : {t}, {t}) outs(%empty : {t}) {{
  ^bb0(%a: {e}, %b: {e}, %o: {e}):
    %one = arith.constant 1.0 : {e}
    %na = arith.negf %a : {e}
    %ex = math.exp %na : {e}
    %den = arith.addf %one, %ex : {e}
    %s = arith.divf %a, %den : {e}
    %m = arith.mulf %s, %b : {e}
    linalg.yield %m : {e}
  }} -> {t}
  return %r : {t}
}}
"""


class GatedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(8, 16)
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x):
        return self.down(silu_mul(self.gate(x), self.up(x)))


def test_registry_names():
    assert "turbine_test::silu_mul" in registered_custom_ops()


def test_op_survives_export_and_expands_by_phase():
    model = GatedMLP().eval()
    x = torch.randn(3, 8)
    out = export(model, args=(x,))
    # export() imports to the "import" (= custom_op_expansion) phase: already expanded.
    ir = str(out.mlir_module)
    assert 'torch.operator "torch.turbine_test.silu_mul"' not in ir
    assert "call @__custom_op.turbine_test.silu_mul(" in ir
    assert "func.func private @__custom_op.turbine_test.silu_mul(" in ir

    # The same program imported only to the "torch" phase keeps the op.
    torch_only = type(out.compiled_module)(import_to="torch")
    torch_ir = str(CompiledModule.get_mlir_module(torch_only))
    assert 'torch.operator "torch.turbine_test.silu_mul"' in torch_ir
    CompiledModule.expand_custom_ops(torch_only)
    assert 'torch.operator "torch.turbine_test.silu_mul"' not in str(
        CompiledModule.get_mlir_module(torch_only)
    )


def test_fused_activation_dynamic_batch_matches_eager():
    model = GatedMLP().eval()
    batch = torch.export.Dim("batch", min=1, max=32)
    out = export(model, args=(torch.randn(2, 8),), dynamic_shapes={"x": {0: batch}})
    ir = str(out.mlir_module)
    assert "tensor<?x16xf32>" in ir  # specialized for the dynamic batch
    loaded = load_module(out.compile(None, extra_args=FAST))
    for n in (1, 6):
        x = torch.randn(n, 8)
        with torch.no_grad():
            torch.testing.assert_close(loaded.main(x), model(x), rtol=1e-5, atol=1e-5)


def test_one_specialization_per_signature():
    class Twice(nn.Module):
        def forward(self, a, b, c):
            return silu_mul(a, b), silu_mul(b, a), silu_mul(c, c)

    a, b, c = torch.randn(2, 3), torch.randn(2, 3), torch.randn(4)
    out = export(Twice(), args=(a, b, c))
    ir = str(out.mlir_module)
    assert ir.count("func.func private @__custom_op.turbine_test.silu_mul") == 2
    loaded = load_module(out.compile(None, extra_args=FAST))
    for got, want in zip(loaded.main(a, b, c), Twice()(a, b, c), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@torch.library.custom_op("turbine_test::bad_op", mutates_args=())
def bad_op(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@bad_op.register_fake
def _(x):
    return torch.empty_like(x)


class UsesBadOp(nn.Module):
    def forward(self, x):
        return bad_op(x)


@pytest.mark.parametrize(
    ("expansion", "message"),
    [
        (lambda sig: "this is not MLIR", "does not parse"),
        (lambda sig: "func.func private @other() { return }", "must define func.func"),
        (
            lambda sig: (
                f"func.func private @{sig.func_name}(%x: tensor<1xf32>) -> tensor<1xf32> "
                "{ return %x : tensor<1xf32> }"
            ),
            "has type",
        ),
        (lambda sig: 42, "expected MLIR text"),
    ],
    ids=["unparsable", "wrong-name", "wrong-type", "not-text"],
)
def test_bad_expansions_are_reported(expansion, message):
    register_custom_op_expansion("turbine_test::bad_op", expansion)
    try:
        with pytest.raises(CustomOpExpansionError, match=message) as info:
            export(UsesBadOp(), args=(torch.randn(2, 2),))
        assert "turbine_test::bad_op" in str(info.value)
    finally:
        unregister_custom_op_expansion(bad_op)


def test_unexpanded_custom_op_fails_compile_with_diagnostics():
    from turbine_aot import CompileError

    out = export(UsesBadOp(), args=(torch.randn(2, 2),))  # no expansion registered
    assert 'torch.operator "torch.turbine_test.bad_op"' in str(out.mlir_module)
    with pytest.raises(CompileError, match=r"torch\.turbine_test\.bad_op"):
        out.compile(None, extra_args=FAST)


def test_bad_op_names():
    with pytest.raises(CustomOpExpansionError, match="namespace::name"):
        register_custom_op_expansion("nonamespace", lambda sig: "")
    with pytest.raises(CustomOpExpansionError, match="is not a torch op"):
        register_custom_op_expansion(object(), lambda sig: "")


@torch.library.custom_op("turbine_test::scale_by", mutates_args=())
def scale_by(x: torch.Tensor, k: int) -> torch.Tensor:
    return x * k


@scale_by.register_fake
def _(x, k):
    return torch.empty_like(x)


@custom_op_expansion("turbine_test::scale_by")
def _expand_scale_by(sig: CustomOpSignature) -> str:
    t, e = sig.arg_types[0], sig.element_type(0)
    assert sig.arg_types[1] == "i64" and sig.torch_arg_types[1] == "!torch.int"
    return f"""
#map = affine_map<(d0) -> (d0)>
func.func private @{sig.func_name}(%x: {t}, %k: i64) -> {t} {{
  %kf = arith.sitofp %k : i64 to {e}
  %empty = tensor.empty() : {t}
  %r = linalg.generic {{indexing_maps = [#map, #map], iterator_types = ["parallel"]}}
      ins(%x : {t}) outs(%empty : {t}) {{
  ^bb0(%a: {e}, %o: {e}):
    %m = arith.mulf %a, %kf : {e}
    linalg.yield %m : {e}
  }} -> {t}
  return %r : {t}
}}
"""


def test_scalar_operand_is_converted():
    class Scale(nn.Module):
        def forward(self, x):
            return scale_by(x, 3)

    x = torch.randn(5)
    out = export(Scale(), args=(x,))
    ir = str(out.mlir_module)
    assert "torch_c.to_i64" in ir
    loaded = load_module(out.compile(None, extra_args=FAST))
    torch.testing.assert_close(loaded.main(x), x * 3)
