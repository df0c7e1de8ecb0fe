"""Reading archives: ``ParameterArchive`` and its entries as numpy arrays or torch tensors."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ._dtypes import TensorMetadata
from ._errors import ParameterArchiveError
from ._index import ParameterIndex, ParameterIndexEntry, check_splat_size

__all__ = ["ParameterArchive", "ParameterArchiveEntry"]


class ParameterArchiveEntry:
    """Wraps a raw :class:`ParameterIndexEntry` with helpers to view it as an array or tensor.

    ``as_flat_array`` / ``as_array`` return numpy arrays (no torch needed); ``as_flat_tensor`` /
    ``as_tensor`` return torch tensors. Entries of an archive opened with ``mmap=True`` are views of
    the mapping (zero-copy); read-only archives are mapped copy-on-write, so writing into such a
    view changes only this process's memory.
    """

    __slots__ = ("_md", "_md_done", "raw")

    def __init__(self, raw: ParameterIndexEntry):
        self.raw = raw
        self._md: TensorMetadata | None = None
        self._md_done = False

    @property
    def key(self) -> str:
        return self.raw.key

    @property
    def metadata(self) -> bytes:
        """The raw metadata bytes (``b""`` when none)."""
        return self.raw.metadata

    @property
    def length(self) -> int:
        """Length of the entry's data in bytes."""
        return self.raw.length

    @property
    def entry_type(self) -> str:
        """``"data"``, ``"splat"``, ``"external"`` or ``"buffer"``."""
        return self.raw.entry_type

    @property
    def is_splat(self) -> bool:
        return self.raw.is_splat

    @property
    def splat_pattern(self) -> bytes | None:
        """A splat's pattern (1-16 bytes, repeated to :attr:`length`), else ``None``."""
        return self.raw.splat_pattern

    @property
    def splat_value(self) -> np.ndarray | None:
        """A splat's repeated value, without expanding it: a 1-D numpy array of the entry's
        dtype holding the elements that repeat (usually one), or ``None`` for other entries.

        With :attr:`shape`, this describes the tensor whatever its size: ``np.full(shape,
        value)`` is what :meth:`as_array` would give. Entries without tensor metadata (or of a
        dtype numpy lacks) give the pattern as uint8.

        Raises:
            ParameterArchiveError: the tensor metadata is malformed.
        """
        pattern = self.raw.splat_pattern
        if pattern is None:
            return None
        md = self.tensor_metadata
        if md is not None:
            try:
                np_dtype = md.dtype.numpy_dtype()
            except (ParameterArchiveError, TypeError, ValueError):
                np_dtype = None
            if np_dtype is not None:
                unit = _splat_unit(pattern, md.dtype.itemsize)
                if unit is not None and len(unit) % np.dtype(np_dtype).itemsize == 0:
                    return np.frombuffer(unit, dtype=np_dtype).copy()
        return np.frombuffer(pattern, dtype=np.uint8).copy()

    def _where(self) -> dict[str, Any]:
        return {"path": self.raw.origin, "offset": self.raw.entry_offset}

    @property
    def tensor_metadata(self) -> TensorMetadata | None:
        """Decoded ``PYTORCH:`` metadata, or ``None`` when the entry has none.

        Raises:
            ParameterArchiveError: the metadata is malformed or names an unknown dtype.
        """
        if not self._md_done:
            try:
                self._md = TensorMetadata.decode(self.raw.metadata)
            except ParameterArchiveError as e:
                raise ParameterArchiveError(
                    f"entry {self.key!r}: {e.reason}", **self._where()
                ) from None
            self._md_done = True
        return self._md

    @property
    def dtype_name(self) -> str | None:
        md = self.tensor_metadata
        return md.dtype.torch_name if md else None

    @property
    def shape(self) -> tuple[int, ...] | None:
        md = self.tensor_metadata
        return md.shape if md else None

    def _require_md(self) -> TensorMetadata:
        md = self.tensor_metadata
        if md is None:
            raise ParameterArchiveError(
                f"entry {self.key!r} has no PYTORCH tensor metadata (dtype/shape); read its bytes "
                f"with as_flat_tensor() / as_flat_array()",
                **self._where(),
            )
        if md.nbytes != self.length:
            raise ParameterArchiveError(
                f"entry {self.key!r}: metadata says {md.dtype.torch_name}{list(md.shape)} "
                f"({md.nbytes} bytes) but the entry holds {self.length} bytes",
                **self._where(),
            )
        return md

    # ---- numpy ----------------------------------------------------------------------------

    def as_flat_array(self) -> np.ndarray:
        """The contents as a flat uint8 numpy array (a view of the file or the splat pattern).

        Raises:
            ParameterArchiveError: a splat of a multi-byte pattern whose expansion would take
                more than :func:`~turbine_params.max_splat_bytes` (read :attr:`splat_value`).
        """
        return self.raw.flat_array()

    def as_array(self) -> np.ndarray:
        """A numpy array with dtype/shape from the metadata.

        Raises:
            ValueError: (``ParameterArchiveError``) no tensor metadata, a size mismatch, or a
                dtype numpy lacks (bfloat16/float8 need ``ml_dtypes``; or use :meth:`as_tensor`).
        """
        md = self._require_md()
        np_dtype = md.dtype.numpy_dtype()
        unit = _splat_unit(self.raw.splat_pattern, md.dtype.itemsize)
        if unit is not None:
            values = np.frombuffer(unit, dtype=np_dtype)
            check_splat_size(self.raw, self.length, expand=len(values) != 1)
            if len(values) == 1:
                return np.broadcast_to(values.reshape(()), md.shape)
            return np.tile(values, md.numel // len(values)).reshape(md.shape)
        return self.as_flat_array().view(np_dtype).reshape(md.shape)

    # ---- torch ----------------------------------------------------------------------------

    def as_flat_tensor(self) -> Any:
        """The contents as a flat uint8 torch tensor.

        A view of the mapped file for data entries (zero-copy with ``mmap=True``); for a splat, a
        view of the pattern when it is one byte, else the pattern repeated.

        Raises:
            ImportError: torch is not installed (turbine-params alone needs numpy only; use
                :meth:`as_flat_array`).
        """
        torch = _import_torch("as_flat_tensor", "as_flat_array")

        raw = self.raw
        if raw.length == 0:
            return torch.empty(0, dtype=torch.uint8)
        if raw.splat_pattern is not None:
            pattern = torch.frombuffer(bytearray(raw.splat_pattern), dtype=torch.uint8)
            check_splat_size(raw, raw.length, expand=len(raw.splat_pattern) != 1)
            if len(raw.splat_pattern) == 1:
                return pattern.expand(raw.length)
            return pattern.repeat(raw.length // len(raw.splat_pattern))
        f = raw.file
        if f is not None and f.mapping is not None:
            f.check(raw.offset, raw.length, f"entry {raw.key!r}")
            return torch.frombuffer(
                f.mapping, dtype=torch.uint8, count=raw.length, offset=raw.offset
            )
        arr = raw.flat_array()
        if not arr.flags.writeable:
            arr = arr.copy()
        return torch.from_numpy(arr)

    def as_tensor(self) -> Any:
        """A torch tensor viewed with the dtype and shape from the metadata (zero-copy when
        mapped; a splat is an expanded view of its value when the pattern makes one element,
        e.g. IREE's 1-byte strip pattern over float32, else the pattern repeated).

        Raises:
            ValueError: (``ParameterArchiveError``) the entry has no tensor metadata, its
                metadata disagrees with its length, or names an unknown dtype.
            ImportError: torch is not installed (use :meth:`as_array`; bfloat16 and bool
                entries read as raw bytes with :meth:`as_flat_array`).
        """
        torch = _import_torch("as_tensor", "as_array")

        md = self._require_md()
        dtype = md.dtype.torch_dtype()
        unit = _splat_unit(self.raw.splat_pattern, md.dtype.itemsize)
        if unit is not None:
            values = torch.frombuffer(bytearray(unit), dtype=torch.uint8).view(dtype)
            check_splat_size(self.raw, self.length, expand=values.numel() != 1)
            if values.numel() == 1:
                return values.reshape(()).expand(md.shape)
            return values.repeat(md.numel // values.numel()).reshape(md.shape)
        if self.length == 0:
            return torch.empty(md.shape, dtype=dtype)
        return self.as_flat_tensor().view(dtype).reshape(md.shape)

    def __repr__(self) -> str:
        try:
            md = self.tensor_metadata
        except ParameterArchiveError:
            md = None
        desc = f"{md.dtype.name}{list(md.shape)}" if md else f"{self.length} bytes"
        return f"<ParameterArchiveEntry {self.key!r} {self.entry_type} {desc}>"


def _import_torch(method: str, numpy_method: str) -> Any:
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            f"ParameterArchiveEntry.{method}() needs torch, which is not installed; install "
            f"torch, or read the entry as a numpy array with {numpy_method}()"
        ) from e
    return torch


def describe_keys(keys: list[str]) -> str:
    """``"N keys: 'a', 'b', ..."`` (the first ten), for messages about a wrong key."""
    shown = ", ".join(repr(k) for k in keys[:10]) + (" ..." if len(keys) > 10 else "")
    return f"{len(keys)} keys: {shown}"


def _splat_unit(pattern: bytes | None, itemsize: int) -> bytes | None:
    """A splat's pattern repeated to whole elements (``None`` for non-splats).

    Patterns and item sizes are powers of two, so either the pattern fills one element when
    repeated (IREE's ``--strip`` writes a 1-byte zero pattern over any dtype) or it holds a
    whole number of elements.
    """
    if pattern is None:
        return None
    return pattern * max(1, itemsize // len(pattern))


class ParameterArchive:
    """Read access to parameter archives as CPU tensors or numpy arrays.

    Opening parses only the entry tables (milliseconds for ten thousand entries); data is touched
    when an entry is viewed. ``items()`` lists every entry in file order (duplicated keys kept);
    mapping access (``archive[key]``, ``key in archive``, ``keys()``, ``len``) uses the first
    entry of each key.

    Args:
        file_path: An .irpa file to load (more can be added with :meth:`load`).
        mmap: Map the file and hand out zero-copy views (default); ``False`` reads on access.
        readable: Kept for API compatibility (archives are always readable).
        writable: Map shared and writable: writes into tensors go to the file. Otherwise the
            mapping is copy-on-write and the file never changes.

    Example:
        >>> with ParameterArchive("weights.irpa") as archive:  # doctest: +SKIP
        ...     w = archive["fc.weight"].as_tensor()
    """

    def __init__(
        self,
        file_path: str | Path | None = None,
        *,
        mmap: bool = True,
        readable: bool = True,
        writable: bool = False,
    ):
        self._index = ParameterIndex()
        self._items: list[tuple[str, ParameterArchiveEntry]] | None = None
        self._by_key: dict[str, int] | None = None
        self._cache: dict[int, ParameterArchiveEntry] = {}
        if file_path is not None:
            self.load(file_path, mmap=mmap, readable=readable, writable=writable)

    def load(
        self,
        file_path: str | Path,
        *,
        mmap: bool = True,
        readable: bool = True,
        writable: bool = False,
    ) -> None:
        """Loads index entries from a file, adding them to the in-memory archive.

        Raises:
            ParameterArchiveError: missing or malformed file (names the file and byte offset).
        """
        self._index.load(os.fspath(file_path), mmap=mmap, readable=readable, writable=writable)
        self._items = None
        self._by_key = None
        self._cache = {}

    @property
    def index(self) -> ParameterIndex:
        """The underlying :class:`ParameterIndex` (``.to_iree()`` converts it for IREE)."""
        return self._index

    def items(self) -> list[tuple[str, ParameterArchiveEntry]]:
        """Returns the items in the archive, in file order.

        Note that there can be duplicates if the archive was constructed that way.
        """
        if self._items is None:
            self._items = [(e.key, ParameterArchiveEntry(e)) for e in self._index]
            for pos, entry in self._cache.items():  # keep objects already handed out
                self._items[pos] = (entry.key, entry)
        return list(self._items)

    def _lookup(self) -> dict[str, int]:
        # key -> position of its first entry; built from the keys alone (no entry objects), so
        # a lookup in a freshly opened large archive stays cheap.
        if self._by_key is None:
            d: dict[str, int] = {}
            for i, k in enumerate(self._index.keys()):
                d.setdefault(k, i)
            self._by_key = d
        return self._by_key

    def keys(self) -> list[str]:
        """Distinct keys in file order."""
        return list(self._lookup())

    def __getitem__(self, key: str) -> ParameterArchiveEntry:
        try:
            pos = self._lookup()[key]
        except KeyError:
            raise KeyError(
                f"no parameter {key!r} in the archive ({describe_keys(self.keys())})"
            ) from None
        if self._items is not None:
            return self._items[pos][1]
        entry = self._cache.get(pos)
        if entry is None:
            entry = self._cache[pos] = ParameterArchiveEntry(self._index.entry(pos))
        return entry

    def get(self, key: str, default: Any = None) -> ParameterArchiveEntry | Any:
        return self[key] if key in self._lookup() else default

    def __contains__(self, key: object) -> bool:
        return key in self._lookup()

    def __len__(self) -> int:
        return len(self._lookup())

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def close(self) -> None:
        """Closes the files; tensors still viewing a mapping keep it alive until freed."""
        self._index.close()

    def __enter__(self) -> ParameterArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
