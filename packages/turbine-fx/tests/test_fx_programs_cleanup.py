"""FxPrograms.save / load remove what a save killed with kill -9 left behind (its generation
files, its temporaries, its marker), and nothing else: not the files of a save that still runs,
not another set's, not a user's. Every temporary a save creates is turbine's owner-named one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from turbine_fx import FxPrograms, FxProgramsBuilder

# A child that saves a set and stops for good once its tensor data is written to its temporary
# file (graphs already renamed into place, the descriptor not yet replaced): the moment a crash
# leaves the most litter. It touches argv[2] when it gets there.
_CHILD = r"""
import contextlib, sys, time
import torch
import turbine_params._safetensors as writer
from turbine_fx import FxProgramsBuilder

real_atomic_fd = writer.atomic_fd

@contextlib.contextmanager
def atomic_fd_then_hang(path):
    with real_atomic_fd(path) as fd:
        yield fd  # the tensor data are written to the temporary now; it is not renamed yet
        open(sys.argv[2], "w").close()
        time.sleep(3600)

writer.atomic_fd = atomic_fd_then_hang
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
fxb = FxProgramsBuilder(model)
fxb.export_program(lambda m, x: m(x), args=(torch.randn(2, 4),), name="main")
fxb.export_program(lambda m, x: m(x) * 2, args=(torch.randn(3, 4),), name="twice")
fxb.save(sys.argv[1])
"""


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x)


def _save(path: Path, name: str = "main") -> None:
    fxb = FxProgramsBuilder(Small())
    fxb.export_program(lambda m, x: m(x), args=(torch.randn(2, 4),), name=name)
    fxb.save(path)


def _named(path: Path) -> set[str]:
    d = json.loads(path.read_text())
    return {d["data_file"], *(p["file"] for p in d["programs"].values())}


def _start_stuck_save(path: Path) -> subprocess.Popen:
    """A child process stuck in the middle of FxPrograms.save(path) (see _CHILD)."""
    ready = path.parent / "child-ready"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), str(ready)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 600
    while not ready.exists():
        if child.poll() is not None:
            raise AssertionError(f"the saving child died: {child.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            child.kill()
            raise AssertionError("the saving child did not reach its tensor data in 600 s")
        time.sleep(0.1)
    ready.unlink()
    return child


def _litter(directory: Path, before: set[str]) -> set[str]:
    return {p.name for p in directory.iterdir()} - before


@pytest.mark.parametrize("then", ["load", "save"])
def test_a_save_killed_midway_leaves_litter_that_the_next_load_or_save_removes(tmp_path, then):
    path = tmp_path / "set.json"
    _save(path)
    # Files that are not litter of this set, some of them close to its pattern.
    others = [
        "set.json.bak",
        "set.0123456789ab.main.ep.json.orig",
        "set.notes.txt",
        "set.abc.x.ep.json",
    ]
    for name in others:
        (tmp_path / name).write_text("mine")
    _save(tmp_path / "other.json")  # another set in the same directory
    before = {p.name for p in tmp_path.iterdir()}

    child = _start_stuck_save(path)
    try:
        litter = _litter(tmp_path, before)
        gens = {n.split(".")[1] for n in litter if not n.startswith(".")}
        assert len(gens) == 1, litter
        (gen,) = gens
        assert {f"set.{gen}.main.ep.json", f"set.{gen}.twice.ep.json"} <= litter
        assert any(n.startswith(f".set.{gen}.tensors.safetensors.turbine~") for n in litter)
        assert any(n.startswith(f".set.{gen}.saving.turbine~") for n in litter)  # its marker
        # While the writer runs, its files are its own: neither a load nor a save takes them.
        assert list(FxPrograms.load(path).programs) == ["main"]
        _save(tmp_path / "other.json")
        assert litter <= {p.name for p in tmp_path.iterdir()}
        before = {p.name for p in tmp_path.iterdir()} - litter
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert litter <= {p.name for p in tmp_path.iterdir()}  # kill -9: nothing was cleaned up

    if then == "load":
        assert list(FxPrograms.load(path).programs) == ["main"]
        assert {p.name for p in tmp_path.iterdir()} == before
    else:
        previous = _named(path)
        _save(path, name="again")
        assert list(FxPrograms.load(path).programs) == ["again"]
        assert {p.name for p in tmp_path.iterdir()} == (before - previous) | _named(path)
    for name in others:
        assert (tmp_path / name).read_text() == "mine"
    assert list(FxPrograms.load(tmp_path / "other.json").programs) == ["main"]


def test_orphans_of_an_unmarked_generation_are_removed_but_not_those_another_descriptor_names(
    tmp_path,
):
    """A generation no descriptor names and no live writer holds (an older turbine-fx wrote no
    markers) is removed; one that another descriptor of the same stem names is kept."""
    path = tmp_path / "set.json"
    _save(path)
    _save(tmp_path / "set.v1")  # stem "set" too: a second descriptor of the same stem
    kept = _named(tmp_path / "set.v1")
    orphan = ["set.00112233aabb.main.ep.json", "set.00112233aabb.tensors.safetensors"]
    orphan_temp = ".set.00112233aabb.tensors.safetensors.k2j3l4m5.tmp"  # mkstemp-style temp
    for name in [*orphan, orphan_temp]:
        (tmp_path / name).write_bytes(b"x")
    FxPrograms.load(path)
    names = {p.name for p in tmp_path.iterdir()}
    assert not names & {*orphan, orphan_temp}
    assert kept <= names and _named(path) <= names
    assert list(FxPrograms.load(tmp_path / "set.v1").programs) == ["main"]


# A child that saves a set of about 256 MB (one weight), for a real kill in the middle of its
# tensor data: it says "saving" just before FxPrograms.save.
_LARGE_SAVE = r"""
import sys, torch
from turbine_fx import FxPrograms
model = torch.nn.Linear(1024, 64 * 1024, bias=False)
fxp = FxPrograms()
fxp.programs["main"] = torch.export.export(model, (torch.randn(1, 1024),))
print("saving", flush=True)
fxp.save(sys.argv[1])
"""


def _kill_while_writing_tensor_data(path: Path) -> set[str]:
    """Starts a large save into ``path``'s directory and SIGKILLs it once a hidden file of more
    than 1 MB exists there (the tensor data being written); returns the names left."""
    child = subprocess.Popen(
        [sys.executable, "-c", _LARGE_SAVE, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "saving", child.stderr.read()[-2000:]
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and child.poll() is None:
            with os.scandir(path.parent) as entries:
                if any(e.name.startswith(".") and e.stat().st_size > 1 << 20 for e in entries):
                    break
            time.sleep(0.001)
        assert child.poll() is None, "the save finished before its tensor data were seen"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    return {p.name for p in path.parent.iterdir()}


def test_a_save_killed_while_writing_tensor_data_leaves_only_owner_named_temporaries(tmp_path):
    """Failing-first (issue 23): safetensors' save_file wrote the data through a temporary of
    its own, ``.tmpXXXXXX``, which a killed save left and no later save removed. Every
    temporary is now turbine's, named for its writer, and the next save removes them all."""
    path = tmp_path / "set.json"
    left = _kill_while_writing_tensor_data(path)
    hidden = {n for n in left if n.startswith(".")}
    assert hidden, left
    assert all(".turbine~" in n for n in hidden), f"temporaries not named for their owner: {left}"
    assert any(".tensors.safetensors.turbine~" in n for n in hidden), left  # killed mid-data
    _save(path)
    assert {p.name for p in tmp_path.iterdir()} == {"set.json", *_named(path)}
    assert list(FxPrograms.load(path).programs) == ["main"]


def _legacy_temp(directory: Path, name: str, fmt: str) -> None:
    """A ``.tmpXXXXXX`` as safetensors' save_file left it (a safetensors file, header first)."""
    from safetensors.torch import save_file

    save_file({"t0": torch.zeros(4)}, str(directory / "x.safetensors"), metadata={"format": fmt})
    os.replace(directory / "x.safetensors", directory / name)


def test_safetensors_temporaries_of_older_saves_are_removed_unless_a_save_runs(tmp_path):
    """What saves of earlier turbine-fx versions left, ``.tmpXXXXXX`` with an FxPrograms
    tensor header, is removed when no save holds a marker; other ``.tmp*`` files stay."""
    from turbine_params import make_owned_temp

    path = tmp_path / "set.json"
    _save(path)
    _legacy_temp(tmp_path, ".tmpAb12Cd", "turbine-fx-programs")
    _legacy_temp(tmp_path, ".tmpOther1", "pt")  # another writer's safetensors temporary
    (tmp_path / ".tmpUser99").write_text("mine")
    # A save of another set that runs (its marker's owner is this process): nothing is taken.
    marker = make_owned_temp(tmp_path / "other.0123456789ab.saving")
    _save(path)
    assert {".tmpAb12Cd", ".tmpOther1", ".tmpUser99"} <= {p.name for p in tmp_path.iterdir()}
    marker.unlink()
    FxPrograms.load(path)
    names = {p.name for p in tmp_path.iterdir()}
    assert ".tmpAb12Cd" not in names
    assert {".tmpOther1", ".tmpUser99"} <= names
    assert (tmp_path / ".tmpUser99").read_text() == "mine"


def test_a_marker_of_a_save_killed_before_its_first_file_is_removed(tmp_path):
    path = tmp_path / "set.json"
    _save(path)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from turbine_params import make_owned_temp; "
            "print(make_owned_temp(sys.argv[1]).name)",
            str(tmp_path / "set.0123456789ab.saving"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (tmp_path / child.stdout.strip()).exists()  # its writer has exited
    _save(path)
    assert {p.name for p in tmp_path.iterdir()} == {"set.json", *_named(path)}
