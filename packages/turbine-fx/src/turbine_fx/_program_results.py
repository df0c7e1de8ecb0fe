"""The results of an imported program's function: user outputs' dtypes and the constant results.

``import_exported_program`` leaves constant user outputs (``None``, numbers, strings) out of the
function it builds and records them in its :data:`CONSTANT_RESULTS_ATTR` attribute; whoever
calls that function (``jittable``, a ``CompiledModule`` procedure calling a private program, a
runtime wrapper) puts them back at their flat positions before unflattening the outputs with the
program's ``out_spec``, and types tensor results with the dtypes the program declared. Those
rules live here once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.export.graph_signature import ConstantArgument, OutputKind

from turbine_ir.ir import StringAttr

__all__ = [
    "CONSTANT_RESULTS_ATTR",
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
