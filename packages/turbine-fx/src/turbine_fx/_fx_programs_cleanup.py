"""Removes what killed ``FxPrograms.save`` calls left beside a descriptor.

A save writes ``<stem>.<gen>.<program>.ep.json`` and ``<stem>.<gen>.tensors.safetensors`` (each
through a hidden, owner-named temporary file), then commits them by replacing the descriptor.
A save killed before the commit (``kill -9``, a power cut) leaves that generation's files, which
no descriptor names, and its temporaries. So that a cleanup never takes the files of a save that
is still running, each save holds a marker while it writes: an owner-named temporary
``.<stem>.<gen>.saving.turbine~<host>.<boot>.<pid>.<start>.<random>.tmp``
(``turbine_params.make_owned_temp``), created before its first file and removed after its
commit (or after it removed its files on failure).

:func:`remove_orphans` (run by every save, after its commit, and by every load) removes a
generation's files and temporaries when no FxPrograms descriptor of that stem in the directory
names them and no marker of a writer that may still run exists for it: the marker's owner is
provably gone (``turbine_params.remove_stale_temps`` decides, and removes the marker), or there
is none (a generation of a turbine-fx that had no markers). Only names of that set's own
pattern are looked at; any other file (a user's, another set's) is left alone. Cleaning up is
best effort: errors (a read-only directory, a file removed meanwhile) are ignored.

A marker whose save was killed before its first file is removed too (it is a temporary of that
save like the others). Earlier turbine-fx versions wrote the tensor data with the
``safetensors`` package's ``save_file``, which writes through a temporary of its own,
``.tmpXXXXXX`` (Rust's ``tempfile``), named for no owner; a save killed meanwhile left one. Such
a file is recognized by its safetensors header (metadata ``format: turbine-fx-programs``) and
removed when no marker of any set's save is in the directory (its writer held one: markers
predate the change).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import struct
from collections.abc import Collection, Iterator
from pathlib import Path

from turbine_params import make_owned_temp, remove_stale_temps

__all__ = ["remove_orphans", "saving_marker"]

_GEN = r"[0-9a-f]{12}"
_MARKER_SUFFIX = "saving"
_MAX_DESCRIPTOR_BYTES = 64 << 20
_FORMAT = "turbine-fx-programs"  # the descriptor's format and the tensor file's metadata
_LEGACY_TEMP = re.compile(r"\.tmp[A-Za-z0-9]{6}")  # safetensors' save_file temporaries
_ANY_MARKER = re.compile(rf".*\.{_GEN}\.{_MARKER_SUFFIX}\.turbine~.*\.tmp")


def _marker_target(directory: Path, stem: str, generation: str) -> Path:
    return directory / f"{stem}.{generation}.{_MARKER_SUFFIX}"


@contextlib.contextmanager
def saving_marker(directory: Path, stem: str, generation: str) -> Iterator[None]:
    """Holds the marker that says generation ``generation`` of ``stem`` is being written."""
    marker = make_owned_temp(_marker_target(directory, stem, generation))
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            marker.unlink()


def _referenced(directory: Path, stem: str, names: list[str], generation_file) -> set[str]:
    """The files named by every FxPrograms descriptor of ``stem`` in the directory (``<stem>``
    or ``<stem>.<suffix>``: several may share a stem, ``set.json`` and ``set.txt``)."""
    out: set[str] = set()
    for name in names:
        if name != stem and not (name.startswith(f"{stem}.") and "." not in name[len(stem) + 1 :]):
            continue
        if generation_file.fullmatch(name):
            continue
        try:
            if os.path.getsize(directory / name) > _MAX_DESCRIPTOR_BYTES:
                continue
            descriptor = json.loads((directory / name).read_text())
        except (OSError, ValueError, RecursionError):
            continue
        if not isinstance(descriptor, dict) or descriptor.get("format") != _FORMAT:
            continue
        named = [descriptor.get("data_file")]
        programs = descriptor.get("programs")
        if isinstance(programs, dict):
            named += [p.get("file") for p in programs.values() if isinstance(p, dict)]
        out.update(n for n in named if isinstance(n, str))
    return out


def remove_orphans(path: Path, stem: str, named: Collection[str] = ()) -> list[Path]:
    """Removes the generation files and temporaries of killed saves of the set at ``path``.

    ``named``: files the caller knows a descriptor names (kept; when every candidate is one of
    them, no other descriptor is read). Returns the paths removed. See the module docstring
    for what counts as orphaned.
    """
    directory = path.parent
    removed: list[Path] = []
    with contextlib.suppress(OSError):
        # The descriptor's own temporaries (a save killed while committing).
        removed += remove_stale_temps(path)
    try:
        return (
            removed + _remove_generations(directory, stem, named) + _remove_legacy_temps(directory)
        )
    except OSError:
        return removed


def _remove_generations(directory: Path, stem: str, named: Collection[str]) -> list[Path]:
    removed: list[Path] = []
    s = re.escape(stem)
    generation_file = re.compile(rf"{s}\.(?P<gen>{_GEN})\.(.+\.ep\.json|tensors\.safetensors)")
    hidden = re.compile(
        rf"\.{s}\.(?P<gen>{_GEN})\.(.+\.ep\.json|tensors\.safetensors)\.(turbine~.*|[a-z0-9_]+)\.tmp"
    )
    marker = re.compile(rf"\.{s}\.(?P<gen>{_GEN})\.{_MARKER_SUFFIX}\.turbine~.*\.tmp")
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    # Order matters against a save running meanwhile: its marker exists before its first file
    # (so a listed file of a running save has a live marker), and it removes its marker only
    # after its commit (so the descriptors, read after the markers, name its files then).
    candidates: dict[str, list[str]] = {}
    marked: set[str] = set()
    for name in names:
        m = generation_file.fullmatch(name) or hidden.fullmatch(name)
        if m is not None and name not in named:
            candidates.setdefault(m["gen"], []).append(name)
        m = marker.fullmatch(name)
        if m is not None:
            marked.add(m["gen"])
    for gen in marked - set(candidates):  # a save killed before its first file: its marker
        with contextlib.suppress(OSError):
            removed += remove_stale_temps(_marker_target(directory, stem, gen))
    if not candidates:
        return removed
    for gen in list(candidates):
        if any(marker.fullmatch(n) and f".{gen}." in n for n in names):
            with contextlib.suppress(OSError):
                remove_stale_temps(_marker_target(directory, stem, gen))
            try:
                live = any(marker.fullmatch(n) and f".{gen}." in n for n in os.listdir(directory))
            except OSError:
                live = True
            if live:  # a writer that runs (or of another host): its files are its own
                del candidates[gen]
    referenced = _referenced(directory, stem, names, generation_file)
    for files in candidates.values():
        for name in files:
            if name in referenced:
                continue
            with contextlib.suppress(OSError):
                (directory / name).unlink()
                removed.append(directory / name)
    return removed


def _remove_legacy_temps(directory: Path) -> list[Path]:
    """Removes the ``.tmpXXXXXX`` files older turbine-fx saves left (see the module docstring)."""
    names = os.listdir(directory)
    if any(_ANY_MARKER.fullmatch(n) for n in names):
        return []  # a save is running (or its marker awaits its own set's cleanup)
    removed = []
    for name in names:
        if _LEGACY_TEMP.fullmatch(name) and _is_fx_programs_tensor_file(directory / name):
            with contextlib.suppress(OSError):
                (directory / name).unlink()
                removed.append(directory / name)
    return removed


def _is_fx_programs_tensor_file(path: Path) -> bool:
    """Whether ``path`` is a regular file with a safetensors header saying it holds the tensors
    of an FxPrograms set."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return False
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_DESCRIPTOR_BYTES:
                return False
            header = json.loads(f.read(n))
    except (OSError, ValueError, RecursionError):
        return False
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return isinstance(meta, dict) and meta.get("format") == _FORMAT
