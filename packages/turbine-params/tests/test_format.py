"""Archive layout and numpy round trips (no torch, no IREE needed)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from turbine_params import (
    EntryType,
    ParameterArchive,
    ParameterArchiveBuilder,
    ParameterArchiveError,
    TensorMetadata,
    dtype_info,
    known_dtype_names,
)

NUMPY_DTYPES = [
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.bool_,
]


def _sample(dtype, shape):
    n = int(np.prod(shape))
    if dtype is np.bool_:
        return (np.arange(n) % 3 == 0).reshape(shape)
    vals = np.arange(n).astype(dtype).reshape(shape)
    if np.issubdtype(dtype, np.complexfloating):
        vals = vals + 1j * (vals + 0.5)
    return vals.astype(dtype)


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(2, 3), (), (0, 4), (5,)], ids=str)
def test_numpy_round_trip(tmp_path, dtype, shape):
    a = _sample(dtype, shape)
    b = ParameterArchiveBuilder()
    b.add_tensor("t", a)
    path = b.save(tmp_path / "x.irpa")
    with ParameterArchive(path) as archive:
        e = archive["t"]
        got = e.as_array()
        assert got.dtype == a.dtype and got.shape == a.shape
        np.testing.assert_array_equal(got, a)
        expected = "bool" if dtype is np.bool_ else np.dtype(dtype).name
        assert e.dtype_name == f"torch.{expected}"
        assert e.as_flat_array().tobytes() == a.tobytes()


def test_metadata_is_pytorch_json(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("w", np.zeros((2, 3), np.float32))
    archive = ParameterArchive(b.save(tmp_path / "m"))
    md = archive["w"].metadata
    assert md.startswith(b'PYTORCH:{"type": "Tensor", "dtype": "float32", "shape": [2, 3]')
    assert b'"dtype_desc"' in md


@pytest.mark.parametrize("name", known_dtype_names())
def test_every_dtype_name_round_trips_as_raw_bytes(tmp_path, name):
    """Dtypes numpy lacks (bf16, fp8, complex32, sub-byte) still round-trip as bytes+metadata."""
    info = dtype_info(name)
    shape = (3, 2)
    raw = np.arange(6 * info.itemsize, dtype=np.uint8)
    b = ParameterArchiveBuilder()
    b.add_blob("t", raw, metadata=TensorMetadata(info, shape).encode())
    with ParameterArchive(b.save(tmp_path / "d")) as archive:
        e = archive["t"]
        assert e.dtype_name == f"torch.{name}"
        assert e.shape == shape
        np.testing.assert_array_equal(e.as_flat_array(), raw)
        if info.numpy is not None:
            np.testing.assert_array_equal(e.as_array().reshape(-1).view(np.uint8), raw)
        else:
            try:
                import ml_dtypes  # noqa: F401
            except ImportError:
                with pytest.raises(
                    ParameterArchiveError, match=f"numpy has no dtype for torch.{name}"
                ):
                    e.as_array()


def test_layout_matches_iree_conventions(tmp_path, irpa):
    b = ParameterArchiveBuilder()
    b.add_tensor("a", np.arange(5, dtype=np.float32))
    b.add_splat("s", np.int16(7), shape=(6,))
    b.add_blob("bb", np.arange(3, dtype=np.int8))
    path = b.save(tmp_path / "x")
    assert path.name == "x.irpa"
    h = irpa.read_header(path)
    assert h["magic"] == 0x41505249 and h["major"] == 0 and h["header_size"] == irpa.HEADER.size
    assert h["entry_offset"] == 96 and h["entry_count"] == 3
    # data entry 76 -> 80, splat 85 -> 96, data 76 (no trailing pad)
    assert h["entry_length"] == 80 + 96 + 76
    assert h["metadata_offset"] == 96 + h["entry_length"]
    assert h["storage_offset"] % 64 == 0
    assert os.path.getsize(path) % 4096 == 0
    with ParameterArchive(path) as archive:
        assert [k for k, _ in archive.items()] == ["a", "s", "bb"]
        assert archive["a"].raw.offset % 64 == 0
        assert archive["bb"].raw.offset % 64 == 0


@pytest.mark.parametrize("alignment", [1, 16, 256, 4096])
def test_configurable_alignment(tmp_path, alignment):
    b = ParameterArchiveBuilder(data_alignment=alignment, file_alignment=512)
    arrays = {f"t{i}": np.arange(i + 1, dtype=np.int8) for i in range(5)}
    for k, v in arrays.items():
        b.add_tensor(k, v)
    path = b.save(tmp_path / "a.irpa")
    assert os.path.getsize(path) % 512 == 0
    with ParameterArchive(path) as archive:
        for k, v in arrays.items():
            assert archive[k].raw.offset % alignment == 0
            np.testing.assert_array_equal(archive[k].as_array(), v)


def test_bad_alignment_rejected():
    with pytest.raises(ParameterArchiveError, match="power of two"):
        ParameterArchiveBuilder(data_alignment=48)


def test_all_entry_types(tmp_path):
    ext = tmp_path / "external.bin"
    ext.write_bytes(b"\x00" * 8 + np.arange(4, dtype=np.float32).tobytes())
    b = ParameterArchiveBuilder()
    b.add_tensor("data", np.full((2, 2), 3.0, np.float64))
    b.add_splat("splat", np.float32(1.5), shape=(3, 4))
    b.add_splat("splat16", b"\x01\x02" * 8, length=64)
    b.add_skip("erased")
    b.add_external(
        "ext",
        "external.bin",
        offset=8,
        length=16,
        metadata=TensorMetadata(dtype_info("float32"), (4,)).encode(),
    )
    path = b.save(tmp_path / "all.irpa")
    with ParameterArchive(path) as archive:
        assert archive.keys() == ["data", "splat", "splat16", "ext"]
        assert "erased" not in archive
        types = [r.type for _, r in archive.index.raw_entries]
        assert types == [
            EntryType.DATA,
            EntryType.SPLAT,
            EntryType.SPLAT,
            EntryType.SKIP,
            EntryType.EXTERNAL,
        ]
        np.testing.assert_array_equal(archive["data"].as_array(), np.full((2, 2), 3.0))
        s = archive["splat"].as_array()
        assert s.shape == (3, 4) and s.dtype == np.float32 and (s == 1.5).all()
        assert archive["splat"].as_flat_array().tobytes() == np.float32(1.5).tobytes() * 12
        assert archive["splat16"].as_flat_array().tobytes() == b"\x01\x02" * 32
        np.testing.assert_array_equal(archive["ext"].as_array(), np.arange(4, dtype=np.float32))
        assert archive["ext"].entry_type == "external"


def test_linked_headers(tmp_path):
    """Two archives concatenated and linked with next_header_offset read as one."""
    b1 = ParameterArchiveBuilder()
    b1.add_tensor("first", np.arange(3, dtype=np.int32))
    p1 = b1.save(tmp_path / "one.irpa")
    b2 = ParameterArchiveBuilder()
    b2.add_tensor("second", np.arange(4, dtype=np.float32))
    b2.add_splat("third", np.uint8(9), shape=(5,))
    p2 = b2.save(tmp_path / "two.irpa")
    one = bytearray(p1.read_bytes())
    link = len(one)
    one[16:24] = link.to_bytes(8, "little")
    joined = tmp_path / "joined.irpa"
    joined.write_bytes(bytes(one) + p2.read_bytes())
    with ParameterArchive(joined) as archive:
        assert archive.keys() == ["first", "second", "third"]
        np.testing.assert_array_equal(archive["second"].as_array(), np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(archive["third"].as_array(), np.full(5, 9, np.uint8))


def test_tied_arrays_stored_once(tmp_path, irpa):
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    b = ParameterArchiveBuilder()
    b.add_tensor("embed.weight", w)
    b.add_tensor("lm_head.weight", w)
    b.add_tensor("copy", w.copy())  # equal values, different memory: stored separately
    b.add_tensor("transposed", w.T)  # same memory, different strides: stored separately
    path = b.save(tmp_path / "tied.irpa")
    with ParameterArchive(path) as archive:
        e1, e2, e3, e4 = (archive[k].raw for k in archive)
        assert e1.offset == e2.offset and e1.length == e2.length
        assert len({e1.offset, e3.offset, e4.offset}) == 3
        np.testing.assert_array_equal(archive["transposed"].as_array(), w.T)
    assert irpa.read_header(path)["storage_length"] < 4 * w.nbytes


def test_duplicates_and_mapping_api(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("k", np.array([1], np.int32))
    b.add_tensor("k", np.array([2], np.int32))
    b.add_tensor("other", np.array([3], np.int32))
    with ParameterArchive(b.save(tmp_path / "dup.irpa")) as archive:
        assert [k for k, _ in archive.items()] == ["k", "k", "other"]
        assert len(archive) == 2 and list(archive) == ["k", "other"]
        assert archive["k"].as_array()[0] == 1  # first entry wins
        assert "k" in archive and "nope" not in archive
        assert archive.get("nope") is None
        with pytest.raises(KeyError, match="no parameter 'nope'"):
            archive["nope"]


def test_load_appends_files(tmp_path):
    paths = []
    for i in range(2):
        b = ParameterArchiveBuilder()
        b.add_tensor(f"t{i}", np.array([i], np.int64))
        paths.append(b.save(tmp_path / f"p{i}.irpa"))
    archive = ParameterArchive()
    for p in paths:
        archive.load(p)
    assert archive.keys() == ["t0", "t1"]
    assert len(archive.index) == 2


@pytest.mark.parametrize("mmap", [True, False])
def test_read_only_mapping_is_copy_on_write(tmp_path, mmap):
    b = ParameterArchiveBuilder()
    b.add_tensor("w", np.zeros(16, np.float32))
    path = b.save(tmp_path / "ro.irpa")
    before = path.read_bytes()
    with ParameterArchive(path, mmap=mmap) as archive:
        a = archive["w"].as_array()
        a[:] = 7.0  # must neither crash nor reach the file
        assert (archive["w"].as_array() == (7.0 if mmap else 0.0)).all()
    assert path.read_bytes() == before


def test_writable_mapping_writes_through(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("w", np.zeros(4, np.float32))
    path = b.save(tmp_path / "rw.irpa")
    archive = ParameterArchive(path, writable=True)
    archive["w"].as_array()[:] = 5.0
    del archive
    with ParameterArchive(path) as again:
        np.testing.assert_array_equal(again["w"].as_array(), np.full(4, 5.0, np.float32))


def test_zero_copy_numpy_view(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("w", np.ones(1024, np.float32))
    with ParameterArchive(b.save(tmp_path / "z.irpa")) as archive:
        a = archive["w"].as_array()
        assert not a.flags.owndata
        base = a
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        assert not isinstance(base, np.ndarray)  # the mmap itself


def test_save_is_atomic(tmp_path):
    path = tmp_path / "keep.irpa"
    b = ParameterArchiveBuilder()
    b.add_tensor("ok", np.arange(4, dtype=np.float32))
    b.save(path)
    before = path.read_bytes()

    bad = ParameterArchiveBuilder()
    bad.add_tensor("ok", np.arange(4, dtype=np.float32))
    big = np.arange(1 << 16, dtype=np.float32)
    bad.add_tensor("big", big)
    big.resize((1 << 15,), refcheck=False)  # the tensor shrinks after add: save must fail
    with pytest.raises(ParameterArchiveError, match="changed size"):
        bad.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["keep.irpa"]  # no temp file left behind

    # A source file that shrinks before save fails mid-write, after other data went out.
    src = tmp_path / "src.bin"
    src.write_bytes(bytes(1 << 20))
    mid = ParameterArchiveBuilder()
    mid.add_tensor("first", np.ones(1 << 16, np.float32))
    mid.add_file_range("second", src, offset=0, length=1 << 20)
    src.write_bytes(b"short")
    with pytest.raises(ParameterArchiveError, match="past the end"):
        mid.save(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.irpa", "src.bin"]


def test_builder_index(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("a", np.arange(3, dtype=np.int16))
    b.add_splat("s", np.float32(0), shape=(2,))
    b.add_skip("gone")
    idx = b.index
    assert [k for k, _ in idx.items()] == ["a", "s"]
    e = dict(idx.items())
    assert e["a"].is_buffer and e["a"].length == 6
    assert e["s"].is_splat and e["s"].splat_pattern == bytes(4)


def test_splat_validation():
    b = ParameterArchiveBuilder()
    with pytest.raises(ParameterArchiveError, match="1, 2, 4, 8 or 16"):
        b.add_splat("x", b"abc", length=3)
    with pytest.raises(ParameterArchiveError, match="multiple"):
        b.add_splat("x", b"ab", length=3)
    with pytest.raises(ParameterArchiveError, match="exactly one element"):
        b.add_splat("x", np.zeros(2, np.float32), shape=(4,))
    with pytest.raises(ParameterArchiveError, match="dtype="):
        b.add_splat("x", 1.0, shape=(4,))
    b.add_splat("ok", 3, dtype="int32", shape=(2, 2))
    assert b.index.items()[0][1].splat_pattern == np.int32(3).tobytes()


def test_as_array_without_metadata_is_value_error(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_blob("blob", b"hello world")
    with ParameterArchive(b.save(tmp_path / "b.irpa")) as archive:
        e = archive["blob"]
        assert e.as_flat_array().tobytes() == b"hello world"
        with pytest.raises(ValueError, match="no PYTORCH tensor metadata"):
            e.as_array()


def test_empty_archive(tmp_path):
    path = ParameterArchiveBuilder().save(tmp_path / "empty.irpa")
    assert os.path.getsize(path) == 4096
    with ParameterArchive(path) as archive:
        assert archive.items() == [] and len(archive) == 0


def test_entry_header_struct_sizes(irpa):
    assert irpa.HEADER.size == 88 and irpa.ENTRY_HEADER.size == 60


def test_progress_line(capsys):
    from turbine_params._progress import Progress

    p = Progress(1 << 30, "writing x.irpa", enabled=True)
    p.advance(1 << 29)
    p.advance(1 << 29)
    p.close()
    err = capsys.readouterr().err
    assert "writing x.irpa: 100.0% 1.00/1.00 GB" in err
    assert not Progress(1 << 30, "quiet").enabled  # stderr is not a terminal under pytest


@pytest.mark.parametrize(
    ("pattern", "dtype", "expected"),
    [
        (b"\x00", np.float32, 0.0),  # what IREE's `iree-convert-parameters --strip` writes
        (b"\x01", np.int16, 0x0101),  # the byte repeats within each element
        (np.arange(4, dtype=np.int32).tobytes(), np.int32, [0, 1, 2, 3, 0, 1, 2, 3]),
    ],
)
def test_splat_pattern_not_one_element_reads_as_tensor(tmp_path, pattern, dtype, expected):
    md = TensorMetadata(dtype_info(np.dtype(dtype).name), (8,))
    b = ParameterArchiveBuilder()
    b.add_splat("s", pattern, length=md.nbytes, metadata=md.encode())
    with ParameterArchive(b.save(tmp_path / "s.irpa")) as archive:
        got = archive["s"].as_array()
    assert got.dtype == dtype and got.shape == (8,)
    np.testing.assert_array_equal(got, np.broadcast_to(np.asarray(expected, dtype), (8,)))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_save_honours_umask_without_changing_it(tmp_path, monkeypatch):
    # Reading the umask with os.umask() sets it process-wide for a moment, racing with other
    # threads that create files; save() must read it without touching it.
    old = os.umask(0o027)
    try:

        def no_umask(*_):
            raise AssertionError("save() changed the process umask")

        monkeypatch.setattr(os, "umask", no_umask)
        b = ParameterArchiveBuilder()
        b.add_tensor("w", np.ones(4, np.float32))
        path = b.save(tmp_path / "m.irpa")
    finally:
        monkeypatch.undo()
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o640
