"""Prepared calls: one or more functions of a loaded module called again and again with
arguments of the same shapes and dtypes, with as little Python per call as the runtime allows
(docs/running.md, "Prepared calls").

A call through :class:`~.loaded_module.LoadedFunction` binds its arguments against the recorded
signature, creates a device buffer per tensor, invokes, and wraps each result as a torch tensor.
Each piece is a few Python and torch calls, and right after a call that streamed a model's weights
through the caches each costs microseconds: an LLM decode step of the 110M Llama spent about 0.2
ms a token in them around a 5.3 ms ``invoke`` (int4 weights, one thread). A
:class:`PreparedCall` does that work once: the arguments live in device buffers it owns, mapped
into numpy arrays the caller writes in place; the list of arguments is built once; the results
come back as numpy views of the result buffers. Local (CPU) drivers only, where a device buffer
is host memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .caller_sched import BatchWhileCalling
from .tensors import (
    LOCAL_DRIVERS,
    _numpy_dtype,
    _tables,
    result_carrier,
    torch_dtype_for_element_type,
)

if TYPE_CHECKING:
    from .loaded_module import LoadedFunction

__all__ = ["COPY_LIMIT", "PreparedCall"]

#: Up to this many bytes of arguments, a call of a function that stores module state hands IREE
#: fresh copies of them (a few us); above it (or with an empty argument), the call waits for the
#: state to be written instead (one more round trip through the device's queue: ~65 us on
#: local-task on a 2-core VM; docs/running.md, "Module state and argument buffers")
COPY_LIMIT = 1 << 20


class PreparedCall:
    """Calls of ``functions`` (of one loaded module, all taking arguments of the same shapes
    and dtypes) on arguments kept in device buffers.

    Write the arguments into :attr:`inputs` (numpy views of the buffers), call with the index
    of the function; the results are numpy arrays viewing the result buffers (the torch dtype
    of each is in :attr:`result_dtypes` after the call), valid until the next call: copy what
    is kept. bfloat16 and float8 travel as their unsigned integer bits both ways, as
    :mod:`.tensors` reads them. Not thread-safe: one caller at a time, as for the module's
    state.

    Attributes:
        inputs: the arguments' writable numpy arrays, in the functions' argument order.
        result_dtypes: the torch dtype of each result of the last call.
    """

    __slots__ = (
        "_copies",
        "_functions",
        "_keep",
        "_labels",
        "_list",
        "_module",
        "_outputs",
        "_results",
        "_types",
        "_waits",
        "inputs",
        "result_dtypes",
    )

    def __init__(self, functions: Sequence[LoadedFunction], args: Sequence[Any]) -> None:
        """Prepares ``functions`` for arguments like ``args``.

        Args:
            functions: functions of one loaded module (``module.name`` / ``module["name"]``)
                that all take arguments of these shapes and dtypes.
            args: the first arguments (numpy arrays or CPU torch tensors; their shapes and
                dtypes are kept for every call, their values are written to :attr:`inputs`).

        Raises:
            ValueError: no function, functions of different modules, a device that is not
                local, a function returning anything but tensors.
            CallArgumentTypeError, CallArgumentValueError: arguments a function does not take
                (the checks of a call).
        """
        import iree.runtime as rt
        import torch

        if not functions:
            raise ValueError("PreparedCall: no function to call")
        tensors = [
            (torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a)
            .detach()
            .cpu()
            .contiguous()
            for a in args
        ]
        module = functions[0]._module
        for fn in functions:
            if fn._module is not module:
                raise ValueError("PreparedCall: the functions belong to different modules")
            if any(module.drivers[d] not in LOCAL_DRIVERS for d in fn._placement or [0]):
                raise ValueError(
                    f"PreparedCall: {fn.label} runs on {', '.join(module.device_uris)}; prepared "
                    "calls need a local (CPU) driver: local-sync or local-task"
                )
            if not all(spec.is_tensor for spec in fn.signature.outputs):
                raise ValueError(
                    f"PreparedCall: {fn.label} returns something other than tensors; call it "
                    "as a function instead"
                )
            fn.check_flat(tensors)  # a call's own checks: count, dtypes, static and dynamic dims
        to_hal, _ = _tables()
        self._module = module
        self._functions = [fn._fn for fn in functions]
        # per function, its wait on the state it stores (or None): the work writing that
        # state may still read the arguments when the call returns, and the caller writes the
        # input buffers again right away (docs/running.md, "Module state and argument buffers")
        self._waits = [fn._wait_state for fn in functions]
        self._labels = [fn.label for fn in functions]
        self._list = rt.VmVariantList(len(tensors))
        self._keep: list[Any] = []
        #: per argument, how a call of a function storing state copies it (the allocator's
        #: ``allocate_buffer_copy`` and its arguments but the array), or None where the
        #: arguments are too large to copy (such a call waits instead)
        self._copies: list[tuple[Any, int, int, Any, Any]] | None = []
        self.inputs: list[np.ndarray] = []
        placement = functions[0]._placement
        for i, t in enumerate(tensors):
            element_type, carrier = to_hal[t.dtype]
            device = module.devices[placement[i] if i < len(placement) else 0]
            buffer = device.allocator.allocate_buffer(
                memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
                allowed_usage=int(rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING_PERSISTENT),
                allocation_size=max(t.numel() * t.element_size(), 1),
            )
            mapping = buffer.map()
            shape = tuple(t.shape)
            view = mapping.asarray(shape, _numpy_dtype(carrier))
            view[...] = t.view(carrier).numpy()
            self._keep += [buffer, mapping]
            self.inputs.append(view)
            self._list.push_ref(rt.HalBufferView(buffer, shape, element_type).ref)
            self._copies.append(
                (
                    device.allocator.allocate_buffer_copy,
                    int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
                    int(rt.BufferUsage.DEFAULT | rt.BufferUsage.MAPPING_PERSISTENT),
                    device,
                    element_type,
                )
            )
        if sum(v.nbytes for v in self.inputs) > COPY_LIMIT or not all(
            v.nbytes for v in self.inputs
        ):
            self._copies = None
        self.result_dtypes: list[Any] = []
        #: HAL element type -> (torch dtype, numpy dtype of its carrier), as results arrive
        self._types: dict[int, tuple[Any, np.dtype]] = {}
        #: per function, per result: (shape, numpy dtype, torch dtype) where the signature
        #: declares them all (read without asking the buffer view), else None
        self._results = [[_declared(spec) for spec in fn.signature.outputs] for fn in functions]
        self._outputs = [max(len(fn.signature.outputs), 1) for fn in functions]

    def __call__(self, index: int = 0) -> list[np.ndarray]:
        """Invokes function ``index`` on :attr:`inputs`; returns its results as numpy views.

        Raises:
            TurbineRuntimeError: IREE failed while running the function.
        """
        import iree.runtime as rt

        m = self._module
        outputs = rt.VmVariantList(self._outputs[index])
        wait = self._waits[index]
        args = self._list
        if wait is not None and self._copies is not None:
            # a function storing state gets copies nobody writes (cheaper than waiting)
            args = rt.VmVariantList(len(self.inputs))
            for view, (copy, memory, usage, device, element_type) in zip(
                self.inputs, self._copies, strict=True
            ):
                args.push_ref(copy(memory, usage, device, view, element_type).ref)
            wait = None
        try:
            if m._batch_calls:  # docs/running.md, "The calling thread during a call"
                with BatchWhileCalling():
                    m._context.invoke(self._functions[index], args, outputs)
            else:
                m._context.invoke(self._functions[index], args, outputs)
            if wait is not None:
                m.wait_state(wait)
        except Exception as e:
            raise m._call_error(
                f"calling {self._labels[index]} on {', '.join(m.device_uris)} failed", e
            ) from e
        results, dtypes = [], []
        declared = self._results[index]
        for i in range(len(outputs)):
            bv = outputs.get_as_object(i, rt.HalBufferView)
            known = declared[i] if i < len(declared) else None
            if known is None:
                key = int(bv.element_type)
                types = self._types.get(key)
                if types is None:
                    types = self._types[key] = _result_types(key)
                known = (tuple(bv.shape), types[1], types[0])
            shape, np_dtype, dtype = known
            if 0 in shape:
                results.append(np.empty(shape, np_dtype))
            else:
                results.append(bv.map().asarray(shape, np_dtype))
            dtypes.append(dtype)
        self.result_dtypes = dtypes
        return results


def _declared(spec: Any) -> tuple[tuple[int, ...], np.dtype, Any] | None:
    """A result's static shape, numpy dtype read as, and torch dtype, from its declaration;
    None where the shape is dynamic or the element type has no torch dtype."""
    dtype = spec.torch_dtype
    if dtype is None or any(d is None for d in spec.shape):
        return None
    return tuple(spec.shape), result_carrier(dtype)[1], dtype


def _result_types(element_type: int) -> tuple[Any, np.dtype]:
    """The torch dtype of a result's HAL element type and the numpy dtype it is read as."""
    dtype = torch_dtype_for_element_type(element_type)
    return dtype, result_carrier(dtype)[1]
