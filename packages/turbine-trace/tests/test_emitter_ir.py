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

    harness.check(
        r"func.func @dims\(%arg0: tensor<\?x4xf32>\) -> \(index, index, i32\)",
        r"(%\w+) = tensor.dim %arg0, %c0 : tensor<\?x4xf32>",
        r"%c4 = arith.constant 4 : index",
        r"arith.index_cast %dim : index to i32",
        r"return %dim, %c4, %\d+ : index, index, i32",
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
        r"%extracted_slice = tensor.extract_slice %arg0\[%arg1, 1\] \[%0, 1\] \[1, 1\] : "
        r"tensor<\?x\?xf32> to tensor<\?x1xf32>",
        r"tensor.extract_slice %extracted_slice\[0, 0\] \[1, 1\] \[1, 1\] : tensor<\?x1xf32> to "
        r"tensor<1x1xf32>",
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
        r"%extracted_slice = tensor.extract_slice %arg0\[1, 0\] \[%0, 4\]",
        r"(%\d+) = util.optimization_barrier %extracted_slice : tensor<\?x4xf32>",
        r"tensor.insert_slice %1 into %arg0\[0, 0\] \[%0, 4\] \[1, 1\]",
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
        (lambda x: IREE.tensor_reshape(x, 5), r"cannot reshape tensor<2x3xf32> \(6 elements\)"),
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

    harness.check(r"tensor.extract_slice %arg0\[0\] \[%dim\] \[1\]")


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
