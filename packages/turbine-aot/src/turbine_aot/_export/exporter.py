"""``export()``: from an ``nn.Module`` / ``ExportedProgram`` / ``FxPrograms`` / ``CompiledModule``
to an imported MLIR module in a compiler session, with each function's call signature recorded,
as an :class:`~.output.ExportOutput`."""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from typing import Any

from .._compiled_module.module import (
    CompiledModule,
    CompiledModuleMeta,
    ExportedProgramDef,
)
from .._compiler.session import new_session, session_context
from .._signatures.recording import eager_defaults, record_module_signatures
from .diagnosis import torch_export_error
from .output import ExportOutput

__all__ = ["ExportOutput", "export"]

_log = logging.getLogger("turbine.aot")


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
    the module so that the compiled module is called like the eager one (see ``turbine_aot._signatures``).

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
