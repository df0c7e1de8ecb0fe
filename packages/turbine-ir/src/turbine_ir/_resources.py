"""torch tensors → MLIR data attributes, through raw bytes (no numpy dtypes).

A tensor's bytes are copied (``t.view(torch.uint8)``, little-endian host layout, which is what
MLIR's resource blobs and IREE expect) into a 64-byte aligned buffer that the resulting
``DenseResourceElementsAttr`` owns. That works for every element type with a byte-addressable
layout: bf16, each float8 variant, complex (real/imag interleaved), bool (one byte per element,
0 or 1), unsigned integers. Later mutation of the tensor does not change the attribute.
"""

from __future__ import annotations

import ctypes
import re
from typing import TYPE_CHECKING

import torch

from ._dtypes import torch_dtype_to_element_asm, torch_tensor_type
from ._errors import UnsupportedDtypeError

if TYPE_CHECKING:
    from iree.compiler import ir

__all__ = [
    "RESOURCE_ALIGNMENT",
    "tensor_to_bytes",
    "tensor_to_dense_attr",
    "tensor_to_dense_resource_attr",
]

#: Alignment (bytes) of the buffers backing dense resources; matches the IRPA data alignment.
RESOURCE_ALIGNMENT = 64


def _check_materializable(t: torch.Tensor, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.is_meta or _is_fake(t):
        raise UnsupportedDtypeError(
            f"{what}: tensor of shape {tuple(t.shape)} has no data (meta or fake tensor); "
            "materialize it, or make the global external (ExternalTensorTrait / "
            "GlobalAttributes(external=True)) or uninitialized"
        )
    if t.layout != torch.strided:
        raise UnsupportedDtypeError(
            f"{what}: layout {t.layout} is not supported; convert with t.to_dense()"
        )
    torch_dtype_to_element_asm(t.dtype)  # raises with the reason when unmappable
    name = str(t.dtype)
    if re.fullmatch(r"torch\.u?int[1-7]", name):
        raise UnsupportedDtypeError(
            f"{what}: sub-byte dtype {t.dtype} has no defined storage layout in MLIR resources; "
            "store it as torch.uint8/int8 and convert in the program"
        )


def _is_fake(t: torch.Tensor) -> bool:
    try:
        from torch._subclasses.fake_tensor import is_fake
    except ImportError:  # pragma: no cover
        return False
    return bool(is_fake(t))


def tensor_to_bytes(t: torch.Tensor) -> bytes:
    """The raw little-endian bytes of a tensor's elements in row-major order.

    Conjugate/negative views are resolved and non-contiguous tensors compacted first.
    """
    _check_materializable(t, "tensor_to_bytes")
    return _copy_out(t).raw


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    # A bool tensor is stored as one byte per element (0/1): the layout IREE reads for i1.
    return t.reshape(-1).view(torch.uint8)


def _copy_out(t: torch.Tensor) -> _AlignedBuffer:
    src = _byte_view(t)
    buf = _AlignedBuffer(src.numel())
    if src.numel():
        ctypes.memmove(buf.address, src.data_ptr(), src.numel())
    return buf


class _AlignedBuffer:
    """A ``RESOURCE_ALIGNMENT``-aligned byte buffer exposing the buffer protocol (via memoryview)."""

    __slots__ = ("_storage", "address", "nbytes", "view")

    def __init__(self, nbytes: int):
        self._storage = (ctypes.c_uint8 * (nbytes + RESOURCE_ALIGNMENT))()
        base = ctypes.addressof(self._storage)
        offset = (-base) % RESOURCE_ALIGNMENT
        self.address = base + offset
        self.nbytes = nbytes
        # The memoryview slice keeps self._storage alive for as long as MLIR holds the buffer.
        self.view = memoryview(self._storage).cast("B")[offset : offset + nbytes]

    @property
    def raw(self) -> bytes:
        return self.view.tobytes()


def tensor_to_dense_resource_attr(
    t: torch.Tensor,
    *,
    name: str | None = None,
    context: ir.Context | None = None,
) -> ir.DenseResourceElementsAttr:
    """A ``dense_resource<name> : tensor<...>`` attribute holding a copy of ``t``'s bytes.

    Args:
        t: A CPU (or any device; it is copied to host) strided tensor of a mappable dtype.
        name: Resource blob name hint (MLIR makes it unique); default
            ``torch_tensor_<dims joined by _>_<str(dtype)>`` (e.g. ``torch_tensor_2_40_torch.float32``),
            the name the reference ``iree.turbine.aot`` gives inline tensor data.
        context: MLIR context (default: the current one).

    Raises:
        UnsupportedDtypeError: Meta/fake tensors, unmappable or sub-byte dtypes.
    """
    from iree.compiler import ir

    _check_materializable(t, "tensor_to_dense_resource_attr")
    ttype = torch_tensor_type(list(t.shape), t.dtype, context)
    if name is None:
        name = inline_blob_name(t)
    buf = _copy_out(t)
    # The buffer itself is RESOURCE_ALIGNMENT-aligned, but the alignment *declared* on the
    # resource is the element size: the bytecode writer records it, and a reader then demands
    # that the whole bytecode buffer be that aligned. iree-compile/iree-opt read small .mlirbc
    # files into 16-byte-aligned heap buffers, so declaring 64 made those files unreadable.
    return ir.DenseResourceElementsAttr.get_from_buffer(
        buf.view,
        name,
        ttype,
        alignment=declared_resource_alignment(t.element_size()),
        context=ttype.context,
    )


def inline_blob_name(t: torch.Tensor) -> str:
    """``torch_tensor_<dims joined by _>_<str(dtype)>``: the default name of inline tensor data."""
    return f"torch_tensor_{'_'.join(str(d) for d in t.shape)}_{t.dtype}"


def declared_resource_alignment(element_size: int) -> int:
    """The alignment a dense resource of ``element_size``-byte elements declares (1..16)."""
    return min(16, max(1, element_size))


def _emulated_float_formats() -> dict[torch.dtype, str]:
    names = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")
    out = {torch.bfloat16: "H"}
    for n in names:
        d = getattr(torch, n, None)
        if isinstance(d, torch.dtype):
            out[d] = "B"
    return out


#: dtypes IREE 3.13 cannot compile as ``dense_resource`` in all cases, with the buffer format
#: used to hand their raw bytes to ``DenseElementsAttr`` (same element size, no conversion).
_DENSE_ELEMENTS_FORMATS = _emulated_float_formats()


def tensor_to_dense_attr(
    t: torch.Tensor, context: ir.Context | None = None, *, blob_name: str | None = None
) -> ir.Attribute:
    """The attribute IREE compiles best for ``t``'s data (what globals and literals use).

    * empty → ``dense<>``; one element → a ``dense<…>`` splat (better constant folding);
    * bf16 and float8 → ``dense<…>`` built from the raw bytes: IREE 3.13 fails on
      ``dense_resource`` of these types (bf16 up to ~128 elements: "'arith.constant' op failed
      to verify that all of {value, result} have same type"; float8 from ~1000 elements:
      "unhandled float element bit width 8"), while ``dense`` compiles at every size;
    * everything else → ``dense_resource`` (:func:`tensor_to_dense_resource_attr`).

    Complex empty/one-element tensors stay resources: the Python bindings cannot wrap complex
    ``dense`` attributes. ``blob_name`` names the resource (default :func:`inline_blob_name`).
    """
    from iree.compiler import ir

    _check_materializable(t, "tensor_to_dense_attr")
    if t.numel() == 0 and not t.dtype.is_complex:
        ttype = torch_tensor_type(list(t.shape), t.dtype, context)
        return ir.Attribute.parse(f"dense<> : {ttype}", ttype.context)
    if t.numel() == 1 and not t.dtype.is_complex:
        ttype = torch_tensor_type(list(t.shape), t.dtype, context)
        if t.dtype == torch.bool:
            lit = "true" if bool(t.reshape(-1)[0]) else "false"
        else:
            lit = '"0x' + bytes(_byte_view(t).tolist()).hex().upper() + '"'
        return ir.Attribute.parse(f"dense<{lit}> : {ttype}", ttype.context)
    fmt = _DENSE_ELEMENTS_FORMATS.get(t.dtype)
    if fmt is not None:
        ttype = torch_tensor_type(list(t.shape), t.dtype, context)
        buf = _copy_out(t)
        view = buf.view.cast(fmt, list(t.shape))  # type: ignore[call-overload]
        return ir.DenseElementsAttr.get(
            view, type=ttype.element_type, shape=list(t.shape), context=ttype.context
        )
    return tensor_to_dense_resource_attr(t, name=blob_name, context=context)
