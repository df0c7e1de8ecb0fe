"""LiveGlobalCollectionProxy: a collection of globals seen from a procedure; item assignment stores.

``self.params["w"] = value`` inside a procedure reaches the proxy, which hands the assignment to
the current trace (``handle_assignment``); reads return the global intrinsics, nested
collections proxied in turn.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ._base import current_ir_trace
from ._errors import ProcedureTraceError

__all__ = ["LiveGlobalCollectionProxy"]


class LiveGlobalCollectionProxy:
    """Proxy object around a collection which knows how to redirect setitem.

    ``proxy[key] = value`` inside a procedure becomes an assignment to the global at ``key``
    (through ``current_ir_trace().handle_assignment``); reading returns the global intrinsic, or
    a proxy for a nested collection.
    """

    __slots__ = ["_raw_collection"]

    def __init__(self, raw_collection: Any):
        self._raw_collection = raw_collection

    @property
    def raw_collection(self) -> Any:
        return self._raw_collection

    @staticmethod
    def unwrap(value: Any) -> Any:
        """``value`` with every proxy replaced by its collection, recursively (in tuples other
        than named tuples, lists and dicts): what a procedure returns or stores."""
        unwrap = LiveGlobalCollectionProxy.unwrap
        if isinstance(value, LiveGlobalCollectionProxy):
            return unwrap(value.raw_collection)
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(unwrap(v) for v in value)
        if isinstance(value, list):
            return [unwrap(v) for v in value]
        if isinstance(value, dict):
            return {k: unwrap(v) for k, v in value.items()}
        return value

    def __getitem__(self, key: Any) -> Any:
        return _wrap_live(self._raw_collection[key])

    def __setitem__(self, key: Any, value: Any) -> None:
        try:
            target = self._raw_collection[key]
        except (KeyError, IndexError):
            raise ProcedureTraceError(
                f"procedure {current_ir_trace().name!r}: no global {key!r} in this collection; "
                f"available: {_keys_text(self._raw_collection)}"
            ) from None
        current_ir_trace().handle_assignment(self, target, value)

    def __getattr__(self, name: str) -> Any:
        # Read-only mapping API of the underlying collection; nested collections come back
        # proxied (as from ``[]``) so that assigning into them still stores the globals.
        if name in ("keys", "index", "count"):
            return getattr(self._raw_collection, name)
        if name == "get":
            return lambda key, default=None: (
                _wrap_live(self._raw_collection[key]) if key in self._raw_collection else default
            )
        if name == "values":
            return lambda: [_wrap_live(v) for v in self._raw_collection.values()]
        if name == "items":
            return lambda: [(k, _wrap_live(v)) for k, v in self._raw_collection.items()]
        raise AttributeError(name)

    def __len__(self) -> int:
        return len(self._raw_collection)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._raw_collection)

    def __contains__(self, key: Any) -> bool:
        return key in self._raw_collection

    def __repr__(self) -> str:
        return f"LiveGlobalCollectionProxy({self._raw_collection!r})"


def _wrap_live(value: Any) -> Any:
    if isinstance(value, (dict, list, tuple)):
        return LiveGlobalCollectionProxy(value)
    return value


def _keys_text(collection: Any) -> str:
    if isinstance(collection, dict):
        return ", ".join(repr(k) for k in collection) or "(none)"
    return f"indices 0..{len(collection) - 1}"
