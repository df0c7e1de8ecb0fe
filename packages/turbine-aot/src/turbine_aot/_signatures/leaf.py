"""One leaf of a recorded argument or result tree: where it is, what kind of value, its flat
index, dtype and shape (:class:`Leaf`), and the check of a leaf read from a record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Dim", "Leaf", "check_leaf_record", "value_text"]

Dim = int | str | None  # a static size, a symbol / expression, or unknown


@dataclass(frozen=True)
class Leaf:
    """One leaf of an argument or result tree.

    Attributes:
        path: where it is, as Python would write it: ``x``, ``inputs['ids']``, ``[1][0]``.
        kind: ``"tensor"``, ``"scalar"`` (a Python number passed to the function) or
            ``"constant"`` (specialized at export: not an argument/result of the function).
        index: the compiled function's argument (or result) index; None for a constant.
        dtype: the MLIR element type (tensors) or scalar type.
        shape: per dimension an int, a symbol/expression string (dynamic), or None (dynamic,
            unnamed).
        value: a constant's value (JSON).
        device: the ``iree.abi.affinity`` device name of an argument, if any.
    """

    path: str
    kind: str
    index: int | None = None
    dtype: str | None = None
    shape: tuple[Dim, ...] = ()
    value: Any = None
    device: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "kind": self.kind}
        if self.index is not None:
            out["index"] = self.index
        if self.dtype is not None:
            out["dtype"] = self.dtype
        if self.kind == "tensor":
            out["shape"] = list(self.shape)
        if self.kind == "constant":
            out["value"] = self.value
        if self.device is not None:
            out["device"] = self.device
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Leaf:
        return cls(
            path=str(d["path"]),
            kind=str(d["kind"]),
            index=d.get("index"),
            dtype=d.get("dtype"),
            shape=tuple(d.get("shape", ())),
            value=d.get("value"),
            device=d.get("device"),
        )

    def type_text(self, symbols: bool = False) -> str:
        """``tensor<?x4xf32>`` (with ``symbols``, dynamic dims by symbol: ``tensor<s0x4xf32>``)."""
        if self.kind == "constant":
            return f"constant {value_text(self.value)}"
        if self.kind != "tensor":
            return str(self.dtype)
        dims = "x".join(
            str(d) if isinstance(d, int) or (symbols and d is not None) else "?" for d in self.shape
        )
        return f"tensor<{dims + 'x' if dims else ''}{self.dtype}>"


_LEAF_KINDS = ("tensor", "scalar", "constant")


def check_leaf_record(where: str, leaf: Leaf) -> None:
    if leaf.kind not in _LEAF_KINDS:
        raise ValueError(f"{where}.kind is {leaf.kind!r}, not one of {', '.join(_LEAF_KINDS)}")
    if leaf.kind == "constant":
        if leaf.index is not None:
            raise ValueError(f"{where}: a constant has no flat index")
    elif type(leaf.index) is not int or leaf.index < 0:
        raise TypeError(f"{where}.index is {leaf.index!r}, not a flat index")
    for field_name in ("dtype", "device"):
        value = getattr(leaf, field_name)
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{where}.{field_name} is {type(value).__name__}, not a string")
    if leaf.kind == "tensor" and leaf.dtype is None:
        raise ValueError(f"{where}: a tensor without dtype")
    for d, dim in enumerate(leaf.shape):
        if dim is not None and not isinstance(dim, str) and (type(dim) is not int or dim < 0):
            raise TypeError(f"{where}.shape[{d}] is {dim!r}, not a size or a symbol")


def value_text(value: Any) -> str:
    """A recorded JSON value as Python writes it (``None``, ``True``, ``3``, ``'a'``)."""
    return repr(value)
