"""Our own parameter index: named entries backed by a file range, a splat or a host buffer."""

from __future__ import annotations

import importlib
import mmap as _mmap
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ._dtypes import TensorMetadata
from ._errors import ParameterArchiveError
from ._irpa_format import EntryType, RawEntry
from ._irpa_parser import parse_archive
from ._irpa_vectorized import EntryTable
from ._safetensors import read_safetensors_header
from ._sources import host_bytes, host_nbytes

__all__ = [
    "MAX_SPLAT_BYTES_ENV",
    "MappedFile",
    "ParameterIndex",
    "ParameterIndexEntry",
    "max_splat_bytes",
]

#: Environment variable that sets the most bytes expanding one splat may allocate.
MAX_SPLAT_BYTES_ENV = "TURBINE_PARAMS_MAX_SPLAT_BYTES"
_MAX_VIEW_BYTES = 2**63 - 1  # numpy/torch sizes are signed 64-bit


def max_splat_bytes() -> int:
    """The most bytes that expanding (materializing) one splat entry may allocate.

    ``$TURBINE_PARAMS_MAX_SPLAT_BYTES`` when set (an integer; ``0`` refuses every expansion),
    else half the memory available now (``MemAvailable`` of ``/proc/meminfo``; elsewhere the
    free physical memory), so that one expansion cannot push the machine into the OOM killer. A splat is stored as a pattern of 1-16 bytes plus a length, so an archive
    of a few kilobytes can declare terabytes; zero-copy views of a one-element pattern
    (``as_flat_array`` of a 1-byte pattern, ``as_array``/``as_tensor`` of a one-element value)
    allocate nothing and are not limited.
    """
    env = os.environ.get(MAX_SPLAT_BYTES_ENV)
    if env is not None:
        try:
            return max(0, int(env))
        except ValueError:
            raise ParameterArchiveError(
                f"${MAX_SPLAT_BYTES_ENV} is {env!r}; expected a number of bytes"
            ) from None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 2
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (OSError, ValueError, AttributeError):
        return _MAX_VIEW_BYTES


def check_splat_size(entry: ParameterIndexEntry, nbytes: int, *, expand: bool) -> None:
    """Raises before a splat is viewed (``expand=False``: only the 64-bit size limit) or
    expanded into ``nbytes`` of new memory (``expand=True``: :func:`max_splat_bytes`)."""
    pattern = (entry.splat_pattern or b"").hex()
    how = (
        "read its value without expanding it with entry.splat_value (and entry.shape), or "
        "view it: a one-element pattern expands to a zero-copy view"
    )
    if entry.length > _MAX_VIEW_BYTES:
        raise ParameterArchiveError(
            f"entry {entry.key!r} is a splat (pattern 0x{pattern}) of {entry.length} bytes, more "
            f"than any array can hold (2**63 - 1); {how}",
            path=entry.origin,
            offset=entry.entry_offset,
        )
    if expand:
        limit = max_splat_bytes()
        if nbytes > limit:
            raise ParameterArchiveError(
                f"entry {entry.key!r} is a splat (pattern 0x{pattern}) of {entry.length} bytes: "
                f"expanding it needs {nbytes} bytes of memory, over the limit of {limit} (half the "
                f"memory available now, or ${MAX_SPLAT_BYTES_ENV}); {how}",
                path=entry.origin,
                offset=entry.entry_offset,
            )


class MappedFile:
    """An open file, memory-mapped (zero-copy views) or read with ``pread`` (copies).

    Read-only files are mapped copy-on-write (``MAP_PRIVATE``): writing into a tensor obtained from
    them changes only this process's copy, never the file, and never faults.
    """

    def __init__(self, path: str | os.PathLike, *, mmap: bool = True, writable: bool = False):
        self.path = os.fspath(path)
        self.writable = writable
        flags = os.O_RDWR if writable else os.O_RDONLY
        try:
            self.fd = os.open(self.path, flags | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise ParameterArchiveError(
                f"cannot open ({e.strerror}); check the path and permissions", path=self.path
            ) from e
        st = os.fstat(self.fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(self.fd)
            self.fd = -1
            raise ParameterArchiveError(
                "not a regular file; expected an .irpa (or .safetensors) file", path=self.path
            )
        self.size = st.st_size
        self.mapping: _mmap.mmap | None = None
        if mmap and self.size > 0:
            access = _mmap.ACCESS_WRITE if writable else _mmap.ACCESS_COPY
            self.mapping = _mmap.mmap(self.fd, self.size, access=access)

    def check(self, offset: int, length: int, what: str) -> None:
        if self.fd < 0 and self.mapping is None:
            raise ParameterArchiveError(
                f"cannot read {what}: the archive was closed; open it again (or read entries "
                f"before close())",
                path=self.path,
            )
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ParameterArchiveError(
                f"{what} [{offset}, {offset + length}) extends past the end of the file "
                f"(size {self.size}); the file is truncated",
                path=self.path,
                offset=offset,
            )

    def read(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset`` (a copy)."""
        self.check(offset, length, "read")
        if self.mapping is not None:
            return self.mapping[offset : offset + length]
        return os.pread(self.fd, length, offset)

    def flat_array(self, offset: int, length: int) -> np.ndarray:
        """A uint8 array of the range: a view of the mapping, or a fresh copy without one."""
        self.check(offset, length, "data")
        if self.mapping is not None:
            return np.frombuffer(self.mapping, dtype=np.uint8, count=length, offset=offset)
        out = np.empty(length, dtype=np.uint8)
        view = memoryview(out.data)
        done = 0
        while done < length:
            n = os.preadv(self.fd, [view[done:]], offset + done)
            if n <= 0:
                raise ParameterArchiveError(
                    "unexpected end of file while reading", path=self.path, offset=offset + done
                )
            done += n
        return out

    def close(self) -> None:
        if self.mapping is not None:
            try:
                self.mapping.close()
            except BufferError:
                # Views of it are still alive (tensors handed out); it closes when they die.
                pass
            else:
                self.mapping = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        try:
            if getattr(self, "fd", -1) >= 0:
                os.close(self.fd)
        except OSError:
            pass


class ParameterIndexEntry:
    """One named parameter: ``key``, ``metadata`` bytes, ``length`` and its storage.

    Storage is one of: a range of a file (``is_file``; DATA entries of an archive, or EXTERNAL
    entries resolved to their file), a repeated ``splat_pattern`` (``is_splat``), or a host
    ``buffer`` (``is_buffer``; what a builder holds before saving).
    """

    __slots__ = (
        "_buffer",
        "entry_offset",
        "entry_type",
        "file",
        "key",
        "length",
        "metadata",
        "minimum_alignment",
        "offset",
        "origin",
        "splat_pattern",
    )

    def __init__(
        self,
        key: str,
        metadata: bytes,
        length: int,
        *,
        entry_type: str,
        file: MappedFile | None = None,
        offset: int = 0,
        splat_pattern: bytes | None = None,
        buffer: Any = None,
        entry_offset: int | None = None,
        minimum_alignment: int = 0,
        origin: str | None = None,
    ):
        self.key = key
        self.metadata = bytes(metadata)
        self.length = int(length)
        self.entry_type = entry_type  # "data" | "external" | "splat" | "buffer"
        self.file = file
        self.offset = int(offset)
        self.splat_pattern = splat_pattern
        self._buffer = buffer
        self.entry_offset = entry_offset
        self.minimum_alignment = minimum_alignment
        # The archive the entry was read from (for error messages), if any.
        self.origin = origin if origin is not None else (file.path if file is not None else None)

    @property
    def is_file(self) -> bool:
        return self.file is not None

    @property
    def is_splat(self) -> bool:
        return self.splat_pattern is not None

    @property
    def is_buffer(self) -> bool:
        return self._buffer is not None

    @property
    def buffer(self) -> Any:
        """The host object backing a buffer entry (a numpy array or torch tensor), else None."""
        return self._buffer

    @property
    def file_storage(self) -> tuple[str, int]:
        """``(path, offset)`` of a file-backed entry."""
        if self.file is None:
            raise ParameterArchiveError(f"entry {self.key!r} is not backed by a file")
        return self.file.path, self.offset

    @property
    def file_view(self) -> memoryview:
        """The entry's bytes as a read-only ``memoryview`` (format ``"B"``), as in
        ``iree.runtime.ParameterIndexEntry``: zero-copy over the mapping of an archive opened
        with ``mmap=True`` (a copy read from the file otherwise).

        Raises:
            ParameterArchiveError: (a ``ValueError``) the entry is not file-backed (a splat).
        """
        if self.file is None:
            raise ParameterArchiveError(
                f"entry {self.key!r} is not file storage based ({self.entry_type}); check "
                f"is_file first, or use flat_array()"
            )
        return memoryview(self.file.flat_array(self.offset, self.length)).toreadonly()  # type: ignore[arg-type]

    def flat_array(self) -> np.ndarray:
        """The entry's bytes as a flat uint8 numpy array (a view where possible)."""
        if self.file is not None:
            return self.file.flat_array(self.offset, self.length)
        if self.splat_pattern is not None:
            pattern = np.frombuffer(self.splat_pattern, dtype=np.uint8)
            reps = self.length // len(pattern)
            # A 1-byte pattern is a zero-copy view; a longer one is expanded (a copy).
            check_splat_size(self, self.length, expand=len(pattern) > 1)
            if len(pattern) == 1:
                return np.broadcast_to(pattern, (self.length,))
            return np.broadcast_to(pattern, (reps, len(pattern))).reshape(-1)

        return host_bytes(self._buffer)

    def __repr__(self) -> str:
        if self.file is not None:
            where = f"{self.file.path}:{self.offset}"
        elif self.splat_pattern is not None:
            where = f"splat {self.splat_pattern!r}"
        else:
            where = "buffer"
        return f"<ParameterIndexEntry {self.key!r} {self.entry_type} {where}:{self.length}>"


class ParameterIndex:
    """An ordered list of parameter entries (duplicated keys allowed, as in IREE's index).

    Load archives into it, add entries, save it as an archive, or convert it to an
    ``iree.runtime.ParameterIndex`` with :meth:`to_iree` when the runtime is installed.
    """

    def __init__(self) -> None:
        self._done: list[ParameterIndexEntry] = []
        # Entry tables parsed but not yet turned into entry objects (done on first access, so
        # that opening a large archive costs only the vectorized parse).
        self._pending: list[tuple[MappedFile, EntryTable]] = []
        self._files: list[MappedFile] = []
        self._raw: list[tuple[MappedFile, RawEntry | EntryTable]] = []

    def _materialize(self) -> None:
        if self._pending:
            for f, table in self._pending:
                self._done.extend(_entries_from_table(f, table))
            self._pending.clear()

    @property
    def _entries(self) -> list[ParameterIndexEntry]:
        self._materialize()
        return self._done

    def __len__(self) -> int:
        n = len(self._done)
        for _, t in self._pending:
            n += int((t.type != EntryType.SKIP).sum())
        return n

    def __iter__(self) -> Iterator[ParameterIndexEntry]:
        return iter(self._entries)

    def keys(self) -> list[str]:
        """Every key in order (duplicates included), without creating entry objects."""
        out = [e.key for e in self._done]
        for _, t in self._pending:
            keys = t.keys()
            out.extend(k for k, ty in zip(keys, t.type.tolist()) if ty != EntryType.SKIP)
        return out

    def entry(self, position: int) -> ParameterIndexEntry:
        """The entry at ``position`` (as in :meth:`keys`), created alone if not yet built."""
        if position < len(self._done):
            return self._done[position]
        position -= len(self._done)
        for f, t in self._pending:
            rows = np.flatnonzero(t.type != EntryType.SKIP)
            if position < len(rows):
                i = int(rows[position])
                o, n = int(t.name_off[i]), int(t.name_len[i])
                return _entry_from_row(f, t, i, t.metadata[o : o + n].decode("ascii"))
            position -= len(rows)
        raise IndexError(position)

    def items(self) -> list[tuple[str, ParameterIndexEntry]]:
        """``(key, entry)`` pairs in insertion (file) order, duplicates included."""
        return [(e.key, e) for e in self._entries]

    @property
    def raw_entries(self) -> list[tuple[str, RawEntry]]:
        """Every entry table record loaded from files, SKIP entries included: (path, record)."""
        out: list[tuple[str, RawEntry]] = []
        for f, r in self._raw:
            if isinstance(r, EntryTable):
                out.extend((f.path, x) for x in r.raw_entries())
            else:
                out.append((f.path, r))
        return out

    def add(self, entry: ParameterIndexEntry) -> None:
        self._entries.append(entry)

    def add_buffer(self, key: str, buffer: Any, *, metadata: bytes | str | None = None) -> None:
        """Adds a host buffer (numpy array, torch tensor or bytes-like) under ``key``."""

        self.add(
            ParameterIndexEntry(
                key,
                metadata_bytes(metadata),
                host_nbytes(buffer),
                entry_type="buffer",
                buffer=buffer,
            )
        )

    def add_splat(
        self, key: str, pattern: bytes, total_length: int, *, metadata: bytes | str | None = None
    ) -> None:
        """Adds a splat entry: ``pattern`` (1, 2, 4, 8 or 16 bytes) repeated to ``total_length``."""
        pattern = bytes(pattern)
        if len(pattern) not in (1, 2, 4, 8, 16):
            raise ParameterArchiveError(
                f"splat pattern for {key!r} is {len(pattern)} bytes; expected 1, 2, 4, 8 or 16"
            )
        if total_length < 0 or total_length % len(pattern):
            raise ParameterArchiveError(
                f"splat length {total_length} for {key!r} is not a non-negative multiple of the "
                f"{len(pattern)}-byte pattern"
            )
        self.add(
            ParameterIndexEntry(
                key,
                metadata_bytes(metadata),
                total_length,
                entry_type="splat",
                splat_pattern=pattern,
            )
        )

    def add_from_file(
        self,
        key: str,
        path: str | os.PathLike,
        length: int,
        offset: int = 0,
        *,
        metadata: bytes | str | None = None,
    ) -> None:
        """Adds a range of an existing file (read-only, mapped lazily) under ``key``."""
        f = self._open(Path(path), mmap=True, writable=False)
        f.check(offset, length, f"entry {key!r}")
        self.add(
            ParameterIndexEntry(
                key, metadata_bytes(metadata), length, entry_type="external", file=f, offset=offset
            )
        )

    def _open(self, path: Path, *, mmap: bool, writable: bool) -> MappedFile:
        for f in self._files:
            if f.path == os.fspath(path) and f.writable == writable:
                return f
        f = MappedFile(path, mmap=mmap, writable=writable)
        self._files.append(f)
        return f

    def load(
        self,
        file_path: str | os.PathLike,
        *,
        mmap: bool = True,
        readable: bool = True,
        writable: bool = False,
    ) -> None:
        """Parses an .irpa file and appends its entries (SKIP entries are recorded, not listed).

        A ``.safetensors`` file is read too (as IREE's index does): its tensors become
        file-backed entries with ``PYTORCH:`` metadata.

        Raises:
            ParameterArchiveError: the file is missing or malformed.
        """
        if not readable and not writable:
            raise ParameterArchiveError(
                "an archive must be opened readable, writable or both", path=file_path
            )
        if os.fspath(file_path).endswith(".safetensors"):
            self._load_safetensors(file_path, mmap=mmap, writable=writable)
            return
        f = MappedFile(file_path, mmap=mmap, writable=writable)
        try:
            raw, _ = parse_archive(f.read, f.size, f.path, fast=True)
        except BaseException:
            f.close()
            raise
        # A bad entry (an EXTERNAL file that cannot be opened) must not leave this file's
        # earlier entries behind: restore the index as it was before this load.
        saved = (list(self._done), list(self._pending), list(self._raw), len(self._files))
        self._files.append(f)
        try:
            self._add_parsed(f, raw, mmap=mmap)
        except BaseException:
            self._done, self._pending, self._raw, n_files = saved
            for opened in self._files[n_files:]:
                opened.close()
            del self._files[n_files:]
            raise

    def _add_parsed(self, f: MappedFile, raw: list, *, mmap: bool) -> None:
        base_dir = Path(f.path).parent
        for r in raw:
            self._raw.append((f, r))
            if isinstance(r, EntryTable):
                self._pending.append((f, r))
                continue
            self._materialize()  # keep file order: earlier tables first
            if r.type == EntryType.SKIP:
                continue
            elif r.type == EntryType.SPLAT:
                self.add(
                    ParameterIndexEntry(
                        r.key,
                        r.metadata,
                        r.length,
                        entry_type="splat",
                        splat_pattern=r.splat_pattern,
                        entry_offset=r.entry_offset,
                        origin=f.path,
                    )
                )
            elif r.type == EntryType.DATA:
                self.add(
                    ParameterIndexEntry(
                        r.key,
                        r.metadata,
                        r.length,
                        entry_type="data",
                        file=f,
                        offset=r.data_offset,
                        entry_offset=r.entry_offset,
                        origin=f.path,
                        minimum_alignment=r.minimum_alignment,
                    )
                )
            else:  # EXTERNAL: resolve relative paths against the archive's directory.
                ext = Path(r.external_path)
                ext = ext if ext.is_absolute() else base_dir / ext
                try:
                    ef = self._open(ext, mmap=mmap, writable=False)
                except ParameterArchiveError as e:
                    raise ParameterArchiveError(
                        f"external entry {r.key!r} refers to {str(ext)!r}, which cannot be "
                        f"opened ({e.reason})",
                        path=f.path,
                        offset=r.entry_offset,
                    ) from e
                if r.data_offset + r.length > ef.size:
                    raise ParameterArchiveError(
                        f"external entry {r.key!r} range [{r.data_offset}, "
                        f"{r.data_offset + r.length}) lies past the end of {str(ext)!r} "
                        f"(size {ef.size})",
                        path=f.path,
                        offset=r.entry_offset,
                    )
                self.add(
                    ParameterIndexEntry(
                        r.key,
                        r.metadata,
                        r.length,
                        entry_type="external",
                        file=ef,
                        offset=r.data_offset,
                        entry_offset=r.entry_offset,
                        origin=f.path,
                    )
                )

    def _load_safetensors(
        self, file_path: str | os.PathLike, *, mmap: bool, writable: bool
    ) -> None:
        base, tensors = read_safetensors_header(file_path)
        f = MappedFile(file_path, mmap=mmap, writable=writable)
        self._materialize()
        self._files.append(f)
        for name, md, begin, end in tensors:
            self.add(
                ParameterIndexEntry(
                    name, md.encode(), end - begin, entry_type="data", file=f, offset=base + begin
                )
            )

    def close(self) -> None:
        """Closes the files (mappings with live views close when the views are gone)."""
        for f in self._files:
            f.close()
        self._files.clear()

    def to_iree(self) -> Any:
        """An ``iree.runtime.ParameterIndex`` with the same entries (zero-copy where mapped).

        Raises:
            ImportError: ``iree-base-runtime`` is not installed.
        """
        rt = importlib.import_module("iree.runtime")
        out = rt.ParameterIndex()
        for e in self._entries:
            md = e.metadata.decode("utf-8", "surrogateescape") if e.metadata else None
            if e.splat_pattern is not None:
                out.add_splat(e.key, e.splat_pattern, e.length, metadata=md)
            elif e.file is not None and e.length == 0:
                out.add_buffer(e.key, np.zeros(0, np.uint8), metadata=md)
            else:
                out.add_buffer(e.key, e.flat_array(), metadata=md)
        return out


def _entry_from_row(f: MappedFile, t: EntryTable, i: int, key: str) -> ParameterIndexEntry:
    mo, mn = int(t.md_off[i]), int(t.md_len[i])
    meta = t.metadata[mo : mo + mn]
    if int(t.type[i]) == EntryType.DATA:
        return ParameterIndexEntry(
            key,
            meta,
            int(t.length[i]),
            entry_type="data",
            file=f,
            offset=int(t.data_offset[i]),
            entry_offset=int(t.entry_offset[i]),
            minimum_alignment=int(t.min_align[i]),
        )
    assert t.pattern is not None
    return ParameterIndexEntry(
        key,
        meta,
        int(t.length[i]),
        entry_type="splat",
        splat_pattern=bytes(t.pattern[i, : int(t.plen[i])]),
        entry_offset=int(t.entry_offset[i]),
        origin=f.path,
    )


def _entries_from_table(f: MappedFile, t: EntryTable) -> list[ParameterIndexEntry]:
    # Hot path when listing a large archive: fill the slots directly (no __init__ call).
    md = t.metadata
    keys = t.keys()
    types = t.type.tolist()
    lengths = t.length.tolist()
    offsets = t.data_offset.tolist()
    entry_offsets = t.entry_offset.tolist()
    md_off = t.md_off.tolist()
    md_end = (t.md_off + t.md_len).tolist()
    aligns = t.min_align.tolist()
    plens = t.plen.tolist()
    new = ParameterIndexEntry.__new__
    data_type = int(EntryType.DATA)
    splat_type = int(EntryType.SPLAT)
    out = []
    for i, key in enumerate(keys):
        et = types[i]
        e = new(ParameterIndexEntry)
        e.key = key
        e.metadata = md[md_off[i] : md_end[i]]
        e.length = lengths[i]
        e.entry_offset = entry_offsets[i]
        e.origin = f.path
        e._buffer = None
        if et == data_type:
            e.entry_type = "data"
            e.file = f
            e.offset = offsets[i]
            e.splat_pattern = None
            e.minimum_alignment = aligns[i]
        elif et == splat_type:
            assert t.pattern is not None
            e.entry_type = "splat"
            e.file = None
            e.offset = 0
            e.splat_pattern = t.pattern[i, : plens[i]].tobytes()
            e.minimum_alignment = 0
        else:
            continue  # SKIP
        out.append(e)
    return out


def metadata_bytes(metadata: bytes | str | TensorMetadata | None) -> bytes:
    """Entry metadata as stored: bytes as given, str as UTF-8, ``TensorMetadata`` encoded."""
    if metadata is None:
        return b""
    if isinstance(metadata, TensorMetadata):
        return metadata.encode()
    if isinstance(metadata, str):
        return metadata.encode("utf-8")
    return bytes(metadata)
