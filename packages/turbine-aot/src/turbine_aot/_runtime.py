"""Loading compiled modules and calling them with torch tensors.

:func:`load_module` takes a ``.vmfb`` (bytes, a file, a compiler ``Output``, or an
``ExportOutput`` which it compiles), the parameter archives per scope, and one or more device
URIs, and returns a :class:`LoadedModule` whose attributes are Python callables per exported
function. The VM context lives as long as the module, so mutable globals keep their values across
calls. Only ``iree.runtime`` is needed to load a ``.vmfb``; ``iree.compiler`` is imported only to
compile an ``ExportOutput``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from turbine_aot._compiler.cache import compile_export_output
from turbine_aot._errors import TurbineRuntimeError
from turbine_aot._module_check import check_module_in_child
from turbine_aot._runtime_tensors import buffer_view_to_tensor, tensor_to_buffer_view
from turbine_aot._signatures.abi import (
    FunctionSignature,
    TensorSpec,
    affinity_device_index,
    parse_abi_declaration,
    signatures_from_mlir,
)
from turbine_aot._signatures.call import rebuild_results
from turbine_aot._signatures.checks import check_tensor
from turbine_aot._signatures.element_types import element_type_name
from turbine_aot._signatures.errors import type_error
from turbine_aot._signatures.leaf import Leaf
from turbine_aot._signatures.reflection import function_signature, module_functions, module_name

__all__ = [
    "DEFAULT_PARAMETER_SCOPE",
    "FunctionSignature",
    "LoadedFunction",
    "LoadedModule",
    "TensorSpec",
    "TurbineRuntimeError",
    "function_signature",
    "load_module",
    "parse_abi_declaration",
    "signatures_from_mlir",
]

logger = logging.getLogger("turbine.aot.runtime")

#: The scope a bare parameter file is bound to: ``externalize_module_parameters`` writes an empty
#: scope as ``"model"`` (see DESIGN.md).
DEFAULT_PARAMETER_SCOPE = "model"

_KNOWN_DRIVERS = ("local-task", "local-sync", "vulkan", "cuda", "hip", "metal")


class _NoSuchFunctionError(TurbineRuntimeError, AttributeError):
    """A module has no function of that name: an AttributeError too, so ``hasattr``,
    ``getattr(m, name, default)`` and duck-typing probes answer instead of raising."""


def _module_bytes_or_path(module: Any, **compile_kwargs: Any) -> tuple[bytes | None, Path | None]:
    """Normalizes what ``load_module`` accepts to (bytes, None) or (None, path)."""
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
    if hasattr(module, "mlir_module") and hasattr(module, "compile"):  # ExportOutput
        return compile_export_output(module, **compile_kwargs), None
    raise TurbineRuntimeError(
        f"cannot load a module from {type(module).__name__}; pass .vmfb bytes, a .vmfb path, "
        "an iree.compiler Output or an ExportOutput"
    )


def _normalize_devices(device: str | Sequence[str]) -> list[str]:
    uris = [device] if isinstance(device, str) else list(device)
    if not uris:
        raise TurbineRuntimeError("no device given; pass a URI such as 'local-task'")
    import iree.runtime as rt

    available = rt.query_available_drivers()
    for uri in uris:
        driver = uri.split("://", 1)[0].split(":", 1)[0]
        if driver not in available:
            raise TurbineRuntimeError(
                f"unknown or unavailable IREE device {uri!r}; this runtime has the drivers: "
                f"{', '.join(available)} (e.g. 'local-task', 'local-sync', 'vulkan', 'cuda')"
            )
    return uris


def _driver_of(uri: str) -> str:
    return uri.split("://", 1)[0].split(":", 1)[0]


#: Devices made to replace one of IREE's cached devices that was lost, by URI (None: make one at
#: the next load). IREE's cache (``iree.runtime.get_device``) keeps handing out a lost device.
_replacement_devices: dict[str, Any] = {}

#: What IREE's drivers say when a device is gone for good (every later use fails the same way).
_DEVICE_LOST = ("DEVICE_LOST",)


def device_lost(error: BaseException | str) -> bool:
    """Whether an IREE error says the device was lost (``VK_ERROR_DEVICE_LOST``)."""
    return any(marker in str(error) for marker in _DEVICE_LOST)


def forget_lost_devices(devices: Sequence[Any], uris: Sequence[str]) -> None:
    """After ``devices`` (created for ``uris``) were lost: the next load of each URI creates a
    new device instead of reusing the lost one."""
    for device, uri in zip(devices, uris):
        current = _replacement_devices.get(uri)
        if current is None or current is device:
            _replacement_devices[uri] = None


def _create_devices(uris: list[str]) -> list[Any]:
    import iree.runtime as rt

    devices, seen = [], set()
    for uri in uris:
        try:
            if uri in seen:
                # A second device with the same URI must be a distinct device (multi-device).
                devices.append(rt.get_device(uri, cache=False))
            elif uri in _replacement_devices:
                if _replacement_devices[uri] is None:
                    _replacement_devices[uri] = rt.get_device(uri, cache=False)
                devices.append(_replacement_devices[uri])
            else:
                devices.append(rt.get_device(uri, cache=True))
        except Exception as e:
            raise TurbineRuntimeError(
                f"could not create IREE device {uri!r}: {str(e).splitlines()[0]}; check the "
                "driver is installed (e.g. Vulkan needs a loader and an ICD such as Mesa "
                "lavapipe) or choose another device"
            ) from e
        seen.add(uri)
    return devices


ParametersArg = (
    None | str | os.PathLike | Mapping[str, "str | os.PathLike | Sequence[str | os.PathLike] | Any"]
)


def _parameter_modules(instance: Any, parameters: Any) -> tuple[list[Any], list[Any]]:
    """Builds one io_parameters module per scope; returns (modules, objects to keep alive)."""
    import iree.runtime as rt

    if parameters is None:
        return [], []
    if isinstance(parameters, (str, os.PathLike)):
        parameters = {DEFAULT_PARAMETER_SCOPE: parameters}
    if not isinstance(parameters, Mapping):
        raise TurbineRuntimeError(
            "parameters must be a path (bound to scope 'model') or a mapping of scope -> "
            f"path(s) / ParameterIndex / dict of tensors; got {type(parameters).__name__}"
        )
    providers, keep = [], []
    for scope, source in parameters.items():
        if isinstance(source, rt.ParameterIndex):
            index = source
        else:
            index = rt.ParameterIndex()
            if isinstance(source, (str, os.PathLike)):
                sources: list[Any] = [source]
            elif isinstance(source, Mapping):
                sources = [source]
            else:
                sources = list(source)
            for src in sources:
                if isinstance(src, Mapping):  # in-memory tensors by name
                    for key, tensor in src.items():
                        data = _tensor_bytes(tensor)
                        keep.append(data)
                        index.add_buffer(key, data)
                    continue
                path = Path(src)
                if not path.is_file():
                    raise TurbineRuntimeError(
                        f"parameter archive {str(path)!r} for scope {scope!r} does not exist; "
                        "write it with turbine_params.save_module_parameters or pass the "
                        "right path"
                    )
                try:
                    index.load(str(path))
                except Exception as e:
                    raise TurbineRuntimeError(
                        f"could not read parameter archive {str(path)!r} for scope {scope!r}: "
                        f"{str(e).splitlines()[0]} (IREE reads .irpa, .safetensors and .gguf)"
                    ) from e
        keep.append(index)
        providers.append(index.create_provider(scope=scope))
    return [rt.create_io_parameters_module(instance, *providers)], keep


def _tensor_bytes(tensor: Any) -> Any:
    import torch

    if isinstance(tensor, np.ndarray):
        return np.ascontiguousarray(tensor).view(np.uint8).reshape(-1)
    t = tensor.detach().cpu().contiguous()
    return t.view(torch.uint8).reshape(-1).numpy() if t.numel() else np.empty(0, np.uint8)


class LoadedFunction:
    """A callable exported function: torch tensors in, torch tensors out.

    Returns one tensor for a single result, a tuple for several, None for none.
    """

    __slots__ = ("_copy_results", "_fn", "_module", "_placement", "_zero_copy", "signature")

    def __init__(
        self,
        module: LoadedModule,
        fn: Any,
        signature: FunctionSignature,
        copy: bool,
        zero_copy_inputs: bool = False,
    ):
        self._module = module
        self._fn = fn
        self.signature = signature
        self._copy_results = copy
        self._zero_copy = zero_copy_inputs
        # Device index per argument from its ABI affinity (device 0 when none).
        self._placement = [module._device_index(s.device) for s in signature.inputs]

    @property
    def name(self) -> str:
        return self.signature.name

    @property
    def label(self) -> str:
        """``module.function``, as errors name it."""
        return f"{self._module.name}.{self.signature.name}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the function like the eager program.

        With recorded call signatures (modules exported by turbine): positional and keyword
        arguments, nested inputs, the eager result structure (tensor, tuple, dict,
        ``ModelOutput``...). Without (a bare ``.vmfb`` from elsewhere): flat tensor arguments;
        one tensor for a single result, a tuple for several, None for none.

        Raises:
            CallArgumentTypeError: wrong count, unknown/missing keyword, another structure.
            CallArgumentValueError: dtype, rank, a static dimension, a dynamic dimension outside
                its exported range.
            TurbineRuntimeError: IREE failed while running the function.
        """
        call = self.signature.call
        if call is not None:
            flat = call.bind(self.label, args, kwargs)
            results = self._invoke(flat)
            if call.return_schema is not None:
                return rebuild_results(call, results)
            return _pack(results)
        if kwargs:
            raise type_error(
                f"{self.label}() got keyword argument(s) {', '.join(map(repr, kwargs))}, but "
                "this module records no argument names (it was not exported by turbine): pass "
                f"its {len(self.signature.inputs)} argument(s) positionally"
            )
        return _pack(self.call_flat(*args))

    def call_flat(self, *args: Any) -> list[Any]:
        """Calls with the compiled function's flat arguments (one per ABI argument, as
        ``iree-run-module`` takes them); returns the flat results. Checked like a call."""
        call = self.signature.call
        if call is not None:
            call.check_flat(self.label, args)
        else:
            _check_flat_args(self.label, args, self.signature.inputs)
        return self._invoke(args)

    def _invoke(self, args: Sequence[Any]) -> list[Any]:
        import iree.runtime as rt
        import torch

        sig = self.signature
        m = self._module
        inputs = rt.VmVariantList(len(args))
        for i, arg in enumerate(args):
            dev_idx = self._placement[i] if i < len(self._placement) else 0
            device, driver = m.devices[dev_idx], m.drivers[dev_idx]
            if isinstance(arg, np.ndarray):
                arg = torch.from_numpy(arg)
            if isinstance(arg, torch.Tensor):
                bv = tensor_to_buffer_view(device, arg, driver=driver, zero_copy=self._zero_copy)
                inputs.push_ref(bv.ref)
            elif isinstance(arg, bool | int):
                inputs.push_int(int(arg))
            elif isinstance(arg, float):
                inputs.push_float(arg)
            elif isinstance(arg, rt.HalBufferView):
                inputs.push_ref(arg.ref)
            else:
                raise type_error(
                    f"{self.label}(): argument {i} is {type(arg).__name__}; pass a "
                    "torch.Tensor, numpy array, int or float"
                )
        outputs = rt.VmVariantList(max(len(sig.outputs), 1))
        try:
            m._context.invoke(self._fn, inputs, outputs)
        except Exception as e:
            raise m._call_error(
                f"calling {self.label} on {', '.join(m.device_uris)} failed", e
            ) from e
        try:
            results = [self._convert(outputs, i) for i in range(len(outputs))]
        except (TypeError, ValueError) as e:  # an element type or shape torch cannot hold
            raise TurbineRuntimeError(
                f"calling {self.label} on {', '.join(m.device_uris)}: a result cannot be read "
                f"({e}); the module is damaged or returns a type turbine does not support"
            ) from e
        except Exception as e:  # the device failed while the results were read back
            raise m._call_error(f"reading the results of {self.label} failed", e) from e
        results = [self._with_declared_dtype(i, r) for i, r in enumerate(results)]
        if self._zero_copy and not self._copy_results:
            # A result may be an imported argument's buffer (a function returning its input):
            # keep the argument tensors alive as long as the results.
            keep = tuple(args)
            for r in results:
                if isinstance(r, torch.Tensor):
                    r._turbine_inputs = keep  # type: ignore[attr-defined]
        return results

    def _with_declared_dtype(self, i: int, result: Any) -> Any:
        """IREE's buffer views are signless (a ``uint8`` result comes back as ``int8``): the
        recorded signature's dtype (``ui8``) is restored as a view, bits unchanged."""
        import torch

        outs = self.signature.outputs
        if not isinstance(result, torch.Tensor) or i >= len(outs) or not outs[i].is_tensor:
            return result
        want = element_type_name(outs[i].dtype)
        if (
            want is None
            or want == result.dtype
            or want.is_floating_point
            or result.dtype.is_floating_point
            or want == torch.bool
            or result.dtype == torch.bool
            or want.itemsize != result.dtype.itemsize
        ):
            return result
        return result.view(want)

    def _convert(self, vlist: Any, i: int) -> Any:
        import iree.runtime as rt

        m = self._module
        try:
            bv = vlist.get_as_object(i, rt.HalBufferView)
        except Exception:
            bv = None
        if bv is not None:
            # Local-driver buffers are host memory; other results are staged through device 0.
            return buffer_view_to_tensor(
                m.devices[0], bv, driver=m.drivers[0], copy=self._copy_results
            )
        try:
            sub = vlist.get_as_list(i)
        except Exception:
            return vlist.get_variant(i)
        return [self._convert(sub, j) for j in range(len(sub))]


def _pack(results: list[Any]) -> Any:
    if len(results) == 1:
        return results[0]
    return tuple(results) if results else None


def _check_flat_args(label: str, args: Sequence[Any], specs: Sequence[TensorSpec]) -> None:
    """Count, dtype, rank and static dims of flat arguments against the ABI's specs (modules
    without recorded call signatures)."""
    import torch

    if specs and len(args) != len(specs):
        raise type_error(
            f"{label}() takes {len(specs)} argument(s) "
            f"({', '.join(str(s) for s in specs)}); got {len(args)}"
        )
    for i, (arg, spec) in enumerate(zip(args, specs)):
        if isinstance(arg, np.ndarray):
            arg = torch.from_numpy(arg)
        if not spec.is_tensor or not isinstance(arg, torch.Tensor):
            continue
        leaf = Leaf(str(i), "tensor", i, spec.dtype, spec.shape)
        check_tensor(f"{label}(): argument {i}", leaf, arg, {}, {})


class LoadedModule:
    """A compiled module loaded on one or more devices; exported functions are attributes.

    Example:
        >>> m = load_module("model.vmfb", device="local-task", parameters="model.irpa")
        >>> y = m.main(torch.randn(2, 8))  # doctest: +SKIP

    Attributes:
        name: the VM module name (``module`` unless exported under another name).
        devices: the ``iree.runtime.HalDevice`` objects, in ``__device_N`` order.
        device_uris: the URIs they were created from.
        functions: exported functions by name.
        verified_calls: after ``load_module(..., verify=True)``, what the checking child did
            with each public function: ``"called"``, ``"call failed: <IREE's error>"`` or
            ``"not called: <why>"``; None when the module was not verified (or with
            ``verify="load"``).
    """

    def __init__(
        self,
        vm_module: Any,
        *,
        instance: Any,
        device_uris: list[str],
        devices: list[Any],
        context: Any,
        keep_alive: list[Any],
        copy_results: bool,
        signatures: Mapping[str, FunctionSignature] | None = None,
        zero_copy_inputs: bool = False,
        where: str = "the module",
        verified_calls: Mapping[str, str] | None = None,
        functions: Sequence[tuple[str, Any, Mapping[str, str]]] | None = None,
    ) -> None:
        self._vm_module = vm_module
        self._instance = instance
        self._context = context
        self._keep_alive = keep_alive
        self.name: str = module_name(vm_module, where)
        self.device_uris = device_uris
        self.devices = devices
        self.drivers = [_driver_of(u) for u in device_uris]
        self.verified_calls = dict(verified_calls) if verified_calls is not None else None
        self._device_names: dict[str, int] = {}
        self.functions: dict[str, LoadedFunction] = {}
        # __init and main$async (takes fences: not a plain call) are left out.
        if functions is None:
            functions = module_functions(vm_module, where)
        for fname, fn, reflection in functions:
            given = (signatures or {}).get(fname)
            sig = function_signature(fname, reflection, given, where=where)
            self.functions[fname] = LoadedFunction(self, fn, sig, copy_results, zero_copy_inputs)

    def _call_error(self, what: str, error: BaseException) -> TurbineRuntimeError:
        """The error for a failed call; a lost device is forgotten, so that the next load on
        its URI gets a new one (this module stays bound to the lost one)."""
        if not device_lost(error):
            return TurbineRuntimeError(f"{what}: {error}")
        forget_lost_devices(self.devices, self.device_uris)
        return TurbineRuntimeError(
            f"{what}: {error}\nThe device ({', '.join(self.device_uris)}) was lost: this module "
            "cannot run any more; load it again (load_module creates a new device)"
        )

    def _device_index(self, name: str | None) -> int:
        idx = affinity_device_index(name, self._device_names)
        if idx >= len(self.devices):
            raise TurbineRuntimeError(
                f"module {self.name!r} places an argument on device {name!r} (index {idx}) but "
                f"was loaded with {len(self.devices)} device(s) {self.device_uris}; pass "
                f"device=[...] with at least {idx + 1} URIs"
            )
        return idx

    @property
    def function_names(self) -> list[str]:
        return list(self.functions)

    def signatures(self) -> dict[str, FunctionSignature]:
        """Signatures of the exported functions, by name."""
        return {k: f.signature for k, f in self.functions.items()}

    def __getitem__(self, name: str) -> LoadedFunction:
        try:
            return self.functions[name]
        except KeyError:
            raise _NoSuchFunctionError(
                f"module {self.name!r} has no function {name!r}; it exports: "
                f"{', '.join(self.functions) or '(none)'}"
            ) from None

    def __getattr__(self, name: str) -> LoadedFunction:
        if name.startswith("_") or name not in self.__dict__.get("functions", {}):
            if name.startswith("_"):
                raise AttributeError(name)
            return self[name]
        return self.functions[name]

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self.functions})

    def __repr__(self) -> str:
        return f"LoadedModule({self.name!r}, functions={self.function_names}, devices={self.device_uris})"


def load_module(
    module: Any,
    *,
    device: str | Sequence[str] = "local-task",
    parameters: Any = None,
    runtime_flags: Sequence[str] = (),
    copy_results: bool = False,
    compile_flags: Sequence[str] | None = None,
    cache: Any = True,
    signatures: Mapping[str, FunctionSignature] | None = None,
    zero_copy_inputs: bool = False,
    verify: bool | str = False,
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
            ``.irpa``, ``.safetensors`` and ``.gguf`` files are read by IREE (memory-mapped).
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
        verify: load the module in a short-lived child process first, call each public
            function there once on zeros of its signature, and raise if that child dies: IREE
            does not check a module's contents, and a corrupted ``.vmfb`` can kill the process
            when loaded or when called (see :mod:`turbine_aot._module_check`,
            docs/security.md). ``"load"``: the child only loads the module. Costs one child
            process (about a second); ``LoadedModule.verified_calls``
            says what the child called.

    Returns:
        The loaded module.

    Raises:
        TurbineRuntimeError: missing file, unknown device, unreadable archive, a module the
            runtime rejects (built for another target or IREE version) or whose records are
            damaged, or (``verify``) a module that crashed or hung the checking child.
    """
    import iree.runtime as rt

    if verify not in (False, True, "load"):
        raise TurbineRuntimeError(f"verify must be True, False or 'load'; got {verify!r}")
    uris = _normalize_devices(device)
    if signatures is None and hasattr(module, "mlir_module"):
        signatures = signatures_from_mlir(module)
    if runtime_flags:
        rt.flags.parse_flags(*runtime_flags)
    data, path = _module_bytes_or_path(
        module, device=uris, compile_flags=compile_flags, cache=cache
    )
    where = repr(str(path)) if path is not None else "the given module bytes"
    verified_calls = None
    if verify:
        calls = verify != "load"
        checked = check_module_in_child(
            data, path, uris, parameters, calls=calls, signatures=signatures
        )
        verified_calls = checked if calls else None
    devices = _create_devices(uris)
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
    hal = (
        rt.create_hal_module(instance, devices[0])
        if len(devices) == 1
        else rt.create_hal_module(instance, devices=devices)
    )
    param_modules, keep = _parameter_modules(instance, parameters)
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
        verified_calls=verified_calls,
        functions=functions,
    )


def _iree_version() -> str:
    try:
        from iree.runtime import version

        return version.VERSION
    except Exception:  # pragma: no cover - very old runtimes
        return "(unknown version)"
