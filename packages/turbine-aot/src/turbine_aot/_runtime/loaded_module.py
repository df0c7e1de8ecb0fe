"""A loaded module and its functions: :class:`LoadedModule` (exported functions as attributes,
the VM context that holds its globals) and :class:`LoadedFunction` (called with torch tensors
like the eager program, checked against its recorded signature)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from turbine_aot._compiler.stored_state import WAIT_STATE_PREFIX
from turbine_aot._errors import TurbineRuntimeError
from turbine_aot._signatures.abi import FlatSignature, TensorSpec, affinity_device_index
from turbine_aot._signatures.call import rebuild_results
from turbine_aot._signatures.checks import check_tensor
from turbine_aot._signatures.element_types import element_type_name
from turbine_aot._signatures.errors import type_error
from turbine_aot._signatures.leaf import Leaf
from turbine_aot._signatures.reflection import function_signature, module_functions, module_name

from .caller_sched import BatchWhileCalling, resolve_mode, switches_policy
from .devices import device_lost, driver_of, forget_lost_devices
from .tensors import buffer_view_to_tensor, tensor_to_buffer_view

__all__ = ["LoadedFunction", "LoadedModule"]

logger = logging.getLogger("turbine.aot.runtime")


class _NoSuchFunctionError(TurbineRuntimeError, AttributeError):
    """A module has no function of that name: an AttributeError too, so ``hasattr``,
    ``getattr(m, name, default)`` and duck-typing probes answer instead of raising."""


class LoadedFunction:
    """A callable exported function: torch tensors in, torch tensors out.

    Returns one tensor for a single result, a tuple for several, None for none.
    """

    __slots__ = (
        "_copy_results",
        "_declared",
        "_fn",
        "_module",
        "_placement",
        "_wait_state",
        "_zero_copy",
        "signature",
    )

    def __init__(
        self,
        module: LoadedModule,
        fn: Any,
        signature: FlatSignature,
        copy: bool,
        zero_copy_inputs: bool = False,
        wait_state: Any = None,
    ):
        self._module = module
        self._fn = fn
        #: the module's function waiting on the state this one stores, or None (its stores
        #: may still read the arguments when the call returns: _compiler/stored_state.py)
        self._wait_state = wait_state
        self.signature = signature
        self._copy_results = copy
        self._zero_copy = zero_copy_inputs
        # Device index per argument from its ABI affinity (device 0 when none).
        self._placement = [module._device_index(s.device) for s in signature.inputs]
        # Per result, the torch dtype a signless integer result is viewed as (None: as read).
        self._declared = [_declared_dtype(s) for s in signature.outputs]

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
            flat = None if kwargs else call.bind_positional(args)
            if flat is None:
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
        self.check_flat(args)
        return self._invoke(args)

    def check_flat(self, args: Sequence[Any]) -> None:
        """Checks flat arguments as :meth:`call_flat` does, without calling.

        Raises:
            CallArgumentTypeError: wrong count or type.
            CallArgumentValueError: dtype, rank, a static dimension, a dynamic dimension outside
                its exported range.
        """
        call = self.signature.call
        if call is not None:
            call.check_flat(self.label, args)
        else:
            _check_flat_args(self.label, args, self.signature.inputs)

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
                bv = tensor_to_buffer_view(
                    device,
                    arg,
                    driver=driver,
                    zero_copy=self._zero_copy,
                    allocator=m.allocators[dev_idx],
                )
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
            if m._batch_calls:  # docs/running.md, "The calling thread during a call"
                with BatchWhileCalling():
                    m._context.invoke(self._fn, inputs, outputs)
            else:
                m._context.invoke(self._fn, inputs, outputs)
            if self._zero_copy and self._wait_state is not None:
                # the arguments are the caller's memory, free to change once this returns
                m.wait_state(self._wait_state)
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

        want = self._declared[i] if i < len(self._declared) else None
        if (
            want is None
            or not isinstance(result, torch.Tensor)
            or want == result.dtype
            or result.dtype.is_floating_point
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


def _declared_dtype(spec: TensorSpec) -> Any:
    """The integer torch dtype a result of ``spec`` is viewed as (:meth:`LoadedFunction.
    _with_declared_dtype`), or None: not a tensor, no torch dtype, floating point or bool."""
    import torch

    if not spec.is_tensor:
        return None
    want = element_type_name(spec.dtype)
    if want is None or want.is_floating_point or want == torch.bool:
        return None
    return want


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
        checked_calls: after ``load_module(..., check_in_child=True)``, what the checking child
            did with each public function: ``"called"``, ``"call failed: <IREE's error>"`` or
            ``"not called: <why>"``; None when the module was not checked (or with
            ``check_in_child="load"``). ``verified_calls`` is its former name.
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
        signatures: Mapping[str, FlatSignature] | None = None,
        zero_copy_inputs: bool = False,
        where: str = "the module",
        checked_calls: Mapping[str, str] | None = None,
        functions: Sequence[tuple[str, Any, Mapping[str, str]]] | None = None,
    ) -> None:
        self._vm_module = vm_module
        self._instance = instance
        self._context = context
        self._keep_alive = keep_alive
        self.name: str = module_name(vm_module, where)
        self.device_uris = device_uris
        self.devices = devices
        self.drivers = [driver_of(u) for u in device_uris]
        self.allocators = [d.allocator for d in devices]  # read once: a call runs cold
        # Calls on local-task run with the caller under SCHED_BATCH (_runtime.caller_sched).
        self._batch_calls = switches_policy(self.drivers, resolve_mode())
        self.checked_calls = dict(checked_calls) if checked_calls is not None else None
        self._device_names: dict[str, int] = {}
        self.functions: dict[str, LoadedFunction] = {}
        # __init and main$async (takes fences: not a plain call) are left out.
        if functions is None:
            functions = module_functions(vm_module, where)
        for fname, fn, reflection in functions:
            given = (signatures or {}).get(fname)
            sig = function_signature(fname, reflection, given, where=where)
            self.functions[fname] = LoadedFunction(
                self,
                fn,
                sig,
                copy_results,
                zero_copy_inputs,
                _wait_state_function(vm_module, fname),
            )

    def wait_state(self, wait_state: Any) -> None:
        """Invokes a function's ``__turbine_wait_state.<name>`` companion: returns once the
        module state that function stored is written, so that nothing IREE still runs reads
        the call's arguments (docs/running.md, "Module state and argument buffers").

        Raises:
            Whatever ``VmContext.invoke`` raises; the callers turn it into their call's error.
        """
        import iree.runtime as rt

        empty = rt.VmVariantList(0)
        self._context.invoke(wait_state, empty, rt.VmVariantList(0))

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

    @property
    def verified_calls(self) -> dict[str, str] | None:
        """The former name of :attr:`checked_calls` (``load_module(verify=...)`` became
        ``check_in_child=...``)."""
        return self.checked_calls

    def signatures(self) -> dict[str, FlatSignature]:
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


def _wait_state_function(vm_module: Any, name: str) -> Any:
    """The ``__turbine_wait_state.<name>`` function of ``vm_module``, or None (a function
    storing no module state, or a module compiled without turbine's rewrites)."""
    try:
        return vm_module.lookup_function(WAIT_STATE_PREFIX + name)
    except Exception:  # absent: IREE's binding returns None or raises, by version
        return None
