"""Abstract types, pytree helpers and the trace stack (no IREE compile)."""

from __future__ import annotations

import pytest
import torch

from turbine_ir import ir
from turbine_trace import (
    AbstractBool,
    AbstractF32,
    AbstractF64,
    AbstractI32,
    AbstractI64,
    Abstractifiable,
    AbstractifyError,
    AbstractIndex,
    AbstractScalar,
    AbstractTensor,
    AbstractTypedef,
    CallableIntrinsic,
    IrImmediateScalar,
    IrImmediateTensor,
    ProcedureTrace,
    ProcedureTraceError,
    TreeAbstractifiable,
    TreeSpec,
    abstractify,
    abstractify_single_value,
    current_ir_trace,
    new_ir_trace_scope,
    tree_flatten,
    tree_map,
    tree_unflatten,
)


def test_abstract_tensor_repr_eq_and_validation():
    t = AbstractTensor(3, 2, dtype=torch.float16)
    assert repr(t) == "AbstractTensor(3, 2, dtype=torch.float16)"
    assert repr(AbstractTensor(None, 4)) == "AbstractTensor(None, 4, dtype=torch.float32)"
    assert t.size == (3, 2) and t.dtype == torch.float16
    assert t == AbstractTensor(3, 2, dtype=torch.float16)
    assert t != AbstractTensor(3, 2)
    assert len({t, AbstractTensor(3, 2, dtype=torch.float16)}) == 1
    with pytest.raises(AbstractifyError, match=r"dimension 1 is -1"):
        AbstractTensor(2, -1)
    with pytest.raises(AbstractifyError, match=r"must be a torch\.dtype"):
        AbstractTensor(2, dtype="float32")


def test_abstract_types_give_ir_types(harness):
    mb = harness.mb
    assert str(AbstractTensor(None, 4, dtype=torch.bfloat16).get_ir_type(mb)) == "tensor<?x4xbf16>"
    assert str(AbstractTensor(dtype=torch.int64).get_ir_type(mb)) == "tensor<i64>"
    assert str(AbstractTensor(2, dtype=torch.bool).get_ir_type(mb)) == "tensor<2xi1>"
    got = [
        str(a.get_ir_type(mb))
        for a in (AbstractI32, AbstractI64, AbstractF32, AbstractF64, AbstractBool, AbstractIndex)
    ]
    assert got == ["i32", "i64", "f32", "f64", "i1", "index"]
    assert repr(AbstractI64) == "AbstractScalar(i64)"
    custom = AbstractScalar("f16", lambda: ir.F16Type.get())
    assert str(custom.get_ir_type(mb)) == "f16" and custom.label == "f16"


def test_abstractify():
    assert abstractify_single_value(torch.zeros(2, 3, dtype=torch.int8)) == AbstractTensor(
        2, 3, dtype=torch.int8
    )
    a = AbstractTensor(1)
    assert abstractify_single_value(a) is a
    assert abstractify_single_value(True) is AbstractBool
    assert abstractify_single_value(3) is AbstractI64
    assert abstractify_single_value(1.5) is AbstractF64

    class Selfish(Abstractifiable):
        def abstractify(self) -> AbstractTypedef:
            return AbstractI32

    assert abstractify_single_value(Selfish()) is AbstractI32
    tree = abstractify({"x": torch.ones(4), "y": [1, torch.ones(2, 2, dtype=torch.float16)]})
    assert tree == {
        "x": AbstractTensor(4),
        "y": [AbstractI64, AbstractTensor(2, 2, dtype=torch.float16)],
    }

    class Tree(TreeAbstractifiable):
        def abstractify_tree(self):
            return {"z": AbstractF32}

    assert abstractify(Tree()) == {"z": AbstractF32}
    with pytest.raises(AbstractifyError, match="cannot abstractify a value of type str"):
        abstractify(["text"])
    with pytest.raises(TypeError):
        abstractify_single_value(object())


def test_tree_helpers_roundtrip_and_treespec_members():
    tree = ({"a": 1, "b": [2, 3]}, 4)
    leaves, spec = tree_flatten(tree)
    assert leaves == [1, 2, 3, 4]
    assert isinstance(spec, TreeSpec)
    assert spec.num_leaves == 4 and spec.num_children == 2 and not spec.is_leaf()
    assert spec.unflatten([10, 20, 30, 40]) == ({"a": 10, "b": [20, 30]}, 40)
    assert tree_unflatten(leaves, spec) == tree
    assert spec.child(1).is_leaf()
    assert tree_map(lambda x, y: x + y, tree, tree) == ({"a": 2, "b": [4, 6]}, 8)
    # Abstract types are leaves.
    leaves, _ = tree_flatten([AbstractTensor(1), (AbstractI64,)])
    assert leaves == [AbstractTensor(1), AbstractI64]
    assert tree_flatten([1, [2]], is_leaf=lambda x: isinstance(x, list) and x == [2])[0] == [1, [2]]


def test_no_trace_active_is_a_clear_error():
    with pytest.raises(ProcedureTraceError, match="no procedural trace is active"):
        current_ir_trace()


def test_trace_scope_nests_and_finalizes(harness):
    finalized = []

    class Recording(ProcedureTrace):
        def finalize(self):
            finalized.append(self.name)

    t1 = ProcedureTrace.define_func(
        harness.mb, symbol_name="a", posargs=(), kwargs={}, loc=harness.loc
    )
    t2 = ProcedureTrace.define_func(
        harness.mb, symbol_name="b", posargs=(), kwargs={}, loc=harness.loc
    )
    r1 = Recording(module_builder=harness.mb, func_op=t1.func_op, proxy_posargs=(), proxy_kwargs={})
    r2 = Recording(module_builder=harness.mb, func_op=t2.func_op, proxy_posargs=(), proxy_kwargs={})
    with new_ir_trace_scope(r1):
        assert current_ir_trace() is r1
        with pytest.raises(RuntimeError), new_ir_trace_scope(r2):
            assert current_ir_trace() is r2
            raise RuntimeError("boom")
        assert current_ir_trace() is r1
    assert finalized == ["b", "a"]
    with pytest.raises(ProcedureTraceError):
        current_ir_trace()


def test_define_func_proxies_trees_of_arguments(harness):
    seen = {}

    @harness.proc(
        "f",
        (AbstractTensor(None, 4), [AbstractI64, AbstractF32]),
        {"flag": AbstractBool},
    )
    def trace(x, pair, *, flag):
        seen.update(x=x, pair=pair, flag=flag)

    assert isinstance(seen["x"], IrImmediateTensor)
    assert seen["x"].shape == [None, 4] and seen["x"].rank == 2 and seen["x"].dtype == torch.float32
    assert seen["x"].dynamic_dim_indices == [0]
    assert isinstance(seen["pair"], list) and all(
        isinstance(p, IrImmediateScalar) for p in seen["pair"]
    )
    assert str(seen["flag"].ir_type) == "i1"
    assert trace.name == "f"
    harness.check(
        r"func.func @f\(%arg0: tensor<\?x4xf32>, %arg1: i64, %arg2: f32, %arg3: i1\)",
        r"torch.args_schema = ",
        r"return\n",
    )


def test_callable_intrinsic_calls_go_through_handle_call(harness):
    calls = []

    class Doubler(CallableIntrinsic):
        def resolve_call(self, proc_trace, *args, **kwargs):
            calls.append((proc_trace.name, len(args), sorted(kwargs)))
            (x,) = args
            return x + x

    doubler = Doubler()

    @harness.proc("g", (AbstractI64,))
    def _(n):
        return doubler(n)

    assert calls == [("g", 1, [])]
    harness.check(r"func.func @g\(%arg0: i64\) -> i64", r"arith.addi %arg0, %arg0 : i64", r"return")


def test_intrinsic_defaults_are_clear_errors(harness):
    from turbine_trace import Intrinsic

    class Opaque(Intrinsic):
        def __repr__(self):
            return "Opaque()"

    with pytest.raises(ProcedureTraceError, match=r"procedure 'h': Opaque\(\) is not callable"):

        @harness.proc("h")
        def _():
            current_ir_trace().handle_call(Opaque(), (), {})
