"""torch dtype ↔ MLIR element types, in the builtin-tensor and ``!torch.vtensor`` worlds.

Two conventions meet here:

* builtin tensors (what IREE's ``util.global``/``flow``/``tensor`` ops use) are **signless**:
  ``torch.int8`` and ``torch.uint8`` are both ``i8``; ``torch.bool`` is ``i1``;
* the torch dialect's ``!torch.vtensor`` is **signed**: ``si8``, ``ui8``, ``si64``, ``i1`` (bool).

Floating point types (``f16``, ``bf16``, ``f32``, ``f64``, every ``float8`` variant) and complex
(``complex<f16>``/``complex<f32>``/``complex<f64>``) are the same in both worlds.

No conversion here goes through numpy dtypes, so bf16/fp8 need no ``ml_dtypes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ._errors import UnsupportedDtypeError

if TYPE_CHECKING:
    from iree.compiler import ir

__all__ = [
    "IREE_TYPE_ASM_TO_TORCH_DTYPE",
    "SIGNED_MLIR_TYPE_ASM_TO_TORCH_DTYPE",
    "TORCH_DTYPE_TO_IREE_TYPE_ASM",
    "TORCH_DTYPE_TO_SIGNED_MLIR_TYPE_ASM",
    "element_type_to_torch_dtype",
    "tensor_type_asm",
    "torch_dtype_to_element_asm",
    "torch_dtype_to_element_type",
    "torch_dtype_to_vtensor_element_asm",
    "torch_tensor_type",
    "torch_vtensor_type",
    "vtensor_type_asm",
]


def _optional(*names: str) -> list[torch.dtype]:
    return [getattr(torch, n) for n in names if isinstance(getattr(torch, n, None), torch.dtype)]


# (torch dtype, builtin element asm, vtensor element asm). Order matters for the reverse maps:
# the first dtype listed for an asm string wins (i8 -> int8, i1 -> bool).
_TABLE: list[tuple[torch.dtype, str, str]] = [
    (torch.bool, "i1", "i1"),
    (torch.float16, "f16", "f16"),
    (torch.bfloat16, "bf16", "bf16"),
    (torch.float32, "f32", "f32"),
    (torch.float64, "f64", "f64"),
    (torch.int8, "i8", "si8"),
    (torch.int16, "i16", "si16"),
    (torch.int32, "i32", "si32"),
    (torch.int64, "i64", "si64"),
    (torch.uint8, "i8", "ui8"),
    (torch.complex32, "complex<f16>", "complex<f16>"),
    (torch.complex64, "complex<f32>", "complex<f32>"),
    (torch.complex128, "complex<f64>", "complex<f64>"),
]
for _dt, _asm in (
    ("uint16", "16"),
    ("uint32", "32"),
    ("uint64", "64"),
):
    for _d in _optional(_dt):
        _TABLE.append((_d, f"i{_asm}", f"ui{_asm}"))
for _dt, _asm in (
    ("float8_e4m3fn", "f8E4M3FN"),
    ("float8_e4m3fnuz", "f8E4M3FNUZ"),
    ("float8_e5m2", "f8E5M2"),
    ("float8_e5m2fnuz", "f8E5M2FNUZ"),
    ("float8_e8m0fnu", "f8E8M0FNU"),
):
    for _d in _optional(_dt):
        _TABLE.append((_d, _asm, _asm))
# Sub-byte integer dtypes: torch declares them (as "shell" dtypes, one byte per element in
# storage) and torch-mlir types accept them. They map for type conversion; tensors of these
# dtypes cannot be turned into data attributes (see _resources.py).
for _bits in range(1, 8):
    for _d in _optional(f"int{_bits}"):
        _TABLE.append((_d, f"i{_bits}", f"si{_bits}"))
    for _d in _optional(f"uint{_bits}"):
        _TABLE.append((_d, f"i{_bits}", f"ui{_bits}"))

#: torch dtype -> builtin (signless) element type asm, e.g. ``torch.uint8 -> "i8"``.
TORCH_DTYPE_TO_IREE_TYPE_ASM: dict[torch.dtype, str] = {}
#: torch dtype -> ``!torch.vtensor`` element asm, e.g. ``torch.uint8 -> "ui8"``.
TORCH_DTYPE_TO_SIGNED_MLIR_TYPE_ASM: dict[torch.dtype, str] = {}
for _d, _b, _s in _TABLE:
    TORCH_DTYPE_TO_IREE_TYPE_ASM.setdefault(_d, _b)
    TORCH_DTYPE_TO_SIGNED_MLIR_TYPE_ASM.setdefault(_d, _s)
# Quantized tensors exist only in the torch dialect (scale/zero point live in the op).
for _qname in ("qint8", "quint8", "qint32"):
    for _q in _optional(_qname):
        TORCH_DTYPE_TO_SIGNED_MLIR_TYPE_ASM[_q] = f"!torch.{_qname}"

#: builtin element asm -> torch dtype (``i8 -> torch.int8``, ``i1 -> torch.bool``).
IREE_TYPE_ASM_TO_TORCH_DTYPE: dict[str, torch.dtype] = {}
for _d, _b in TORCH_DTYPE_TO_IREE_TYPE_ASM.items():
    IREE_TYPE_ASM_TO_TORCH_DTYPE.setdefault(_b, _d)
#: ``!torch.vtensor`` element asm -> torch dtype (``ui8 -> torch.uint8``).
SIGNED_MLIR_TYPE_ASM_TO_TORCH_DTYPE: dict[str, torch.dtype] = {}
for _d, _s in TORCH_DTYPE_TO_SIGNED_MLIR_TYPE_ASM.items():
    SIGNED_MLIR_TYPE_ASM_TO_TORCH_DTYPE.setdefault(_s, _d)
# Builtin signed/unsigned spellings also name a torch dtype (e.g. after a torch->builtin cast).
for _s, _d in list(SIGNED_MLIR_TYPE_ASM_TO_TORCH_DTYPE.items()):
    IREE_TYPE_ASM_TO_TORCH_DTYPE.setdefault(_s, _d)


def _why_unsupported(dtype: torch.dtype) -> str:
    name = str(dtype)
    if name == "torch.float4_e2m1fn_x2":
        return (
            "it packs two 4-bit floats per byte and no MLIR element type has that layout; "
            "view the tensor as torch.uint8 (t.view(torch.uint8)) and unpack in the program"
        )
    if name.startswith("torch.bits"):
        return "bits dtypes carry no numeric meaning; view the tensor as a uint dtype first"
    if name.startswith(("torch.qint", "torch.quint")):
        return (
            "quantized tensors have no builtin tensor element type; use t.int_repr() and pass "
            "scale/zero point separately (the !torch.vtensor world supports it)"
        )
    return "it is not a numeric dtype IREE knows"


def torch_dtype_to_element_asm(dtype: torch.dtype) -> str:
    """Builtin (signless) element type asm for a torch dtype, e.g. ``"bf16"``, ``"i8"``.

    Raises:
        UnsupportedDtypeError: The dtype has no builtin element type (with the reason).
    """
    try:
        return TORCH_DTYPE_TO_IREE_TYPE_ASM[dtype]
    except (KeyError, TypeError):
        raise UnsupportedDtypeError(
            f"torch dtype {dtype} has no MLIR builtin element type: {_why_unsupported(dtype)}. "
            f"Supported: {', '.join(sorted(str(d) for d in TORCH_DTYPE_TO_IREE_TYPE_ASM))}"
        ) from None


def torch_dtype_to_vtensor_element_asm(dtype: torch.dtype) -> str:
    """``!torch.vtensor`` element asm for a torch dtype, e.g. ``"si64"``, ``"ui8"``, ``"i1"``.

    Raises:
        UnsupportedDtypeError: The dtype has no torch-dialect element type.
    """
    try:
        return TORCH_DTYPE_TO_SIGNED_MLIR_TYPE_ASM[dtype]
    except (KeyError, TypeError):
        raise UnsupportedDtypeError(
            f"torch dtype {dtype} has no !torch.vtensor element type: {_why_unsupported(dtype)}"
        ) from None


def torch_dtype_to_element_type(dtype: torch.dtype, context: ir.Context | None = None) -> ir.Type:
    """The builtin MLIR element :class:`Type` for a torch dtype (signless integers).

    Args:
        dtype: A torch dtype.
        context: MLIR context; defaults to the current one (``with context:``).

    Raises:
        UnsupportedDtypeError: The dtype has no builtin element type.
    """
    from iree.compiler import ir

    return ir.Type.parse(torch_dtype_to_element_asm(dtype), context)


def element_type_to_torch_dtype(element_type: ir.Type | str) -> torch.dtype:
    """The torch dtype of an MLIR element type (builtin or vtensor spelling).

    Signless integers map to signed torch dtypes (``i8 -> torch.int8``), ``i1`` to ``torch.bool``,
    ``ui8`` to ``torch.uint8``.

    Raises:
        UnsupportedDtypeError: No torch dtype corresponds.
    """
    asm = str(element_type)
    dt = IREE_TYPE_ASM_TO_TORCH_DTYPE.get(asm) or SIGNED_MLIR_TYPE_ASM_TO_TORCH_DTYPE.get(asm)
    if dt is None:
        raise UnsupportedDtypeError(
            f"MLIR element type {asm} has no torch dtype; known element types: "
            f"{', '.join(sorted(IREE_TYPE_ASM_TO_TORCH_DTYPE))}"
        )
    return dt


def _dims(shape: Sequence[int | None]) -> list[int | None]:
    out: list[int | None] = []
    for d in shape:
        if d is None or (isinstance(d, int) and d < 0):
            out.append(None)
        elif isinstance(d, int):
            out.append(int(d))
        elif isinstance(d, torch.SymInt):
            # A symbolic dim is dynamic: int(d) would specialize it to its hint and add a guard
            # to the shape environment. Only a SymInt that is really a constant is static.
            out.append(d.node.maybe_as_int())
        else:
            try:
                out.append(int(d))  # numpy ints
            except (TypeError, ValueError):
                out.append(None)
    return out


def tensor_type_asm(shape: Sequence[int | None], dtype: torch.dtype) -> str:
    """Builtin tensor type asm: ``tensor_type_asm([2, None], torch.bfloat16) == "tensor<2x?xbf16>"``.

    ``None`` (or a negative number) is a dynamic dimension.
    """
    elt = torch_dtype_to_element_asm(dtype)
    dims = "".join(f"{'?' if d is None else d}x" for d in _dims(shape))
    return f"tensor<{dims}{elt}>"


def vtensor_type_asm(shape: Sequence[int | None], dtype: torch.dtype) -> str:
    """torch-dialect tensor type asm: ``"!torch.vtensor<[2,?],si64>"``. ``None`` is dynamic."""
    elt = torch_dtype_to_vtensor_element_asm(dtype)
    dims = ",".join("?" if d is None else str(d) for d in _dims(shape))
    return f"!torch.vtensor<[{dims}],{elt}>"


def torch_tensor_type(
    shape: Sequence[int | None], dtype: torch.dtype, context: ir.Context | None = None
) -> ir.RankedTensorType:
    """A builtin :class:`RankedTensorType` for a shape (``None`` = dynamic) and torch dtype."""
    from iree.compiler import ir

    dyn = ir.ShapedType.get_dynamic_size()
    dims = [dyn if d is None else d for d in _dims(shape)]
    elt = torch_dtype_to_element_type(dtype, context)
    return ir.RankedTensorType.get(dims, elt, loc=ir.Location.unknown(elt.context))


def torch_vtensor_type(
    shape: Sequence[int | None], dtype: torch.dtype, context: ir.Context | None = None
) -> ir.Type:
    """The ``!torch.vtensor<[...],elt>`` :class:`Type` (torch dialect; ``None`` = dynamic)."""
    from iree.compiler import ir

    return ir.Type.parse(vtensor_type_asm(shape, dtype), context)
