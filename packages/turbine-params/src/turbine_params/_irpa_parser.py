"""The exact IRPA parser: every archive header and entry checked field by field.

Anything malformed is a :class:`ParameterArchiveError` naming the file and the byte offset of the
bad field (what a reader needs to find the damage in a hex dump). With ``fast=True`` a well-formed
entry table is read by the numpy fast path (:mod:`._irpa_vectorized`) instead; anything that path
does not accept is parsed here, so the precise error always comes from this module.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._errors import ParameterArchiveError
from ._irpa_format import (
    DATA_SIZE,
    DATA_TAIL,
    ENTRY_ALIGNMENT,
    ENTRY_HEADER,
    EXTERNAL_SIZE,
    EXTERNAL_TAIL,
    HEADER_ALIGNMENT,
    HEADER_PREFIX,
    HEADER_V0,
    MAGIC,
    SPLAT_PATTERN_LENGTHS,
    SPLAT_SIZE,
    SPLAT_TAIL,
    EntryType,
    RawEntry,
    align,
)
from ._irpa_vectorized import EntryTable

__all__ = ["parse_archive"]


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


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0
