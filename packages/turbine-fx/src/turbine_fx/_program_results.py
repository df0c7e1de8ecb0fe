"""The results of an imported program's function: their dtypes, the constant results, builtin values.

``import_exported_program`` leaves constant user outputs (``None``, numbers, strings) out of the
function it builds and records them in its :data:`CONSTANT_RESULTS_ATTR` attribute; whoever
calls that function (``jittable``, a ``CompiledModule`` procedure calling a private program, a
runtime wrapper) puts them back at their flat positions before unflattening the outputs with the
program's ``out_spec``, and receives the function's torch-dialect results as builtin values
typed with the dtypes the program declared. Those rules live here once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.export.graph_signature import ConstantArgument, OutputKind

from turbine_ir import NativeTypeConverter
from turbine_ir.ir import Operation, StringAttr, Value
from turbine_trace import IrImmediateScalar, IrImmediateTensor

__all__ = [
    "CONSTANT_RESULTS_ATTR",
    "builtin_results",
    "constant_results",
    "record_constant_results",
    "user_output_dtypes",
    "with_constant_results",
]

#: Function attribute recording the program's constant outputs (``None``, Python numbers,
#: strings), which are not returned by the compiled function: JSON ``{"<flat output index>":
#: value}``. A runner re-inserts them at those positions before unflattening the outputs with
#: ``program.call_spec.out_spec``.
CONSTANT_RESULTS_ATTR = "turbine.constant_results"


def user_output_dtypes(program: Any) -> list[torch.dtype | None]:
    """The dtypes of an ``ExportedProgram``'s non-constant user outputs, in order.

    These are the function's results after import (constant outputs are left out of it); an
    output without a tensor value (a symbolic int) is ``None``.
    """
    nodes = {n.name: n for n in program.graph.nodes}
    out: list[torch.dtype | None] = []
    for s in program.graph_signature.output_specs:
        if s.kind != OutputKind.USER_OUTPUT or isinstance(s.arg, ConstantArgument):
            continue
        val = nodes[s.arg.name].meta.get("val")
        out.append(getattr(val, "dtype", None))
    return out


def record_constant_results(func_op: Any, constants: Mapping[int, Any]) -> None:
    """Records ``{flat output index: value}`` on ``func_op`` (nothing when empty).

    Values that JSON cannot hold are recorded as their ``repr``. Needs the op's context current.
    """
    if constants:
        func_op.attributes[CONSTANT_RESULTS_ATTR] = StringAttr.get(
            json.dumps({str(k): _jsonable(v) for k, v in constants.items()})
        )


def constant_results(func_op: Any) -> dict[int, Any]:
    """The constant results :func:`record_constant_results` put on ``func_op`` (``{}`` if none)."""
    attrs = func_op.attributes
    if CONSTANT_RESULTS_ATTR not in attrs:
        return {}
    raw = json.loads(StringAttr(attrs[CONSTANT_RESULTS_ATTR]).value)
    return {int(k): v for k, v in raw.items()}


def with_constant_results(results: Iterable[Any], constants: Mapping[int, Any]) -> list[Any]:
    """The program's flat outputs: ``results`` (what the function returned, in order) with each
    constant at its recorded position."""
    returned = list(results)
    it = iter(returned)
    return [
        constants[i] if i in constants else next(it) for i in range(len(returned) + len(constants))
    ]


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


#: torch-dialect scalar result types and the ``torch_c`` op that makes each a builtin value.
_SCALAR_RESULTS = {"!torch.int": "torch_c.to_i64", "!torch.float": "torch_c.to_f64"}


def builtin_results(
    values: Sequence[Value],
    dtypes: Sequence[torch.dtype | None],
    converter: NativeTypeConverter,
    *,
    unsupported: Callable[[int, str], Exception],
) -> list[IrImmediateTensor | IrImmediateScalar]:
    """The results of a ``func.call`` of an imported function, as a procedure receives them.

    A ``!torch.vtensor`` goes through ``torch_c.to_builtin_tensor`` and becomes an
    ``IrImmediateTensor`` of the program's declared dtype (``dtypes[i]``; ``None`` past their
    end, see :func:`user_output_dtypes`); a ``!torch.int`` / ``!torch.float`` goes through
    ``torch_c.to_i64`` / ``torch_c.to_f64`` and becomes an ``IrImmediateScalar``. The ops are
    emitted at the current insertion point and location.

    Args:
        values: The call's results.
        dtypes: The torch dtypes of the results.
        converter: The module builder's ``native_type_converter``.
        unsupported: Makes the error raised for result ``i`` of type ``asm`` (another type,
            which a procedure cannot receive); the caller words it.
    """
    results: list[IrImmediateTensor | IrImmediateScalar] = []
    for i, value in enumerate(values):
        asm = str(value.type)
        if asm.startswith("!torch.vtensor"):
            op_name = "torch_c.to_builtin_tensor"
        elif asm in _SCALAR_RESULTS:
            op_name = _SCALAR_RESULTS[asm]
        else:
            raise unsupported(i, asm)
        native = converter.torch_type_to_native(value.type)
        builtin = Operation.create(op_name, results=[native], operands=[value]).result
        if op_name == "torch_c.to_builtin_tensor":
            results.append(IrImmediateTensor(builtin, dtypes[i] if i < len(dtypes) else None))
        else:
            results.append(IrImmediateScalar(builtin))
    return results
