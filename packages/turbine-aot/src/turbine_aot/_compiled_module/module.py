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

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import CompiledModuleError, CompileError, Diagnostic
from .custom_ops import expand_custom_ops_in_module
from .info import (
    CompiledModuleClassInfo,
    CompiledModuleInstanceInfo,
    CompiledModuleMeta,
    ExportedProgramDef,
    ExportProcDef,
    ImportPhase,
    class_infos,
    instance_infos,
)
from .input_pipeline import run_iree_input_pipeline
from .module_io import save_module, verify_module
from .trace import import_exports

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
                from .._compiler.session import new_session, session_context

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
        instance_infos[self] = info
        import_exports(self, info)
        info.current_import_phase = ImportPhase.TORCH_IR
        CompiledModule.run_import(self, target)

    def __getattr__(self, name: str) -> Any:
        info = instance_infos.get(self)
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
            return class_infos[cls]
        except (KeyError, TypeError):
            raise CompiledModuleError(
                f"{cls!r} is not a CompiledModule subclass (the base class itself has no exports)"
            ) from None

    @staticmethod
    def get_info(inst: CompiledModule) -> CompiledModuleInstanceInfo:
        """The per-instance state (module builder, current import phase, ...)."""
        try:
            return instance_infos[inst]
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
            import_exports(inst, info)
            info.current_import_phase = ImportPhase.TORCH_IR
        if info.current_import_phase < ImportPhase.IMPORT <= target:
            CompiledModule.expand_custom_ops(inst)
            info.current_import_phase = ImportPhase.IMPORT
        if info.current_import_phase < ImportPhase.FULL <= target:
            run_iree_input_pipeline(info)
            info.current_import_phase = ImportPhase.FULL

    @staticmethod
    def expand_custom_ops(inst: CompiledModule) -> None:
        """Replaces ``torch.operator`` ops of registered custom ops by their expansions."""

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
