"""FxPrograms.load on tampered files: it never leaves the descriptor's directory, never executes
anything from the files, and fails with an FxProgramsError naming the file and the field."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from turbine_fx import FxPrograms, FxProgramsBuilder, FxProgramsError


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x)


def _save_set(directory: Path) -> Path:
    fxb = FxProgramsBuilder(Small())
    fxb.export_program(lambda m, x: m(x), args=(torch.randn(2, 4),), name="main")
    path = directory / "set.json"
    fxb.save(path)
    return path


def _edit(path: Path, edit) -> None:
    descriptor = json.loads(path.read_text())
    edit(descriptor)
    path.write_text(json.dumps(descriptor))


class _Reads:
    """Records every file the process opens (Python's audit events, and safetensors' own opens,
    which happen in Rust) while active."""

    _hook_installed = False
    _current: list[str] | None = None

    def __enter__(self) -> list[str]:
        if not _Reads._hook_installed:
            sys.addaudithook(_Reads._hook)
            _Reads._hook_installed = True
        _Reads._current = []
        import safetensors

        self._real_safe_open = safetensors.safe_open

        def spy(filename, *args, **kwargs):
            assert _Reads._current is not None
            _Reads._current.append(os.path.realpath(filename))
            return self._real_safe_open(filename, *args, **kwargs)

        safetensors.safe_open = spy
        return _Reads._current

    def __exit__(self, *exc) -> None:
        import safetensors

        safetensors.safe_open = self._real_safe_open
        _Reads._current = None

    @staticmethod
    def _hook(event: str, args: tuple) -> None:
        if _Reads._current is not None and event == "open" and isinstance(args[0], (str, Path)):
            _Reads._current.append(os.path.realpath(args[0]))


# -- item 2: every path of a descriptor stays inside the descriptor's directory ------------------


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("file", "../outside/g.ep.json", "'..'"),
        ("data_file", "../outside/t.safetensors", "'..'"),
        ("file", "/etc/passwd", "absolute"),
        ("data_file", "/etc/passwd", "absolute"),
        ("file", "sub/../set.g.ep.json", "'..'"),
        ("file", "sub/g.ep.json", "directory part"),
        ("file", "", "not a file name"),
        ("file", 7, "not a file name"),
        ("data_file", "t\0.safetensors", "NUL"),
    ],
)
def test_load_refuses_a_path_that_leaves_the_directory(tmp_path, field, value, why):
    path = _save_set(tmp_path / "set")
    outside = tmp_path / "outside"
    outside.mkdir()
    descriptor = json.loads(path.read_text())
    # Real copies outside, so a load that follows the path finds valid files there.
    (outside / "g.ep.json").write_bytes(
        (path.parent / descriptor["programs"]["main"]["file"]).read_bytes()
    )
    (outside / "t.safetensors").write_bytes((path.parent / descriptor["data_file"]).read_bytes())

    def edit(d):
        if field == "file":
            d["programs"]["main"]["file"] = value
        else:
            d["data_file"] = value

    _edit(path, edit)
    where = "programs.main.file" if field == "file" else "data_file"
    with _Reads() as reads, pytest.raises(FxProgramsError) as err:
        FxPrograms.load(path)
    message = str(err.value)
    assert str(path) in message and where in message and why in message
    assert not [r for r in reads if not r.startswith(os.path.realpath(path.parent))], reads
    assert os.path.realpath("/etc/passwd") not in reads


@pytest.mark.parametrize("field", ["file", "data_file"])
def test_load_refuses_a_symlink_that_leaves_the_directory(tmp_path, field):
    path = _save_set(tmp_path / "set")
    descriptor = json.loads(path.read_text())
    name = descriptor["programs"]["main"]["file"] if field == "file" else descriptor["data_file"]
    outside = tmp_path / "outside" / name
    outside.parent.mkdir()
    (path.parent / name).rename(outside)
    (path.parent / name).symlink_to(outside)  # the name the descriptor gives, pointing away
    with _Reads() as reads, pytest.raises(FxProgramsError, match="symbolic link") as err:
        FxPrograms.load(path)
    assert ("programs.main.file" if field == "file" else "data_file") in str(err.value)
    assert os.path.realpath(outside) not in reads


def test_a_symlink_that_stays_inside_the_directory_loads(tmp_path):
    path = _save_set(tmp_path)
    descriptor = json.loads(path.read_text())
    name = descriptor["programs"]["main"]["file"]
    (tmp_path / name).rename(tmp_path / "real.ep.json")
    (tmp_path / name).symlink_to("real.ep.json")
    assert list(FxPrograms.load(path).programs) == ["main"]


def test_load_refuses_a_graph_file_that_is_not_a_regular_file(tmp_path):
    """A FIFO in the directory would make a read block forever."""
    path = _save_set(tmp_path)
    descriptor = json.loads(path.read_text())
    name = descriptor["programs"]["main"]["file"]
    (tmp_path / name).unlink()
    os.mkfifo(tmp_path / name)
    with pytest.raises(FxProgramsError, match=r"programs\.main\.file.*not a regular file"):
        FxPrograms.load(path)


def test_etc_passwd_as_graph_is_rejected_before_it_is_read(tmp_path):
    path = _save_set(tmp_path)
    _edit(path, lambda d: d["programs"]["main"].__setitem__("file", "/etc/passwd"))
    with _Reads() as reads, pytest.raises(FxProgramsError, match="absolute path"):
        FxPrograms.load(path)
    assert reads == [os.path.realpath(path)]  # the descriptor only
