"""Interop with IREE: its runtime reads our archives and we read its archives, byte for byte.

Runs when iree-base-runtime (and for the tool test, ``iree-dump-parameters``) is installed; the
numpy-only standalone environment skips these with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from turbine_params import (
    ParameterArchive,
    ParameterArchiveBuilder,
    TensorMetadata,
    dtype_info,
)


def _rt():
    try:
        import iree.runtime as rt
    except ImportError:
        pytest.skip("iree-base-runtime is not installed (the standalone session has numpy only)")
    return rt


def _dump_tool() -> str:
    exe = shutil.which("iree-dump-parameters") or str(
        Path(sys.executable).parent / "iree-dump-parameters"
    )
    if not Path(exe).exists():
        pytest.skip("iree-dump-parameters is not installed (comes with iree-base-runtime)")
    return exe


def _sample_builder() -> tuple[ParameterArchiveBuilder, dict[str, np.ndarray]]:
    arrays = {
        "w": np.arange(24, dtype=np.float32).reshape(4, 6),
        "b": np.arange(3, dtype=np.int8),
        "big": np.random.default_rng(1).standard_normal(5000).astype(np.float64),
        "empty": np.zeros((0,), np.float32),
    }
    b = ParameterArchiveBuilder()
    for k, v in arrays.items():
        b.add_tensor(k, v)
    b.add_tensor("w_tied", arrays["w"])
    b.add_splat("splat", np.float32(0.25), shape=(16,))
    return b, arrays


def test_iree_runtime_loads_our_archive(tmp_path):
    rt = _rt()
    b, arrays = _sample_builder()
    path = b.save(tmp_path / "ours.irpa")
    index = rt.ParameterIndex()
    index.load(str(path))
    entries = dict(index.items())
    assert list(k for k, _ in index.items()) == ["w", "b", "big", "empty", "w_tied", "splat"]
    for key, arr in arrays.items():
        e = entries[key]
        assert e.length == arr.nbytes
        if arr.nbytes:
            assert e.is_file
            _, offset = e.file_storage
            assert bytes(memoryview(e.file_view)) == arr.tobytes()
            assert offset == ParameterArchive(path)[key].raw.offset
        assert TensorMetadata.decode(e.metadata).shape == arr.shape
    assert entries["w_tied"].file_storage[1] == entries["w"].file_storage[1]
    assert entries["splat"].is_splat
    assert entries["splat"].splat_pattern == np.float32(0.25).tobytes()


def test_we_read_iree_written_archive(tmp_path):
    rt = _rt()
    a = np.arange(10, dtype=np.float32)
    md = TensorMetadata(dtype_info("float32"), (2, 5)).encode().decode()
    index = rt.ParameterIndex()
    index.add_buffer("a", a, metadata=md)
    index.add_splat("s", np.array([7], np.int16), 12)
    index.add_buffer("raw", np.arange(3, dtype=np.uint8))
    path = tmp_path / "theirs.irpa"
    index.create_archive_file(str(path))
    with ParameterArchive(path) as archive:
        assert archive.keys() == ["a", "s", "raw"]
        np.testing.assert_array_equal(archive["a"].as_array(), a.reshape(2, 5))
        assert archive["s"].as_flat_array().tobytes() == np.int16(7).tobytes() * 6
        assert archive["raw"].as_flat_array().tolist() == [0, 1, 2]


def test_byte_identical_to_iree_builder(tmp_path):
    """The same entries written by IREE and by us give the same file, byte for byte."""
    rt = _rt()
    a = np.arange(5, dtype=np.float32)
    c = np.arange(100, dtype=np.int64)
    md = "PYTORCH:{}"
    index = rt.ParameterIndex()
    index.add_buffer("a", a, metadata=md)
    index.add_splat("s", np.array([7], np.int16), 12)
    index.add_buffer("ccc", c)
    theirs = tmp_path / "theirs.irpa"
    index.create_archive_file(str(theirs))
    b = ParameterArchiveBuilder()
    b.add_blob("a", a, metadata=md)
    b.add_splat("s", np.int16(7).tobytes(), length=12)
    b.add_blob("ccc", c)
    ours = b.save(tmp_path / "ours.irpa")
    assert ours.read_bytes() == theirs.read_bytes()


def test_to_iree_index_round_trips(tmp_path):
    rt = _rt()
    b, arrays = _sample_builder()
    path = b.save(tmp_path / "x.irpa")
    for source in (ParameterArchive(path).index, ParameterArchive(path, mmap=False).index, b.index):
        iree_index = source.to_iree()
        assert isinstance(iree_index, rt.ParameterIndex)
        out = tmp_path / "via_iree.irpa"
        iree_index.create_archive_file(str(out))
        with ParameterArchive(out) as again:
            for key, arr in arrays.items():
                np.testing.assert_array_equal(again[key].as_array(), arr)
            assert (again["splat"].as_array() == 0.25).all()


def test_iree_dump_parameters_lists_our_entries(tmp_path):
    exe = _dump_tool()
    b, arrays = _sample_builder()
    path = b.save(tmp_path / "dump.irpa")
    out = subprocess.run(
        [exe, f"--parameters={path}"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    archive = ParameterArchive(path)
    for key, arr in arrays.items():
        assert f"`{key}`" in out
        if arr.nbytes:
            start = archive[key].raw.offset
            assert f"{start} |" in out.replace("  ", " ")
    assert "`splat`" in out and "6 entries" in out


def test_iree_dump_parameters_rejects_what_we_reject(tmp_path, irpa):
    """A corrupted archive is refused by both readers."""
    exe = _dump_tool()
    b, _ = _sample_builder()
    path = b.save(tmp_path / "bad.irpa")
    irpa.patch(path, 0, "<4s", b"NOPE")
    proc = subprocess.run([exe, f"--parameters={path}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    from turbine_params import ParameterArchiveError

    with pytest.raises(ParameterArchiveError, match="wrong magic"):
        ParameterArchive(path)


MLIR = """
module @module {
  util.global private @w = #flow.parameter.named<"model"::"w"> : tensor<4xf32>
  util.global private @s = #flow.parameter.named<"model"::"s"> : tensor<4xf32>
  func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %w = util.global.load @w : tensor<4xf32>
    %s = util.global.load @s : tensor<4xf32>
    %0 = arith.addf %arg0, %w : tensor<4xf32>
    %1 = arith.mulf %0, %s : tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}
"""


def test_program_runs_with_our_archive(tmp_path, iree_device):
    """A compiled program resolves #flow.parameter.named from an archive we wrote."""
    _rt()
    w = np.array([1.0, -2.0, 3.5, 0.25], np.float32)
    b = ParameterArchiveBuilder()
    b.add_tensor("w", w)
    b.add_splat("s", np.float32(2.0), shape=(4,))
    path = b.save(tmp_path / "model.irpa")
    module = iree_device.load(iree_device.compile(MLIR), parameters={"model": path})
    x = np.arange(4, dtype=np.float32)
    got = np.asarray(module.main(x).to_host())
    np.testing.assert_allclose(got, (x + w) * 2.0)


def _iree_tool(name: str) -> str:
    exe = shutil.which(name) or str(Path(sys.executable).parent / name)
    if not Path(exe).exists():
        pytest.skip(f"{name} is not installed (comes with iree-base-runtime)")
    return exe


def test_iree_convert_parameters_round_trip(tmp_path):
    """IREE's converter reads our archive (and strips it); we read what it writes."""
    exe = _iree_tool("iree-convert-parameters")
    b, arrays = _sample_builder()
    ours = b.save(tmp_path / "ours.irpa")
    out = tmp_path / "by_iree.irpa"
    subprocess.run(
        [exe, f"--parameters={ours}", "--rename=w=renamed", f"--output={out}"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    with ParameterArchive(out) as archive:
        np.testing.assert_array_equal(archive["renamed"].as_array(), arrays["w"])
        np.testing.assert_array_equal(archive["big"].as_array(), arrays["big"])
        assert (archive["splat"].as_array() == 0.25).all()
    stripped = tmp_path / "stripped_by_iree.irpa"
    subprocess.run(
        [exe, f"--parameters={ours}", "--strip", f"--output={stripped}"],
        capture_output=True,
        timeout=60,
        check=True,
    )
    with ParameterArchive(stripped) as archive:
        assert all(e.is_splat for _, e in archive.items())
        assert archive["big"].length == arrays["big"].nbytes
        # IREE strips to a 1-byte zero pattern: it still reads with the entry's dtype/shape.
        assert (archive["big"].as_array() == 0).all()
        assert archive["w"].as_array().shape == arrays["w"].shape


def test_iree_converts_safetensors_we_verify(tmp_path):
    exe = _iree_tool("iree-convert-parameters")
    from turbine_params import irpa_to_safetensors, verify_archive

    b, _ = _sample_builder()
    st = irpa_to_safetensors(b.save(tmp_path / "src.irpa"), tmp_path / "src.safetensors")
    out = tmp_path / "from_st.irpa"
    subprocess.run(
        [exe, f"--parameters={st}", f"--output={out}"], capture_output=True, timeout=60, check=True
    )
    assert verify_archive(out, against=st)[0] == 6
