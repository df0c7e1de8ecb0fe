"""Converters (safetensors <-> irpa, torch checkpoint -> irpa) and the turbine-params CLI."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from turbine_params import (
    ParameterArchive,
    ParameterArchiveBuilder,
    ParameterArchiveError,
    TensorMetadata,
    convert_parameters,
    dtype_info,
    irpa_to_safetensors,
    safetensors_to_irpa,
    strip_archive,
    verify_archive,
    write_safetensors,
)
from turbine_params._cli import main as cli
from turbine_params._safetensors import read_safetensors_header


def _write_safetensors(path, tensors: dict[str, np.ndarray], extra: dict | None = None):
    """A minimal safetensors writer (the format is public), so this runs without the library."""
    header: dict = {"__metadata__": {"format": "pt"}}
    names = {"float32": "F32", "int64": "I64", "float16": "F16", "uint8": "U8", "bool": "BOOL"}
    off = 0
    for k, v in tensors.items():
        header[k] = {
            "dtype": names[v.dtype.name],
            "shape": list(v.shape),
            "data_offsets": [off, off + v.nbytes],
        }
        off += v.nbytes
    header.update(extra or {})
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for v in tensors.values():
            f.write(v.tobytes())


TENSORS = {
    "layer.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
    "layer.bias": np.array([1, 2, 3], np.int64),
    "half": np.ones((2, 2), np.float16),
    "mask": np.array([True, False]),
    "empty": np.zeros((0, 3), np.float32),
}


def test_safetensors_to_irpa_and_back(tmp_path):
    src = tmp_path / "m.safetensors"
    _write_safetensors(src, TENSORS)
    out = safetensors_to_irpa(src, tmp_path / "m")
    assert out.name == "m.irpa"
    with ParameterArchive(out) as archive:
        for k, v in TENSORS.items():
            np.testing.assert_array_equal(archive[k].as_array(), v)
            assert archive[k].raw.offset % 64 == 0
    assert verify_archive(out, against=src) == (
        len(TENSORS),
        sum(v.nbytes for v in TENSORS.values()),
    )
    back = irpa_to_safetensors(out, tmp_path / "back.safetensors")
    # The round trip reproduces the tensor data exactly.
    out2 = safetensors_to_irpa(back, tmp_path / "again.irpa")
    verify_archive(out2, against=out)


def test_irpa_to_safetensors_with_splats_and_bf16(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_splat("z", np.float32(0.5), shape=(1000,))
    b.add_blob(
        "bf", bytes(range(8)), metadata=TensorMetadata(dtype_info("bfloat16"), (4,)).encode()
    )
    b.add_blob("raw", b"xyz")
    st = irpa_to_safetensors(b.save(tmp_path / "s.irpa"), tmp_path / "s.safetensors")
    (n,) = struct.unpack("<Q", st.read_bytes()[:8])
    header = json.loads(st.read_bytes()[8 : 8 + n])
    assert header["bf"]["dtype"] == "BF16" and header["bf"]["shape"] == [4]
    assert header["raw"] == {"dtype": "U8", "shape": [3], "data_offsets": [4008, 4011]}
    back = safetensors_to_irpa(st, tmp_path / "back.irpa")
    with ParameterArchive(back) as archive:
        assert (archive["z"].as_array() == 0.5).all()
        assert archive["bf"].as_flat_array().tobytes() == bytes(range(8))
        assert archive["raw"].as_flat_array().tobytes() == b"xyz"


def test_safetensors_library_reads_our_output(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="safetensors is not installed")
    b = ParameterArchiveBuilder()
    for k, v in TENSORS.items():
        b.add_tensor(k, v)
    out = irpa_to_safetensors(b.save(tmp_path / "x.irpa"), tmp_path / "x.safetensors")
    loaded = st.load_file(str(out))
    for k, v in TENSORS.items():
        np.testing.assert_array_equal(loaded[k], v)
    st.save_file(TENSORS, str(tmp_path / "lib.safetensors"))
    verify_archive(
        safetensors_to_irpa(tmp_path / "lib.safetensors", tmp_path / "lib.irpa"),
        against=tmp_path / "lib.safetensors",
    )


def test_write_safetensors_numpy_round_trip_aligned_and_atomic(tmp_path):
    arrays = {
        "b": np.arange(3, dtype=np.uint8),
        "a": np.arange(6, dtype=np.float64).reshape(2, 3),
        "flags": np.array([True, False]),
        "scalar": np.array(7, dtype=np.int32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "big_endian": np.arange(4, dtype=">i2"),
    }
    out = write_safetensors(tmp_path / "x.safetensors", arrays, metadata={"format": "test"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.safetensors"]  # no temporary left
    base, entries = read_safetensors_header(out)
    assert base % 8 == 0
    for _name, md, begin, _end in entries:
        assert begin % md.dtype.itemsize == 0  # largest elements first: each one aligned
    with ParameterArchive(out) as archive:
        for k, v in arrays.items():
            np.testing.assert_array_equal(
                archive[k].as_array(), v.astype(v.dtype.newbyteorder("="))
            )
    st = pytest.importorskip("safetensors.numpy", reason="safetensors is not installed")
    loaded = st.load_file(str(out))
    for k, v in arrays.items():
        np.testing.assert_array_equal(loaded[k], v)


def test_write_safetensors_torch_dtypes_read_back_by_the_safetensors_library(tmp_path):
    torch = pytest.importorskip("torch")
    safe_open = pytest.importorskip("safetensors").safe_open
    raw = torch.arange(12, dtype=torch.uint8).reshape(3, 4)
    tensors = {
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "f8": raw.view(torch.float8_e4m3fn),
        "e8m0": raw.view(torch.float8_e8m0fnu),
        "f4": raw.view(torch.float4_e2m1fn_x2),  # two values per byte: safetensors' F4
        "u16": torch.arange(6, dtype=torch.int32).to(torch.uint16),
        "c64": torch.randn(2, dtype=torch.complex64),
        "strided": torch.randn(4, 6)[:, ::2],
        "i64": torch.tensor(5),
    }
    out = write_safetensors(tmp_path / "t.safetensors", tensors, metadata={"k": "v"})
    with safe_open(str(out), "pt") as f:
        assert f.metadata() == {"k": "v"}
        for k, v in tensors.items():
            got = f.get_tensor(k)
            assert got.dtype == v.dtype and got.shape == v.shape, k
            assert torch.equal(
                got.reshape(-1).view(torch.uint8), v.contiguous().reshape(-1).view(torch.uint8)
            ), k


def test_write_safetensors_refuses_what_safetensors_cannot_hold(tmp_path):
    with pytest.raises(ParameterArchiveError, match=r"'__metadata__' is reserved"):
        write_safetensors(tmp_path / "x.safetensors", {"__metadata__": np.zeros(1)})
    with pytest.raises(
        ParameterArchiveError,
        match=r"tensor 'c' has dtype torch.complex128, which safetensors cannot",
    ):
        write_safetensors(tmp_path / "x.safetensors", {"c": np.zeros(2, np.complex128)})
    with pytest.raises(ParameterArchiveError, match=r"'l' is a list; pass a torch tensor"):
        write_safetensors(tmp_path / "x.safetensors", {"l": [1, 2]})
    with pytest.raises(ParameterArchiveError, match=r"metadata must map strings to strings"):
        write_safetensors(tmp_path / "x.safetensors", {}, metadata={"n": 1})
    assert list(tmp_path.iterdir()) == []


def test_irpa_to_safetensors_rejects_duplicates_and_unsupported(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("k", np.zeros(1, np.int8))
    b.add_tensor("k", np.zeros(1, np.int8))
    with pytest.raises(ParameterArchiveError, match="appears more than once"):
        irpa_to_safetensors(b.save(tmp_path / "d.irpa"), tmp_path / "d.safetensors")
    b = ParameterArchiveBuilder()
    b.add_tensor("c", np.zeros(2, np.complex128))
    with pytest.raises(ParameterArchiveError, match="safetensors cannot store"):
        irpa_to_safetensors(b.save(tmp_path / "c.irpa"), tmp_path / "c.safetensors")
    assert not (tmp_path / "c.safetensors").exists()


def test_irpa_to_safetensors_rejects_reserved_metadata_key(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("__metadata__", np.zeros(1, np.int8))
    with pytest.raises(ParameterArchiveError, match="safetensors reserves that name"):
        irpa_to_safetensors(b.save(tmp_path / "m.irpa"), tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()


@pytest.mark.parametrize(
    "header, match",
    [
        (
            {"x": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}},
            "unknown safetensors dtype",
        ),
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, "do not hold 8 bytes"),
        ({"x": {"dtype": "F32"}}, "malformed header entry"),
    ],
)
def test_bad_safetensors(tmp_path, header, match):
    p = tmp_path / "bad.safetensors"
    blob = json.dumps(header).encode()
    p.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(4))
    with pytest.raises(ParameterArchiveError, match=match):
        safetensors_to_irpa(p, tmp_path / "o.irpa")
    p.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(ParameterArchiveError, match="header length"):
        safetensors_to_irpa(p, tmp_path / "o.irpa")


def test_torch_checkpoint_to_irpa(tmp_path):
    torch = pytest.importorskip("torch")
    from turbine_params import torch_checkpoint_to_irpa

    w = torch.randn(8, 8)
    ckpt = {
        "model": {"w": w, "tied": w, "b": torch.arange(3, dtype=torch.bfloat16)},
        "step": 12,
        "opt": [torch.ones(2)],
    }
    torch.save(ckpt, tmp_path / "c.pt")
    out = torch_checkpoint_to_irpa(tmp_path / "c.pt", tmp_path / "c.irpa")
    with ParameterArchive(out) as archive:
        assert archive.keys() == ["model.w", "model.tied", "model.b", "opt.0"]
        torch.testing.assert_close(archive["model.w"].as_tensor(), w)
        torch.testing.assert_close(archive["model.b"].as_tensor(), ckpt["model"]["b"])
        assert archive["model.w"].raw.offset == archive["model.tied"].raw.offset


class _NotAWeight:
    pass


def test_legacy_torch_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    from turbine_params import torch_checkpoint_to_irpa

    good = tmp_path / "legacy.pt"
    torch.save({"w": torch.arange(4.0)}, good, _use_new_zipfile_serialization=False)
    with ParameterArchive(torch_checkpoint_to_irpa(good, tmp_path / "legacy.irpa")) as archive:
        torch.testing.assert_close(archive["w"].as_tensor(), torch.arange(4.0))
    # weights_only refusing a legacy file is a ParameterArchiveError too (CLI: one line, exit 2).
    bad = tmp_path / "unsafe.pt"
    torch.save({"w": _NotAWeight()}, bad, _use_new_zipfile_serialization=False)
    with pytest.raises(ParameterArchiveError, match=r"unsafe\.pt: cannot load torch checkpoint"):
        torch_checkpoint_to_irpa(bad, tmp_path / "unsafe.irpa")
    assert not (tmp_path / "unsafe.irpa").exists()


def test_torch_checkpoint_to_safetensors_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    src = tmp_path / "m.pt"
    torch.save({"w": torch.ones(2)}, src)
    # Not supported: it must say so, not write "m.safetensors.irpa".
    with pytest.raises(ParameterArchiveError, match=r"cannot convert .*torch checkpoint"):
        convert_parameters(src, tmp_path / "m.safetensors")
    assert cli(["convert", str(src), str(tmp_path / "m.safetensors")]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]


def test_strip(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("w", np.arange(1 << 16, dtype=np.float32))
    b.add_tensor("keep", np.arange(4, dtype=np.float32))
    b.add_blob("odd", b"abc")
    src = b.save(tmp_path / "full.irpa")
    out = strip_archive(src, tmp_path / "stripped.irpa", keep=("keep",))
    assert out.stat().st_size < src.stat().st_size
    with ParameterArchive(out) as archive:
        assert archive["w"].is_splat and (archive["w"].as_array() == 0).all()
        assert archive["w"].shape == (1 << 16,) and archive["w"].raw.splat_pattern == bytes(4)
        np.testing.assert_array_equal(archive["keep"].as_array(), np.arange(4, dtype=np.float32))
        assert archive["odd"].as_flat_array().tobytes() == bytes(3)


def test_strip_unknown_keep_key_is_an_error(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("fc.weight", np.ones(4, np.float32))
    src = b.save(tmp_path / "full.irpa")
    dst = tmp_path / "stripped.irpa"
    # A typo must not silently strip the entry the caller meant to keep.
    with pytest.raises(ParameterArchiveError, match=r"keep: no entry 'fc.weigth'.*'fc.weight'"):
        strip_archive(src, dst, keep=("fc.weigth",))
    assert not dst.exists()
    assert cli(["strip", str(src), str(dst), "--keep", "nope"]) == 2
    assert not dst.exists()


# ---- CLI --------------------------------------------------------------------------------------


@pytest.fixture
def small(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("fc.weight", np.ones((2, 3), np.float32))
    b.add_splat("fc.bias", np.float32(0), shape=(2,))
    b.add_skip("old")
    return b.save(tmp_path / "small.irpa")


def test_cli_inspect(small, capsys):
    assert cli(["inspect", str(small)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["KEY", "DTYPE", "SHAPE", "BYTES", "OFFSET", "TYPE"]
    row = out[1].split()
    assert row[:4] == ["fc.weight", "float32", "[2,3]", "24"] and row[5] == "data"
    assert int(row[4]) == ParameterArchive(small)["fc.weight"].raw.offset
    assert out[2].split() == ["fc.bias", "float32", "[2]", "8", "-", "splat"]
    assert out[-1] == "2 entries, 32 bytes"
    assert cli(["inspect", "--all", "--json", str(small)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["type"] for r in rows] == ["data", "splat", "skip"]


def test_cli_convert_strip_verify(tmp_path, capsys):
    src = tmp_path / "m.safetensors"
    _write_safetensors(src, TENSORS)
    assert cli(["convert", str(src), str(tmp_path / "m.irpa")]) == 0
    assert cli(["verify", str(tmp_path / "m.irpa"), "--against", str(src)]) == 0
    assert "identical to" in capsys.readouterr().out
    assert cli(["convert", str(tmp_path / "m.irpa"), str(tmp_path / "r.safetensors")]) == 0
    assert (tmp_path / "r.safetensors").exists()
    assert (
        cli(
            [
                "convert",
                str(tmp_path / "m.irpa"),
                str(tmp_path / "repacked.irpa"),
                "--alignment",
                "4096",
            ]
        )
        == 0
    )
    with ParameterArchive(tmp_path / "repacked.irpa") as archive:
        assert all(e.raw.offset % 4096 == 0 for _, e in archive.items() if e.length)
    assert cli(["strip", str(tmp_path / "m.irpa"), str(tmp_path / "s.irpa")]) == 0
    assert cli(["verify", str(tmp_path / "s.irpa")]) == 0


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.irpa"
    bad.write_bytes(b"NOTANARCHIVE" * 10)
    for argv in (
        ["inspect", str(bad)],
        ["verify", str(bad)],
        ["convert", str(bad), str(tmp_path / "x.safetensors")],
        ["inspect", str(tmp_path / "missing.irpa")],
        ["convert", str(tmp_path / "a.txt"), str(tmp_path / "b.irpa")],
    ):
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("turbine-params: error: ") and err.count("\n") == 1, err


def test_cli_verify_detects_difference(tmp_path, capsys):
    src = tmp_path / "m.safetensors"
    _write_safetensors(src, TENSORS)
    out = safetensors_to_irpa(src, tmp_path / "m.irpa")
    changed = dict(TENSORS)
    changed["layer.bias"] = np.array([1, 2, 4], np.int64)
    _write_safetensors(src, changed)
    assert cli(["verify", str(out), "--against", str(src)]) == 2
    assert "'layer.bias' differs" in capsys.readouterr().err


def test_torch_checkpoint_conversion_keeps_memory_flat(tmp_path):
    """Tensors mapped from the checkpoint are released after writing: RSS stays flat."""
    torch = pytest.importorskip("torch")
    psutil = pytest.importorskip("psutil")
    import threading

    from turbine_params import torch_checkpoint_to_irpa

    sd = {f"w{i}": torch.rand(4 << 20) for i in range(8)}  # 128 MB
    torch.save(sd, tmp_path / "big.pt")
    expected = {k: v[:: 1 << 16].clone() for k, v in sd.items()}
    del sd
    proc = psutil.Process()
    before = proc.memory_info().rss
    peak = [before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            stop.wait(0.002)

    t = threading.Thread(target=sample)
    t.start()
    try:
        out = torch_checkpoint_to_irpa(tmp_path / "big.pt", tmp_path / "big.irpa")
    finally:
        stop.set()
        t.join()
    assert (peak[0] - before) < 64 << 20, f"RSS grew by {(peak[0] - before) >> 20} MB"
    with ParameterArchive(out) as archive:
        for k, v in expected.items():
            assert torch.equal(archive[k].as_tensor()[:: 1 << 16], v)


def test_cli_module_entry_point(small):
    import subprocess
    import sys

    ok = subprocess.run(
        [sys.executable, "-m", "turbine_params", "inspect", str(small)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0 and "fc.weight" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "turbine_params", "verify", str(small) + ".missing"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("turbine-params: error: ") and bad.stderr.count("\n") == 1


def test_archive_reads_safetensors_directly(tmp_path):
    src = tmp_path / "direct.safetensors"
    _write_safetensors(src, TENSORS)
    with ParameterArchive(src) as archive:
        assert set(archive.keys()) == set(TENSORS)
        for k, v in TENSORS.items():
            np.testing.assert_array_equal(archive[k].as_array(), v)
        # and it re-saves as an archive
        b = ParameterArchiveBuilder()
        for _, e in archive.items():
            b.add_index_entry(e)
        out = b.save(tmp_path / "direct.irpa")
    verify_archive(out, against=src)


def test_cli_inspects_safetensors(tmp_path, capsys):
    src = tmp_path / "i.safetensors"
    _write_safetensors(src, TENSORS)
    assert cli(["inspect", str(src)]) == 0
    out = capsys.readouterr().out
    assert "layer.weight  float32" in out and f"{len(TENSORS)} entries" in out
