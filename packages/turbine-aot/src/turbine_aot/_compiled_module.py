"""``CompiledModule``: class-based programs assembled into one MLIR module.

A subclass body declares *exports*: procedures (methods whose parameters default to abstract
types, traced with ``turbine_trace.ProcedureTrace``), globals (``export_global``,
``export_global_tree``, ``export_parameters``, ``export_buffers``), and imported
``torch.export.ExportedProgram``\\ s. Instantiating the class builds the module and brings it to
an import phase.

Lifetimes, split as in torch-mlir's importer: the *class info* (exports collected by the
metaclass, shared by every instance), the *instance info* (one module builder, the tracked
globals, the current import phase) and the per-procedure traces.
"""

from __future__ import annotations

import enum
import inspect
import io
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turbine_params import atomic_output_file

from ._errors import CompiledModuleError, CompileError, Diagnostic, ExportError
from ._program_calls import exported_program_call, unwrap_program

__all__ = [
    "CompiledModule",
    "CompiledModuleClassInfo",
    "CompiledModuleInstanceInfo",
    "CompiledModuleMeta",
    "ExportProcDef",
    "ExportedProgramDef",
    "ImportPhase",
    "save_module",
    "verify_module",
]


# ---------------------------------------------------------------------------------------------
# Import phases
# ---------------------------------------------------------------------------------------------
class ImportPhase(enum.IntEnum):
    """How far a module has been imported (the reference's members and aliases).

    ``TORCH_IR`` (alias ``TORCH``): the raw torch-dialect IR from tracing/FX import.
    ``CUSTOM_OP_EXPANSION`` (alias ``IMPORT``): custom ops expanded; what IREE ingests.
    ``IREE_INTERNAL`` (alias ``FULL``): after IREE's input pipeline (``--compile-to=input``).
    """

    TORCH_IR = 0
    CUSTOM_OP_EXPANSION = 1
    IREE_INTERNAL = 2
    TORCH = TORCH_IR
    IMPORT = CUSTOM_OP_EXPANSION
    FULL = IREE_INTERNAL

    @staticmethod
    def parse(spec: ImportPhase | str | None) -> ImportPhase:
        """``ImportPhase`` from an enum member or a mnemonic (case-insensitive); ``None`` is
        ``IMPORT``, the default phase."""
        if spec is None:
            return ImportPhase.IMPORT
        if isinstance(spec, ImportPhase):
            return spec
        if isinstance(spec, str):
            key = spec.strip().upper().replace("-", "_")
            if key in ImportPhase.__members__:
                return ImportPhase[key]
        valid = ", ".join(repr(n.lower()) for n in ImportPhase.__members__)
        raise ValueError(f"unknown import phase {spec!r}; choose one of: {valid}")


# ---------------------------------------------------------------------------------------------
# Export descriptors
# ---------------------------------------------------------------------------------------------
@dataclass
class ExportProcDef:
    """A procedure export: a Python function traced into a public ``func.func``.

    Attributes:
        export_name: the function's symbol name in the module.
        callable: the Python function (``self`` first).
        signature: the abstract positional arguments (after ``self``).
        kw_signature: the abstract keyword-only arguments.
        arg_device: device affinities of the flattened arguments (``signature_info``).
    """

    export_name: str
    callable: Callable
    signature: list[Any]
    kw_signature: dict[str, Any]
    arg_device: dict[int, Any] | None = None
    file_line_loc: tuple[str, int] | None = None

    def copy(self) -> ExportProcDef:
        return ExportProcDef(
            self.export_name,
            self.callable,
            list(self.signature),
            dict(self.kw_signature),
            self.arg_device,
            self.file_line_loc,
        )


@dataclass
class ExportedProgramDef:
    """An ``ExportedProgram`` imported as a public function named ``export_name``."""

    program: Any
    export_name: str
    public: bool = True
    arg_device: dict[int, Any] | None = None
    import_symbolic_shape_expressions: bool = False


@dataclass
class ExportedGlobalsDef:
    """A ``GlobalsDef`` attribute (``export_global``, ``export_parameters``, ...)."""

    attr_name: str
    globals_def: Any


@dataclass
class CompiledModuleClassInfo:
    """Per-class information collected by :class:`CompiledModuleMeta`.

    Attributes:
        export_name: the module's symbol name (``module @<export_name>``).
        options: ``ModuleBuilderOptions`` for the builder, or ``None``.
        all_exports: exports by attribute name, in declaration order (inherited first).
    """

    export_name: str
    options: Any = None
    all_exports: dict[str, Any] = field(default_factory=dict)

    @property
    def export_procs(self) -> list[tuple[str, ExportProcDef]]:
        return [(k, v) for k, v in self.all_exports.items() if isinstance(v, ExportProcDef)]

    @property
    def export_globals(self) -> list[tuple[str, ExportedGlobalsDef]]:
        return [(k, v) for k, v in self.all_exports.items() if isinstance(v, ExportedGlobalsDef)]

    @property
    def exported_programs(self) -> list[tuple[str, ExportedProgramDef]]:
        return [(k, v) for k, v in self.all_exports.items() if isinstance(v, ExportedProgramDef)]


@dataclass
class CompiledModuleInstanceInfo:
    """Per-instance state: the module under construction and how far it was imported."""

    class_info: CompiledModuleClassInfo
    module_builder: Any
    session: Any = None
    current_import_phase: ImportPhase | None = None
    shadow_dict: dict[str, Any] = field(default_factory=dict)
    proc_funcs: dict[str, Any] = field(default_factory=dict)
    proc_returns: dict[str, Any] = field(default_factory=dict)
    program_funcs: dict[str, Any] = field(default_factory=dict)
    tracing: set[str] = field(default_factory=set)
    owned_module: Any = None

    @property
    def module_op(self) -> Any:
        return self.module_builder.module_op


_class_infos: weakref.WeakKeyDictionary[type, CompiledModuleClassInfo] = weakref.WeakKeyDictionary()
_instance_infos: weakref.WeakKeyDictionary[Any, CompiledModuleInstanceInfo] = (
    weakref.WeakKeyDictionary()
)


def _default_export_name(class_name: str) -> str:
    """``BasicModule`` -> ``basic``; ``MyHTTPModel`` -> ``my_http_model`` (DESIGN.md)."""
    name = class_name[: -len("Module")] if class_name.endswith("Module") else class_name
    if not name:
        return "module"
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return name.lower()


def _is_abstract(value: Any) -> bool:
    from turbine_trace import AbstractTypedef, tree_flatten

    try:
        leaves, _ = tree_flatten(value)
    except Exception:
        return False
    return all(isinstance(leaf, AbstractTypedef) for leaf in leaves)


def _proc_def_from_function(name: str, f: Callable, cls_name: str) -> ExportProcDef:
    sig = inspect.signature(f)
    params = list(sig.parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise CompiledModuleError(
            f"{cls_name}.{name}: a procedure must take `self` as its first parameter"
        )
    posargs: list[Any] = []
    kwargs: dict[str, Any] = {}
    for p in params[1:]:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise CompiledModuleError(
                f"{cls_name}.{name}: *args/**kwargs are not supported in procedures; give each "
                "argument a default that is an abstract type, e.g. `x=AbstractTensor(None, 4)`"
            )
        if p.default is inspect.Parameter.empty or not _is_abstract(p.default):
            raise CompiledModuleError(
                f"{cls_name}.{name}: argument {p.name!r} needs a default that is an abstract "
                f"type or a tuple/list/dict of them (AbstractTensor, AbstractI64, ...); got "
                f"{'no default' if p.default is inspect.Parameter.empty else repr(p.default)}"
            )
        if p.kind == inspect.Parameter.KEYWORD_ONLY:
            kwargs[p.name] = p.default
        else:
            posargs.append(p.default)
    info = getattr(f, "__turbine_signature_info__", {})
    loc = None
    try:
        code = f.__code__
        loc = (code.co_filename, code.co_firstlineno)
    except AttributeError:
        pass
    return ExportProcDef(name, f, posargs, kwargs, info.get("arg_device"), loc)


# ---------------------------------------------------------------------------------------------
# Metaclass
# ---------------------------------------------------------------------------------------------
class CompiledModuleMeta(type):
    """Collects a ``CompiledModule`` subclass's exports into its class info."""

    def __new__(
        mcls,
        name: str,
        bases: tuple[type, ...],
        dct: dict[str, Any],
        *,
        export_name: str | None = None,
        options: Any = None,
    ):
        is_root = not any(isinstance(b, CompiledModuleMeta) for b in bases)
        if is_root:
            return super().__new__(mcls, name, bases, dct)

        from turbine_trace import GlobalsDef

        info = CompiledModuleClassInfo(export_name or _default_export_name(name), options)
        # Inherited exports first (most basic class first), so subclasses override by name.
        for base in reversed(bases):
            for klass in reversed(base.__mro__):
                base_info = _class_infos.get(klass)
                if base_info is None:
                    continue
                for k, v in base_info.all_exports.items():
                    info.all_exports[k] = v.copy() if isinstance(v, ExportProcDef) else v
                if options is None and base_info.options is not None:
                    info.options = base_info.options
        new_dct: dict[str, Any] = {}
        for key, value in dct.items():
            if key.startswith("__") and key.endswith("__"):
                new_dct[key] = value
                continue
            export = _classify_member(key, value, name, GlobalsDef)
            if export is None:
                new_dct[key] = value
                info.all_exports.pop(key, None)
            else:
                info.all_exports[key] = export
        cls = super().__new__(mcls, name, bases, new_dct)
        _class_infos[cls] = info
        return cls

    def __init__(cls, name, bases, dct, **kwargs):
        super().__init__(name, bases, dct)


def _classify_member(key: str, value: Any, cls_name: str, globals_def_type: type) -> Any:
    """The export a class member stands for, or ``None`` for a plain attribute."""
    if isinstance(value, ExportedProgramDef):
        return value
    program = unwrap_program(value)
    if program is not None:
        # A leading underscore makes the function private: callable from procedures only.
        return ExportedProgramDef(
            program,
            key,
            public=not key.startswith("_"),
            arg_device=getattr(value, "arg_device", None) if program is not value else None,
        )
    if key.startswith("_"):
        return None
    if isinstance(value, globals_def_type):
        return ExportedGlobalsDef(key, value)
    if isinstance(value, (staticmethod, classmethod, property)):
        return None
    if inspect.isfunction(value):
        return _proc_def_from_function(key, value, cls_name)
    return None


class _JittableAttribute:
    """``CompiledModule.jittable``: ``turbine_fx.jittable``, imported on first access."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        from turbine_fx import jittable

        return jittable


# ---------------------------------------------------------------------------------------------
# CompiledModule
# ---------------------------------------------------------------------------------------------
class CompiledModule(metaclass=CompiledModuleMeta):
    """Base class for all staged modules.

    Example::

        class Adder(CompiledModule):
            state = export_global(torch.zeros(4), mutable=True)

            def add(self, x=AbstractTensor(4)):
                self.state = self.state + x  # traced to util.global.store
                return self.state

        inst = Adder(import_to="import")
        print(CompiledModule.get_mlir_module(inst))   # module @adder { ... }

    Args:
        context: an MLIR context to build in (default: a new compiler session's context).
        module_op: an existing ``builtin.module`` to add to (default: a new one).
        import_to: how far to take the module after tracing: ``"torch"``, ``"import"``
            (default; also what ``None`` means) or ``"full"``. Constructing always traces every
            export (globals, exported programs, procedures) into the module; the phase only
            decides which later steps (custom-op expansion, IREE's input pipeline) run now.

    ``CompiledModule.jittable`` is :class:`turbine_fx.jittable` (as in the reference): a torch
    function decorated with it in the class body is callable as ``self.name(...)`` inside
    procedures.
    """

    jittable: Any = _JittableAttribute()

    def __init__(
        self,
        *,
        context: Any = None,
        module_op: Any = None,
        import_to: ImportPhase | str | None = "import",
    ):
        from turbine_ir import ModuleBuilder
        from turbine_ir.ir import Location, Module, StringAttr

        class_info = CompiledModule.get_class_info(type(self))
        session = None
        module = None
        if module_op is None:
            if context is None:
                from ._iree_session import new_session, session_context

                session = new_session()
                context = session_context(session)
            with context, Location.unknown():
                module = Module.create()
                module_op = module.operation
                module_op.attributes["sym_name"] = StringAttr.get(class_info.export_name)
        builder = ModuleBuilder(module_op, options=class_info.options)
        info = CompiledModuleInstanceInfo(class_info, builder, session=session)
        info.owned_module = module  # keeps a Module we created alive with the instance
        target = ImportPhase.parse(import_to)
        _instance_infos[self] = info
        _import_exports(self, info)
        info.current_import_phase = ImportPhase.TORCH_IR
        CompiledModule.run_import(self, target)

    def __getattr__(self, name: str) -> Any:
        info = _instance_infos.get(self)
        if info is not None and name in info.class_info.all_exports:
            raise CompiledModuleError(
                f"{type(self).__name__}.{name} is an export of the compiled module; it cannot be "
                "called from Python. Compile the module (turbine_aot.export(...).compile()) and "
                "call the compiled function instead"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ---- class-level API -------------------------------------------------------------------
    @classmethod
    def create_from_dict(
        cls,
        name: str,
        dct: dict,
        *,
        export_name: str | None = None,
        options: Any = None,
    ) -> CompiledModuleMeta:
        """Creates a CompiledModule subclass with an explicit dictionary of members.

        The unsugared form of ``class Foo(CompiledModule, export_name="bar"): ...``.
        """
        return CompiledModuleMeta(name, (cls,), dict(dct), export_name=export_name, options=options)

    @staticmethod
    def get_class_info(cls: CompiledModuleMeta) -> CompiledModuleClassInfo:
        """The exports and naming collected for a CompiledModule subclass."""
        try:
            return _class_infos[cls]
        except (KeyError, TypeError):
            raise CompiledModuleError(
                f"{cls!r} is not a CompiledModule subclass (the base class itself has no exports)"
            ) from None

    @staticmethod
    def get_info(inst: CompiledModule) -> CompiledModuleInstanceInfo:
        """The per-instance state (module builder, current import phase, ...)."""
        try:
            return _instance_infos[inst]
        except (KeyError, TypeError):
            raise CompiledModuleError(f"{inst!r} is not a CompiledModule instance") from None

    @staticmethod
    def get_mlir_module(inst: CompiledModule) -> Any:
        """The ``builtin.module`` operation of an instance."""
        return CompiledModule.get_info(inst).module_op

    @staticmethod
    def get_module_builder(inst: CompiledModule) -> Any:
        """The ``turbine_ir.ModuleBuilder`` of an instance."""
        return CompiledModule.get_info(inst).module_builder

    @staticmethod
    def signature_info(*, arg_device: dict[int, Any] | None = None) -> Callable:
        """Annotates a procedure with extra signature information.

        Args:
            arg_device: device affinity (``DeviceAffinity``) per flattened argument index.
        """

        def decorator(f: Callable) -> Callable:
            f.__turbine_signature_info__ = {"arg_device": arg_device}  # type: ignore[attr-defined]
            return f

        return decorator

    # ---- import ------------------------------------------------------------------------------
    @staticmethod
    def run_import(inst: CompiledModule, import_to: ImportPhase | str | None = "import") -> None:
        """Brings the module to ``import_to`` (``None`` means ``"import"``; a no-op for a phase
        already reached).

        Raises:
            CompileError: IREE's input pipeline failed (``full``); carries the diagnostics.
        """
        target = ImportPhase.parse(import_to)
        info = CompiledModule.get_info(inst)
        if info.current_import_phase is None:
            _import_exports(inst, info)
            info.current_import_phase = ImportPhase.TORCH_IR
        if info.current_import_phase < ImportPhase.IMPORT <= target:
            CompiledModule.expand_custom_ops(inst)
            info.current_import_phase = ImportPhase.IMPORT
        if info.current_import_phase < ImportPhase.FULL <= target:
            _run_iree_input_pipeline(info)
            info.current_import_phase = ImportPhase.FULL

    @staticmethod
    def expand_custom_ops(inst: CompiledModule) -> None:
        """Replaces ``torch.operator`` ops of registered custom ops by their expansions."""
        from ._custom_ops import expand_custom_ops_in_module

        info = CompiledModule.get_info(inst)
        expand_custom_ops_in_module(info.module_builder)

    @staticmethod
    def run_pass_pipeline(
        inst: CompiledModule, pipeline: str, enable_ir_printing: bool = False
    ) -> None:
        """Runs an arbitrary pass pipeline against the current IR.

        Args:
            pipeline: the textual pipeline, as ``PassManager.parse`` takes it
                (e.g. ``"builtin.module(canonicalize)"``).
            enable_ir_printing: print the IR after every pass to stderr.

        Raises:
            CompileError: the pipeline did not parse or a pass failed (with diagnostics).
        """
        from turbine_ir.ir import MLIRError
        from turbine_ir.passmanager import PassManager

        module_op = CompiledModule.get_mlir_module(inst)
        with module_op.context:
            try:
                pm = PassManager.parse(pipeline)
            except (ValueError, MLIRError) as e:
                raise CompileError(
                    f"parsing pass pipeline {pipeline!r}",
                    [Diagnostic("error", str(e))],
                    hint="The pipeline needs its anchor, e.g. 'builtin.module(canonicalize)'.",
                ) from None
            if enable_ir_printing:
                pm.enable_ir_printing()
            try:
                pm.run(module_op)
            except MLIRError as e:
                diags = [Diagnostic("error", str(d)) for d in e.error_diagnostics] or [
                    Diagnostic("error", str(e))
                ]
                raise CompileError(f"pass pipeline {pipeline!r}", diags) from None

    @staticmethod
    def save_mlir(inst: CompiledModule, path: Path | str) -> None:
        """Saves the module's IR to ``path`` (bytecode for ``.mlirbc``, else text), atomically."""
        save_module(CompiledModule.get_mlir_module(inst), path)


# ---------------------------------------------------------------------------------------------
# Import machinery
# ---------------------------------------------------------------------------------------------
def _import_exports(inst: CompiledModule, info: CompiledModuleInstanceInfo) -> None:
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


def _ensure_proc(inst: CompiledModule, info: CompiledModuleInstanceInfo, key: str) -> Any:
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

    def __init__(self, inst: CompiledModule, info: CompiledModuleInstanceInfo):
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

        def __init__(self, inst: CompiledModule, info: CompiledModuleInstanceInfo, key: str):
            self.inst = inst
            self.info = info
            self.key = key

        def __repr__(self) -> str:
            return f"<procedure {self.key}>"

        def resolve_call(self, proc_trace: Any, *args: Any, **kwargs: Any) -> Any:
            return _emit_proc_call(self, proc_trace, args, kwargs)

    return _ProcCallImpl


_proc_call_type: type | None = None


def _ProcCall(inst: CompiledModule, info: CompiledModuleInstanceInfo, key: str) -> Any:
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
    proxies = []
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
        if _is_abstract(v):
            raise CompiledModuleError(
                f"call of procedure {proc.export_name!r}: every argument must be given a traced "
                "value (defaults are abstract types, not values)"
            )
    return pos, kw


def _run_iree_input_pipeline(info: CompiledModuleInstanceInfo) -> None:
    """Runs IREE's input pipeline (``--compile-to=input``) on the module, in place."""
    from ._iree_session import CapturedInvocation, new_session

    module_op = info.module_op
    if info.session is not None:
        with CapturedInvocation(
            info.session, stage="import to 'full' (IREE input pipeline)"
        ) as inv:
            inv.inv.import_module(module_op)
            inv.run_pipeline(compile_to="input")
        return
    # The module lives in a context we do not own a session for: round trip through a session
    # of our own (bytecode in, text out: text parses from any buffer alignment).
    from iree.compiler.api import Output

    from turbine_ir.ir import Module

    data = io.BytesIO()
    module_op.write_bytecode(data)
    session = new_session()
    with CapturedInvocation(session, stage="import to 'full' (IREE input pipeline)") as inv:
        inv.parse_bytes(data.getvalue())
        inv.run_pipeline(compile_to="input")
        out = Output.open_membuffer()
        inv.inv.output_ir(out)
        result = bytes(out.map_memory()).decode("utf-8")
    with module_op.context:
        new_module = Module.parse(result)
        body = module_op.regions[0].blocks[0]
        for op in list(body.operations):
            op.erase()
        for op in list(new_module.body.operations):
            body.append(op)


# ---------------------------------------------------------------------------------------------
# Module helpers shared with ExportOutput
# ---------------------------------------------------------------------------------------------
def verify_module(module_op: Any, *, what: str = "the module") -> None:
    """Verifies ``module_op``; raises :class:`ExportError` with the verifier's diagnostics.

    Besides MLIR's verifiers, checks what IREE 3.13's do not: a ``flow.tensor.reshape``
    (``IREE.tensor_reshape``) between static shapes of different element counts.
    """
    from turbine_ir import reshape_element_count_errors
    from turbine_ir.ir import MLIRError

    try:
        module_op.verify()
    except MLIRError as e:
        details = "\n".join(str(d) for d in e.error_diagnostics) or str(e)
        raise ExportError(f"{what} failed verification:\n{details}") from None
    errors = reshape_element_count_errors(module_op)
    if errors:
        raise ExportError(f"{what} failed verification:\n" + "\n".join(errors))


def save_module(module_op: Any, path: str | Path) -> None:
    """Writes ``module_op`` to ``path``: MLIR bytecode for ``.mlirbc``, text otherwise."""
    path = Path(path)
    with atomic_output_file(path, parents=True) as tmp:
        if path.suffix == ".mlirbc":
            with open(tmp, "wb") as f:
                module_op.write_bytecode(f)
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                module_op.print(file=f)
