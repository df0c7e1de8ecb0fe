"""Calling a private ``ExportedProgram`` class attribute from a ``CompiledModule`` procedure.

``class M(CompiledModule): _compute = torch.export.export(...)`` imports the program as
``func.func private @_compute`` over torch-dialect types; ``self._compute(x)`` inside a procedure
emits, as the reference does::

    %0 = torch_c.from_builtin_tensor %arg0 : tensor<3xf32> -> !torch.vtensor<[3],f32>
    %1 = call @_compute(%0) : (!torch.vtensor<[3],f32>) -> !torch.vtensor<[3],f32>
    %2 = torch_c.to_builtin_tensor %1 : !torch.vtensor<[3],f32> -> tensor<3xf32>

The call's arguments must flatten to the program's inputs, in number, order and type (the
structure may differ, as in the reference: ``args=([t1, t2],), kwargs={"foobar": t3}`` called
as ``self._compute(t1, t2, foobar=t3)``); its results are rebuilt with the program's
``out_spec``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["exported_program_call", "unwrap_program"]


def unwrap_program(value: Any) -> Any:
    """The ``ExportedProgram`` ``value`` is or wraps (``FxPrograms.programs`` values carry it as
    ``.target``), or ``None``."""
    try:
        from torch.export import ExportedProgram
    except ImportError:  # pragma: no cover
        return None
    if isinstance(value, ExportedProgram):
        return value
    target = getattr(value, "target", None) if not isinstance(value, type) else None
    if isinstance(target, ExportedProgram):
        return target
    return None


def exported_program_call(name: str, pdef: Any, func_op: Any) -> Any:
    """The intrinsic ``self.<name>`` stands for inside a procedure."""
    return _call_type()(name, pdef, func_op)


_CALL_TYPE: type | None = None


def _call_type() -> type:
    global _CALL_TYPE
    if _CALL_TYPE is not None:
        return _CALL_TYPE
    from turbine_trace import CallableIntrinsic

    class ExportedProgramCall(CallableIntrinsic):
        """A private imported ``ExportedProgram``, called with ``func.call``."""

        __slots__ = ("func_op", "name", "pdef")

        def __init__(self, name: str, pdef: Any, func_op: Any):
            self.name = name
            self.pdef = pdef
            self.func_op = func_op

        def __repr__(self) -> str:
            return f"<exported program {self.name}>"

        def resolve_call(self, proc_trace: Any, *args: Any, **kwargs: Any) -> Any:
            return _emit_call(self, proc_trace, args, kwargs)

    _CALL_TYPE = ExportedProgramCall
    return _CALL_TYPE


def _emit_call(call: Any, proc_trace: Any, args: tuple, kwargs: dict) -> Any:
    from torch.utils import _pytree as pytree

    from turbine_fx import (
        builtin_results,
        constant_results,
        user_output_dtypes,
        with_constant_results,
    )
    from turbine_ir.ir import FlatSymbolRefAttr, Operation, StringAttr
    from turbine_trace import IrTensor

    if call.pdef.public:
        raise ValueError(
            f"Currently, only private ExportedPrograms can be called: {call.name!r} is public. "
            f"Name the class attribute with a leading underscore (e.g. `_{call.name}`) to make it "
            "a private function callable from procedures"
        )
    program = unwrap_program(call.pdef.program)
    signature = program.module_call_graph[0].signature
    flat_args, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    if spec != signature.in_spec and spec.num_leaves != signature.in_spec.num_leaves:
        # Another structure with the same leaves in the same order is accepted, as the
        # reference does: args=([t1, t2],), kwargs={"foobar": t3} called as
        # self._compute(t1, t2, foobar=t3). The types are checked leaf by leaf below.
        raise ValueError(
            f"Mismatched arguments to exported program {call.name!r}: "
            f"{spec.num_leaves} flattened arguments given, it was exported with "
            f"{signature.in_spec.num_leaves}:\n"
            f"  got:      {spec}\n  expected: {signature.in_spec}\n"
            "Call it with the arguments it was exported with (their structure may differ when "
            "the flattened arguments match in number and type)."
        )
    func_op = call.func_op
    mb = proc_trace.module_builder
    conv = mb.native_type_converter
    input_types = list(func_op.type.inputs)
    if len(flat_args) != len(input_types):
        raise ValueError(
            f"call of exported program {call.name!r}: {len(flat_args)} arguments given, its "
            f"function takes {len(input_types)} (constant arguments cannot be passed)"
        )
    with proc_trace.context, proc_trace.loc, proc_trace.ip:
        operands = []
        for i, (leaf, arg_type) in enumerate(zip(flat_args, input_types, strict=True)):
            if not isinstance(leaf, IrTensor):
                raise ValueError(
                    f"call of exported program {call.name!r}: argument {i} must be an IR tensor "
                    f"(a procedure argument, an IREE.* result or a global), got "
                    f"{type(leaf).__name__}"
                )
            value = leaf.ir_value
            builtin_type = conv.torch_type_to_native(arg_type)
            if str(value.type) != str(builtin_type):
                raise ValueError(
                    f"call of exported program {call.name!r}: argument {i} has type "
                    f"{value.type}, the program takes {builtin_type}"
                )
            operands.append(
                Operation.create(
                    "torch_c.from_builtin_tensor", results=[arg_type], operands=[value]
                ).result
            )
        callee = StringAttr(func_op.attributes["sym_name"]).value
        call_op = Operation.create(
            "func.call",
            results=list(func_op.type.results),
            operands=operands,
            attributes={"callee": FlatSymbolRefAttr.get(callee)},
        )
        results = builtin_results(
            call_op.results,
            user_output_dtypes(program),
            conv,
            unsupported=lambda i, asm: ValueError(
                f"call of exported program {call.name!r}: result {i} has type {asm}, which a "
                "procedure cannot receive"
            ),
        )
    flat = with_constant_results(results, constant_results(func_op))
    return pytree.tree_unflatten(flat, signature.out_spec)
