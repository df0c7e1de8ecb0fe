"""``load_module``: a compiled module (``.vmfb`` bytes, a file, a compiler ``Output``) loaded on
one or more IREE devices with its parameter archives, as a :class:`LoadedModule`.

The runtime loads; it never compiles. An ``ExportOutput`` passed here compiles itself (through
the compile cache, on the export side) by the two methods of :class:`LoadableExport`: the runtime
knows the protocol, not the export side (``tools/check_layers.py`` keeps it so)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from turbine_aot._compiler.amx import (
    AmxUnavailableError,
    module_requires_amx,
    request_amx_permission,
)
from turbine_aot._errors import TurbineRuntimeError
from turbine_aot._signatures.abi import FlatSignature
from turbine_aot._signatures.reflection import module_functions, module_name

from .cpu_check import check_kernel_features, check_module_cpu
from .devices import (
    create_devices,
    device_lost,
    driver_of,
    forget_lost_devices,
    normalize_devices,
)
from .loaded_module import LoadedModule
from .module_check import check_module_in_child
from .parameter_memory import resolve_policy
from .parameters import parameter_modules

__all__ = ["LoadableExport", "load_module", "module_bytes_or_path"]


@runtime_checkable
class LoadableExport(Protocol):
    """What the runtime reads of an exported program (``turbine_aot.ExportOutput``): the module
    compiled for device URIs, and its functions' flat signatures."""

    def _vmfb_for_devices(
        self, devices: Sequence[str], *, compile_flags: Sequence[str] | None, cache: Any
    ) -> bytes: ...

    def _flat_signatures(self) -> Mapping[str, FlatSignature]: ...


def module_bytes_or_path(
    module: Any,
    *,
    device: Sequence[str] = ("local-task",),
    compile_flags: Sequence[str] | None = None,
    cache: Any = True,
) -> tuple[bytes | None, Path | None]:
    """Normalizes what ``load_module`` accepts to (bytes, None) or (None, path); an export is
    compiled (by itself) for ``device`` with ``compile_flags`` through ``cache``."""
    if isinstance(module, (bytes, bytearray, memoryview)):
        return bytes(module), None
    if isinstance(module, (str, os.PathLike)):
        path = Path(module)
        if not path.is_file():
            raise TurbineRuntimeError(
                f"compiled module {str(path)!r} does not exist; pass the path of a .vmfb "
                "written by ExportOutput.compile(save_to=...) or `turbine-aot compile`"
            )
        return None, path
    if hasattr(module, "map_memory"):  # iree.compiler Output
        return bytes(module.map_memory()), None
    if isinstance(module, LoadableExport):
        return module._vmfb_for_devices(device, compile_flags=compile_flags, cache=cache), None
    raise TurbineRuntimeError(
        f"cannot load a module from {type(module).__name__}; pass .vmfb bytes, a .vmfb path, "
        "an iree.compiler Output or an ExportOutput"
    )


def load_module(
    module: Any,
    *,
    device: str | Sequence[str] = "local-task",
    parameters: Any = None,
    runtime_flags: Sequence[str] = (),
    copy_results: bool = False,
    compile_flags: Sequence[str] | None = None,
    cache: Any = True,
    signatures: Mapping[str, FlatSignature] | None = None,
    zero_copy_inputs: bool = False,
    check_in_child: bool | str = False,
    verify: bool | str | None = None,
    parameter_memory: str | None = None,
) -> LoadedModule:
    """Loads a compiled module on one or more IREE devices.

    Args:
        module: ``.vmfb`` bytes, a path to a ``.vmfb`` (memory-mapped), an ``iree.compiler``
            ``Output``, or an ``ExportOutput`` (compiled here for ``device`` with turbine's
            default flags, through the compile cache).
        device: a device URI (``"local-task"``, ``"local-sync"``, ``"vulkan"``, ``"cuda"``,
            ``"hip"``, ``"cuda://0"``...) or a list of URIs for a multi-device program, in
            ``__device_0``, ``__device_1``... order.
        parameters: a path (bound to scope ``"model"``), or a mapping scope -> a path, a list
            of paths, an ``iree.runtime.ParameterIndex``, or a dict of name -> tensor.
            ``.irpa``, ``.safetensors`` and ``.gguf`` files are read by IREE (memory-mapped,
            or copied into huge-page memory: see ``parameter_memory``).
        runtime_flags: flags for ``iree.runtime.flags.parse_flags`` (process-wide).
        copy_results: give each result its own memory even where it could share the result
            buffer (local drivers share by default: IREE hands result buffers to the caller).
        compile_flags: only for an ``ExportOutput``: flags replacing turbine's defaults.
        cache: only for an ``ExportOutput``: True (default cache), False, or a
            :class:`~turbine_aot.runtime.CompileCache`.
        signatures: function signatures to use where the module has no ABI reflection
            (modules compiled from torch-dialect IR); taken from an ``ExportOutput``'s IR
            automatically.
        zero_copy_inputs: on local (CPU) drivers, pass contiguous tensor arguments by
            importing their memory instead of copying it. Only for programs that do not keep an
            argument (store it into a global) and callers that do not modify an argument while
            the module may still read it.
        check_in_child: load the module in a short-lived child process first, call each
            public function there once on zeros of its signature, and raise if that child
            dies: IREE does not check a module's contents, and a corrupted ``.vmfb`` can kill
            the process when loaded or when called (see
            :mod:`turbine_aot._runtime.module_check`, docs/security.md). ``"load"``: the child
            only loads the module. Costs one child process (about a second);
            ``LoadedModule.checked_calls`` says what the child called.
        verify: the former name of ``check_in_child`` (a ``DeprecationWarning``): "verify"
            means checking an artifact without running it everywhere else in turbine
            (``ExportOutput.verify()``, ``load_bundle(verify=True)``, docs/design.md).
        parameter_memory: where parameter archive files' bytes live: ``"auto"`` (on Linux
            with transparent huge pages, for a module on local CPU drivers, an archive of 2 MiB
            up to half the available memory is read into private memory advised for huge
            pages, which runs faster; else as ``"mmap"``), ``"mmap"`` (IREE maps the file:
            read lazily, shared through the page cache) or ``"huge-pages"`` (always the copy).
            None: ``$TURBINE_PARAMETER_MEMORY``, else ``"auto"``. See docs/running.md,
            "Parameter memory" (:mod:`turbine_aot._runtime.parameter_memory`).

    Returns:
        The loaded module.

    Raises:
        TurbineRuntimeError: missing file, unknown device, unreadable archive, unknown
            ``parameter_memory`` policy, a module the runtime rejects (built for another target
            or IREE version) or whose records are damaged, or (``check_in_child``) a module that
            crashed or hung the checking child.
    """
    import iree.runtime as rt

    if verify is not None:
        warnings.warn(
            "load_module(verify=...) is now load_module(check_in_child=...): it loads and "
            "calls the module in a child process first",
            DeprecationWarning,
            stacklevel=2,
        )
        check_in_child = check_in_child or verify
    if check_in_child not in (False, True, "load"):
        raise TurbineRuntimeError(
            f"check_in_child must be True, False or 'load'; got {check_in_child!r}"
        )
    memory_policy = resolve_policy(parameter_memory)
    uris = normalize_devices(device)
    if signatures is None and isinstance(module, LoadableExport):
        signatures = dict(module._flat_signatures())
    if runtime_flags:
        rt.flags.parse_flags(*runtime_flags)
    data, path = module_bytes_or_path(module, device=uris, compile_flags=compile_flags, cache=cache)
    where = repr(str(path)) if path is not None else "the given module bytes"
    # Before anything of it runs (the child's check included): CPU code for instructions this
    # CPU lacks would die of SIGILL (docs/running.md, "A module built for another CPU").
    drivers = [driver_of(uri) for uri in uris]
    check_module_cpu(data, path, drivers, f"module {where}" if path is not None else "the module")
    checked_calls = None
    if check_in_child:
        calls = check_in_child != "load"
        checked = check_module_in_child(
            data, path, uris, parameters, calls=calls, signatures=signatures
        )
        checked_calls = checked if calls else None
    devices = create_devices(uris)
    instance = rt.VmInstance()
    try:
        if path is not None:
            vm_module = rt.VmModule.mmap(instance, str(path))
        else:
            vm_module = rt.VmModule.copy_buffer(instance, data)
    except Exception as e:
        where = str(path) if path else "the given bytes"
        raise TurbineRuntimeError(
            f"{where} is not a loadable IREE module: {str(e).splitlines()[0]}; recompile it "
            f"with iree-compile {_iree_version()}"
        ) from e
    # Its records are read before anything of it runs (initializers): a damaged one fails here.
    name = module_name(vm_module, where)
    functions = module_functions(vm_module, where)
    reflections = [reflection for _, _, reflection in functions]
    check_kernel_features(reflections, drivers, name)
    _prepare_cpu_for(name, reflections)
    hal = (
        rt.create_hal_module(instance, devices[0])
        if len(devices) == 1
        else rt.create_hal_module(instance, devices=devices)
    )
    param_modules, keep = parameter_modules(
        instance, parameters, device_uris=uris, parameter_memory=memory_policy
    )
    try:
        context = rt.VmContext(instance, [hal, *param_modules, vm_module])
    except Exception as e:
        msg = str(e)
        if device_lost(e):
            forget_lost_devices(devices, uris)
            raise TurbineRuntimeError(
                f"could not initialize module {name!r}: the device ({', '.join(uris)}) was lost "
                f"({msg.strip().splitlines()[0]}); load it again (a new device is created)"
            ) from e
        hint = (
            "the module was compiled for another device or needs more devices; compile it "
            f"for {', '.join(uris)} or load it on the device it was built for"
        )
        cli_hint = hint
        if "parameter" in msg.lower() or "not found" in msg.lower():
            hint = "pass the parameter archives it needs: parameters={'model': 'weights.irpa'}"
            cli_hint = "pass the parameter archives it needs: -p model=weights.irpa"
        what = (
            f"could not initialize module {name!r} on {', '.join(uris)}: "
            f"{msg.strip().splitlines()[0] if msg.strip() else type(e).__name__}"
        )
        err = TurbineRuntimeError(f"{what}; {hint}")
        err.cli_message = f"{what}; {cli_hint}"
        raise err from e
    return LoadedModule(
        vm_module,
        instance=instance,
        device_uris=uris,
        devices=devices,
        context=context,
        keep_alive=[data, *keep],
        copy_results=copy_results,
        signatures=signatures,
        zero_copy_inputs=zero_copy_inputs,
        where=where,
        checked_calls=checked_calls,
        functions=functions,
    )


def _prepare_cpu_for(name: str, reflections: Sequence[Mapping[str, str]]) -> None:
    """A module with AMX kernels (``precision="bf16"``, or quantized products built on an AMX
    machine) runs AMX code: Linux must grant the process the tile state first (else SIGILL);
    see :mod:`turbine_aot._compiler.amx`. ``reflections`` are its public functions' (already
    read: a damaged one was refused before this)."""
    if not module_requires_amx(reflections):
        return
    try:
        request_amx_permission()
    except AmxUnavailableError as e:
        raise TurbineRuntimeError(
            f"module {name!r} runs AMX code (built with precision='bf16', or torchao-quantized "
            f"products on an AMX machine), which this process cannot: {e}. Recompile it on "
            "this machine (a bf16 module with precision='fp32', the default)"
        ) from e


def _iree_version() -> str:
    try:
        from iree.runtime import version

        return version.VERSION
    except Exception:  # pragma: no cover - very old runtimes
        return "(unknown version)"
