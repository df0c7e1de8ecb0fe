"""What a ``CompiledModule`` class declares: import phases, export descriptors, the class and
instance info, and the metaclass that collects a class body's exports."""

from __future__ import annotations

import enum
import inspect
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._errors import CompiledModuleError
from .program_calls import unwrap_program

__all__ = [
    "CompiledModuleClassInfo",
    "CompiledModuleInstanceInfo",
    "CompiledModuleMeta",
    "ExportProcDef",
    "ExportedGlobalsDef",
    "ExportedProgramDef",
    "ImportPhase",
    "class_infos",
    "instance_infos",
    "is_abstract",
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


class_infos: weakref.WeakKeyDictionary[type, CompiledModuleClassInfo] = weakref.WeakKeyDictionary()
instance_infos: weakref.WeakKeyDictionary[Any, CompiledModuleInstanceInfo] = (
    weakref.WeakKeyDictionary()
)


def _default_export_name(class_name: str) -> str:
    """``BasicModule`` -> ``basic``; ``MyHTTPModel`` -> ``my_http_model`` (docs/design.md,
    "Module and function names")."""
    name = class_name[: -len("Module")] if class_name.endswith("Module") else class_name
    if not name:
        return "module"
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return name.lower()


def is_abstract(value: Any) -> bool:
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
        if p.default is inspect.Parameter.empty or not is_abstract(p.default):
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
                base_info = class_infos.get(klass)
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
        class_infos[cls] = info
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
