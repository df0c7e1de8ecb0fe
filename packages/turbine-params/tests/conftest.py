"""Shared fixtures for turbine-params tests (numpy only)."""

from __future__ import annotations

import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

HEADER = struct.Struct("<IHHQQQQQQQQQQ")
ENTRY_HEADER = struct.Struct("<QIQQQQQQ")


def read_header(path: Path, base: int = 0) -> dict:
    raw = Path(path).read_bytes()[base : base + HEADER.size]
    f = HEADER.unpack(raw)
    names = [
        "magic",
        "major",
        "minor",
        "header_size",
        "next_header_offset",
        "flags",
        "entry_count",
        "entry_offset",
        "entry_length",
        "metadata_offset",
        "metadata_length",
        "storage_offset",
        "storage_length",
    ]
    return dict(zip(names, f))


def patch(path: Path, offset: int, fmt: str, *values) -> None:
    data = bytearray(Path(path).read_bytes())
    struct.pack_into(fmt, data, offset, *values)
    Path(path).write_bytes(bytes(data))


@pytest.fixture
def irpa() -> SimpleNamespace:
    """Raw-format helpers: header struct, entry-header struct, read_header(), patch()."""
    return SimpleNamespace(
        HEADER=HEADER, ENTRY_HEADER=ENTRY_HEADER, read_header=read_header, patch=patch
    )
