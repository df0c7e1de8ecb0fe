"""Which IR value or symbol each Python object became, so that each is materialized once.

A :class:`RefTracker` maps objects (by identity, and tensors also by the storage they view, so
tied weights share one entry) to a :class:`RefMapping` whose ``value`` starts as :data:`Empty`.
The module builder keeps one for globals and one for the FX importer's literal values.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Empty", "EmptyType", "RefMapping", "RefTracker", "tensor_storage_key"]


class EmptyType:
    """Type of the :data:`Empty` marker (no value associated yet)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Empty"


#: Marker for "no value yet" in a :class:`RefMapping`.
Empty: Any = EmptyType()


class RefMapping:
    """The IR value/symbol associated with one tracked Python object (``value`` is ``Empty`` first)."""

    __slots__ = ("referrent", "value")

    def __init__(self, referrent: Any):
        self.referrent = referrent
        self.value: Any = Empty

    @property
    def is_empty(self) -> bool:
        return self.value is Empty

    def __repr__(self) -> str:
        return f"<RefMapping {type(self.referrent).__name__} -> {self.value!r}>"


def tensor_storage_key(t: torch.Tensor) -> tuple | None:
    """A key equal for two tensors that view the same elements of the same storage, or ``None``.

    ``(storage data_ptr, storage_offset, shape, stride, dtype, device, is_conj, is_neg)``: tied
    weights (one ``Parameter`` under two names, ``t`` and ``t.detach()``) share it; ``t.conj()``
    does not. Tensors without real storage (meta, fake, empty) get ``None`` and are tracked by
    identity only.
    """
    if not isinstance(t, torch.Tensor) or t.is_meta or t.numel() == 0:
        return None
    try:
        from torch._subclasses.fake_tensor import is_fake

        if is_fake(t):
            return None
        ptr = t.untyped_storage().data_ptr()
    except Exception:
        return None
    if not ptr:
        return None
    # Conjugate/negative views share the storage but not the values: they must not tie.
    return (
        ptr,
        t.storage_offset(),
        tuple(t.shape),
        tuple(t.stride()),
        t.dtype,
        str(t.device),
        t.is_conj(),
        t.is_neg(),
    )


class RefTracker:
    """Tracks Python objects → their IR association, so each is materialized once.

    Objects are keyed by identity; tensors additionally by :func:`tensor_storage_key`, so two
    tensor objects viewing the same storage (tied weights) share one mapping. Tracked objects
    are kept alive for the tracker's lifetime (an ``id()`` must not be reused while tracked).
    Compatible with ``iree.compiler.extras.fx_importer``'s ``py_attr_tracker`` protocol.
    """

    __slots__ = ("_alive", "_by_id", "_by_storage")

    def __init__(self) -> None:
        self._by_id: dict[int, RefMapping] = {}
        self._by_storage: dict[tuple, RefMapping] = {}
        self._alive: list[Any] = []  # strong refs: an id() must not be reused while tracked

    def track(self, referrent: Any) -> RefMapping:
        """The mapping for ``referrent`` (created empty on first sight)."""
        existing = self._by_id.get(id(referrent))
        if existing is not None:
            return existing
        key = tensor_storage_key(referrent) if isinstance(referrent, torch.Tensor) else None
        mapping = self._by_storage.get(key) if key is not None else None
        if mapping is None:
            mapping = RefMapping(referrent)
            if key is not None:
                self._by_storage[key] = mapping
        self._by_id[id(referrent)] = mapping
        self._alive.append(referrent)
        return mapping

    def lookup(self, referrent: Any) -> RefMapping | None:
        """The mapping for ``referrent`` if tracked (by identity or storage), else ``None``."""
        existing = self._by_id.get(id(referrent))
        if existing is not None:
            return existing
        key = tensor_storage_key(referrent) if isinstance(referrent, torch.Tensor) else None
        return self._by_storage.get(key) if key is not None else None

    def __len__(self) -> int:
        return len(self._by_id)

    def __bool__(self) -> bool:
        # Always truthy: callers write `py_attr_tracker or RefTracker()` (the FX importer does),
        # which must not replace an empty tracker.
        return True
