"""Golden IR of every IREEEmitter op, static and dynamic, and their error paths."""

from __future__ import annotations

import pytest
import torch

from turbine_ir import ir
from turbine_trace import (
    IREE,
    AbstractF32,
    AbstractI32,
    AbstractI64,
    AbstractIndex,
    AbstractTensor,
    IrImmediateTensor,
    ProcedureTraceError,
    current_ir_trace,
)

DYN2 = AbstractTensor(None, None)


def test_tensor_dim_static_dynamic_and_dtype(harness):
    @harness.proc("dims", (AbstractTensor(None, 4),))
    def _(x):
        return (
            IREE.tensor_dim(x, 0),
            IREE.tensor_dim(x, -1),
            IREE.tensor_dim(x, 0, dtype=torch.int32),
        )

    # As the reference: a constant and a tensor.dim even for the static dimension, and
    # index_castui for dtype=.
    harness.check(
        r"func.func @dims\(%arg0: tensor<\?x4xf32>\) -> \(index, index, i32\)",
        r"%c0 = arith.constant 0 : index\n",
        r"%dim = tensor.dim %arg0, %c0 : tensor<\?x4xf32>\n",
        r"%c1 = arith.constant 1 : index\n",
        r"%dim_0 = tensor.dim %arg0, %c1 : tensor<\?x4xf32>\n",
        r"%0 = arith.index_castui %dim : index to i32\n",
        r"return %dim, %dim_0, %0 : index, index, i32",
    )


def test_tensor_dim_caches_dynamic_dims(harness):
    @harness.proc("twice", (AbstractTensor(None),))
    def _(x):
        return IREE.tensor_dim(x, 0), IREE.tensor_dim(x, 0)

    text = harness.check(r"return %dim, %dim : index, index")
    assert text.count("tensor.dim") == 1


def test_tensor_empty_static_dynamic_and_raw_element_types(harness):
    @harness.proc("empty", (AbstractIndex, AbstractI64))
    def _(n, m):
        a = IREE.tensor_empty(2, 3, dtype=torch.float16)
        b = IREE.tensor_empty(n, 4)
        c = IREE.tensor_empty(m, n, dtype="i24")
        d = IREE.tensor_empty(n, dtype=ir.IntegerType.get_signless(8))
        assert b.shape == [None, 4] and c.dtype is None and d.dtype == torch.int8
        return a, b

    harness.check(
        r"flow.tensor.empty : tensor<2x3xf16>\n",
        r"flow.tensor.empty : tensor<\?x4xf32>\{%arg0\}",
        r"(%\d+) = arith.index_cast %arg1 : i64 to index",
        r"flow.tensor.empty : tensor<\?x\?xi24>\{%\d+, %arg0\}",
        r"flow.tensor.empty : tensor<\?xi8>\{%arg0\}",
    )


def test_tensor_splat_converts_value_to_element_type(harness):
    @harness.proc("splat", (AbstractIndex, AbstractF32, AbstractI32))
    def _(n, f, i):
        a = IREE.tensor_splat(n, 2, value=f, dtype=torch.float32)
        b = IREE.tensor_splat(3, value=i, dtype=torch.float16)
        c = IREE.tensor_splat(n, value=7, dtype=torch.int64)
        d = IREE.tensor_splat(2, value=1, dtype="i4")
        return a, b, c, d

    harness.check(
        r"flow.tensor.splat %arg1 : tensor<\?x2xf32>\{%arg0\}",
        r"arith.sitofp %arg2 : i32 to f16",
        r"flow.tensor.splat %\d+ : tensor<3xf16>\n",
        r"arith.constant 7 : i64",
        r"flow.tensor.splat %c7_i64 : tensor<\?xi64>\{%arg0\}",
        r"arith.constant 1 : i4",
        r"flow.tensor.splat %c1_i4 : tensor<2xi4>",
    )


def test_tensor_reshape_dynamic_source_and_result(harness):
    @harness.proc("reshape", (AbstractTensor(None, None),))
    def _(x):
        n = IREE.tensor_dim(x, 0) * IREE.tensor_dim(x, 1)
        flat = IREE.tensor_reshape(x, n)
        return IREE.tensor_reshape(flat, IREE.tensor_dim(x, 1), IREE.tensor_dim(x, 0))

    harness.check(
        r"%dim = tensor.dim %arg0, %c0",
        r"%dim_0 = tensor.dim %arg0, %c1",
        r"(%\d+) = arith.muli %dim, %dim_0 : index",
        r"flow.tensor.reshape %arg0 : tensor<\?x\?xf32>\{%dim, %dim_0\} -> tensor<\?xf32>\{%0\}",
        # The flat tensor's size is remembered: no tensor.dim of the reshape result.
        r"flow.tensor.reshape %1 : tensor<\?xf32>\{%0\} -> tensor<\?x\?xf32>\{%dim_0, %dim\}",
    )


def test_tensor_reshape_static(harness):
    @harness.proc("reshape_static", (AbstractTensor(2, 6),))
    def _(x):
        return IREE.tensor_reshape(x, 3, 4)

    harness.check(r"flow.tensor.reshape %arg0 : tensor<2x6xf32> -> tensor<3x4xf32>")


def test_tensor_slice_dynamic_offsets_and_lengths(harness):
    @harness.proc("slice", (DYN2, AbstractIndex, AbstractI64))
    def _(x, start, length):
        a = IREE.tensor_slice(x, (start, length), 1)
        b = IREE.tensor_slice(a, 0, (0, 1))
        assert a.shape == [None, 1] and b.shape == [1, 1]
        return a, b

    harness.check(
        r"(%\d+) = arith.index_cast %arg2 : i64 to index",
        # Rows of a column: not one contiguous range (IREE 3.13 miscopies flow.tensor.slice).
        r"%extracted_slice = tensor.extract_slice %arg0\[%arg1, 1\] \[%0, 1\] \[1, 1\] : "
        r"tensor<\?x\?xf32> to tensor<\?x1xf32>",
        # One element is contiguous: the reference's flow.tensor.slice, with the source's
        # dynamic dimension as its {dims} operand.
        r"%c1 = arith.constant 1 : index\n",
        r"%c0 = arith.constant 0 : index\n",
        r"%c0_0 = arith.constant 0 : index\n",
        r"flow.tensor.slice %extracted_slice\[%c0, %c0_0 for %c1, %c1\] : "
        r"tensor<\?x1xf32>\{%0\} -> tensor<1x1xf32>",
    )


def test_tensor_update_dynamic_offsets(harness):
    @harness.proc("update", (DYN2, AbstractTensor(None, 4), AbstractIndex))
    def _(target, update, row):
        return IREE.tensor_update(target, update, row, 0)

    text = harness.check(
        r"%dim = tensor.dim %arg0, %c0",
        r"%dim_0 = tensor.dim %arg0, %c1",
        r"%dim_1 = tensor.dim %arg1, %c0",
        r"tensor.insert_slice %arg1 into %arg0\[%arg2, 0\] \[%dim_1, 4\] \[1, 1\] : "
        r"tensor<\?x4xf32> into tensor<\?x\?xf32>",
    )
    assert "optimization_barrier" not in text


def test_tensor_update_of_own_slice_gets_barrier(harness):
    @harness.proc("shift", (AbstractTensor(None, 4),))
    def _(x):
        rows = IREE.tensor_dim(x, 0)
        tail = IREE.tensor_slice(x, (1, rows - 1), (0, 4))
        return IREE.tensor_update(x, tail, 0, 0)

    harness.check(
        r"%dim = tensor.dim %arg0, %c0 : tensor<\?x4xf32>",
        r"%0 = arith.subi %dim, %c1 : index",
        r"%1 = flow.tensor.slice %arg0\[%c1_0, %c0_1 for %0, %c4\] : "
        r"tensor<\?x4xf32>\{%dim\} -> tensor<\?x4xf32>\{%0\}",
        r"%2 = util.optimization_barrier %1 : tensor<\?x4xf32>",
        r"flow.tensor.update %2, %arg0\[%c0_2, %c0_2\] : tensor<\?x4xf32>\{%0\} -> "
        r"%arg0 as tensor<\?x4xf32>\{%dim\}",
    )


def test_tensor_trace_passes_dynamic_dims(harness):
    @harness.proc("trace", (AbstractTensor(None, 4), AbstractTensor(2)))
    def _(x, y):
        IREE.tensor_trace("values", x, y)

    harness.check(
        r'flow.tensor.trace "values" = \[%arg0 : tensor<\?x4xf32>\{%dim\}, %arg1 : tensor<2xf32>\]'
    )


def test_scalar_arithmetic(harness):
    @harness.proc("arith", (AbstractIndex, AbstractI64, AbstractF32))
    def _(i, j, f):
        return i + 1, 2 * j, j - i, i // 2, j % 3, f / 2.0, f * j

    harness.check(
        r"arith.addi %arg0, %c1 : index",
        r"arith.muli %c2_i64, %arg1 : i64",
        r"arith.index_cast %arg1 : i64 to index",
        r"arith.subi",
        r"arith.floordivsi %arg0, %c2 : index",
        r"arith.remsi %arg1, %c3_i64 : i64",
        r"arith.divf %arg2, %cst : f32",
        r"arith.sitofp %arg1 : i64 to f32",
        r"arith.mulf",
    )


# Error paths ---------------------------------------------------------------------------------


def test_slice_with_wrong_rank_names_op_procedure_and_argument(harness):
    with pytest.raises(
        ProcedureTraceError,
        match=r"IREE.tensor_slice in procedure 'bad_slice': got 1 indices for a rank-2 source "
        r"tensor tensor<\?x4xf32>",
    ):

        @harness.proc("bad_slice", (AbstractTensor(None, 4),))
        def _(x):
            return IREE.tensor_slice(x, 0)


def test_static_out_of_bounds_slice_and_update(harness):
    with pytest.raises(ProcedureTraceError, match=r"index 1: \[2, 6\) is out of bounds"):

        @harness.proc("oob", (AbstractTensor(3, 4),))
        def _(x):
            return IREE.tensor_slice(x, 0, (2, 4))

    with pytest.raises(ProcedureTraceError, match=r"start index 0: update of size 2 at offset 2"):

        @harness.proc("oob2", (AbstractTensor(3, 4), AbstractTensor(2, 4)))
        def _(x, u):
            return IREE.tensor_update(x, u, 2, 0)


def test_other_emitter_errors(harness):
    cases = [
        (lambda x: IREE.tensor_dim(x, 2), r"dimension 2 is out of range for rank-2"),
        (lambda x: IREE.tensor_update(x, IREE.tensor_empty(2), 0), r"has rank 1 but target"),
        (
            lambda x: IREE.tensor_update(x, IREE.tensor_empty(1, 1, dtype=torch.int8), 0, 0),
            r"update element type i8 differs",
        ),
        (lambda x: IREE.tensor_empty(2, dtype="notatype"), r"dtype 'notatype' is not a valid"),
        (lambda x: IREE.tensor_slice("x", 0, 0), r"source must be an IR tensor"),
        (lambda x: IREE.tensor_slice(x, (0, 1, 2), 0), r"index 0 is \(0, 1, 2\)"),
        (lambda x: IREE.tensor_empty(-1), r"dims\[0\] is -1"),
        (lambda x: IREE.tensor_dim(x, 0) + "a", r"cannot combine str"),
    ]
    for i, (body, message) in enumerate(cases):
        with pytest.raises(ProcedureTraceError, match=message):
            harness.proc(f"err{i}", (AbstractTensor(2, 3),))(body)


def test_scalar_has_no_truth_value(harness):
    with pytest.raises(ProcedureTraceError, match="no Python truth value"):

        @harness.proc("branchy", (AbstractIndex,))
        def _(n):
            if n:
                return n


def test_emitter_accepts_raw_values(harness):
    @harness.proc("raw", (AbstractTensor(None),))
    def _(x):
        raw = x.ir_value
        t = IREE.tensor_slice(raw, (0, IREE.tensor_dim(x, 0).ir_value))
        assert isinstance(t, IrImmediateTensor)
        return t

    # The raw Value is wrapped anew, so its dimension is asked again (%dim_1).
    harness.check(
        r"flow.tensor.slice %arg0\[%c0_2 for %dim\] : tensor<\?xf32>\{%dim_1\} -> "
        r"tensor<\?xf32>\{%dim\}"
    )


def test_meta_tensor_and_dim_bookkeeping(harness):
    @harness.proc("meta", (AbstractTensor(None, 3, dtype=torch.float16), AbstractIndex))
    def _(x, n):
        meta = x.to_meta_tensor(dynamic_size=5)
        assert meta.device.type == "meta" and meta.shape == (5, 3) and meta.dtype == torch.float16
        assert x.element_type == ir.F16Type.get()
        x.set_dynamic_dim_values([n.ir_value])
        assert x.get_dim_value(0) == n.ir_value
        with pytest.raises(ProcedureTraceError, match="has 1 dynamic dimensions but 2"):
            x.set_dynamic_dim_values([n.ir_value, n.ir_value])
        return IREE.tensor_dim(x, 0)

    text = harness.check(r"return %arg1 : index")
    assert "tensor.dim" not in text


# The reference's IR, op by op (issue 13) ------------------------------------------------------


def test_tensor_dim_static_is_cached_per_tensor_and_dim(harness):
    @harness.proc("static_dims", (AbstractTensor(3, 4),))
    def _(x):
        return IREE.tensor_dim(x, 1), IREE.tensor_dim(x, 1), IREE.tensor_dim(x, 0)

    text = harness.check(
        r"%c1 = arith.constant 1 : index\n",
        r"%dim = tensor.dim %arg0, %c1 : tensor<3x4xf32>\n",
        r"%c0 = arith.constant 0 : index\n",
        r"%dim_0 = tensor.dim %arg0, %c0 : tensor<3x4xf32>\n",
        r"return %dim, %dim, %dim_0 : index, index, index",
    )
    assert text.count("tensor.dim") == 2


def test_tensor_splat_of_an_index_casts_with_index_castui(harness):
    @harness.proc("splat_index", (AbstractIndex,))
    def _(n):
        return IREE.tensor_splat(2, value=n, dtype=torch.int32)

    harness.check(
        r"%0 = arith.index_castui %arg0 : index to i32\n",
        r"%1 = flow.tensor.splat %0 : tensor<2xi32>\n",
    )


def test_tensor_slice_as_the_reference(harness):
    @harness.proc("slice_ref", (AbstractTensor(3, 4),))
    def _(x):
        return IREE.tensor_slice(x, 0, (1, 3))

    # Length constants first (one per value), then a fresh constant per start.
    harness.check(
        r"%c1 = arith.constant 1 : index\n",
        r"%c3 = arith.constant 3 : index\n",
        r"%c0 = arith.constant 0 : index\n",
        r"%c1_0 = arith.constant 1 : index\n",
        r"%0 = flow.tensor.slice %arg0\[%c0, %c1_0 for %c1, %c3\] : tensor<3x4xf32> -> "
        r"tensor<1x3xf32>\n",
    )


def test_tensor_slice_dynamic_rows_emit_flow_with_dims(harness):
    @harness.proc("rows", (AbstractTensor(None, 4), AbstractIndex, AbstractIndex))
    def _(x, start, n):
        return IREE.tensor_slice(x, (start, n), (0, 4))

    harness.check(
        r"%dim = tensor.dim %arg0, %c0 : tensor<\?x4xf32>\n",
        r"%c4 = arith.constant 4 : index\n",
        r"flow.tensor.slice %arg0\[%arg1, %c0_0 for %arg2, %c4\] : tensor<\?x4xf32>\{%dim\} -> "
        r"tensor<\?x4xf32>\{%arg2\}",
    )


def test_tensor_update_as_the_reference(harness):
    @harness.proc("update_ref", (AbstractTensor(4, 4), AbstractTensor(1, 4), AbstractIndex))
    def _(target, update, i):
        return IREE.tensor_update(target, update, i, 0)

    harness.check(
        r"%c0 = arith.constant 0 : index\n",
        r"%0 = flow.tensor.update %arg1, %arg0\[%arg2, %c0\] : tensor<1x4xf32> -> "
        r"%arg0 as tensor<4x4xf32>\n",
    )


def test_tensor_update_creates_one_constant_per_value(harness):
    # The reference's own test: IREE.tensor_update(g, u, 0, 0) on a global prints
    # %_state0.global[%c0, %c0] (it was [%c0, %c0_0]).
    from turbine_trace import export_global

    state = harness.track(export_global(torch.zeros(5, 6), name="global", mutable=True), "state0")

    @harness.proc("update_corner", (AbstractTensor(1, 6),))
    def _(update):
        current_ir_trace().handle_assignment(None, state, IREE.tensor_update(state, update, 0, 0))

    text = harness.check(
        r"%_state0.global = util.global.load @_state0.global : tensor<5x6xf32>\n",
        r"%c0 = arith.constant 0 : index\n",
        r"%0 = flow.tensor.update %arg0, %_state0.global\[%c0, %c0\] : tensor<1x6xf32> -> "
        r"%_state0.global as tensor<5x6xf32>\n",
        r"util.global.store %0, @_state0.global : tensor<5x6xf32>",
    )
    assert text.count("arith.constant 0 : index") == 1


def test_tensor_update_of_a_block_uses_insert_slice(harness):
    # A 2x2 block of a 4x4 target is not one contiguous range: IREE 3.13 performs
    # flow.tensor.update as one contiguous copy (test_e2e pins the miscompile), so the block
    # goes through tensor.insert_slice.
    @harness.proc("block", (AbstractTensor(4, 4), AbstractTensor(2, 2), AbstractIndex))
    def _(target, update, i):
        return IREE.tensor_update(target, update, i, 1)

    text = harness.check(
        r"tensor.insert_slice %arg1 into %arg0\[%arg2, 1\] \[2, 2\] \[1, 1\] : "
        r"tensor<2x2xf32> into tensor<4x4xf32>"
    )
    assert "flow.tensor.update" not in text


def test_tensor_update_of_a_global_loads_updates_and_stores(harness):
    from turbine_trace import export_global

    state = harness.track(export_global(torch.zeros(4, 4), name="s", mutable=True), "g")

    @harness.proc("store_row", (AbstractTensor(1, 4),))
    def _(row):
        current_ir_trace().handle_assignment(None, state, IREE.tensor_update(state, row, 2, 0))

    text = harness.check(
        r"%_g.s = util.global.load @_g.s : tensor<4x4xf32>\n",
        r"%c2 = arith.constant 2 : index\n",
        r"%c0 = arith.constant 0 : index\n",
        r"%0 = flow.tensor.update %arg0, %_g.s\[%c2, %c0\] : tensor<1x4xf32> -> "
        r"%_g.s as tensor<4x4xf32>\n",
        r"util.global.store %0, @_g.s : tensor<4x4xf32>\n",
    )
    assert "optimization_barrier" not in text


def test_python_float_literal_with_i32_is_f32(harness):
    @harness.proc("lit", (AbstractI32,))
    def _(i):
        return i + 3.23

    harness.check(
        r"func.func @lit\(%arg0: i32\) -> f32",
        r"%0 = arith.sitofp %arg0 : i32 to f32\n",
        r"%cst = arith.constant 3.230000e\+00 : f32\n",
        r"%1 = arith.addf %0, %cst : f32\n",
        r"return %1 : f32",
    )


def test_tensor_reshape_element_mismatch_is_left_to_verify(harness):
    @harness.proc("bad_reshape", (AbstractTensor(2, 3),))
    def _(x):
        return IREE.tensor_reshape(x, 5)  # emitted, as the reference does

    from turbine_ir import IrBuildError

    assert "flow.tensor.reshape %arg0 : tensor<2x3xf32> -> tensor<5xf32>" in str(harness.module)
    with pytest.raises(
        IrBuildError,
        match=r"flow.tensor.reshape of tensor<2x3xf32> \(6 elements\) to "
        r"tensor<5xf32> \(5 elements\)",
    ):
        harness.asm()  # finalize_construct verifies
