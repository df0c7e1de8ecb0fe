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
    read: Callable[[int, int], bytes], file_size: int, path: str
) -> tuple[list[RawEntry], int]:
    """Parses every linked archive header of a file.

    Args:
        read: ``read(offset, length)`` returning exactly those bytes (callers bound-check first).
        file_size: Size of the file in bytes.
        path: File name for error messages.

    Returns:
        (entries in file order, SKIP entries included; number of archive headers).

    Raises:
        ParameterArchiveError: on anything malformed, naming the file and byte offset.
    """
    entries: list[RawEntry] = []
    base = 0
    headers = 0
    while True:
        headers += 1
        nxt = _parse_one(read, file_size, path, base, entries)
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
    out: list[RawEntry],
) -> int:
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
    if entry_count == 0:
        return next_off
    table = read(base + entry_off, entry_len)
    metadata = read(base + meta_off, meta_len) if meta_len else b""

    def meta_ref(o: int, n: int, what: str, at: int) -> bytes:
        if n == 0:
            return b""
        if o > meta_len or n > meta_len - o:
            raise _err(
                path,
                at,
                f"{what} reference [{o}, {o + n}) lies outside the metadata segment of "
                f"{meta_len} bytes",
            )
        return metadata[o : o + n]

    def text(raw: bytes, what: str, at: int) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _err(
                path, at, f"{what} is not valid UTF-8 ({e.reason} at byte {e.start})"
            ) from None

    pos = 0
    unpack_header = ENTRY_HEADER.unpack_from
    for i in range(entry_count):
        abs_off = base + entry_off + pos
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
        key = text(meta_ref(name_o, name_n, f"entry {i} name", abs_off + 20), "entry name", abs_off)
        md = meta_ref(md_o, md_n, f"entry {i} metadata", abs_off + 36)
        if etype == EntryType.SKIP:
            out.append(RawEntry(EntryType.SKIP, key, md, abs_off, 0, header_offset=base))
        elif etype == EntryType.SPLAT:
            if size < SPLAT_SIZE:
                raise _err(
                    path, abs_off, f"splat entry {key!r} has entry_size {size} < {SPLAT_SIZE}"
                )
            length, pattern, plen = SPLAT_TAIL.unpack_from(table, pos + ENTRY_HEADER.size)
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
                    f"splat entry {key!r} length {length} is not a multiple of its "
                    f"{plen}-byte pattern",
                )
            out.append(
                RawEntry(
                    EntryType.SPLAT,
                    key,
                    md,
                    abs_off,
                    length,
                    splat_pattern=bytes(pattern[:plen]),
                    header_offset=base,
                )
            )
        elif etype == EntryType.DATA:
            if size < DATA_SIZE:
                raise _err(path, abs_off, f"data entry {key!r} has entry_size {size} < {DATA_SIZE}")
            d_off, d_len = DATA_TAIL.unpack_from(table, pos + ENTRY_HEADER.size)
            if d_len and (d_off > stor_len or d_len > stor_len - d_off):
                raise _err(
                    path,
                    abs_off + 60,
                    f"data entry {key!r} range [{d_off}, {d_off + d_len}) lies outside the "
                    f"storage segment of {stor_len} bytes",
                )
            data_abs = base + stor_off + d_off
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
            out.append(
                RawEntry(
                    EntryType.DATA,
                    key,
                    md,
                    abs_off,
                    d_len,
                    data_offset=data_abs,
                    minimum_alignment=min_align,
                    header_offset=base,
                )
            )
        elif etype == EntryType.EXTERNAL:
            if size < EXTERNAL_SIZE:
                raise _err(
                    path, abs_off, f"external entry {key!r} has entry_size {size} < {EXTERNAL_SIZE}"
                )
            p_o, p_n, r_off, r_len = EXTERNAL_TAIL.unpack_from(table, pos + ENTRY_HEADER.size)
            ext = text(meta_ref(p_o, p_n, f"entry {key!r} path", abs_off + 60), "path", abs_off)
            if not ext:
                raise _err(path, abs_off + 60, f"external entry {key!r} has an empty file path")
            out.append(
                RawEntry(
                    EntryType.EXTERNAL,
                    key,
                    md,
                    abs_off,
                    r_len,
                    data_offset=r_off,
                    minimum_alignment=min_align,
                    external_path=ext,
                    header_offset=base,
                )
            )
        else:
            raise _err(
                path,
                abs_off + 8,
                f"entry {i} has unknown type {etype}; expected 0 (SKIP), 1 (SPLAT), 2 (DATA) "
                f"or 3 (EXTERNAL)",
            )
        pos += align(size, ENTRY_ALIGNMENT)
    return next_off


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
