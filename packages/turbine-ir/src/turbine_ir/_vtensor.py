"""The torch dialect's ranked tensor type string, ``!torch.vtensor<[2,?],si64>``, parsed and printed.

Every layer that reads a torch-dialect type from IR text (the module builder's type converter,
turbine_aot's rewrites, ABI reader and custom-op expansion) parses it here, so the spelling's
corner cases (``?`` for a dynamic size, ``-1`` as older printers wrote it, spaces, element types
with their own angle brackets such as ``complex<f32>``) are decided once. Pure Python: no MLIR
bindings and no torch are needed to read a type string.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["VtensorType"]

_PREFIX = "!torch.vtensor<["
# A static size: a decimal integer (bounded, so a damaged string cannot make a huge int).
_SIZE = re.compile(r"[0-9]{1,18}")
# An element type: a dialect type name, optionally with bracketed parameters
# (`f32`, `si64`, `ui8`, `complex<f64>`, `!torch.qint8`).
_ELEMENT = re.compile(r"!?[A-Za-z_][\w.]*(<[\w.<>, ]*>)?")


@dataclass(frozen=True)
class VtensorType:
    """A ranked ``!torch.vtensor``: its sizes (``None`` = dynamic) and element type.

    ``dtype`` is the torch dialect's element-type spelling (``f32``, ``si64``, ``ui8``, ``i1``,
    ``bf16``, ``complex<f32>``); map it to a torch dtype with
    :func:`turbine_ir.element_type_to_torch_dtype`.

    Example:
        >>> t = VtensorType.parse("!torch.vtensor<[2,?],si64>")
        >>> t.sizes, t.dtype, t.rank
        ((2, None), 'si64', 2)
        >>> str(t.with_sizes([4, 4]))
        '!torch.vtensor<[4,4],si64>'
        >>> VtensorType.parse("tensor<2xf32>") is None
        True
    """

    sizes: tuple[int | None, ...]
    dtype: str

    def __post_init__(self) -> None:
        sizes = tuple(self.sizes)
        for s in sizes:
            if s is not None and (not isinstance(s, int) or isinstance(s, bool) or s < 0):
                raise ValueError(
                    f"VtensorType sizes are non-negative ints or None (dynamic), got {sizes!r}"
                )
        object.__setattr__(self, "sizes", sizes)

    @classmethod
    def parse(cls, text: str) -> VtensorType | None:
        """The type that ``text`` spells, or ``None`` when it is not a ranked ``!torch.vtensor``.

        Accepts what MLIR prints (``!torch.vtensor<[2,?],f32>``, ``!torch.vtensor<[],si64>``)
        and, leniently, spaces around sizes and the comma and ``-1`` for a dynamic size.
        Unranked (``!torch.vtensor<*,f32>``), unsized (``!torch.vtensor``), other types
        (``tensor<2xf32>``, ``!torch.int``) and damaged strings give ``None``, never an error.
        """
        text = text.strip()
        if not (text.startswith(_PREFIX) and text.endswith(">")):
            return None
        sizes_text, sep, rest = text[len(_PREFIX) : -1].partition("]")
        if not sep:
            return None
        rest = rest.lstrip()
        if not rest.startswith(","):
            return None
        dtype = rest[1:].strip()
        if not _ELEMENT.fullmatch(dtype) or dtype.count("<") != dtype.count(">"):
            return None
        sizes: list[int | None] = []
        if sizes_text.strip():
            for part in sizes_text.split(","):
                part = part.strip()
                if part in ("?", "-1"):
                    sizes.append(None)
                elif _SIZE.fullmatch(part):
                    sizes.append(int(part))
                else:
                    return None
        return cls(tuple(sizes), dtype)

    @classmethod
    def of(cls, value: Any) -> VtensorType | None:
        """The type of an IR value, an IR type, or a type string; ``None`` if not a vtensor.

        An object with a ``type`` attribute (an ``ir.Value``) is read through it; anything else
        through ``str()`` (an ``ir.Type`` prints its assembly).
        """
        if isinstance(value, str):
            return cls.parse(value)
        typ = getattr(value, "type", value)
        return cls.parse(str(typ))

    @property
    def rank(self) -> int:
        return len(self.sizes)

    @property
    def has_static_shape(self) -> bool:
        return all(s is not None for s in self.sizes)

    def with_sizes(self, sizes: Iterable[int | None], dtype: str | None = None) -> VtensorType:
        """This type with other sizes (and optionally another element type)."""
        return VtensorType(tuple(sizes), dtype or self.dtype)

    def asm(self) -> str:
        """The canonical spelling, as MLIR prints it: ``!torch.vtensor<[2,?],si64>``."""
        dims = ",".join("?" if s is None else str(s) for s in self.sizes)
        return f"{_PREFIX}{dims}],{self.dtype}>"

    def __str__(self) -> str:
        return self.asm()
