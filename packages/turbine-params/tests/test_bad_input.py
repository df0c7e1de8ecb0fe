"""Malformed archives raise ParameterArchiveError naming the file, the offset and the fix."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from turbine_params import (
    ParameterArchive,
    ParameterArchiveBuilder,
    ParameterArchiveError,
)


@pytest.fixture
def good(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("weight", np.arange(16, dtype=np.float32).reshape(4, 4))
    b.add_splat("zeros", np.float32(0), shape=(8,))
    b.add_tensor("bias", np.arange(4, dtype=np.float32))
    return b.save(tmp_path / "good.irpa")


def _open(path):
    with ParameterArchive(path) as archive:
        for _, e in archive.items():
            e.as_flat_array()
            if e.tensor_metadata is not None:
                e.as_array()


def _expect(path, match, *, offset=None):
    with pytest.raises(ParameterArchiveError, match=match) as info:
        _open(path)
    err = info.value
    assert isinstance(err, ValueError)
    assert str(path) in str(err)
    if offset is not None:
        assert err.offset == offset
        assert f"byte offset {offset}" in str(err)
    return err


def test_good_archive_opens(good):
    _open(good)


@pytest.mark.parametrize("keep", [0, 10, 31, 60, 100, 300, 500])
def test_truncated(good, tmp_path, keep):
    bad = tmp_path / "t.irpa"
    bad.write_bytes(good.read_bytes()[:keep])
    _expect(bad, "truncated|past the end|outside")


def test_empty_file(tmp_path):
    p = tmp_path / "empty.irpa"
    p.write_bytes(b"")
    _expect(p, "truncated", offset=0)


def test_wrong_magic(good, irpa):
    irpa.patch(good, 0, "<4s", b"GGUF")
    _expect(good, "wrong magic b'GGUF'; expected b'IRPA'", offset=0)


def test_safetensors_file_gets_a_hint(tmp_path):
    p = tmp_path / "model.bin"  # safetensors content under another name
    p.write_bytes(struct.pack("<Q", 2) + b"{}" + bytes(100))
    _expect(p, "turbine-params convert")


def test_unknown_major_version(good, irpa):
    irpa.patch(good, 4, "<HH", 3, 1)
    _expect(good, r"unknown archive major version 3\.1; this reader supports version 0", offset=4)


def test_newer_minor_version_is_read(good, irpa):
    irpa.patch(good, 6, "<H", 2)
    _open(good)


def test_header_size_too_small(good, irpa):
    irpa.patch(good, 8, "<Q", 40)
    _expect(good, "header_size 40 too small", offset=8)


def test_header_size_past_end(good, irpa):
    irpa.patch(good, 8, "<Q", 1 << 40)
    _expect(good, "past the end", offset=8)


def test_segment_past_end(good, irpa):
    h = irpa.read_header(good)
    irpa.patch(good, 72, "<Q", h["storage_offset"] + 10**12)
    _expect(good, "storage segment .* extends past the end of the file", offset=72)


def test_huge_offset_does_not_overflow(good, irpa):
    irpa.patch(good, 72, "<QQ", 2**64 - 8, 16)
    _expect(good, "storage segment", offset=72)


def test_overlapping_segments(good, irpa):
    h = irpa.read_header(good)
    irpa.patch(good, 56, "<QQ", h["entry_offset"], h["metadata_length"])
    _expect(good, "overlaps")


def test_segment_overlapping_header(good, irpa):
    irpa.patch(good, 40, "<Q", 16)
    _expect(good, "entry segment .* overlaps the header")


def test_absurd_entry_count(good, irpa):
    irpa.patch(good, 32, "<Q", 2**62)
    _expect(good, "entry_count 4611686018427387904 cannot fit", offset=32)


def test_entry_size_too_small(good, irpa):
    h = irpa.read_header(good)
    irpa.patch(good, h["entry_offset"], "<Q", 8)
    _expect(good, "entry_size 8", offset=h["entry_offset"])


def test_entry_size_too_large(good, irpa):
    h = irpa.read_header(good)
    irpa.patch(good, h["entry_offset"], "<Q", 10**9)
    _expect(good, "entry_size 1000000000")


def test_unknown_entry_type(good, irpa):
    h = irpa.read_header(good)
    irpa.patch(good, h["entry_offset"] + 8, "<I", 9)
    _expect(good, r"unknown type 9; expected 0 \(SKIP\)", offset=h["entry_offset"] + 8)


def test_name_outside_metadata(good, irpa):
    h = irpa.read_header(good)
    irpa.patch(good, h["entry_offset"] + 20, "<QQ", 5, 10**6)
    _expect(good, "name reference .* outside the metadata segment")


def test_data_range_outside_storage(good, irpa):
    h = irpa.read_header(good)
    irpa.patch(good, h["entry_offset"] + 60, "<QQ", 0, h["storage_length"] + 64)
    _expect(good, "outside the storage segment")


def test_misaligned_data(good, irpa):
    h = irpa.read_header(good)
    irpa.patch(good, h["entry_offset"] + 60, "<Q", 4)
    _expect(good, "misaligned: its data starts at file offset .* minimum_alignment 64")


def test_non_power_of_two_alignment(good, irpa):
    h = irpa.read_header(good)
    irpa.patch(good, h["entry_offset"] + 52, "<Q", 48)
    _expect(good, "not a power of two")


def test_non_utf8_name(good, irpa):
    h = irpa.read_header(good)
    irpa.patch(good, h["metadata_offset"], "<2s", b"\xff\xfe")
    _expect(good, "not valid UTF-8")


def test_bad_splat_pattern_length(good, irpa):
    h = irpa.read_header(good)
    splat = h["entry_offset"] + 80  # second entry
    irpa.patch(good, splat + 84, "<B", 3)
    _expect(good, "pattern_length 3; expected 1, 2, 4, 8 or 16", offset=splat + 84)


def test_splat_length_not_multiple(good, irpa):
    h = irpa.read_header(good)
    splat = h["entry_offset"] + 80
    irpa.patch(good, splat + 60, "<Q", 7)
    _expect(good, "not a multiple")


def test_unknown_dtype_name(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_blob(
        "w",
        bytes(8),
        metadata=b'PYTORCH:{"type": "Tensor", "dtype": "torch.float128", "shape": [1]}',
    )
    p = b.save(tmp_path / "dt.irpa")
    err = _expect(p, r"unknown dtype name 'torch.float128'; expected one of: torch.float64")
    assert "entry 'w'" in str(err)


def test_malformed_metadata_json(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_blob("w", bytes(8), metadata=b"PYTORCH:{not json")
    _expect(b.save(tmp_path / "js.irpa"), "not valid UTF-8 JSON")


def test_metadata_size_mismatch(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_blob(
        "w",
        bytes(8),
        metadata=b'PYTORCH:{"type": "Tensor", "dtype": "torch.float32", "shape": [3]}',
    )
    _expect(
        b.save(tmp_path / "sz.irpa"),
        r"metadata says torch.float32\[3\] \(12 bytes\) but the entry holds 8",
    )


def test_next_header_past_end(good, irpa):
    irpa.patch(good, 16, "<Q", 1 << 20)
    _expect(good, "next_header_offset .* past the end", offset=16)


def test_next_header_misaligned(good, irpa):
    irpa.patch(good, 16, "<Q", 4097)
    _expect(good, "next_header_offset 4097 invalid", offset=16)


def test_missing_external_file(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_external("e", "nowhere.bin", length=4)
    _expect(b.save(tmp_path / "ext.irpa"), "external entry 'e' refers to .*nowhere.bin")


def test_missing_file(tmp_path):
    with pytest.raises(ParameterArchiveError, match="cannot open"):
        ParameterArchive(tmp_path / "absent.irpa")


def test_error_exposes_path_and_offset(good, irpa):
    irpa.patch(good, 0, "<4s", b"XXXX")
    with pytest.raises(ParameterArchiveError) as info:
        ParameterArchive(good)
    assert info.value.path == str(good) and info.value.offset == 0


def test_bad_metadata_on_splat_names_the_archive(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_splat(
        "s",
        b"\0\0\0\0",
        length=8,
        metadata=b'PYTORCH:{"type": "Tensor", "dtype": "torch.nope", "shape": [2]}',
    )
    p = b.save(tmp_path / "splat_md.irpa")
    err = _expect(p, "unknown dtype name 'torch.nope'")
    assert "entry 's'" in str(err) and err.offset is not None


def test_directory_is_not_an_archive(tmp_path):
    with pytest.raises(ParameterArchiveError, match="not a regular file"):
        ParameterArchive(tmp_path)


@pytest.mark.parametrize("mmap", [True, False])
def test_reading_after_close_names_the_archive(good, mmap):
    archive = ParameterArchive(good, mmap=mmap)
    entry = archive["weight"]
    archive.close()
    for read in (entry.as_flat_array, entry.as_array, lambda: archive["bias"].as_array()):
        with pytest.raises(ParameterArchiveError, match=r"good\.irpa: .*archive was closed"):
            read()


@pytest.mark.parametrize("list_first", [False, True])
def test_bad_splat_metadata_names_the_file_on_lookup(tmp_path, list_first):
    # A key lookup on a freshly opened archive builds the entry alone; it must still know
    # which file it came from.
    b = ParameterArchiveBuilder()
    b.add_splat("s", b"\0\0\0\0", length=8, metadata=b"PYTORCH:{bad")
    path = b.save(tmp_path / "bm.irpa")
    with ParameterArchive(path) as archive:
        if list_first:
            archive.items()
        with pytest.raises(ParameterArchiveError, match=r"bm\.irpa: byte offset \d+: entry 's'"):
            archive["s"].tensor_metadata  # noqa: B018


def test_add_file_range_of_missing_file(tmp_path):
    b = ParameterArchiveBuilder()
    with pytest.raises(ParameterArchiveError, match=r"nope\.bin: entry 'k': cannot read"):
        b.add_file_range("k", tmp_path / "nope.bin", offset=0, length=4)
    assert len(b) == 0


def test_failed_load_leaves_the_archive_as_it_was(good, tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("partial", np.ones(4, np.float32))
    b.add_external("e", "nowhere.bin", length=4)
    bad = b.save(tmp_path / "ext.irpa")
    archive = ParameterArchive(good)
    before = archive.keys()
    with pytest.raises(ParameterArchiveError, match=r"nowhere\.bin"):
        archive.load(bad)
    assert archive.keys() == before  # not 'partial' from the file that failed
    assert [k for k, _ in archive.items()] == before
    assert len(archive.index) == len(before) and len(archive.index.raw_entries) == 3
    np.testing.assert_array_equal(archive["bias"].as_array(), np.arange(4, dtype=np.float32))
    archive.close()
