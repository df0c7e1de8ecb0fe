"""What an imported program's function returns: user output dtypes, constant results kept aside."""

from __future__ import annotations

import pytest
import torch
from fx_helpers import Built

import turbine_fx
from turbine_fx import (
    CONSTANT_RESULTS_ATTR,
    constant_results,
    import_exported_program,
    user_output_dtypes,
    with_constant_results,
)
from turbine_ir.ir import StringAttr


class Mixed(torch.nn.Module):
    def forward(self, x, n: int):
        return x.to(torch.int32), None, (x * 2).to(torch.float16), 7, x.shape[0] * n


def _mixed_program():
    return torch.export.export(
        Mixed(),
        (torch.randn(4), 3),
        dynamic_shapes={"x": {0: torch.export.Dim("n0")}, "n": torch.export.Dim.DYNAMIC},
    )


def test_user_output_dtypes_skips_constants_and_names_symbolic_ints_none():
    # The function returns int32 and float16 tensors and a symbolic int; None and 7 are constant.
    assert user_output_dtypes(_mixed_program()) == [torch.int32, torch.float16, None]


def test_constant_results_are_recorded_on_import_and_put_back_in_place():
    ep = _mixed_program()
    b = Built()
    with b:
        func = import_exported_program(b.mb, ep)
        raw = StringAttr(func.attributes[CONSTANT_RESULTS_ATTR]).value
    assert raw == '{"1": null, "3": 7}'  # the attribute's format (JSON, flat output positions)
    constants = constant_results(func)
    assert constants == {1: None, 3: 7}
    assert len(func.type.results) == len(user_output_dtypes(ep)) == 3
    assert with_constant_results(["a", "b", "c"], constants) == ["a", None, "b", 7, "c"]


def test_no_constant_results():
    ep = torch.export.export(torch.nn.ReLU(), (torch.randn(2),))
    b = Built()
    with b:
        func = import_exported_program(b.mb, ep)
    assert CONSTANT_RESULTS_ATTR not in func.attributes
    assert constant_results(func) == {}
    assert with_constant_results(["r"], {}) == ["r"]
    assert user_output_dtypes(ep) == [torch.float32]


def test_too_few_results_for_the_constants_fail():
    with pytest.raises(StopIteration):
        with_constant_results([], {1: None})


def test_public_home():
    """One implementation, importable from the package (turbine_aot uses the same objects)."""
    from turbine_fx import _jittable, _program_results

    assert turbine_fx.user_output_dtypes is _program_results.user_output_dtypes
    assert _jittable.user_output_dtypes is user_output_dtypes
    assert not hasattr(_jittable, "_user_output_dtypes")


def test_builtin_results_of_a_call():
    """Tensor and scalar results become builtin values of the declared dtypes; another type is
    the caller's error."""
    from turbine_ir.ir import FlatSymbolRefAttr, InsertionPoint, Operation, Type
    from turbine_trace import IrImmediateScalar, IrImmediateTensor

    b = Built()
    with b:
        func = import_exported_program(b.mb, _mixed_program(), symbol_visibility="private")
        _, caller = b.mb.create_func_op("caller", [])
        with InsertionPoint(caller.entry_block):
            call = Operation.create(
                "func.call",
                results=list(func.type.results),
                operands=[],  # not verified: only the result conversion is under test
                attributes={
                    "callee": FlatSymbolRefAttr.get(StringAttr(func.attributes["sym_name"]).value)
                },
            )
            results = turbine_fx.builtin_results(
                call.results,
                [torch.int32, torch.float16],  # one dtype short: the int result gets None
                b.mb.native_type_converter,
                unsupported=lambda i, asm: AssertionError(f"{i}: {asm}"),
            )
            assert [type(r) for r in results] == [
                IrImmediateTensor,
                IrImmediateTensor,
                IrImmediateScalar,
            ]
            assert [r.dtype for r in results[:2]] == [torch.int32, torch.float16]
            assert [str(r.ir_value.type) for r in results] == [
                "tensor<?xi32>",
                "tensor<?xf16>",
                "i64",
            ]
            none = Operation.create(
                "torch.constant.none", results=[Type.parse("!torch.none")]
            ).results
            with pytest.raises(ValueError, match=r"0: !torch\.none"):
                turbine_fx.builtin_results(
                    none,
                    [],
                    b.mb.native_type_converter,
                    unsupported=lambda i, asm: ValueError(f"{i}: {asm}"),
                )
    asm = b.asm()
    assert "torch_c.to_builtin_tensor" in asm and "torch_c.to_i64" in asm
