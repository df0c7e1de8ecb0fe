"""Element types: torch dtype names <-> item sizes, numpy dtypes and safetensors names.

Archives describe tensors with the string ``PYTORCH:`` + JSON whose ``dtype`` is a torch dtype
name without the ``torch.`` prefix (``"float32"``, ``"bfloat16"``), as the reference
``iree.turbine.aot`` writes and reads them; readers also accept the prefixed spelling
(``"torch.float32"``, which earlier turbine archives hold). This table lets the numpy-only path
read and write every such name without importing torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._errors import ParameterArchiveError

__all__ = [
    "METADATA_PREFIX",
    "DTypeInfo",
    "TensorMetadata",
    "dtype_info",
    "dtype_info_for_numpy",
    "dtype_info_for_safetensors",
    "known_dtype_names",
]

METADATA_PREFIX = b"PYTORCH:"


@dataclass(frozen=True)
class DTypeInfo:
    """One element type.

    Attributes:
        name: torch dtype name without the ``torch.`` prefix (``"bfloat16"``).
        itemsize: Bytes per element (as ``torch.dtype.itemsize``).
        numpy: numpy dtype string, or ``None`` when numpy has no such type.
        safetensors: safetensors dtype name, or ``None`` when safetensors has no such type.
        is_floating_point / is_complex / is_signed: as the torch dtype reports them.
    """

    name: str
    itemsize: int
    numpy: str | None
    safetensors: str | None
    is_floating_point: bool = False
    is_complex: bool = False
    is_signed: bool = False

    @property
    def torch_name(self) -> str:
        return f"torch.{self.name}"

    def torch_dtype(self) -> Any:
        """The ``torch.dtype`` (imports torch)."""
        import torch

        dt = getattr(torch, self.name, None)
        if dt is None:
            raise ParameterArchiveError(
                f"dtype {self.torch_name} does not exist in the installed torch "
                f"{torch.__version__}; upgrade torch or read the entry with as_flat_tensor()"
            )
        return dt

    def numpy_dtype(self) -> Any:
        """The numpy dtype; uses ``ml_dtypes`` for bfloat16/float8 when it is installed."""

        if self.numpy is not None:
            return np.dtype(self.numpy)
        import importlib.util

        if importlib.util.find_spec("ml_dtypes") is not None:
            import ml_dtypes

            if hasattr(ml_dtypes, self.name):
                return np.dtype(getattr(ml_dtypes, self.name))
        raise ParameterArchiveError(
            f"numpy has no dtype for torch.{self.name}; use as_tensor() (needs torch), install "
            f"ml_dtypes, or read raw bytes with as_flat_array()"
        )

    def desc(self) -> dict[str, Any]:
        return {
            "class_name": "dtype",
            "is_complex": self.is_complex,
            "is_floating_point": self.is_floating_point,
            "is_signed": self.is_signed,
            "itemsize": self.itemsize,
        }


def _f(name, size, np_name, st):
    return DTypeInfo(name, size, np_name, st, is_floating_point=True, is_signed=True)


_TABLE: list[DTypeInfo] = [
    _f("float64", 8, "<f8", "F64"),
    _f("float32", 4, "<f4", "F32"),
    _f("float16", 2, "<f2", "F16"),
    _f("bfloat16", 2, None, "BF16"),
    _f("float8_e4m3fn", 1, None, "F8_E4M3"),
    _f("float8_e5m2", 1, None, "F8_E5M2"),
    _f("float8_e4m3fnuz", 1, None, "F8_E4M3FNUZ"),
    _f("float8_e5m2fnuz", 1, None, "F8_E5M2FNUZ"),
    DTypeInfo("float8_e8m0fnu", 1, None, "F8_E8M0", is_floating_point=True),
    _f("float4_e2m1fn_x2", 1, None, None),
    DTypeInfo("complex32", 4, None, None, is_complex=True, is_signed=True),
    DTypeInfo("complex64", 8, "<c8", "C64", is_complex=True, is_signed=True),
    DTypeInfo("complex128", 16, "<c16", None, is_complex=True, is_signed=True),
    DTypeInfo("int64", 8, "<i8", "I64", is_signed=True),
    DTypeInfo("int32", 4, "<i4", "I32", is_signed=True),
    DTypeInfo("int16", 2, "<i2", "I16", is_signed=True),
    DTypeInfo("int8", 1, "i1", "I8", is_signed=True),
    DTypeInfo("uint64", 8, "<u8", "U64"),
    DTypeInfo("uint32", 4, "<u4", "U32"),
    DTypeInfo("uint16", 2, "<u2", "U16"),
    DTypeInfo("uint8", 1, "u1", "U8"),
    DTypeInfo("bool", 1, "?", "BOOL"),
    # Sub-byte "shell" dtypes are stored one element per byte by torch.
    *[DTypeInfo(f"int{n}", 1, None, None, is_signed=True) for n in range(1, 8)],
    *[DTypeInfo(f"uint{n}", 1, None, None) for n in range(1, 8)],
    # Raw bit containers.
    DTypeInfo("bits8", 1, None, None),
    DTypeInfo("bits16", 2, None, None),
    DTypeInfo("bits1x8", 1, None, None),
    DTypeInfo("bits2x4", 1, None, None),
    DTypeInfo("bits4x2", 1, None, None),
]
_BY_NAME: dict[str, DTypeInfo] = {d.name: d for d in _TABLE}
# Aliases torch accepts as attribute names.
_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "cfloat": "complex64",
    "cdouble": "complex128",
    "chalf": "complex32",
    "long": "int64",
    "int": "int32",
    "short": "int16",
}
_BY_NUMPY: dict[str, DTypeInfo] = {}
for _d in _TABLE:
    if _d.numpy is not None:
        _BY_NUMPY.setdefault(_d.numpy.lstrip("<|"), _d)
_BY_SAFETENSORS: dict[str, DTypeInfo] = {d.safetensors: d for d in _TABLE if d.safetensors}
_BY_SAFETENSORS["F8_E4M3FN"] = _BY_NAME["float8_e4m3fn"]


def known_dtype_names() -> list[str]:
    """Every supported dtype name, without the ``torch.`` prefix."""
    return [d.name for d in _TABLE]


def dtype_info(name: Any) -> DTypeInfo:
    """Looks up a dtype by torch name (``"torch.float32"``, ``"float32"``) or ``torch.dtype``.

    Raises:
        ParameterArchiveError: the name is not a supported dtype (the message lists them).
    """
    key = str(name)
    if key.startswith("torch."):
        key = key[len("torch.") :]
    key = _ALIASES.get(key, key)
    info = _BY_NAME.get(key)
    if info is None:
        raise ParameterArchiveError(
            f"unknown dtype name {name!r}; expected one of: "
            + ", ".join(f"torch.{n}" for n in known_dtype_names())
        )
    return info


def dtype_info_for_numpy(dtype: Any) -> DTypeInfo:
    """The entry for a numpy dtype (byte order ignored; ml_dtypes types by name)."""

    dt = np.dtype(dtype)
    if dt.kind in "biufc":
        key = dt.newbyteorder("<").str.lstrip("<|") if dt.itemsize > 1 else dt.str.lstrip("<|")
        if dt.kind == "b":
            key = "?"
        info = _BY_NUMPY.get(key)
        if info is not None:
            return info
    info = _BY_NAME.get(dt.name)  # ml_dtypes: bfloat16, float8_e4m3fn, ...
    if info is not None and info.itemsize == dt.itemsize:
        return info
    raise ParameterArchiveError(
        f"numpy dtype {dt} has no parameter-archive equivalent; expected a bool, integer, "
        f"floating or complex dtype (or an ml_dtypes type)"
    )


def dtype_info_for_safetensors(name: str) -> DTypeInfo:
    info = _BY_SAFETENSORS.get(name)
    if info is None:
        raise ParameterArchiveError(
            f"unknown safetensors dtype {name!r}; expected one of: "
            + ", ".join(sorted(_BY_SAFETENSORS))
        )
    return info


@dataclass(frozen=True)
class TensorMetadata:
    """The decoded ``PYTORCH:{json}`` metadata of an entry.

    ``packed`` is set for sub-byte data stored packed (torchao int4 weights, two values per
    byte): ``(logical dtype name, logical shape)``, e.g. ``("int4", (4096, 4096))``, while
    ``dtype``/``shape`` describe the stored bytes (``uint8``, ``(4096, 2048)``).
    """

    dtype: DTypeInfo
    shape: tuple[int, ...]
    packed: tuple[str, tuple[int, ...]] | None = None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def encode(self) -> bytes:
        """``PYTORCH:`` + JSON, the form other tools read (``"dtype": "float32"``, no prefix)."""
        doc = {
            "type": "Tensor",
            "dtype": self.dtype.name,
            "shape": list(self.shape),
            "dtype_desc": self.dtype.desc(),
        }
        if self.packed is not None:
            doc["packed"] = {"dtype": self.packed[0], "shape": list(self.packed[1])}
        return METADATA_PREFIX + json.dumps(doc).encode()

    @staticmethod
    def decode(raw: bytes) -> TensorMetadata | None:
        """Parses metadata; ``None`` when it is not ``PYTORCH:`` tensor metadata.

        Raises:
            ParameterArchiveError: it is ``PYTORCH:`` metadata but malformed or of an unknown dtype
            (without file context; callers add it).
        """
        if not raw.startswith(METADATA_PREFIX):
            return None
        try:
            doc = json.loads(raw[len(METADATA_PREFIX) :].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ParameterArchiveError(f"PYTORCH metadata is not valid UTF-8 JSON ({e})") from e
        if not isinstance(doc, dict) or doc.get("type", "Tensor") != "Tensor":
            return None
        dtype = doc.get("dtype")
        shape = doc.get("shape")
        if not isinstance(dtype, str):
            raise ParameterArchiveError(f"PYTORCH metadata has no string 'dtype' (got {dtype!r})")
        if (
            not isinstance(shape, list)
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
            or len(shape) > 64
        ):
            raise ParameterArchiveError(
                f"PYTORCH metadata 'shape' must be a list of non-negative ints, got {shape!r}"
            )
        md = TensorMetadata(dtype_info(dtype), tuple(shape), _decode_packed(doc.get("packed")))
        if md.packed is not None:
            logical = 1
            for s in md.packed[1]:
                logical *= s
            if logical * _PACKED_BITS[md.packed[0]] != md.nbytes * 8:
                raise ParameterArchiveError(
                    f"PYTORCH metadata: packed {md.packed[0]}{list(md.packed[1])} does not fill "
                    f"the stored {md.dtype.name}{list(md.shape)} ({md.nbytes} bytes)"
                )
        return md


_PACKED_BITS = {"int4": 4, "uint4": 4}


def _decode_packed(packed: Any) -> tuple[str, tuple[int, ...]] | None:
    """The ``packed`` member (sub-byte data stored packed), checked; ``None`` when absent."""
    if packed is None:
        return None
    dtype = packed.get("dtype") if isinstance(packed, dict) else None
    shape = packed.get("shape") if isinstance(packed, dict) else None
    if (
        dtype not in _PACKED_BITS
        or not isinstance(shape, list)
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
        or len(shape) > 64
    ):
        raise ParameterArchiveError(
            f"PYTORCH metadata 'packed' must be {{'dtype': one of {sorted(_PACKED_BITS)}, "
            f"'shape': [non-negative ints]}}, got {packed!r}"
        )
    return dtype, tuple(shape)
