"""The element type names of IREE's ABI (MLIR's spelling: ``f32``, ``bf16``, ``si64``...) and
the torch dtypes they stand for; torch is imported only to hand out a dtype."""

from __future__ import annotations

import re

__all__ = ["MLIR_TO_TORCH", "TORCH_DTYPE_TO_ABI", "element_bits", "element_type_name"]

# MLIR element type name -> torch dtype name (the ABI declaration uses MLIR names).
MLIR_TO_TORCH: dict[str, str] = {
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "bf16": "bfloat16",
    "f8E4M3FN": "float8_e4m3fn",
    "f8E4M3FNUZ": "float8_e4m3fnuz",
    "f8E5M2": "float8_e5m2",
    "f8E5M2FNUZ": "float8_e5m2fnuz",
    "f8E8M0FNU": "float8_e8m0fnu",
    "i1": "bool",
    "i8": "int8",
    "si8": "int8",
    "ui8": "uint8",
    "i16": "int16",
    "si16": "int16",
    "ui16": "uint16",
    "i32": "int32",
    "si32": "int32",
    "ui32": "uint32",
    "i64": "int64",
    "si64": "int64",
    "ui64": "uint64",
    "complex<f32>": "complex64",
    "complex<f64>": "complex128",
}

# torch-dialect dtype spellings that differ from the builtin ones at the ABI
TORCH_DTYPE_TO_ABI = {"si8": "i8", "si16": "i16", "si32": "i32", "si64": "i64", "ui8": "ui8"}


def element_type_name(mlir_type: str):
    """The torch dtype for an MLIR element type name (``"bf16"`` -> ``torch.bfloat16``).

    Returns None for a name with no torch equivalent.
    """
    import torch

    name = MLIR_TO_TORCH.get(mlir_type)
    return getattr(torch, name, None) if name else None


_ELEMENT_BITS = {"i1": 8, "bf16": 16, "complex<f32>": 64, "complex<f64>": 128}


def element_bits(dtype: str) -> int | None:
    if dtype in _ELEMENT_BITS:
        return _ELEMENT_BITS[dtype]
    m = re.fullmatch(r"(?:[su]?i|f)(\d+)|f(8)E\w+", dtype)
    if not m:
        return None
    return int(m.group(1) or m.group(2))
