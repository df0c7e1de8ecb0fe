"""turbine_params.atomic_output_file / atomic_write_bytes: the one atomic-write helper."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys

import pytest

from turbine_params import (
    atomic_output_file,
    atomic_write_bytes,
    make_owned_temp,
    remove_stale_temps,
)


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


# ----------------------------------------------------------------------------- crashed writers
_KILLED_WRITER = r"""
import sys, time
from turbine_params import atomic_output_file
with atomic_output_file(sys.argv[1]) as tmp:
    with open(tmp, "wb") as f:
        f.write(b"x" * 4096)
        f.flush()
    print(tmp, flush=True)
    time.sleep(600)
"""


def _killed_writer(target) -> str:
    """Runs a writer of ``target`` in a child, kills it (SIGKILL) mid-write; returns its temp."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(target)], stdout=subprocess.PIPE, text=True
    )
    try:
        tmp = proc.stdout.readline().strip()
        assert tmp, "the writer printed no temporary name"
    finally:
        proc.kill()
        proc.wait(timeout=60)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    return tmp


def test_kill_9_mid_write_then_the_next_write_cleans_up(tmp_path):
    target = tmp_path / "w.irpa"
    atomic_write_bytes(target, b"old")
    tmp = _killed_writer(target)
    assert os.path.basename(tmp) in os.listdir(tmp_path)  # the litter a kill -9 leaves
    assert os.path.basename(tmp).startswith(".w.irpa.turbine~")
    assert target.read_bytes() == b"old"
    atomic_write_bytes(target, b"new")
    assert sorted(os.listdir(tmp_path)) == ["w.irpa"]
    assert target.read_bytes() == b"new"


def test_cleanup_keeps_live_writers_other_hosts_and_other_files(tmp_path):
    target = tmp_path / "w.irpa"
    # A writer that still runs (this process: e.g. another thread writing the same file).
    live = make_owned_temp(target)
    stale = _killed_writer(target)
    # Written on another host of a shared filesystem: its owner cannot be checked from here.
    foreign = tmp_path / ".w.irpa.turbine~otherhost.0123abcd.1.1.0badf00d.tmp"
    # Not turbine's, or not for this destination: never touched.
    others = [
        tmp_path / ".w.irpa.abc123.tmp",
        tmp_path / (".v.irpa" + os.path.basename(stale)[len(".w.irpa") :]),
        tmp_path / ".w.irpa.turbine~garbage.tmp",
    ]
    for p in [foreign, *others]:
        p.write_bytes(b"")
    removed = remove_stale_temps(target)
    assert [p.name for p in removed] == [os.path.basename(stale)]
    left = set(os.listdir(tmp_path))
    assert left == {live.name, foreign.name, *(p.name for p in others)}


def test_pid_reuse_and_earlier_boot_count_as_gone(tmp_path):
    from turbine_params import _io

    if not os.path.exists("/proc/self/stat"):
        pytest.skip("start times come from /proc (Linux); elsewhere a live pid counts as alive")
    target = tmp_path / "w.irpa"
    host, boot, pid, start = _io._owner_tag().removeprefix(_io.TEMP_MARKER).split(".")
    prefix = f".w.irpa.{_io.TEMP_MARKER}"
    # This process's pid, but started at another time: the pid was reused since.
    reused = tmp_path / f"{prefix}{host}.{boot}.{pid}.{int(start) + 1}.00000000.tmp"
    other_boot = "ffffffff" if boot != "ffffffff" else "eeeeeeee"
    earlier_boot = tmp_path / f"{prefix}{host}.{other_boot}.{pid}.{start}.00000001.tmp"
    for p in (reused, earlier_boot):
        p.write_bytes(b"")
    assert sorted(p.name for p in remove_stale_temps(target)) == sorted(
        [reused.name, earlier_boot.name]
    )


def test_owned_temp_directories_are_cleaned_too(tmp_path):
    target = tmp_path / "bundle"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, os; from turbine_params import make_owned_temp; "
            "d = make_owned_temp(sys.argv[1], directory=True); (d / 'f').write_bytes(b'x'); "
            "print(d); os._exit(0)",
            str(target),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    litter = proc.stdout.strip()
    assert os.path.isdir(litter)
    assert [p.name for p in remove_stale_temps(target)] == [os.path.basename(litter)]
    assert os.listdir(tmp_path) == []
