"""FxPrograms.save / load remove what a save killed with kill -9 left behind (its generation
files, its temporaries, its marker), and nothing else: not the files of a save that still runs,
not another set's, not a user's."""

from __future__ import annotations

import json
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
import sys, time
import torch
import safetensors.torch
from turbine_fx import FxProgramsBuilder

real_save_file = safetensors.torch.save_file

def save_file_then_hang(payload, filename, metadata=None):
    real_save_file(payload, filename, metadata=metadata)
    open(sys.argv[2], "w").close()
    time.sleep(3600)

safetensors.torch.save_file = save_file_then_hang
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
