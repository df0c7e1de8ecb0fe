"""ProcedureTrace: signatures, results, schemas and error messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from turbine_ir import ir
from turbine_params import DeviceAffinity
from turbine_trace import (
    AbstractF32,
    AbstractI64,
    AbstractTensor,
    ProcedureTrace,
    ProcedureTraceError,
    convert_py_value_to_ir,
    current_ir_trace,
)
from turbine_trace._tree import treespec_loads


def test_results_trees_and_python_scalars(harness):
    trace = harness.proc("results", (AbstractTensor(2), AbstractI64))(
        lambda x, n: {"t": x, "pair": (n, 3), "f": 0.5, "b": True}
    )
    text = harness.check(
        r"func.func @results\(%arg0: tensor<2xf32>, %arg1: i64\) -> "
        r"\(tensor<2xf32>, i64, i64, f64, i1\)",
        r"torch.return_schema = ",
        r"return %arg0, %arg1, %c3_i64, %cst, %true",
    )
    schema = treespec_loads(ir.StringAttr(trace.func_op.attributes["torch.return_schema"]).value)
    assert schema.unflatten(list("abcde")) == {"t": "a", "pair": ("b", "c"), "f": "d", "b": "e"}
    assert "torch.args_schema" in text


def test_no_result_and_tensor_argument_abstractified(harness):
    seen = []
    harness.proc("noresult", (torch.zeros(2, 3, dtype=torch.int8),))(lambda x: seen.append(x))
    assert seen[0].dtype == torch.int8
    harness.check(r"func.func @noresult\(%arg0: tensor<2x3xi8>\)", r"return\n")


def test_symbol_names_are_uniqued(harness):
    t1 = harness.proc("f")(lambda: None)
    t2 = harness.proc("f")(lambda: None)
    assert t1.name == "f" and t2.name != "f" and t2.name.startswith("f_")


def test_arg_device_affinities(harness):
    harness.proc(
        "placed", (AbstractTensor(2), AbstractTensor(2)), arg_device={1: DeviceAffinity(1)}
    )(lambda a, b: b)
    harness.check(
        r"func.func @placed\(%arg0: tensor<2xf32>, %arg1: tensor<2xf32> "
        r"\{iree.abi.affinity = #hal.device.promise<@__device_1>\}\)"
    )


def test_unsupported_return_value_names_procedure_and_position(harness):
    with pytest.raises(
        ProcedureTraceError,
        match=r"procedure 'bad_return': return value\[1\]: cannot convert a value of type str "
        r"\('oops'\) to IR",
    ):
        harness.proc("bad_return", (AbstractTensor(2),))(lambda x: (x, "oops"))
    with pytest.raises(
        ProcedureTraceError,
        match=r"procedure 'eager': the return value: cannot convert a torch.Tensor \(2,\) "
        r"torch.float32 .*export_global",
    ):
        harness.proc("eager")(lambda: torch.ones(2))
    with pytest.raises(ProcedureTraceError, match=r"return value\['k'\]\[0\]: .*type object"):
        harness.proc("nested")(lambda: {"k": [object()]})


def test_bad_arguments_name_procedure_and_argument(harness):
    with pytest.raises(
        ProcedureTraceError,
        match=r"procedure 'bad_arg': argument #1 is int \(3\); procedure arguments must be "
        r"abstract types",
    ):
        ProcedureTrace.define_func(
            harness.mb, symbol_name="bad_arg", posargs=(AbstractF32, 3), kwargs={}, loc=harness.loc
        )
    with pytest.raises(ProcedureTraceError, match=r"argument 'opt'\[0\] is str"):
        ProcedureTrace.define_func(
            harness.mb,
            symbol_name="bad_kwarg",
            posargs=(),
            kwargs={"opt": ["s"]},
            loc=harness.loc,
        )


def test_convert_py_value_to_ir(harness):
    out = []

    @harness.proc("conv", (AbstractTensor(2),))
    def _(x):
        trace = current_ir_trace()
        out.append(convert_py_value_to_ir(trace, x))
        out.append(convert_py_value_to_ir(trace, x.ir_value))
        out.append(convert_py_value_to_ir(trace, 2))
        with pytest.raises(ProcedureTraceError, match="procedure 'conv': cannot convert"):
            convert_py_value_to_ir(trace, None)

    assert out[0][0] == out[1][0]
    assert str(out[2][0].type) == "i64"


def test_bad_arg_device_index_names_procedure(harness):
    with pytest.raises(
        ProcedureTraceError, match=r"procedure 'placed_wrong': arg_device: .*argument 3"
    ):
        ProcedureTrace.define_func(
            harness.mb,
            symbol_name="placed_wrong",
            posargs=(AbstractTensor(2),),
            kwargs={},
            loc=harness.loc,
            arg_device={3: DeviceAffinity(0)},
        )


def test_namedtuple_results_are_flattened(harness):
    import collections

    Pair = collections.namedtuple("Pair", ["a", "b"])
    harness.proc("nt", (AbstractTensor(2), AbstractI64))(lambda x, n: Pair(x, n))
    harness.check(r"func.func @nt\(%arg0: tensor<2xf32>, %arg1: i64\) -> \(tensor<2xf32>, i64\)")


class _BodyFailed(Exception):
    pass


def _symbols(harness) -> list[str]:
    return [
        ir.StringAttr(op.attributes["sym_name"]).value
        for op in harness.module.body.operations
        if "sym_name" in op.attributes
    ]


def test_failing_body_leaves_the_module_as_it_was(harness, iree_device):
    from turbine_trace import IREE

    harness.proc("keep", (AbstractTensor(2),))(lambda x: x)
    before = str(harness.module)

    def body(x, n):
        IREE.tensor_update(x, x, 0)  # some IR is emitted before the failure
        raise _BodyFailed("the procedure's own error")

    with pytest.raises(_BodyFailed, match="the procedure's own error"):
        harness.proc("broken", (AbstractTensor(2), AbstractI64))(body)
    # A bad return value fails after the body ran: the same holds.
    with pytest.raises(ProcedureTraceError, match="procedure 'bad_ret'"):
        harness.proc("bad_ret", (AbstractTensor(2),))(lambda x: (x, "oops"))

    assert _symbols(harness) == ["keep"]
    assert str(harness.module) == before
    # The names are free again, and the module verifies, compiles and runs.
    assert harness.proc("broken", (AbstractTensor(2),))(lambda x: x).name == "broken"
    harness.check(r"func.func @keep\(", r"func.func @broken\(")
    module = harness.load(iree_device)
    x = np.arange(2, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(module.broken(x).to_host()), x)
