"""Splats declare their size: a 4 KB archive can claim 2**31 or 2**62 bytes. Expanding one is
checked against max_splat_bytes() first (ParameterArchiveError, not a MemoryError, a torch
RuntimeError or the OOM killer); splat_value reads the value without expanding anything."""

from __future__ import annotations

import numpy as np
import pytest

from turbine_params import (
    ParameterArchive,
    ParameterArchiveBuilder,
    ParameterArchiveError,
    TensorMetadata,
    dtype_info,
    max_splat_bytes,
)
from turbine_params._index import MAX_SPLAT_BYTES_ENV

try:
    import torch
except ImportError:  # the standalone session has numpy only: the numpy readers are checked
    torch = None


def _readers(entry, flat: bool) -> list:
    """The entry's numpy reader, and its torch reader where torch is installed."""
    if flat:
        return [entry.as_flat_array] + ([entry.as_flat_tensor] if torch else [])
    return [entry.as_array] + ([entry.as_tensor] if torch else [])


def _archive(tmp_path, length: int, pattern: bytes, **kw):
    b = ParameterArchiveBuilder()
    b.add_splat("s", pattern, length=length, **kw)
    path = b.save(tmp_path / "s.irpa")
    assert path.stat().st_size <= 4096  # the declared size costs nothing on disk
    return ParameterArchive(path)


@pytest.mark.parametrize("length", [2**31, 2**62])
def test_expanding_a_huge_splat_is_refused_first(tmp_path, monkeypatch, length):
    if length == 2**31:  # 2 GiB could fit on a big machine: make the limit smaller than it
        monkeypatch.setenv(MAX_SPLAT_BYTES_ENV, str(2**30))
    with _archive(tmp_path, length, b"\x01\x02\x03\x04") as a:
        e = a["s"]
        pattern = rf"'s' is a splat \(pattern 0x01020304\) of {length} bytes: expanding it needs"
        for read in _readers(e, flat=True):
            with pytest.raises(ParameterArchiveError, match=pattern) as info:
                read()
            assert "splat_value" in str(info.value) and str(a["s"].raw.origin) in str(info.value)
        np.testing.assert_array_equal(e.splat_value, np.array([1, 2, 3, 4], np.uint8))


def test_typed_splats_of_several_elements_are_checked_too(tmp_path, monkeypatch):
    monkeypatch.setenv(MAX_SPLAT_BYTES_ENV, "1000")
    pattern = np.array([1.5, -2.0], np.float32).tobytes()
    b = ParameterArchiveBuilder()
    md = TensorMetadata(dtype_info("float32"), (4096,)).encode()
    b.add_splat("s", pattern, length=4096 * 4, metadata=md)
    with ParameterArchive(b.save(tmp_path / "t.irpa")) as a:
        e = a["s"]
        for read in _readers(e, flat=False):
            with pytest.raises(ParameterArchiveError, match="over the limit of 1000"):
                read()
        np.testing.assert_array_equal(e.splat_value, np.array([1.5, -2.0], np.float32))
        assert e.shape == (4096,)
    monkeypatch.setenv(MAX_SPLAT_BYTES_ENV, str(2**20))
    with ParameterArchive(tmp_path / "t.irpa") as a:
        np.testing.assert_array_equal(a["s"].as_array(), np.tile([1.5, -2.0], 2048))


@pytest.mark.parametrize("length", [2**31, 2**62])
def test_one_element_splats_stay_zero_copy_views(tmp_path, length):
    """A one-byte pattern (IREE's --strip writes them) or a one-element value is a broadcast
    view: nothing is allocated, so nothing is limited."""
    md = TensorMetadata(dtype_info("float32"), (length // 4,)).encode()
    with _archive(tmp_path, length, np.float32(0.5).tobytes(), metadata=md) as a:
        e = a["s"]
        arr = e.as_array()
        assert arr.shape == (length // 4,) and arr.strides == (0,) and arr[-1] == 0.5
        if torch is not None:
            t = e.as_tensor()
            assert t.shape == (length // 4,) and t.stride() == (0,) and t[-1].item() == 0.5
        np.testing.assert_array_equal(e.splat_value, np.array([0.5], np.float32))
    with _archive(tmp_path, length, b"\x00") as a:
        assert a["s"].as_flat_array().strides == (0,)
        if torch is not None:
            assert a["s"].as_flat_tensor().stride() == (0,)
            assert a["s"].as_flat_tensor().dtype == torch.uint8


def test_lengths_no_array_can_hold(tmp_path):
    with _archive(tmp_path, 2**64 - 8, b"\x00" * 8) as a:
        e = a["s"]
        for read in _readers(e, flat=True):
            with pytest.raises(ParameterArchiveError, match=r"more than any array can hold"):
                read()
        assert e.length == 2**64 - 8 and e.splat_value.tobytes() == bytes(8)


def test_limit_setting(monkeypatch):
    monkeypatch.setenv(MAX_SPLAT_BYTES_ENV, "12345")
    assert max_splat_bytes() == 12345
    monkeypatch.setenv(MAX_SPLAT_BYTES_ENV, "lots")
    with pytest.raises(ParameterArchiveError, match=r"TURBINE_PARAMS_MAX_SPLAT_BYTES is 'lots'"):
        max_splat_bytes()
    monkeypatch.delenv(MAX_SPLAT_BYTES_ENV)
    assert 0 < max_splat_bytes() < 2**63


def test_non_splats_have_no_splat_value(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("w", np.ones(3, np.float32))
    with ParameterArchive(b.save(tmp_path / "w.irpa")) as a:
        assert a["w"].splat_value is None and a["w"].splat_pattern is None


def test_converting_a_huge_splat_to_safetensors_does_not_fill_the_disk(tmp_path):
    from turbine_params import irpa_to_safetensors

    b = ParameterArchiveBuilder()
    b.add_splat("s", b"\x01\x02", length=2**62)
    src = b.save(tmp_path / "s.irpa")
    with pytest.raises(ParameterArchiveError, match=r"needs \d+ bytes .*bytes free"):
        irpa_to_safetensors(src, tmp_path / "s.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.irpa"]


@pytest.mark.skipif(torch is not None, reason="checks the message given when torch is missing")
def test_torch_readers_without_torch_name_the_numpy_reader(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("w", np.ones(3, np.float32))
    with ParameterArchive(b.save(tmp_path / "w.irpa")) as a:
        with pytest.raises(ImportError, match=r"as_tensor\(\) needs torch.*with as_array\(\)"):
            a["w"].as_tensor()
        with pytest.raises(ImportError, match=r"as_flat_tensor\(\) needs torch.*as_flat_array"):
            a["w"].as_flat_tensor()
