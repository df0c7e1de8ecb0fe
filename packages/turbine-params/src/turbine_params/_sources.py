"""Host objects (numpy arrays, torch tensors, bytes-likes) as flat little-endian bytes."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ._dtypes import TensorMetadata, dtype_info, dtype_info_for_numpy
from ._errors import ParameterArchiveError
from ._subclasses import is_wrapper_subclass, packed_shape_of

__all__ = ["host_bytes", "host_nbytes", "is_torch_tensor", "tensor_metadata", "tie_key"]


def is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")  # a torch tensor can exist only if torch is imported
    return torch is not None and isinstance(obj, torch.Tensor)


def _check_torch(t: Any, what: str) -> None:
    import torch

    if is_wrapper_subclass(t):
        raise ParameterArchiveError(
            f"{what}: a {type(t).__name__} (a tensor subclass, e.g. torchao's quantized "
            "weights) has no bytes of its own; add it with add_tensor() or save_module_parameters"
            "(), which store its inner tensors as NAME.<attribute>"
        )
    if t.layout != torch.strided:
        raise ParameterArchiveError(
            f"{what}: tensor layout {t.layout} is not supported; convert with .to_dense()"
        )
    if t.is_quantized:
        raise ParameterArchiveError(
            f"{what}: quantized tensors ({t.dtype}) carry scales an archive cannot hold; store "
            f"int_repr() and the scales as separate entries"
        )
    if t.device.type == "meta":
        raise ParameterArchiveError(f"{what}: tensor is on the meta device and has no data")


def tensor_metadata(obj: Any, what: str = "tensor") -> TensorMetadata | None:
    """``TensorMetadata`` of a torch tensor or numpy array; ``None`` for other buffers."""
    if is_torch_tensor(obj):
        _check_torch(obj, what)
        packed = packed_shape_of(obj)
        return TensorMetadata(
            dtype_info(str(obj.dtype)),
            tuple(int(s) for s in obj.shape),
            ("int4", packed) if packed is not None else None,
        )
    if isinstance(obj, np.ndarray | np.generic):
        arr = np.asarray(obj)
        return TensorMetadata(dtype_info_for_numpy(arr.dtype), tuple(int(s) for s in arr.shape))
    return None


def host_nbytes(obj: Any) -> int:
    if is_torch_tensor(obj):
        return int(obj.numel()) * obj.element_size()
    if isinstance(obj, np.ndarray | np.generic):
        return int(np.asarray(obj).nbytes)
    return memoryview(obj).nbytes


def host_bytes(obj: Any) -> np.ndarray:
    """The object's bytes as a flat uint8 array, little-endian, C order.

    Zero-copy for contiguous CPU tensors and contiguous little-endian arrays; otherwise one copy
    of this object only (never more than the largest tensor in memory at once).
    """
    if is_torch_tensor(obj):
        import torch

        _check_torch(obj, "tensor")
        t = obj.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        if not t.is_contiguous():
            t = t.contiguous()
        return t.reshape(-1).view(torch.uint8).numpy()
    if isinstance(obj, np.ndarray | np.generic):
        arr = np.asarray(obj)
        if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and sys.byteorder == "big"):
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        arr = np.ascontiguousarray(arr)
        return arr.reshape(-1).view(np.uint8)
    try:
        mv = memoryview(obj)
    except TypeError as e:
        raise ParameterArchiveError(
            f"cannot store an object of type {type(obj).__name__}: expected a numpy array, a "
            f"torch tensor or a bytes-like object"
        ) from e
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    return np.frombuffer(mv.cast("B"), dtype=np.uint8)


def tie_key(obj: Any) -> tuple | None:
    """Identity of the bytes an object views: equal keys mean identical stored bytes."""
    if is_torch_tensor(obj):
        if obj.device.type == "meta" or obj.layout.__class__.__name__ != "layout":
            return None
        try:
            ptr = obj.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return None
        return (
            "torch",
            obj.device.type,
            ptr,
            obj.storage_offset(),
            tuple(obj.shape),
            tuple(obj.stride()),
            str(obj.dtype),
            obj.is_conj(),
            obj.is_neg(),
        )
    if isinstance(obj, np.ndarray):
        return (
            "numpy",
            obj.__array_interface__["data"][0],
            obj.shape,
            obj.strides,
            obj.dtype.str,
        )
    return None
