"""torch tensors <-> IREE HAL buffer views, for every dtype IREE's ABI carries.

numpy has no bfloat16 or float8 types, so those travel through an integer view of the same width
(``torch.uint16`` / ``torch.uint8``) and are tagged with the right ``HalElementType``; torch
re-interprets the bytes on the way back. Nothing here imports ``iree.compiler``: a deployment
needs only ``iree.runtime``.

Copies: on local (CPU) drivers results are mapped host memory and are handed to torch without a
copy; inputs are copied once into a device buffer (importing the caller's memory would let a
program that stores an argument into a global alias the caller's tensor). On other drivers
(Vulkan, CUDA, HIP) inputs are uploaded from a 4096-byte aligned host copy when the tensor is not
aligned (Mesa lavapipe refuses unaligned host pointers) and results are read back through a
host-visible staging buffer, which works on every driver.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from turbine_aot._signatures.element_types import MLIR_TO_TORCH

__all__ = [
    "LOCAL_DRIVERS",
    "buffer_view_to_tensor",
    "hal_element_type",
    "result_carrier",
    "tensor_to_buffer_view",
    "torch_dtype_for_element_type",
]

LOCAL_DRIVERS = frozenset({"local-task", "local-sync"})

#: torch dtype, HAL element type, carrier torch dtype (the one numpy can represent with the
#: same bytes).
_ROWS: tuple[tuple[str, str, str], ...] = (
    ("float16", "FLOAT_16", "float16"),
    ("float32", "FLOAT_32", "float32"),
    ("float64", "FLOAT_64", "float64"),
    ("bfloat16", "BFLOAT_16", "uint16"),
    ("float8_e4m3fn", "FLOAT_8_E4M3_FN", "uint8"),
    ("float8_e4m3fnuz", "FLOAT_8_E4M3_FNUZ", "uint8"),
    ("float8_e5m2", "FLOAT_8_E5M2", "uint8"),
    ("float8_e5m2fnuz", "FLOAT_8_E5M2_FNUZ", "uint8"),
    ("float8_e8m0fnu", "FLOAT_8_E8M0_FNU", "uint8"),
    ("bool", "BOOL_8", "bool"),
    ("int8", "SINT_8", "int8"),
    ("uint8", "UINT_8", "uint8"),
    ("int16", "SINT_16", "int16"),
    ("uint16", "UINT_16", "uint16"),
    ("int32", "SINT_32", "int32"),
    ("uint32", "UINT_32", "uint32"),
    ("int64", "SINT_64", "int64"),
    ("uint64", "UINT_64", "uint64"),
    ("complex64", "COMPLEX_64", "complex64"),
    ("complex128", "COMPLEX_128", "complex128"),
)


def hal_element_type(mlir_type: str) -> int | None:
    """The ``HalElementType`` (as an int) of an MLIR element type name, without torch (the
    checked load's child builds its arguments from these); None when IREE has none."""
    import iree.runtime as rt

    torch_name = MLIR_TO_TORCH.get(mlir_type)
    for tname, hname, _carrier in _ROWS:
        if tname == torch_name:
            het = getattr(rt.HalElementType, hname, None)
            return None if het is None else int(het)
    return None


def _tables() -> tuple[dict[Any, tuple[Any, Any]], dict[int, Any]]:
    """(torch dtype -> (HalElementType, carrier torch dtype), int(HalElementType) -> torch dtype).

    The carrier dtype is the one numpy can represent with the same bytes.
    """
    global _TABLES
    if _TABLES is not None:
        return _TABLES
    import iree.runtime as rt
    import torch

    et = rt.HalElementType
    to_hal: dict[Any, tuple[Any, Any]] = {}
    from_hal: dict[int, Any] = {}
    for tname, hname, cname in _ROWS:
        tdt = getattr(torch, tname, None)
        het = getattr(et, hname, None)
        if tdt is None or het is None:
            continue  # older torch / runtime without this type
        to_hal[tdt] = (het, getattr(torch, cname))
        from_hal[int(het)] = tdt
    # Signless integers (what torch-dialect programs return after IREE's input conversion).
    for hname, tname in (
        ("INT_8", "int8"),
        ("INT_16", "int16"),
        ("INT_32", "int32"),
        ("INT_64", "int64"),
        ("OPAQUE_8", "uint8"),
    ):
        from_hal[int(getattr(et, hname))] = getattr(torch, tname)
    _TABLES = (to_hal, from_hal)
    return _TABLES


_TABLES: tuple[dict[Any, tuple[Any, Any]], dict[int, Any]] | None = None


def torch_dtype_for_element_type(element_type: Any):
    """The torch dtype of a ``HalElementType`` (or its int value); raises KeyError if none."""
    return _tables()[1][int(element_type)]


def _page_aligned_copy(array):
    """A 4096-byte aligned contiguous copy of a numpy array (Vulkan imports only at 4096)."""

    raw = np.empty(array.nbytes + 4096, dtype=np.uint8)
    offset = (-raw.ctypes.data) % 4096
    out = raw[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def tensor_to_buffer_view(
    device: Any, tensor: Any, *, driver: str, zero_copy: bool = False, allocator: Any = None
) -> Any:
    """Uploads a torch tensor (any dtype, any layout) into a new buffer view on ``device``.

    Args:
        device: an ``iree.runtime.HalDevice``.
        tensor: a CPU ``torch.Tensor`` (other devices are copied to the CPU first).
        driver: the device's driver name; non-local drivers get a page-aligned upload.
        zero_copy: on local drivers, import the tensor's memory instead of copying it (the
            buffer keeps the tensor's storage alive). The program then reads the caller's
            memory: only safe when the program does not keep the argument (e.g. store it into
            a global) and the caller does not modify the tensor while the module may read it.
        allocator: ``device.allocator`` where the caller keeps it (a loaded module reads it
            once: each binding call costs microseconds in a call's cold Python side).

    Returns:
        An ``iree.runtime.HalBufferView`` the caller owns.

    Raises:
        TypeError: the tensor's dtype has no IREE element type.
    """
    import iree.runtime as rt

    to_hal, _ = _tables()
    try:
        element_type, carrier = to_hal[tensor.dtype]
    except KeyError:
        raise TypeError(
            f"tensor dtype {tensor.dtype} has no IREE element type; supported: "
            f"{', '.join(str(d).removeprefix('torch.') for d in to_hal)}"
        ) from None
    # Each torch call here is cheap warm but not right after a call evicted the caches (a
    # call's Python side runs cold): only the ones the tensor needs (docs/running.md).
    t = tensor.detach() if tensor.requires_grad else tensor
    if not t.is_cpu:
        t = t.cpu()
    owned_by_caller = t.is_contiguous()
    if not owned_by_caller:
        t = t.contiguous()
    if carrier != t.dtype:
        t = t.view(carrier)
    array = t.numpy()
    # Import only memory the caller owns (a temporary contiguous copy would be freed while the
    # module may still reference it: the imported HAL buffer does not keep numpy alive).
    if zero_copy and owned_by_caller and driver in LOCAL_DRIVERS and array.nbytes:
        try:
            buffer = device.allocator.import_host_allocation(
                array,
                int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
                rt.BufferUsage.DEFAULT,
            )
            return rt.HalBufferView(buffer, array.shape, element_type)
        except Exception:  # the allocator refused the import (alignment, usage): copy instead
            pass
    if driver not in LOCAL_DRIVERS and array.ctypes.data % 4096:
        array = _page_aligned_copy(array)
    if allocator is None:
        allocator = device.allocator
    return allocator.allocate_buffer_copy(
        memory_type=rt.MemoryType.DEVICE_LOCAL,
        allowed_usage=rt.BufferUsage.DEFAULT,
        device=device,
        buffer=array,
        element_type=element_type,
    )


def _staged_host_array(device: Any, buffer_view: Any, np_dtype: Any) -> Any:
    """Copies a device buffer into a mapped host staging buffer; returns the mapped array."""
    import iree.runtime as rt

    source = buffer_view.get_buffer()
    staging = device.allocator.allocate_buffer(
        memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED),
        allocation_size=source.byte_length(),
    )
    sem = device.create_semaphore(0)
    device.queue_copy(
        source,
        staging,
        wait_semaphores=rt.HalFence.create_at(sem, 0),
        signal_semaphores=rt.HalFence.create_at(sem, 1),
    )
    rt.HalFence.create_at(sem, 1).wait()
    return staging.map().asarray(tuple(buffer_view.shape), np_dtype)


_NUMPY_DTYPES: dict[Any, Any] = {}


def result_carrier(dtype: Any) -> tuple[Any, Any]:
    """The torch dtype a result of ``dtype`` is read as (its carrier: the same bytes in a dtype
    numpy has; signless integers and dtypes without a row are their own) and its numpy dtype."""
    to_hal, _ = _tables()
    carrier = to_hal[dtype][1] if dtype in to_hal else dtype
    return carrier, _numpy_dtype(carrier)


def _numpy_dtype(dtype: Any) -> Any:
    """The numpy dtype torch maps ``dtype`` to (kept: a call reads each result through it)."""
    found = _NUMPY_DTYPES.get(dtype)
    if found is None:
        import torch

        found = _NUMPY_DTYPES[dtype] = np.dtype(torch.empty((), dtype=dtype).numpy().dtype)
    return found


def buffer_view_to_tensor(device: Any, buffer_view: Any, *, driver: str, copy: bool = False):
    """Reads a result buffer view into a CPU torch tensor of the matching dtype.

    Args:
        device: the ``HalDevice`` the buffer lives on.
        buffer_view: an ``iree.runtime.HalBufferView``.
        driver: the device's driver name.
        copy: force a private copy even where the mapped memory could be shared (local drivers).

    Returns:
        A ``torch.Tensor``; on local drivers (and ``copy=False``) it shares the result buffer's
        memory, which IREE gives up to the caller once returned.
    """
    import torch

    _, from_hal = _tables()
    key = int(buffer_view.element_type)
    try:
        dtype = from_hal[key]
    except KeyError:
        raise TypeError(
            f"result element type {buffer_view.element_type} has no torch dtype"
        ) from None
    shape = tuple(buffer_view.shape)
    if 0 in shape:  # no bytes (each element type has some)
        return torch.empty(shape, dtype=dtype)
    carrier, np_dtype = result_carrier(dtype)
    if driver in LOCAL_DRIVERS:
        # (torch.frombuffer on the mapping would be one torch call instead of two, but a result
        # alive at exit then outlives IREE's bindings, which print "leaked instance" warnings)
        array = buffer_view.get_buffer().map().asarray(shape, np_dtype)
        if copy:
            array = array.copy()
    else:
        array = _staged_host_array(device, buffer_view, np_dtype)
    out = torch.from_numpy(array)
    if carrier != dtype:
        out = out.view(dtype)
    return out
