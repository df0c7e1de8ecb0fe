"""The IRPA v0 byte format (IREE's ``iree/schemas/parameter_archive.h``): its constants and records.

All structures are packed little-endian. Header (88 bytes)::

    u32 magic "IRPA"; u16 version_major; u16 version_minor; u64 header_size;
    u64 next_header_offset; u64 flags; u64 entry_count;
    (u64 offset, u64 length) entry_segment, metadata_segment, storage_segment

Every offset in a header is relative to the header's own file offset, so archives can be
concatenated and linked through ``next_header_offset``. Entries (each 16-byte aligned) start with a
60-byte common header ``u64 entry_size; u32 type; u64 flags; (u64,u64) name; (u64,u64) metadata;
u64 minimum_alignment`` followed by the type's fields: SPLAT ``u64 length; u8 pattern[16];
u8 pattern_length`` (85 bytes), DATA ``(u64 offset, u64 length) storage`` (76 bytes), EXTERNAL
``(u64,u64) path; (u64 offset, u64 length) range`` (92 bytes).

Reading is :mod:`._irpa_parser` (exact, with offsets in errors) and :mod:`._irpa_vectorized`
(its numpy fast path); writing is :mod:`._irpa_layout`, which reproduces the layout of IREE's own
builder byte for byte.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

__all__ = [
    "DEFAULT_DATA_ALIGNMENT",
    "DEFAULT_FILE_ALIGNMENT",
    "EntryType",
    "RawEntry",
    "align",
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
    """``value`` rounded up to a multiple of ``alignment`` (unchanged for 0 or 1)."""
    if alignment <= 1:
        return value
    return (value + alignment - 1) // alignment * alignment


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
