"""Building archives: collect entries, then stream them to disk with one atomic save."""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._dtypes import TensorMetadata, dtype_info, dtype_info_for_numpy
from ._errors import ParameterArchiveError
from ._index import MappedFile, ParameterIndex, ParameterIndexEntry, metadata_bytes
from ._io import atomic_fd, copy_file_range, write_all
from ._irpa_format import (
    DEFAULT_DATA_ALIGNMENT,
    DEFAULT_FILE_ALIGNMENT,
    SPLAT_PATTERN_LENGTHS,
    EntryType,
)
from ._irpa_layout import LayoutEntry, layout_archive
from ._nn_module import module_tensors
from ._progress import Progress
from ._sources import host_bytes, host_nbytes, is_torch_tensor, tensor_metadata, tie_key
from ._subclasses import int4_values, is_wrapper_subclass, pack_int4, subclass_inner_tensors

__all__ = ["ParameterArchiveBuilder", "save_module_parameters"]

logger = logging.getLogger("turbine.params")


@dataclass
class _Entry:
    type: EntryType
    key: str
    metadata: bytes
    length: int = 0
    storage_id: int | None = None
    splat_pattern: bytes = b""
    external_path: str = ""
    external_offset: int = 0


@dataclass
class _Source:
    """Where a stored range's bytes come from at save time."""

    host: Any = None  # numpy array / torch tensor / bytes-like
    file_path: str | None = None
    file_offset: int = 0
    length: int = 0
    # Applied to ``host`` when its bytes are needed (int4 packing), so that nothing is copied
    # before the save streams it.
    transform: Any = None

    def host_object(self) -> Any:
        return self.transform(self.host) if self.transform is not None else self.host


def _check_key(key: Any) -> str:
    if not isinstance(key, str):
        raise ParameterArchiveError(f"parameter keys must be str, got {type(key).__name__}")
    return key


class ParameterArchiveBuilder:
    """Helper for building parameter archives from live modules, arrays and files.

    Nothing is copied when entries are added: tensors and arrays are held by reference and file
    ranges by name; :meth:`save` streams them to disk one at a time, so memory stays bounded by
    the largest non-contiguous tensor (contiguous tensors are written straight from their memory).
    Tensors with the same storage, offset, shape and strides (tied weights) are stored once.

    Args:
        data_alignment: Alignment of every stored tensor in the file (power of two, default 64).
        file_alignment: The file size is padded to a multiple of this (default 4096).

    Example:
        >>> import numpy as np
        >>> b = ParameterArchiveBuilder()
        >>> b.add_tensor("w", np.ones((2, 3), np.float32))
        >>> b.add_splat("zeros", np.float32(0), shape=(1024,))
        >>> path = b.save(tmp_path / "weights")  # doctest: +SKIP  (writes weights.irpa)
    """

    def __init__(
        self,
        *,
        data_alignment: int = DEFAULT_DATA_ALIGNMENT,
        file_alignment: int = DEFAULT_FILE_ALIGNMENT,
    ):
        for name, v in (("data_alignment", data_alignment), ("file_alignment", file_alignment)):
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ParameterArchiveError(f"{name} must be a power of two >= 1, got {v!r}")
        self.data_alignment = data_alignment
        self.file_alignment = file_alignment
        self._entries: list[_Entry] = []
        self._sources: list[_Source] = []
        self._tied: dict[tuple, int] = {}
        # Set by converters whose tensors are views of a read-only file mapping (torch.load with
        # mmap=True): after writing a tensor its pages are dropped from this process (they are
        # re-read from the file if touched again), so RSS stays flat however large the model.
        self._release_file_backed_pages = False

    # ---- adding entries -------------------------------------------------------------------

    def _add_source(self, source: _Source, key: tuple | None) -> int:
        if key is not None and key in self._tied:
            return self._tied[key]
        self._sources.append(source)
        sid = len(self._sources) - 1
        if key is not None:
            self._tied[key] = sid
        return sid

    def add_tensor(self, name: str, tensor: Any) -> None:
        """Adds a named tensor (torch tensor or numpy array) with ``PYTORCH:`` metadata.

        A tensor subclass (torchao's quantized weights) is added as its inner tensors, named
        ``name.<attribute>`` (``weight.qdata``, ``weight.scale``, ...), torchao's int4 data
        packed two values per byte (see ``turbine_params._subclasses``).

        Raises:
            ParameterArchiveError: unsupported dtype or layout (quantized, sparse, meta).
        """
        _check_key(name)
        if is_wrapper_subclass(tensor):
            for key, inner in subclass_inner_tensors(name, tensor):
                self.add_tensor(key, inner)
            return
        if int4_values(tensor):
            self._add_int4(name, tensor)
            return
        md = tensor_metadata(tensor, what=f"tensor {name!r}")
        if md is None:
            raise ParameterArchiveError(
                f"add_tensor({name!r}) expects a torch tensor or numpy array, got "
                f"{type(tensor).__name__}; use add_blob() for raw bytes"
            )
        length = host_nbytes(tensor)
        sid = self._add_source(_Source(host=tensor, length=length), tie_key(tensor))
        self._entries.append(_Entry(EntryType.DATA, name, md.encode(), length, storage_id=sid))

    def _add_int4(self, name: str, tensor: Any) -> None:
        """torchao int4 data (int8 values in [-8, 7]): stored packed, packed when saved."""
        md = tensor_metadata(tensor, what=f"tensor {name!r}")
        assert md is not None
        shape = (*md.shape[:-1], md.shape[-1] // 2)
        packed = TensorMetadata(dtype_info("uint8"), shape, ("int4", md.shape))
        key = tie_key(tensor)
        sid = self._add_source(
            _Source(host=tensor, length=packed.nbytes, transform=pack_int4),
            ("int4", *key) if key is not None else None,
        )
        self._entries.append(
            _Entry(EntryType.DATA, name, packed.encode(), packed.nbytes, storage_id=sid)
        )

    def add_module(self, module: Any, *, prefix: str = "") -> None:
        """Adds all parameters and persistent buffers from a module hierarchy.

        Keys are state_dict names joined to ``prefix`` with a dot (``prefix="foobar.model"``:
        ``foobar.model.classifier.weight``); tied parameters get one entry per name that share
        the stored bytes.
        """
        for name, tensor in module_tensors(module, prefix=prefix):
            self.add_tensor(name, tensor)

    def add_blob(self, key: str, blob: Any, *, metadata: bytes | str | None = None) -> None:
        """Adds a raw blob (anything exposing the buffer protocol, or a tensor) without metadata.

        Args:
            key: Entry name.
            blob: bytes, bytearray, memoryview, numpy array or torch tensor.
            metadata: Optional raw metadata to store with the entry.
        """
        _check_key(key)
        host_bytes(blob)  # validate now: errors at add time name the key
        length = host_nbytes(blob)
        sid = self._add_source(_Source(host=blob, length=length), tie_key(blob))
        self._entries.append(
            _Entry(EntryType.DATA, key, metadata_bytes(metadata), length, storage_id=sid)
        )

    def add_splat(
        self,
        key: str,
        pattern: Any,
        *,
        shape: tuple[int, ...] | list[int] | None = None,
        dtype: Any = None,
        length: int | None = None,
        metadata: bytes | str | None = None,
    ) -> None:
        """Adds a splat entry: a value repeated over a tensor, stored in the entry table only.

        Args:
            key: Entry name.
            pattern: The repeated value: a numpy scalar / 1-element array or torch tensor (dtype
                from it), a Python number (``dtype`` required), or raw bytes (1, 2, 4, 8 or 16).
            shape: Tensor shape; with a dtype this writes ``PYTORCH:`` metadata.
            dtype: Element type (torch dtype, numpy dtype or name) for a Python number pattern.
            length: Total byte length, when no shape is given.
            metadata: Raw metadata overriding the generated one.

        Example:
            >>> b.add_splat("w", np.float32(0.5), shape=(4096, 4096))  # doctest: +SKIP
        """
        _check_key(key)
        info = None
        if isinstance(pattern, bytes | bytearray | memoryview):
            raw = bytes(pattern)
            if dtype is not None:
                info = _dtype_info_any(dtype)
        elif is_torch_tensor(pattern) or isinstance(pattern, np.ndarray | np.generic):
            md0 = tensor_metadata(pattern, what=f"splat {key!r}")
            assert md0 is not None
            if md0.numel != 1:
                raise ParameterArchiveError(
                    f"splat pattern for {key!r} must have exactly one element, got shape "
                    f"{md0.shape}"
                )
            info = md0.dtype
            raw = host_bytes(pattern).tobytes()
        else:
            if dtype is None:
                raise ParameterArchiveError(
                    f"add_splat({key!r}, {pattern!r}) needs dtype= for a Python number pattern"
                )
            info = _dtype_info_any(dtype)
            raw = _encode_scalar(pattern, info, key)
        if len(raw) not in SPLAT_PATTERN_LENGTHS:
            raise ParameterArchiveError(
                f"splat pattern for {key!r} is {len(raw)} bytes; expected 1, 2, 4, 8 or 16"
            )
        md = metadata_bytes(metadata)
        if shape is not None:
            shape_t = tuple(int(s) for s in shape)
            if info is None:
                raise ParameterArchiveError(f"add_splat({key!r}, shape=...) needs a dtype")
            tm = TensorMetadata(info, shape_t)
            n = tm.nbytes
            if length is not None and length != n:
                raise ParameterArchiveError(
                    f"splat {key!r}: length {length} disagrees with shape {shape_t} of "
                    f"{info.torch_name} ({n} bytes)"
                )
            length = n
            if not md:
                md = tm.encode()
        if length is None:
            raise ParameterArchiveError(f"add_splat({key!r}) needs shape= or length=")
        if length < 0 or length % len(raw):
            raise ParameterArchiveError(
                f"splat {key!r}: length {length} is not a multiple of the {len(raw)}-byte pattern"
            )
        self._entries.append(_Entry(EntryType.SPLAT, key, md, length, splat_pattern=raw))

    def add_external(
        self,
        key: str,
        path: str | os.PathLike,
        *,
        length: int,
        offset: int = 0,
        metadata: bytes | str | None = None,
    ) -> None:
        """Adds an EXTERNAL entry: data that stays in another file (relative paths resolve
        against the archive's directory when read). IREE's runtime does not load EXTERNAL
        entries; our reader does."""
        _check_key(key)
        if length < 0 or offset < 0:
            raise ParameterArchiveError(f"external {key!r}: offset and length must be >= 0")
        self._entries.append(
            _Entry(
                EntryType.EXTERNAL,
                key,
                metadata_bytes(metadata),
                length,
                external_path=os.fspath(path),
                external_offset=offset,
            )
        )

    def add_skip(self, key: str, *, metadata: bytes | str | None = None) -> None:
        """Adds a SKIP entry (an erased entry that readers ignore)."""
        _check_key(key)
        self._entries.append(_Entry(EntryType.SKIP, key, metadata_bytes(metadata)))

    def add_file_range(
        self,
        key: str,
        path: str | os.PathLike,
        *,
        offset: int,
        length: int,
        metadata: bytes | str | TensorMetadata | None = None,
    ) -> None:
        """Adds a DATA entry whose bytes are copied from ``path`` at save time (streaming).

        Raises:
            ParameterArchiveError: ``path`` cannot be read or the range lies outside it.
        """
        _check_key(key)
        src = os.fspath(path)
        try:
            size = os.path.getsize(src)
        except OSError as e:
            raise ParameterArchiveError(
                f"entry {key!r}: cannot read the source file ({e.strerror})", path=src
            ) from e
        if offset < 0 or length < 0 or offset + length > size:
            raise ParameterArchiveError(
                f"entry {key!r}: range [{offset}, {offset + length}) lies outside {src!r} "
                f"(size {size})"
            )
        sid = self._add_source(
            _Source(file_path=src, file_offset=offset, length=length),
            ("file", os.path.realpath(src), offset, length),
        )
        self._entries.append(
            _Entry(EntryType.DATA, key, metadata_bytes(metadata), length, storage_id=sid)
        )

    def add_index_entry(self, entry: Any, *, key: str | None = None) -> None:
        """Adds a copy of an index entry (``ParameterIndexEntry`` or ``ParameterArchiveEntry``)."""
        raw: ParameterIndexEntry = getattr(entry, "raw", entry)
        k = raw.key if key is None else key
        if raw.splat_pattern is not None:
            self._entries.append(
                _Entry(
                    EntryType.SPLAT, k, raw.metadata, raw.length, splat_pattern=raw.splat_pattern
                )
            )
        elif raw.file is not None:
            self.add_file_range(
                k, raw.file.path, offset=raw.offset, length=raw.length, metadata=raw.metadata
            )
        else:
            self.add_blob(k, raw.buffer, metadata=raw.metadata)

    # ---- views ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def index(self) -> ParameterIndex:
        """The entries added so far as a :class:`ParameterIndex` (SKIP entries omitted)."""
        idx = ParameterIndex()
        for e in self._entries:
            if e.type == EntryType.SPLAT:
                idx.add_splat(e.key, e.splat_pattern, e.length, metadata=e.metadata)
            elif e.type == EntryType.DATA:
                assert e.storage_id is not None
                src = self._sources[e.storage_id]
                if src.host is not None:
                    idx.add_buffer(e.key, src.host_object(), metadata=e.metadata)
                else:
                    assert src.file_path is not None
                    idx.add_from_file(
                        e.key, src.file_path, src.length, src.file_offset, metadata=e.metadata
                    )
            elif e.type == EntryType.EXTERNAL:
                idx.add_from_file(
                    e.key, e.external_path, e.length, e.external_offset, metadata=e.metadata
                )
        return idx

    # ---- saving ---------------------------------------------------------------------------

    def save(self, file_path: str | os.PathLike) -> Path:
        """Saves the archive atomically; returns the path written.

        ``.irpa`` is appended when the name does not end with it. The archive is streamed to a
        temporary file in the destination directory, fsynced and renamed over the destination,
        so a failure leaves any previous file intact.

        Raises:
            ParameterArchiveError: an entry's data changed size since it was added, or a source
                file cannot be read.
            OSError: the destination cannot be written.
        """
        path = Path(file_path)
        if path.suffix != ".irpa":
            path = path.with_name(path.name + ".irpa")
        layout = layout_archive(
            [
                LayoutEntry(
                    e.type,
                    e.key.encode("utf-8"),
                    e.metadata,
                    e.length,
                    storage_id=e.storage_id,
                    alignment=self.data_alignment,
                    splat_pattern=e.splat_pattern,
                    external_path=e.external_path.encode("utf-8"),
                    external_offset=e.external_offset,
                )
                for e in self._entries
            ],
            file_alignment=self.file_alignment,
        )
        progress = Progress(layout.storage_length, f"writing {path.name}")
        try:
            with atomic_fd(path) as fd:
                write_all(fd, memoryview(layout.head))
                pos = len(layout.head)
                for sid, rel in layout.placements.items():
                    target = layout.storage_offset + rel
                    if target > pos:
                        write_all(fd, memoryview(bytes(target - pos)))
                        pos = target
                    n = self._write_source(fd, self._sources[sid])
                    pos += n
                    progress.advance(n)
                os.ftruncate(fd, layout.total_size)
        finally:
            progress.close()
        logger.info(
            "wrote %s: %d entries, %d data bytes", path, len(self._entries), layout.storage_length
        )
        return path

    def _write_source(self, fd: int, src: _Source) -> int:
        if src.host is not None:
            data = host_bytes(src.host_object())
            if data.nbytes != src.length:
                raise ParameterArchiveError(
                    f"a tensor changed size after it was added ({src.length} -> {data.nbytes} "
                    f"bytes); add it again"
                )
            write_all(fd, data.data)
            if self._release_file_backed_pages and data.nbytes:
                _release_pages(data)
            return src.length
        assert src.file_path is not None
        mf = MappedFile(src.file_path, mmap=False)
        try:
            mf.check(src.file_offset, src.length, "source range")
            copy_file_range(mf.fd, fd, src.file_offset, src.length)
        finally:
            mf.close()
        return src.length


def _dtype_info_any(dtype: Any):
    if isinstance(dtype, str) or type(dtype).__module__ == "torch":
        return dtype_info(dtype)
    return dtype_info_for_numpy(dtype)


def _encode_scalar(value: Any, info, key: str) -> bytes:
    if info.numpy is not None:
        return np.array(value, dtype=info.numpy).tobytes()
    try:
        import torch
    except ImportError as e:
        raise ParameterArchiveError(
            f"splat {key!r}: encoding a Python number as {info.torch_name} needs torch (or pass "
            f"the pattern as raw bytes)"
        ) from e
    t = torch.tensor([value], dtype=info.torch_dtype())
    return t.view(torch.uint8).numpy().tobytes()


def _release_pages(data: np.ndarray) -> None:
    """``madvise(MADV_DONTNEED)`` on the whole pages inside ``data`` (Linux; else a no-op).

    Only for memory mapped from a file and never written by this process: such pages are
    re-read from the file when touched again, so nothing is lost.
    """
    if not sys.platform.startswith("linux"):
        return
    page = mmap.PAGESIZE
    start = data.ctypes.data
    lo = (start + page - 1) // page * page
    hi = (start + data.nbytes) // page * page
    if hi <= lo:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), 4)  # MADV_DONTNEED


def save_module_parameters(file_path: str | Path, module: Any, *, prefix: str = "") -> None:
    """One shot save of parameters and persistent buffers on a module.

    More options are available by using a :class:`ParameterArchiveBuilder`.

    Args:
        file_path: Destination; ``.irpa`` is appended when it has no such suffix.
        module: A ``torch.nn.Module``.
        prefix: Joined to every state_dict name with a dot (``prefix="foobar.model"`` gives
            keys ``foobar.model.classifier.weight``).
    """
    builder = ParameterArchiveBuilder()
    builder.add_module(module, prefix=prefix)
    builder.save(file_path)
