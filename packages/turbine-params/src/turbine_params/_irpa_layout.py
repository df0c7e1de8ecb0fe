"""The IRPA layout writer: header, entry table and metadata laid out as IREE's builder does.

:func:`layout_archive` computes every byte before the storage segment and where each stored
range goes; the archive builder then streams the data into those places. The result is byte for
byte what IREE's own archive builder writes for the same entries.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._irpa_format import (
    DATA_SIZE,
    DATA_TAIL,
    DEFAULT_DATA_ALIGNMENT,
    DEFAULT_FILE_ALIGNMENT,
    ENTRY_ALIGNMENT,
    ENTRY_HEADER,
    EXTERNAL_SIZE,
    EXTERNAL_TAIL,
    HEADER_V0,
    MAGIC,
    SPLAT_SIZE,
    SPLAT_TAIL,
    EntryType,
    align,
)

__all__ = ["ArchiveLayout", "LayoutEntry", "layout_archive"]


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
