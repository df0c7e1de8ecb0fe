"""The IRPA v0 byte layout (IREE's ``iree/schemas/parameter_archive.h``): parse and lay out.

All structures are packed little-endian. Header (88 bytes)::

    u32 magic "IRPA"; u16 version_major; u16 version_minor; u64 header_size;
    u64 next_header_offset; u64 flags; u64 entry_count;
    (u64 offset, u64 length) entry_segment, metadata_segment, storage_segment

Every offset in a header is relative to the header's own file offset, so archives can be
concatenated and linked through ``next_header_offset``. Entries (each 16-byte aligned) start with a
60-byte common header ``u64 entry_size; u32 type; u64 flags; (u64,u64) name; (u64,u64) metadata;
u64 minimum_alignment`` followed by the type's fields: SPLAT ``u64 length; u8 pattern[16];
u8 pattern_length`` (85 bytes), DATA ``(u64 offset, u64 length) storage`` (76 bytes), EXTERNAL
``(u64,u64) path; (u64 offset, u64 length) range`` (92 bytes). The writer reproduces the layout
of IREE's own builder byte for byte.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._errors import ParameterArchiveError

__all__ = [
    "DEFAULT_DATA_ALIGNMENT",
    "DEFAULT_FILE_ALIGNMENT",
    "EntryType",
    "LayoutEntry",
    "RawEntry",
    "align",
    "layout_archive",
    "parse_archive",
]

MAGIC = 0x41505249  # b"IRPA" little-endian
DEFAULT_FILE_ALIGNMENT = 4096
HEADER_ALIGNMENT = 16
ENTRY_ALIGNMENT = 16
DEFAULT_DATA_ALIGNMENT = 64

HEADER_PREFIX = struct.Struct("<IHHQQQ")
HEADER_V0 = struct.Struct("<IHHQQQQQQQQQQ")
ENTRY_HEADER = struct.Struct("<QIQQQQQQ")
SPLAT_TAIL = struct.Struct("<Q16sB")
DATA_TAIL = struct.Struct("<QQ")
EXTERNAL_TAIL = struct.Struct("<QQQQ")
SPLAT_SIZE = ENTRY_HEADER.size + SPLAT_TAIL.size  # 85
DATA_SIZE = ENTRY_HEADER.size + DATA_TAIL.size  # 76
EXTERNAL_SIZE = ENTRY_HEADER.size + EXTERNAL_TAIL.size  # 92
SPLAT_PATTERN_LENGTHS = (1, 2, 4, 8, 16)


class EntryType(enum.IntEnum):
    """Entry types of the archive entry table."""

    SKIP = 0
    SPLAT = 1
    DATA = 2
    EXTERNAL = 3


def align(value: int, alignment: int) -> int:
    if alignment <= 1:
        return value
    return (value + alignment - 1) // alignment * alignment


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


@dataclass(frozen=True)
class RawEntry:
    """One entry of an archive's entry table as stored (absolute file offsets)."""

    type: EntryType
    key: str
    metadata: bytes
    entry_offset: int
    length: int
    data_offset: int = 0
    minimum_alignment: int = 0
    splat_pattern: bytes = b""
    external_path: str = ""
    header_offset: int = 0


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def parse_archive(
    read: Callable[[int, int], bytes], file_size: int, path: str, *, fast: bool = False
) -> tuple[list[Any], int]:
    """Parses every linked archive header of a file.

    Args:
        read: ``read(offset, length)`` returning exactly those bytes (callers bound-check first).
        file_size: Size of the file in bytes.
        path: File name for error messages.
        fast: Parse well-formed entry tables with vectorized numpy (an :class:`EntryTable` per
            header) instead of one :class:`RawEntry` per entry. Anything unusual (external
            entries, non-ASCII names, any inconsistency) falls back to the exact per-entry
            parser, which produces the precise error.

    Returns:
        (``RawEntry`` records and/or ``EntryTable`` s in file order, SKIP entries included;
        number of archive headers).

    Raises:
        ParameterArchiveError: on anything malformed, naming the file and byte offset.
    """
    entries: list[Any] = []
    base = 0
    headers = 0
    while True:
        headers += 1
        nxt = _parse_one(read, file_size, path, base, entries, fast)
        if nxt == 0:
            return entries, headers
        # Offsets are unsigned, so the chain only moves forward and always terminates.
        base += nxt


def _err(path: str, offset: int | None, msg: str) -> ParameterArchiveError:
    return ParameterArchiveError(msg, path=path, offset=offset)


def _parse_one(
    read: Callable[[int, int], bytes],
    file_size: int,
    path: str,
    base: int,
    out: list[Any],
    fast: bool = False,
) -> int:
    """Parses the archive header at ``base`` and its entries (appended to ``out``); returns its
    ``next_header_offset`` (0: the last header)."""
    hdr = _parse_header(read, file_size, path, base)
    if hdr.entry_count == 0:
        return hdr.next_off
    table = _EntrySegments(
        path,
        base,
        read(base + hdr.entry_off, hdr.entry_len),
        read(base + hdr.meta_off, hdr.meta_len) if hdr.meta_len else b"",
        hdr.entry_off,
        hdr.stor_off,
        hdr.stor_len,
    )
    if fast:
        fast_table = EntryTable.parse(
            table.table,
            table.metadata,
            hdr.entry_count,
            base,
            hdr.entry_off,
            hdr.stor_off,
            hdr.stor_len,
        )
        if fast_table is not None:
            out.append(fast_table)
            return hdr.next_off
    out.extend(_parse_entries(table, hdr.entry_count))
    return hdr.next_off


@dataclass(frozen=True)
class _Header:
    """The checked fields of one archive header (segment offsets relative to ``base``)."""

    next_off: int
    entry_count: int
    entry_off: int
    entry_len: int
    meta_off: int
    meta_len: int
    stor_off: int
    stor_len: int


def _parse_header(
    read: Callable[[int, int], bytes], file_size: int, path: str, base: int
) -> _Header:
    if base % HEADER_ALIGNMENT:
        raise _err(
            path, base, f"archive header is misaligned; expected a multiple of {HEADER_ALIGNMENT}"
        )
    if file_size - base < HEADER_PREFIX.size:
        raise _err(
            path,
            base,
            f"file truncated: {max(file_size - base, 0)} bytes left where an archive header of "
            f"at least {HEADER_PREFIX.size} bytes was expected (file size {file_size})",
        )
    magic, major, minor, header_size, next_off, _flags = HEADER_PREFIX.unpack(
        read(base, HEADER_PREFIX.size)
    )
    if magic != MAGIC:
        raise _err(
            path,
            base,
            f"wrong magic {struct.pack('<I', magic)!r}; expected b'IRPA' (is this an IREE "
            f"parameter archive? .safetensors/.gguf files need conversion: turbine-params convert)",
        )
    if major != 0:
        raise _err(
            path,
            base + 4,
            f"unknown archive major version {major}.{minor}; this reader supports version 0.x",
        )
    if header_size < HEADER_V0.size:
        raise _err(
            path,
            base + 8,
            f"header_size {header_size} too small; expected at least {HEADER_V0.size} for v0",
        )
    if header_size > file_size - base:
        raise _err(
            path,
            base + 8,
            f"file truncated: header_size {header_size} extends past the end of the file "
            f"(file size {file_size})",
        )
    if next_off:
        if next_off % HEADER_ALIGNMENT or next_off < header_size:
            raise _err(
                path,
                base + 16,
                f"next_header_offset {next_off} invalid; expected a multiple of "
                f"{HEADER_ALIGNMENT} past this header's {header_size} bytes",
            )
        if base + next_off > file_size - HEADER_PREFIX.size:
            raise _err(
                path,
                base + 16,
                f"next_header_offset {next_off} points past the end of the file "
                f"(file size {file_size})",
            )
    fields = HEADER_V0.unpack(read(base, HEADER_V0.size))
    entry_count = fields[6]
    seg = {
        "entry": (fields[7], fields[8], base + 40),
        "metadata": (fields[9], fields[10], base + 56),
        "storage": (fields[11], fields[12], base + 72),
    }
    avail = file_size - base
    for name, (off, length, where) in seg.items():
        if length and (off > avail or length > avail - off):
            raise _err(
                path,
                where,
                f"{name} segment [{base + off}, {base + off + length}) extends past the end of "
                f"the file (file size {file_size}); the file is truncated or corrupt",
            )
    # Segments must not overlap the header or each other (entries may share storage ranges).
    spans = [("header", 0, header_size)] + [
        (name, off, off + length) for name, (off, length, _) in seg.items() if length
    ]
    for i in range(len(spans)):
        for j in range(i + 1, len(spans)):
            a, b = spans[i], spans[j]
            if a[1] < b[2] and b[1] < a[2]:
                raise _err(
                    path,
                    base + b[1],
                    f"{b[0]} segment [{base + b[1]}, {base + b[2]}) overlaps the {a[0]} "
                    f"[{base + a[1]}, {base + a[2]}); expected disjoint segments",
                )
    entry_off, entry_len, _ = seg["entry"]
    meta_off, meta_len, _ = seg["metadata"]
    stor_off, stor_len, _ = seg["storage"]
    max_entries = entry_len // ENTRY_HEADER.size if entry_len >= ENTRY_HEADER.size else 0
    if entry_count > max_entries:
        raise _err(
            path,
            base + 32,
            f"entry_count {entry_count} cannot fit in an entry segment of {entry_len} bytes "
            f"(at most {max_entries} entries of >= {ENTRY_HEADER.size} bytes)",
        )
    return _Header(
        next_off, entry_count, entry_off, entry_len, meta_off, meta_len, stor_off, stor_len
    )


@dataclass(frozen=True)
class _EntrySegments:
    """The entry table and metadata segment of one header, for the per-entry parsers."""

    path: str
    base: int
    table: bytes
    metadata: bytes
    entry_off: int
    stor_off: int
    stor_len: int

    def meta_ref(self, o: int, n: int, what: str, at: int) -> bytes:
        if n == 0:
            return b""
        meta_len = len(self.metadata)
        if o > meta_len or n > meta_len - o:
            raise _err(
                self.path,
                at,
                f"{what} reference [{o}, {o + n}) lies outside the metadata segment of "
                f"{meta_len} bytes",
            )
        return self.metadata[o : o + n]

    def text(self, raw: bytes, what: str, at: int) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _err(
                self.path, at, f"{what} is not valid UTF-8 ({e.reason} at byte {e.start})"
            ) from None


def _parse_entries(seg: _EntrySegments, entry_count: int) -> list[RawEntry]:
    """The entries of one header, each checked by the parser of its type."""
    out: list[RawEntry] = []
    path, base, table, entry_len = seg.path, seg.base, seg.table, len(seg.table)
    pos = 0
    unpack_header = ENTRY_HEADER.unpack_from
    for i in range(entry_count):
        abs_off = base + seg.entry_off + pos
        if entry_len - pos < ENTRY_HEADER.size:
            raise _err(
                path,
                abs_off,
                f"entry table truncated at entry {i} of {entry_count}: {entry_len - pos} bytes "
                f"left, expected at least {ENTRY_HEADER.size}",
            )
        size, etype, _eflags, name_o, name_n, md_o, md_n, min_align = unpack_header(table, pos)
        if size < ENTRY_HEADER.size or size > entry_len - pos:
            raise _err(
                path,
                abs_off,
                f"entry {i} has entry_size {size}; expected between {ENTRY_HEADER.size} and the "
                f"{entry_len - pos} bytes left in the entry table",
            )
        name = seg.meta_ref(name_o, name_n, f"entry {i} name", abs_off + 20)
        key = seg.text(name, "entry name", abs_off)
        md = seg.meta_ref(md_o, md_n, f"entry {i} metadata", abs_off + 36)
        parse = _ENTRY_PARSERS.get(etype)
        if parse is None:
            raise _err(
                path,
                abs_off + 8,
                f"entry {i} has unknown type {etype}; expected 0 (SKIP), 1 (SPLAT), 2 (DATA) "
                f"or 3 (EXTERNAL)",
            )
        out.append(parse(seg, key, md, abs_off, pos, size, min_align))
        pos += align(size, ENTRY_ALIGNMENT)
    return out


def _skip_entry(
    seg: _EntrySegments, key: str, md: bytes, abs_off: int, pos: int, size: int, min_align: int
) -> RawEntry:
    return RawEntry(EntryType.SKIP, key, md, abs_off, 0, header_offset=seg.base)


def _splat_entry(
    seg: _EntrySegments, key: str, md: bytes, abs_off: int, pos: int, size: int, min_align: int
) -> RawEntry:
    path = seg.path
    if size < SPLAT_SIZE:
        raise _err(path, abs_off, f"splat entry {key!r} has entry_size {size} < {SPLAT_SIZE}")
    length, pattern, plen = SPLAT_TAIL.unpack_from(seg.table, pos + ENTRY_HEADER.size)
    if plen not in SPLAT_PATTERN_LENGTHS:
        raise _err(
            path,
            abs_off + 84,
            f"splat entry {key!r} has pattern_length {plen}; expected 1, 2, 4, 8 or 16",
        )
    if length % plen:
        raise _err(
            path,
            abs_off + 60,
            f"splat entry {key!r} length {length} is not a multiple of its {plen}-byte pattern",
        )
    return RawEntry(
        EntryType.SPLAT,
        key,
        md,
        abs_off,
        length,
        splat_pattern=bytes(pattern[:plen]),
        header_offset=seg.base,
    )


def _data_entry(
    seg: _EntrySegments, key: str, md: bytes, abs_off: int, pos: int, size: int, min_align: int
) -> RawEntry:
    path, stor_len = seg.path, seg.stor_len
    if size < DATA_SIZE:
        raise _err(path, abs_off, f"data entry {key!r} has entry_size {size} < {DATA_SIZE}")
    d_off, d_len = DATA_TAIL.unpack_from(seg.table, pos + ENTRY_HEADER.size)
    if d_len and (d_off > stor_len or d_len > stor_len - d_off):
        raise _err(
            path,
            abs_off + 60,
            f"data entry {key!r} range [{d_off}, {d_off + d_len}) lies outside the "
            f"storage segment of {stor_len} bytes",
        )
    data_abs = seg.base + seg.stor_off + d_off
    if min_align and not _is_pow2(min_align):
        raise _err(
            path,
            abs_off + 52,
            f"data entry {key!r} minimum_alignment {min_align} is not a power of two",
        )
    if d_len and min_align and data_abs % min_align:
        raise _err(
            path,
            abs_off + 60,
            f"data entry {key!r} is misaligned: its data starts at file offset "
            f"{data_abs}, expected a multiple of its minimum_alignment {min_align}",
        )
    return RawEntry(
        EntryType.DATA,
        key,
        md,
        abs_off,
        d_len,
        data_offset=data_abs,
        minimum_alignment=min_align,
        header_offset=seg.base,
    )


def _external_entry(
    seg: _EntrySegments, key: str, md: bytes, abs_off: int, pos: int, size: int, min_align: int
) -> RawEntry:
    path = seg.path
    if size < EXTERNAL_SIZE:
        raise _err(path, abs_off, f"external entry {key!r} has entry_size {size} < {EXTERNAL_SIZE}")
    p_o, p_n, r_off, r_len = EXTERNAL_TAIL.unpack_from(seg.table, pos + ENTRY_HEADER.size)
    ext = seg.text(seg.meta_ref(p_o, p_n, f"entry {key!r} path", abs_off + 60), "path", abs_off)
    if not ext:
        raise _err(path, abs_off + 60, f"external entry {key!r} has an empty file path")
    return RawEntry(
        EntryType.EXTERNAL,
        key,
        md,
        abs_off,
        r_len,
        data_offset=r_off,
        minimum_alignment=min_align,
        external_path=ext,
        header_offset=seg.base,
    )


_ENTRY_PARSERS: dict[int, Callable[..., RawEntry]] = {
    EntryType.SKIP: _skip_entry,
    EntryType.SPLAT: _splat_entry,
    EntryType.DATA: _data_entry,
    EntryType.EXTERNAL: _external_entry,
}


# One entry-table row as numpy sees it (fields of every entry type, by offset).
_ROW = np.dtype(
    {
        "names": [
            "size",
            "type",
            "name_off",
            "name_len",
            "md_off",
            "md_len",
            "min_align",
            "tail0",
            "tail1",
            "pattern",
            "plen",
        ],
        "formats": [
            "<u8",
            "<u4",
            "<u8",
            "<u8",
            "<u8",
            "<u8",
            "<u8",
            "<u8",
            "<u8",
            ("u1", (16,)),
            "u1",
        ],
        "offsets": [0, 8, 20, 28, 36, 44, 52, 60, 68, 68, 84],
        "itemsize": 96,
    }
)


class EntryTable:
    """A well-formed entry table parsed with vectorized numpy (columns, not objects).

    Only tables whose every check passes are represented this way; see :func:`parse_archive`.
    """

    __slots__ = (
        "count",
        "data_offset",
        "entry_offset",
        "length",
        "md_len",
        "md_off",
        "metadata",
        "min_align",
        "name_len",
        "name_off",
        "pattern",
        "plen",
        "type",
    )
    count: int
    data_offset: np.ndarray
    entry_offset: np.ndarray
    length: np.ndarray
    md_len: np.ndarray
    md_off: np.ndarray
    metadata: bytes
    min_align: np.ndarray
    name_len: np.ndarray
    name_off: np.ndarray
    pattern: np.ndarray | None
    plen: np.ndarray
    type: np.ndarray

    @staticmethod
    def parse(
        table: bytes,
        metadata: bytes,
        count: int,
        base: int,
        entry_off: int,
        stor_off: int,
        stor_len: int,
    ) -> EntryTable | None:
        entry_len = len(table)
        k = (entry_len + 15) // 16
        buf = np.zeros(k * 16 + 128, dtype=np.uint8)
        buf[:entry_len] = np.frombuffer(table, dtype=np.uint8)
        sizes = buf[: k * 16].view("<u8")[::2]
        big = sizes > np.uint64(1 << 40)
        size_i = np.where(big, 0, sizes).astype(np.int64)
        pos = np.arange(k, dtype=np.int64)
        ok = ~big & (size_i >= ENTRY_HEADER.size) & (size_i <= entry_len - pos * 16)
        nxt = np.minimum(pos + (size_i + 15) // 16, k)
        step = int(nxt[0]) if ok[0] else 0
        seq = pos[: count * step : step] if step else pos[:0]
        if len(seq) != count or not (ok[seq].all() and (nxt[seq[:-1]] == seq[1:]).all()):
            # Mixed entry sizes: follow the chain by pointer doubling, O(k log count).
            jump = np.concatenate([np.where(ok, nxt, k + 1), [k + 1, k + 1]])
            seq = np.zeros(1, dtype=np.int64)
            while len(seq) < count:
                seq = np.concatenate([seq, jump[seq]])
                jump = jump[jump]
            seq = seq[:count]
            if (seq >= k).any() or not ok[seq].all():
                return None
        p = seq * 16
        rows = np.lib.stride_tricks.as_strided(buf, shape=(k, _ROW.itemsize), strides=(16, 1))
        rec = rows[seq].view(_ROW).reshape(-1)
        etype = rec["type"]
        size = size_i[seq]
        name_off, name_len = rec["name_off"], rec["name_len"]
        md_off, md_len = rec["md_off"], rec["md_len"]
        min_align = rec["min_align"]
        meta_n = np.uint64(len(metadata))

        def in_meta(o: np.ndarray, n: np.ndarray) -> np.ndarray:
            return (n == 0) | ((o <= meta_n) & (n <= meta_n - np.minimum(o, meta_n)))

        is_splat = etype == EntryType.SPLAT
        is_data = etype == EntryType.DATA
        sized = (
            ((etype == EntryType.SKIP) & (size >= ENTRY_HEADER.size))
            | (is_splat & (size >= SPLAT_SIZE))
            | (is_data & (size >= DATA_SIZE))
        )
        if not (
            sized.all() and in_meta(name_off, name_len).all() and in_meta(md_off, md_len).all()
        ):
            return None  # external entries, unknown types, bad sizes or refs: exact parser
        if len(metadata) and int(np.frombuffer(metadata, dtype=np.uint8).max()) >= 0x80:
            return None  # non-ASCII names need per-name UTF-8 validation
        # DATA: storage ref and alignment; SPLAT: pattern (the same bytes, read per type).
        d_off, d_len = rec["tail0"], rec["tail1"]
        s_n = np.uint64(stor_len)
        data_in = (d_len == 0) | ((d_off <= s_n) & (d_len <= s_n - np.minimum(d_off, s_n)))
        one = np.uint64(1)
        pow2 = (min_align & (min_align - one)) == 0
        safe_align = np.where(min_align == 0, one, min_align)
        abs_data = np.uint64(base + stor_off) + np.where(is_data & data_in, d_off, 0).astype(
            np.uint64
        )
        aligned = (d_len == 0) | (abs_data % safe_align == 0)
        if not (~is_data | (data_in & pow2 & aligned)).all():
            return None
        plen = rec["plen"].astype(np.uint64)
        splat_len = d_off  # a splat's length is the u64 at +60
        plen_ok = (plen > 0) & (plen <= 16) & ((plen & (plen - one)) == 0)
        safe_plen = np.where(plen_ok, plen, one)
        if not (~is_splat | (plen_ok & (splat_len % safe_plen == 0))).all():
            return None
        t = EntryTable()
        t.count = count
        t.type = etype
        t.entry_offset = p + (base + entry_off)
        t.name_off, t.name_len, t.md_off, t.md_len = name_off, name_len, md_off, md_len
        t.min_align = min_align
        t.length = np.where(is_data, d_len, np.where(is_splat, splat_len, 0))
        t.data_offset = np.where(is_data, abs_data, 0)
        t.pattern = rec["pattern"] if is_splat.any() else None
        t.plen = plen
        t.metadata = metadata
        return t

    def keys(self) -> list[str]:
        md = self.metadata
        return [
            md[o : o + n].decode("ascii")
            for o, n in zip(self.name_off.tolist(), self.name_len.tolist())
        ]

    def raw_entries(self) -> list[RawEntry]:
        md = self.metadata
        out = []
        for i, key in enumerate(self.keys()):
            et = EntryType(int(self.type[i]))
            mo, mn = int(self.md_off[i]), int(self.md_len[i])
            pattern = b""
            if et == EntryType.SPLAT and self.pattern is not None:
                pattern = bytes(self.pattern[i, : int(self.plen[i])])
            out.append(
                RawEntry(
                    et,
                    key,
                    md[mo : mo + mn],
                    int(self.entry_offset[i]),
                    int(self.length[i]),
                    data_offset=int(self.data_offset[i]),
                    minimum_alignment=int(self.min_align[i]) if et == EntryType.DATA else 0,
                    splat_pattern=pattern,
                )
            )
        return out


# --------------------------------------------------------------------------------------------
# Layout (writing)
# --------------------------------------------------------------------------------------------


@dataclass
class LayoutEntry:
    """An entry to lay out. ``storage_id`` groups DATA entries sharing one stored range."""

    type: EntryType
    key: bytes
    metadata: bytes
    length: int = 0
    storage_id: int | None = None
    alignment: int = DEFAULT_DATA_ALIGNMENT
    splat_pattern: bytes = b""
    external_path: bytes = b""
    external_offset: int = 0


@dataclass
class ArchiveLayout:
    """The bytes before the storage segment, and where each stored range goes."""

    head: bytes
    storage_offset: int
    storage_length: int
    # storage_id -> offset relative to the storage segment, in write order.
    placements: dict[int, int]
    total_size: int


def layout_archive(
    entries: list[LayoutEntry], *, file_alignment: int = DEFAULT_FILE_ALIGNMENT
) -> ArchiveLayout:
    """Lays out header, entry table and metadata exactly as IREE's archive builder does."""
    # Pass 1: sizes and storage placement.
    entry_len = 0
    sizes = []
    for e in entries:
        size = {
            EntryType.SKIP: ENTRY_HEADER.size,
            EntryType.SPLAT: SPLAT_SIZE,
            EntryType.DATA: DATA_SIZE,
            EntryType.EXTERNAL: EXTERNAL_SIZE,
        }[e.type]
        sizes.append(size)
        entry_len = align(entry_len, ENTRY_ALIGNMENT) + size
    storage_alignment = 0
    storage_len = 0
    placements: dict[int, int] = {}
    for e in entries:
        if e.type != EntryType.DATA:
            continue
        if not storage_alignment:
            storage_alignment = e.alignment  # the first data entry sets the base alignment
        assert e.storage_id is not None
        if e.storage_id in placements:
            continue
        off = align(storage_len, e.alignment)
        placements[e.storage_id] = off
        storage_len = off + e.length
    entry_seg_off = align(HEADER_V0.size, ENTRY_ALIGNMENT)
    meta = bytearray()
    table = bytearray()
    for e, size in zip(entries, sizes):
        if len(table) % ENTRY_ALIGNMENT:
            table += bytes(ENTRY_ALIGNMENT - len(table) % ENTRY_ALIGNMENT)
        name_ref = (len(meta), len(e.key))
        meta += e.key
        md_ref = (len(meta) if e.metadata else 0, len(e.metadata))
        meta += e.metadata
        min_align = e.alignment if e.type == EntryType.DATA else 0
        table += ENTRY_HEADER.pack(size, int(e.type), 0, *name_ref, *md_ref, min_align)
        if e.type == EntryType.SPLAT:
            table += SPLAT_TAIL.pack(
                e.length, e.splat_pattern.ljust(16, b"\0"), len(e.splat_pattern)
            )
        elif e.type == EntryType.DATA:
            assert e.storage_id is not None
            table += DATA_TAIL.pack(placements[e.storage_id], e.length)
        elif e.type == EntryType.EXTERNAL:
            path_ref = (len(meta), len(e.external_path))
            meta += e.external_path
            table += EXTERNAL_TAIL.pack(*path_ref, e.external_offset, e.length)
    assert len(table) == entry_len
    meta_seg_off = entry_seg_off + entry_len
    storage_off = align(meta_seg_off + len(meta), storage_alignment or 1)
    header = HEADER_V0.pack(
        MAGIC,
        0,
        0,
        HEADER_V0.size,
        0,
        0,
        len(entries),
        entry_seg_off,
        entry_len,
        meta_seg_off,
        len(meta),
        storage_off,
        storage_len,
    )
    head = bytearray(header)
    head += bytes(entry_seg_off - len(head))
    head += table
    head += meta
    total = align(storage_off + storage_len, file_alignment)
    return ArchiveLayout(bytes(head), storage_off, storage_len, placements, total)
