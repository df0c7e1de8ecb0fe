"""``export()`` and ``ExportOutput``: from an ``nn.Module`` / ``ExportedProgram`` / ``FxPrograms`` /
``CompiledModule`` to an imported MLIR module in a compiler session, and on to a ``.vmfb``."""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from iree.compiler.api import Output, Session

from ._compiled_module.module import (
    CompiledModule,
    CompiledModuleMeta,
    ExportedProgramDef,
    ImportPhase,
)
from ._compiled_module.module_io import save_module, verify_module
from ._compiler.fallback import compile_with_fallback
from ._compiler.flags import as_list as _as_list
from ._compiler.flags import compile_flags_for
from ._compiler.invoke import compile_module
from ._compiler.refusals import check_program_for_target
from ._compiler.session import (
    new_session,
    session_context,
    session_flags,
)
from ._compiler.traits import program_traits
from ._errors import CompileError
from ._export_errors import torch_export_error
from ._signatures.recording import compile_record, eager_defaults, record_module_signatures
from .runtime import load_module

__all__ = ["ExportOutput", "export"]

_log = logging.getLogger("turbine.aot")


class ExportOutput:
    """Wrapper around a CompiledModule produced by :func:`turbine_aot.export`.

    Gives access to the imported MLIR (``mlir_module``, ``print_readable``, ``save_mlir``), moves
    it through the import phases (``import_to``) and compiles it to an IREE VM module
    (``compile``).

    Args:
        session: the ``iree.compiler.api.Session`` whose context holds the module. Flags set on it
            (``session.set_flags(...)``) are honoured by :meth:`compile`.
        compiled_module: the imported :class:`CompiledModule` instance.
        importer_uses_session: kept for API compatibility with the reference.
    """

    def __init__(
        self,
        session: Session,
        compiled_module: CompiledModule,
        *,
        importer_uses_session: bool = False,
    ):
        self.session = session
        self.compiled_module = compiled_module
        self.importer_uses_session = importer_uses_session
        #: The flags the last compile() used (None before one): without the speed-only defaults
        #: when compiling with them failed (_compiler.fallback.compile_with_fallback).
        self._last_compile_flags: list[str] | None = None

    # ---- the IR ---------------------------------------------------------------------------
    @property
    def mlir_module(self) -> Any:
        """Gets the MLIR module (an ``Operation``) resulting from the last import phase."""
        return CompiledModule.get_mlir_module(self.compiled_module)

    def verify(self) -> None:
        """Runs the verifier on the module, raising :class:`ExportError` on failure."""
        verify_module(self.mlir_module, what="the exported module")

    def print_readable(self, large_elements_limit: int = 50) -> None:
        """Prints a human readable version of the current IR (large constants elided)."""
        # Elide both dense constants with more elements and resource blobs (weights) with more
        # bytes than the limit.
        print(
            self.mlir_module.get_asm(
                large_elements_limit=large_elements_limit,
                large_resource_limit=large_elements_limit,
            )
        )

    def save_mlir(self, file_path: str | Path) -> None:
        """Saves the current IR to ``file_path`` (bytecode for ``.mlirbc``, else text), atomically."""
        save_module(self.mlir_module, file_path)

    def import_to(self, import_to: ImportPhase | str) -> None:
        """Moves the module to an import phase (``torch``, ``import``/``custom_op_expansion``,
        ``iree_internal``/``full``). A no-op if already there."""
        CompiledModule.run_import(self.compiled_module, import_to)

    # ---- compilation ---------------------------------------------------------------------------
    def compile(
        self,
        save_to: str | Path | Output | None = None,
        *,
        target_backends: str | Sequence[str] | None = ("llvm-cpu",),
        target_device: str | Sequence[str] | None = None,
        extra_args: Sequence[str] = (),
        host_cpu: bool = True,
    ) -> Output | None:
        """Compiles the exported program to an IREE VM module (``.vmfb``).

        Compilation runs in-process in a fresh compiler session (flags set on :attr:`session`
        are carried over), so the exported IR is left unchanged and can be compiled again for
        another target.

        Args:
            save_to: ``None`` to compile to memory and return the compiler ``Output`` (read it
                with ``output.map_memory()``); a path to write the ``.vmfb`` atomically; or an
                ``Output`` to write into.
            target_backends: a comma separated string or sequence of IREE backends (the legacy
                way to pick a target). ``None`` specifies no target: then set one with
                ``export_output.session.set_flags("--iree-hal-target-device=...")`` or
                ``extra_args``.
            target_device: one target device name (``"llvm-cpu"``, ``"vmvx"``, ``"vulkan"``,
                ``"cuda"``, ``"rocm"``, ...) or several for a multi-device program (arguments
                placed with ``DeviceAffinity(i)`` go to the i-th). Overrides ``target_backends``.
            extra_args: more ``iree-compile`` flags; each replaces a default of the same name
                (e.g. ``"--iree-llvmcpu-target-cpu=generic"``).
            host_cpu: for CPU targets, tune for this machine's CPU (default). ``False`` builds a
                portable module.

        Returns:
            The compiler ``Output`` when ``save_to`` is ``None``; otherwise ``None``.

        Raises:
            ExportError: the module does not verify (nothing was compiled).
            CompileError: IREE failed; ``.diagnostics`` holds its messages.
            TargetError: the target cannot compile this program correctly (fp16 on IREE's
                default Vulkan target: name one with ``--iree-vulkan-target=...``).
        """
        user_flags = [*self._session_flags(), *extra_args]
        flags = compile_flags_for(
            target_backends=target_backends,
            target_device=target_device,
            host_cpu=host_cpu,
            extra_args=user_flags,
            traits=program_traits(self.mlir_module),
        )
        check_program_for_target(self.mlir_module, flags)
        # Invalid IR would otherwise surface as an obscure bytecode error in the compiler.
        info = CompiledModule.get_info(self.compiled_module)
        if info.current_import_phase is None:  # an instance created with import_to=None
            CompiledModule.run_import(self.compiled_module, ImportPhase.IMPORT)
        self.verify()
        phase = info.current_import_phase
        compile_from = "input" if phase is not None and phase >= ImportPhase.FULL else None
        # A default that is only a speed-up must not cost a compile: on failure, once more
        # without the speed-only defaults (a warning names them).
        result, used = compile_with_fallback(
            lambda f: self._compile(f, save_to, compile_from, target_device, target_backends),
            flags,
            user_flags,
            errors=(CompileError,),
            logger=_log,
        )
        self._last_compile_flags = used
        return result

    def _compile(
        self,
        flags: list[str],
        save_to: str | Path | Output | None,
        compile_from: str | None,
        target_device: str | Sequence[str] | None,
        target_backends: str | Sequence[str] | None,
    ) -> Output | None:
        named = " ".join(_as_list(target_device) or _as_list(target_backends)) or "session flags"
        # The .vmfb records its flags and compiler version (turbine-aot inspect shows them); the
        # exported IR stays target-neutral: target fixes go to a copy (compile_module).
        with compile_record(self.mlir_module, flags):
            return compile_module(
                self.mlir_module,
                flags,
                save_to,
                compile_from=compile_from,
                stage=f"compile ({named})",
            )

    def load(
        self,
        *,
        device: str | Sequence[str] = "local-task",
        parameters: Any = None,
        compile_flags: Sequence[str] | None = None,
        cache: Any = True,
        runtime_flags: Sequence[str] = (),
    ) -> Any:
        """Compiles for ``device`` (through the compile cache), loads and returns the module.

        The one-call path from export to Python callables taking and returning torch tensors
        (see ``turbine_aot.runtime.load_module`` for the arguments).

        Example::

            compiled = turbine_aot.export(model, args=(x,)).load()
            y = compiled.main(x)
        """
        return load_module(
            self,
            device=device,
            parameters=parameters,
            compile_flags=compile_flags,
            cache=cache,
            runtime_flags=runtime_flags,
        )

    def _session_flags(self) -> list[str]:
        # Replayed as set (list options such as --iree-hal-target-device keep one flag per value).
        return [f for f in session_flags(self.session) if not f.startswith("--iree-input-type=")]


# ---------------------------------------------------------------------------------------------
# export()
# ---------------------------------------------------------------------------------------------
_ACCEPTED = (
    "an nn.Module (with args=/kwargs=/dynamic_shapes=), a CompiledModule subclass, a "
    "torch.export.ExportedProgram, or FxPrograms"
)


def export(
    mdl: Any,
    *example_args: Any,
    args: tuple[Any, ...] | list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    dynamic_shapes: dict[str, Any] | tuple[Any, ...] | list[Any] | None = None,
    module_name: str | None = None,
    function_name: str | None = None,
    strict_export: bool = True,
    import_symbolic_shape_expressions: bool = False,
    arg_device: dict[int, Any] | None = None,
) -> ExportOutput:
    """Generic export of supported entities.

    Behaves according to the type of ``mdl``:

    * ``nn.Module``: traced with ``torch.export.export(mdl, args, kwargs,
      dynamic_shapes=dynamic_shapes, strict=strict_export)``, then imported like an
      ``ExportedProgram``.
    * ``torch.export.ExportedProgram``: imported as the single entry point ``function_name``
      (default ``main``) of ``module @<module_name>`` (default ``module``). The current AOT
      decompositions are applied; parameters and buffers become globals named
      ``__auto.<state_dict name>`` (external when they carry an ``ExternalTensorTrait``).
    * ``FxPrograms``: every program becomes a function named after it; shared state is shared.
    * ``CompiledModule`` subclass: instantiated and imported. No other argument is allowed.

    Args:
        mdl: what to export.
        *example_args: example tensors (deprecated: use ``args=``).
        args: example positional arguments for ``torch.export``.
        kwargs: example keyword arguments.
        dynamic_shapes: dynamic shape specs for ``torch.export`` (``torch.export.Dim``).
        module_name: the module's symbol name (default ``"module"``).
        function_name: the entry point's name (default ``"main"``).
        strict_export: ``torch.export``'s ``strict`` mode.
        import_symbolic_shape_expressions: import the symbolic shape relations as
            ``torch.symbolic_int``/``torch.bind_symbolic_shape`` ops.
        arg_device: device affinities for the flattened arguments, by index
            (``{0: DeviceAffinity(0)}``).

    Returns:
        An :class:`ExportOutput` wrapping the imported module and its compiler session.

    Raises:
        TypeError: ``mdl`` is none of the accepted kinds.
        ValueError: inconsistent arguments (example tensors both positionally and as ``args``,
            extra arguments with a ``CompiledModule``).
        ExportError: ``torch.export`` failed (the message says what to try).
    """
    import torch

    if example_args:
        if args is not None:
            raise ValueError(
                "export(): example arguments were given both positionally and as args=; pass "
                "them only as args=(...)"
            )
        warnings.warn(
            "export(): passing example tensors positionally is deprecated; use args=(...)",
            DeprecationWarning,
            stacklevel=2,
        )
        args = tuple(example_args)

    if isinstance(mdl, CompiledModuleMeta):
        extras = {
            "args": args,
            "kwargs": kwargs,
            "dynamic_shapes": dynamic_shapes,
            "function_name": function_name,
            "arg_device": arg_device,
        }
        return _export_compiled_module(mdl, module_name, extras)
    if isinstance(mdl, CompiledModule):
        raise TypeError(
            f"export() takes a CompiledModule subclass, not an instance ({type(mdl).__name__}()); "
            "pass the class, or wrap an instance's IR with ExportOutput(session, instance)"
        )
    programs, fx_devices = _programs_of(
        mdl, args, kwargs, dynamic_shapes, function_name, strict_export
    )

    # FxProgramsBuilder.export_program(arg_device=...) records placements per program.
    program_devices: dict[str, Any] = dict(getattr(mdl, "arg_devices", None) or {})
    dct: dict[str, Any] = {}
    for i, (name, program) in enumerate(programs.items()):
        device = arg_device
        if device is None:
            device = fx_devices.get(name) if fx_devices.get(name) else program_devices.get(name)
        dct[f"_program_{i}"] = ExportedProgramDef(
            program,
            name,
            arg_device=device,
            import_symbolic_shape_expressions=import_symbolic_shape_expressions,
        )
    cm_class = CompiledModule.create_from_dict(
        "ExportedModule", dct, export_name=module_name or "module"
    )
    return _with_signatures(
        _instantiate(cm_class), mdl if isinstance(mdl, torch.nn.Module) else None
    )


def _export_compiled_module(
    cm: Any, module_name: str | None, extras: dict[str, Any]
) -> ExportOutput:
    """``export()`` of a ``CompiledModule`` class: no other argument but ``module_name``."""
    given = [k for k, v in extras.items() if v is not None]
    if given:
        raise ValueError(
            f"export() of the CompiledModule {cm.__name__}: arguments {given} are not "
            "allowed (a CompiledModule declares its own procedures and signatures)"
        )
    cm_class = cm
    if module_name is not None:
        cm_class = CompiledModuleMeta(cm.__name__, (cm,), {}, export_name=module_name)
    return _with_signatures(_instantiate(cm_class))


def _programs_of(
    mdl: Any,
    args: Any,
    kwargs: dict[str, Any] | None,
    dynamic_shapes: Any,
    function_name: str | None,
    strict_export: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ExportedPrograms to import by function name, and the device placements FxPrograms
    wrappers carry, for each kind of export source: an ``nn.Module`` (traced here), an
    ``ExportedProgram`` or ``FxPrograms`` (already exported)."""
    import torch

    fx_programs_type = _fx_programs_type()
    if isinstance(mdl, torch.nn.Module):
        from turbine_fx import check_quantized_module

        check_quantized_module(mdl)  # torchao layouts IREE cannot run: refused before tracing
        start = time.perf_counter()
        program = _torch_export(mdl, args, kwargs, dynamic_shapes, strict_export)
        _log.info("torch.export of %s: %.2f s", type(mdl).__name__, time.perf_counter() - start)
        return {function_name or "main": program}, {}
    if isinstance(mdl, torch.export.ExportedProgram):
        if args is not None or kwargs is not None or dynamic_shapes is not None:
            raise ValueError(
                "export() of an ExportedProgram: args/kwargs/dynamic_shapes are already fixed by "
                "the program; do not pass them"
            )
        return {function_name or "main": mdl}, {}
    if fx_programs_type is not None and isinstance(mdl, fx_programs_type):
        if args is not None or kwargs is not None or dynamic_shapes is not None:
            raise ValueError(
                "export() of FxPrograms: the programs are already exported; args/kwargs/"
                "dynamic_shapes are not allowed"
            )
        if function_name is not None:
            raise ValueError(
                "export() of FxPrograms: function_name is not allowed (each program keeps its name)"
            )
        from turbine_fx import program_and_arg_device

        # Values are FxProgram wrappers (.target, .arg_device); a bare ExportedProgram a user
        # stored in the dict works too.
        programs: dict[str, Any] = {}
        fx_devices: dict[str, Any] = {}
        for name, value in getattr(mdl, "programs", {}).items():
            programs[name], fx_devices[name] = program_and_arg_device(value)
        return programs, fx_devices
    raise TypeError(
        f"export() accepts {_ACCEPTED}; got {type(mdl).__module__}.{type(mdl).__qualname__}"
    )


def _with_signatures(eo: ExportOutput, eager: Any = None) -> ExportOutput:
    """Records each function's call signature (argument/result trees, names, tensor specs) in
    the module so that the compiled module is called like the eager one (see _signatures.py).

    Never fails the export: a signature that cannot be recorded is logged and left out (that
    function then takes flat arguments)."""
    import inspect

    try:
        class_info = CompiledModule.get_info(eo.compiled_module).class_info
        programs = {d.export_name: d.program for _, d in class_info.exported_programs}
        names: dict[str, list[str]] = {}
        for _, proc in class_info.export_procs:
            with contextlib.suppress(TypeError, ValueError):
                names[proc.export_name] = list(inspect.signature(proc.callable).parameters)[1:]
        defaults = {f: eager_defaults(eager, p) for f, p in programs.items()} if eager else {}
        record_module_signatures(eo.mlir_module, programs, arg_names=names, defaults=defaults)
    except Exception as e:  # a record is a convenience: never fail an export for it
        _log.warning(
            "call signatures not recorded (%s: %s); calls take flat arguments",
            type(e).__name__,
            e,
        )
    return eo


def _instantiate(cm_class: Any) -> ExportOutput:
    start = time.perf_counter()
    session = new_session()
    inst = cm_class(context=session_context(session), import_to=None)
    CompiledModule.get_info(inst).session = session
    CompiledModule.run_import(inst, "import")
    _log.info("imported %s in %.2f s", cm_class.__name__, time.perf_counter() - start)
    return ExportOutput(session, inst, importer_uses_session=True)


def _fx_programs_type() -> type | None:
    try:
        from turbine_fx import FxPrograms
    except ImportError:  # turbine_fx without FxPrograms
        return None
    return FxPrograms


def _torch_export(
    mdl: Any,
    args: Any,
    kwargs: dict[str, Any] | None,
    dynamic_shapes: Any,
    strict: bool,
) -> Any:
    import torch

    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    try:
        return torch.export.export(
            mdl, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=strict
        )
    except Exception as e:
        raise torch_export_error(mdl, e, strict=strict) from e
