"""turbine_params.atomic_output_file / atomic_write_bytes: the one atomic-write helper."""

from __future__ import annotations

import os
import stat

import pytest

from turbine_params import atomic_output_file, atomic_write_bytes


class _Boom(Exception):
    pass


def test_failure_midway_leaves_no_target_and_no_temp(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(_Boom), atomic_output_file(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".out.bin.")
        with open(tmp, "wb") as f:
            f.write(b"half of it")
        raise _Boom()
    assert list(tmp_path.iterdir()) == []


def test_failure_keeps_the_previous_file(tmp_path):
    target = tmp_path / "out.bin"
    atomic_write_bytes(target, b"old")
    with pytest.raises(KeyboardInterrupt), atomic_output_file(target) as tmp:
        tmp.write_bytes(b"new, but interrupted")
        raise KeyboardInterrupt
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_success_replaces_and_removes_the_temp(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"previous")
    with atomic_output_file(target) as tmp:
        tmp.write_bytes(b"whole")
        assert target.read_bytes() == b"previous"  # untouched until the body returns
    assert target.read_bytes() == b"whole"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_mode_is_the_umask_s(tmp_path, mask):
    old = os.umask(mask)
    try:
        atomic_write_bytes(tmp_path / "a.bin", b"x")
        with atomic_output_file(tmp_path / "b.bin") as tmp:
            tmp.write_bytes(b"y")
    finally:
        os.umask(old)
    for name in ("a.bin", "b.bin"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~mask, name


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"directory .*nope.* does not exist"):
        atomic_write_bytes(tmp_path / "nope" / "out.bin", b"x")
    assert not (tmp_path / "nope").exists()
    atomic_write_bytes(tmp_path / "nope" / "deeper" / "out.bin", b"x", parents=True)
    assert (tmp_path / "nope" / "deeper" / "out.bin").read_bytes() == b"x"


def test_failed_rename_leaves_no_temp(tmp_path):
    target = tmp_path / "dir"
    target.mkdir()
    (target / "keep").write_bytes(b"")  # a non-empty directory cannot be replaced by a file
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]
