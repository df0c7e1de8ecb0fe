"""Importing a ``CompiledModule`` instance's exports: programs, globals and procedures, traced
through proxies of ``self`` and of procedure calls."""

from __future__ import annotations

import inspect
from typing import Any

from .._errors import CompiledModuleError
from .info import (
    CompiledModuleInstanceInfo,
    ExportedProgramDef,
    ExportProcDef,
    is_abstract,
)
from .program_calls import exported_program_call, unwrap_program

__all__ = [
    "import_exports",
]


# ---------------------------------------------------------------------------------------------
# Import machinery
# ---------------------------------------------------------------------------------------------
def import_exports(inst: object, info: CompiledModuleInstanceInfo) -> None:
    """Imports the exports of ``inst`` (a ``CompiledModule`` instance: only its class and
    attributes are read, so any object is typed here) into ``info``'s module builder."""
    class_info = info.class_info
    builder = info.module_builder
    # Globals first: procedures refer to them.
    for key, gdef in class_info.export_globals:
        info.shadow_dict[key] = gdef.globals_def.track(builder, key)
    for key, pdef in class_info.exported_programs:
        info.program_funcs[key] = _import_program(info, pdef)
    for key, _proc in class_info.export_procs:
        _ensure_proc(inst, info, key)


def _import_program(info: CompiledModuleInstanceInfo, pdef: ExportedProgramDef) -> Any:
    from turbine_fx import import_exported_program

    program = unwrap_program(pdef.program)
    arg_device = pdef.arg_device
    if program is None:
        raise CompiledModuleError(
            f"export {pdef.export_name!r}: expected a torch.export.ExportedProgram (or an "
            f"FxPrograms entry wrapping one), got {type(pdef.program).__name__}"
        )
    if arg_device is None and program is not pdef.program:
        arg_device = getattr(pdef.program, "arg_device", None)
    return import_exported_program(
        info.module_builder,
        program,
        symbol_name=pdef.export_name,
        symbol_visibility=None if pdef.public else "private",
        arg_device=arg_device or None,
        import_symbolic_shape_expressions=pdef.import_symbolic_shape_expressions,
    )


def _ensure_proc(inst: object, info: CompiledModuleInstanceInfo, key: str) -> Any:
    """Traces the procedure ``key`` if not yet done; returns its ``func.func`` op."""
    if key in info.proc_funcs:
        return info.proc_funcs[key]
    if key in info.tracing:
        raise CompiledModuleError(
            f"procedure {key!r} of {type(inst).__name__} calls itself (directly or through other "
            "procedures); recursion cannot be traced"
        )
    from turbine_ir.ir import Location
    from turbine_trace import ProcedureTrace

    proc: ExportProcDef = info.class_info.all_exports[key]
    builder = info.module_builder
    info.tracing.add(key)
    try:
        with builder.context:
            if proc.file_line_loc:
                loc = Location.file(proc.file_line_loc[0], proc.file_line_loc[1], 0)
            else:
                loc = Location.unknown()
            with loc:
                trace = ProcedureTrace.define_func(
                    builder,
                    symbol_name=proc.export_name,
                    posargs=proc.signature,
                    kwargs=proc.kw_signature,
                    loc=loc,
                    arg_device=proc.arg_device,
                )
            proxy = _ProcSelfProxy(inst, info)
            returned: dict[str, Any] = {}

            def invoke(*args: Any, **kwargs: Any) -> Any:
                result = proc.callable(proxy, *args, **kwargs)
                returned["value"] = result
                return result

            trace.trace_py_func(invoke)
        info.proc_funcs[key] = trace.func_op
        info.proc_returns[key] = returned.get("value")
        return trace.func_op
    finally:
        info.tracing.discard(key)


class _ProcSelfProxy:
    """What ``self`` is inside a traced procedure: globals, other procedures, helpers."""

    def __init__(self, inst: object, info: CompiledModuleInstanceInfo):
        object.__setattr__(self, "_inst", inst)
        object.__setattr__(self, "_info", info)

    def __getattr__(self, name: str) -> Any:
        info: CompiledModuleInstanceInfo = object.__getattribute__(self, "_info")
        if name in info.shadow_dict:
            value = info.shadow_dict[name]
            if isinstance(value, (dict, list, tuple)):
                # `self.tree["key"] = value` must become a global store, not a dict update.
                from turbine_trace import LiveGlobalCollectionProxy

                return LiveGlobalCollectionProxy(value)
            return value
        export = info.class_info.all_exports.get(name)
        if isinstance(export, ExportProcDef):
            return _ProcCall(object.__getattribute__(self, "_inst"), info, name)
        if isinstance(export, ExportedProgramDef):
            return exported_program_call(name, export, info.program_funcs[name])
        inst = object.__getattribute__(self, "_inst")
        value = inspect.getattr_static(type(inst), name, _MISSING)
        if value is _MISSING:
            raise AttributeError(f"{type(inst).__name__} has no attribute {name!r}")
        if inspect.isfunction(value):
            return value.__get__(self, type(self))  # helpers see the proxy as self
        if isinstance(value, (staticmethod, classmethod, property)):
            return getattr(inst, name)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        from turbine_trace import current_ir_trace

        info: CompiledModuleInstanceInfo = object.__getattribute__(self, "_info")
        if name not in info.shadow_dict:
            raise CompiledModuleError(
                f"cannot assign {name!r} in a procedure: only exported globals (export_global("
                "..., mutable=True)) can be assigned"
            )
        current_ir_trace().handle_assignment(self, info.shadow_dict[name], value)


_MISSING = object()


def _make_proc_call_type() -> type:
    from turbine_trace import CallableIntrinsic

    class _ProcCallImpl(CallableIntrinsic):
        """Calling another procedure of the same module: emits ``func.call``."""

        __slots__ = ("info", "inst", "key")

        def __init__(self, inst: object, info: CompiledModuleInstanceInfo, key: str):
            self.inst = inst
            self.info = info
            self.key = key

        def __repr__(self) -> str:
            return f"<procedure {self.key}>"

        def resolve_call(self, proc_trace: Any, *args: Any, **kwargs: Any) -> Any:
            return _emit_proc_call(self, proc_trace, args, kwargs)

    return _ProcCallImpl


_proc_call_type: type | None = None


def _ProcCall(inst: object, info: CompiledModuleInstanceInfo, key: str) -> Any:
    global _proc_call_type
    if _proc_call_type is None:
        _proc_call_type = _make_proc_call_type()
    return _proc_call_type(inst, info, key)


def _emit_proc_call(call: Any, proc_trace: Any, args: tuple, kwargs: dict) -> Any:
    from turbine_ir.dialects import func as func_d
    from turbine_ir.ir import FlatSymbolRefAttr, InsertionPoint, StringAttr
    from turbine_trace import (
        IrImmediateScalar,
        IrImmediateTensor,
        IrTensor,
        LiveGlobalCollectionProxy,
        convert_py_value_to_ir,
        tree_flatten,
    )

    info: CompiledModuleInstanceInfo = call.info
    proc: ExportProcDef = info.class_info.all_exports[call.key]
    # Trace the callee first (outside the caller's insertion point).
    func_op = _ensure_proc(call.inst, info, call.key)
    # Bind the call's arguments like Python would, defaults included.
    bound = _bind_call_args(proc, args, kwargs)
    flat_args, _ = tree_flatten((tuple(bound[0]), dict(bound[1])))
    operands: list[Any] = []
    input_types = list(func_op.type.inputs)
    with proc_trace.loc, proc_trace.ip:
        for a in flat_args:
            if isinstance(a, (bool, int, float)) and len(operands) < len(input_types):
                operands.append(_scalar_constant(input_types[len(operands)], a))
            else:
                operands.extend(convert_py_value_to_ir(proc_trace, a))
        if [str(v.type) for v in operands] != [str(t) for t in input_types]:
            raise CompiledModuleError(
                f"call of procedure {proc.export_name!r}: argument types "
                f"({', '.join(str(v.type) for v in operands)}) do not match its signature "
                f"({', '.join(str(t) for t in input_types)})"
            )
        result_types = list(func_op.type.results)
        # The symbol may have been uniqued by define_func (e.g. `f` -> `f_0` when taken).
        callee = StringAttr(func_op.attributes["sym_name"]).value
        call_op = func_d.CallOp(
            result_types,
            FlatSymbolRefAttr.get(callee),
            operands,
            ip=InsertionPoint.current,
        )
    results = list(call_op.results)
    ret = info.proc_returns.get(call.key)
    if ret is None and not results:
        return None
    ret_leaves, ret_spec = tree_flatten(LiveGlobalCollectionProxy.unwrap(ret))
    proxies: list[IrImmediateTensor | IrImmediateScalar] = []
    for leaf, value in zip(ret_leaves, results, strict=False):
        if isinstance(leaf, IrTensor):
            proxies.append(IrImmediateTensor(value, leaf.dtype))
        else:
            proxies.append(IrImmediateScalar(value))
    if len(ret_leaves) != len(results):
        raise CompiledModuleError(
            f"procedure {call.key!r}: its {len(results)} IR results do not match the "
            f"{len(ret_leaves)} values it returned"
        )
    return ret_spec.unflatten(proxies)


def _scalar_constant(ir_type: Any, value: bool | int | float) -> Any:
    from turbine_ir.dialects import arith
    from turbine_ir.ir import FloatAttr, IntegerAttr

    if "f" in str(ir_type) and not str(ir_type).startswith("i"):
        attr = FloatAttr.get(ir_type, float(value))
    else:
        attr = IntegerAttr.get(ir_type, int(value))
    return arith.ConstantOp(ir_type, attr).result


def _bind_call_args(proc: ExportProcDef, args: tuple, kwargs: dict) -> tuple[list, dict]:
    sig = inspect.signature(proc.callable)
    try:
        bound = sig.bind(None, *args, **kwargs)
    except TypeError as e:
        raise CompiledModuleError(f"call of procedure {proc.export_name!r}: {e}") from None
    bound.apply_defaults()
    names = list(sig.parameters)[1:]
    pos: list[Any] = []
    kw: dict[str, Any] = {}
    for n in names:
        p = sig.parameters[n]
        if p.kind == inspect.Parameter.KEYWORD_ONLY:
            kw[n] = bound.arguments[n]
        else:
            pos.append(bound.arguments[n])
    for v in [*pos, *kw.values()]:
        if is_abstract(v):
            raise CompiledModuleError(
                f"call of procedure {proc.export_name!r}: every argument must be given a traced "
                "value (defaults are abstract types, not values)"
            )
    return pos, kw
