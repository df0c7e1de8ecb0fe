"""Tensor subclasses (torchao's quantized weights) as the plain tensors an archive stores.

torchao's ``quantize_`` replaces a weight by a tensor subclass (``Int8Tensor``,
``IntxUnpackedToInt8Tensor``, ...) wrapping plain tensors: the integer data (``qdata``), scales
and zero points. PyTorch's protocol for such *traceable wrapper subclasses*
(``__tensor_flatten__``) names them, and that is all turbine relies on: a subclass tensor named
``NAME`` is stored as one entry per inner tensor, ``NAME.<inner attribute>``
(``layers.0.mlp.weight.qdata``, ``layers.0.mlp.weight.scale``, ...), nested subclasses joined the
same way. The exporter (``turbine_fx``) names the globals and parameter keys of a subclass the
same way, so a saved module resolves at run time.

torchao keeps 4-bit values one per byte (``IntxUnpackedToInt8Tensor`` with ``target_dtype`` int4,
values in [-8, 7] in an int8 tensor). In an archive they are packed, two per byte, in the layout
of IREE's ``i4`` tensors (:func:`pack_int4`), and the exported global is ``tensor<...xi4>``: the
archive and the bytes a compiled module reads are half of int8's. Such an entry's metadata says
``uint8`` with the packed shape (what the bytes are) plus ``"packed": {"dtype": "int4", "shape":
[...]}`` (what they mean; :func:`unpack_int4` restores the values).

torch is imported only by functions given torch tensors, and torchao is never imported: its
classes are recognised through torch's protocol and its ``target_dtype`` attribute.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ._errors import ParameterArchiveError

__all__ = [
    "archive_tensors",
    "int4_values",
    "is_wrapper_subclass",
    "mark_int4",
    "pack_int4",
    "packed_shape_of",
    "subclass_inner_tensors",
    "unpack_int4",
]

#: Joins a subclass tensor's name and an inner tensor's attribute (``weight`` + ``qdata``).
SEPARATOR = "."

# Set on an int8 tensor holding 4-bit values (torchao's unpacked int4 ``qdata``): stored packed.
_INT4_ATTR = "_turbine_int4_values"
# Set on a packed tensor by pack_int4: the logical (unpacked) shape.
_PACKED_ATTR = "_turbine_packed_int4_shape"


def _torch() -> Any:
    return sys.modules.get("torch")


def is_wrapper_subclass(tensor: Any) -> bool:
    """Whether ``tensor`` is a traceable wrapper subclass (torchao's quantized tensors are).

    Plain tensors and ``nn.Parameter`` are not; nor is anything when torch is not imported.
    """
    torch = _torch()
    if torch is None or not isinstance(tensor, torch.Tensor):
        return False
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return bool(is_traceable_wrapper_subclass(tensor))


def _holds_int4(outer: Any, attr: str, inner: Any) -> bool:
    """torchao's ``IntxUnpackedToInt8Tensor`` of int4: its ``qdata`` holds 4-bit values."""
    torch = _torch()
    return (
        attr == "qdata"
        and getattr(outer, "target_dtype", None) is getattr(torch, "int4", object())
        and inner.dtype == torch.int8
        and inner.dim() >= 1
        and inner.shape[-1] % 2 == 0
    )


def subclass_inner_tensors(name: str, tensor: Any) -> list[tuple[str, Any]]:
    """The plain tensors a (possibly nested) subclass tensor holds, named ``name.<attr>``.

    A plain tensor gives ``[(name, tensor)]``. The inner tensors are the subclass's own objects
    (not copies); torchao's int4 ``qdata`` is marked (:func:`int4_values`) for packed storage.

    Raises:
        ParameterArchiveError: the subclass does not flatten into tensors.
    """
    if not is_wrapper_subclass(tensor):
        return [(name, tensor)]
    try:
        attrs, _ = tensor.__tensor_flatten__()
    except Exception as e:
        raise ParameterArchiveError(
            f"tensor {name!r} is a {type(tensor).__name__} whose __tensor_flatten__ failed "
            f"({type(e).__name__}: {e}); turbine stores tensor subclasses as their inner tensors"
        ) from e
    out: list[tuple[str, Any]] = []
    for attr in attrs:
        inner = getattr(tensor, attr)
        full = f"{name}{SEPARATOR}{attr}"
        if is_wrapper_subclass(inner):
            out.extend(subclass_inner_tensors(full, inner))
            continue
        if _holds_int4(tensor, attr, inner):
            mark_int4(inner)
        out.append((full, inner))
    return out


def mark_int4(tensor: Any) -> None:
    """Marks an int8 tensor as holding 4-bit values (stored packed: :func:`int4_values`)."""
    setattr(tensor, _INT4_ATTR, True)


def int4_values(tensor: Any) -> bool:
    """Whether ``tensor`` is an int8 tensor of 4-bit values stored packed (torchao int4 data)."""
    return bool(getattr(tensor, _INT4_ATTR, False))


def pack_int4(tensor: Any) -> Any:
    """Packs int8 values in [-8, 7] two per byte: a ``uint8`` tensor, last dimension halved.

    Element ``2i`` goes in the low nibble of byte ``i``, ``2i + 1`` in the high nibble: the
    layout in which IREE reads a ``tensor<...xi4>``. The result remembers the logical shape
    (:func:`packed_shape_of`).

    Raises:
        ParameterArchiveError: not int8, an odd last dimension, or values outside [-8, 7].
    """
    torch = _torch()
    t = tensor.detach()
    if t.dtype != torch.int8 or t.dim() < 1 or t.shape[-1] % 2:
        raise ParameterArchiveError(
            f"packing 4-bit values needs an int8 tensor with an even last dimension; got "
            f"{t.dtype} of shape {tuple(t.shape)}"
        )
    if t.device.type != "cpu":
        t = t.cpu()
    if t.numel() and (int(t.min()) < -8 or int(t.max()) > 7):
        raise ParameterArchiveError(
            f"int4 data holds values in [{int(t.min())}, {int(t.max())}], outside [-8, 7]; it "
            "is not torchao int4 data"
        )
    u = t.contiguous().view(torch.uint8) & 0x0F
    packed = u[..., 0::2] | (u[..., 1::2] << 4)
    setattr(packed, _PACKED_ATTR, tuple(int(s) for s in t.shape))
    return packed


def packed_shape_of(tensor: Any) -> tuple[int, ...] | None:
    """The logical int4 shape of a tensor made by :func:`pack_int4`, else ``None``."""
    return getattr(tensor, _PACKED_ATTR, None)


def unpack_int4(packed: Any, shape: tuple[int, ...] | list[int] | None = None) -> Any:
    """The int8 values of packed int4 data (a ``uint8`` torch tensor or numpy array).

    Args:
        packed: bytes as :func:`pack_int4` lays them out (or an archive entry's array).
        shape: the logical shape (the entry's ``packed`` metadata); default: the packed shape
            with its last dimension doubled.
    """
    arr = packed.numpy() if hasattr(packed, "numpy") else np.asarray(packed)
    arr = arr.astype(np.uint8, copy=False)
    low = (arr & 0x0F).astype(np.int8)
    high = (arr >> 4).astype(np.int8)
    values = np.stack([low, high], axis=-1).reshape(*arr.shape[:-1], arr.shape[-1] * 2)
    values = np.where(values > 7, values - 16, values).astype(np.int8)
    if shape is not None:
        values = values.reshape(tuple(shape))
    torch = _torch()
    if torch is not None and isinstance(packed, torch.Tensor):
        return torch.from_numpy(values)
    return values


def archive_tensors(name: str, tensor: Any) -> list[tuple[str, Any]]:
    """The entries an archive holds for a tensor: itself, or a subclass's inner tensors.

    torchao int4 data comes packed (:func:`pack_int4`, a new tensor): what an in-memory
    parameter provider must hold for a module exported with external int4 weights.
    (:class:`~turbine_params.ParameterArchiveBuilder` packs while it writes instead.)
    """
    return [
        (key, pack_int4(inner) if int4_values(inner) else inner)
        for key, inner in subclass_inner_tensors(name, tensor)
    ]
