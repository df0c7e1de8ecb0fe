"""Checks an FxPrograms descriptor and the files it names before anything of them is used.

``FxPrograms.load`` reads files that may come from anywhere. Everything of a descriptor is
checked here first, against what ``FxPrograms.save`` writes: its structure (every field of the
type save gives it), and every path, which must name a regular file directly inside the
descriptor's directory (no absolute path, no ``..``, no directory part, no symbolic link that
leads out of the directory). A descriptor that fails is an ``FxProgramsError`` naming the file
and the JSON field path (``programs.main.file``); nothing it names has been opened then.
Each graph file is then checked by :func:`check_graph` before torch's deserializer sees any of
them: every string torch would evaluate must pass the strict parsers of ``_fx_programs_exprs``.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import _fx_programs_exprs as exprs
from ._errors import FxProgramsError

__all__ = ["CheckedDescriptor", "check_descriptor", "check_graph", "member_path"]

_RESAVE = "save the set again with FxPrograms.save"


@dataclass(frozen=True)
class CheckedDescriptor:
    """A descriptor that passed :func:`check_descriptor`, with its files' checked paths."""

    descriptor: dict[str, Any]
    data_path: Path
    graph_paths: dict[str, Path]  # program name -> graph file


def _field(parts: tuple[str | int, ...]) -> str:
    """``programs.main.file``, ``tensors.t0.shape[1]``, ``bindings.main.state_dict["a.b"]``."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p.isidentifier() and p.isascii():
            out += f".{p}" if out else p
        else:
            out += json.dumps(p).join("[]")
    return out or "(the whole document)"


def fail(file: Path, where: tuple[str | int, ...], problem: str, todo: str = _RESAVE) -> None:
    """Raises the FxProgramsError of a check: ``<file>: <field>: <problem>; <what to do>``."""
    raise FxProgramsError(f"{file}: {_field(where)}: {problem}; {todo}")


def _unsafe_name(name: object) -> str | None:
    """Why ``name`` is not a plain file name (the only kind FxPrograms.save writes), or None."""
    if not isinstance(name, str) or not name or name in (".", ".."):
        if name == "..":
            return "a '..' component"
        return f"{name!r} is not a file name"
    if "\0" in name:
        return "a NUL byte"
    if os.path.isabs(name) or name.startswith(("/", "\\")) or name[1:2] == ":":
        return "an absolute path"
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        return "a '..' component"
    if len(parts) > 1:
        return "a directory part"
    return None


def member_path(
    directory: Path, name: object, file: Path, where: tuple[str | int, ...], what: str
) -> Path:
    """The path of the file ``name`` beside the descriptor ``file``, checked to stay inside.

    ``name`` must be a plain file name (no absolute path, ``..`` or directory part); the file it
    names, symbolic links resolved, must be a regular file in ``directory`` itself. Only
    ``stat`` is used: nothing is opened. Returns the resolved path (read that one).
    """
    why = _unsafe_name(name)
    if why is not None:
        fail(
            file,
            where,
            f"{name!r} is not a file beside the descriptor ({why})",
            "an FxPrograms descriptor names files in its own directory only: " + _RESAVE,
        )
    assert isinstance(name, str)
    real_dir = os.path.realpath(directory)
    real = os.path.realpath(os.path.join(directory, name))
    if os.path.dirname(real) != real_dir:
        fail(
            file,
            where,
            f"{name!r} is a symbolic link to {real!r}, outside the descriptor's directory "
            f"{real_dir!r}",
            "an FxPrograms descriptor names files in its own directory only: " + _RESAVE,
        )
    try:
        mode = os.stat(real).st_mode
    except OSError as e:
        fail(file, where, f"cannot read {what} {name!r}: {e.strerror or e}")
    if not stat.S_ISREG(mode):
        fail(file, where, f"{what} {name!r} is not a regular file")
    return Path(real)


# -- structure --------------------------------------------------------------------------------


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _expect(ok: bool, file: Path, where: tuple, what: str, value: object) -> None:
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        fail(file, where, f"expected {what}, found {shown}")


def _dict(value: object, file: Path, where: tuple) -> dict:
    _expect(isinstance(value, dict), file, where, "an object", value)
    assert isinstance(value, dict)
    return value


def _str(value: object, file: Path, where: tuple) -> str:
    _expect(isinstance(value, str), file, where, "a string", value)
    assert isinstance(value, str)
    return value


def _uint(value: object, file: Path, where: tuple) -> int:
    _expect(_is_int(value) and value >= 0, file, where, "an integer >= 0", value)  # type: ignore[operator]
    assert isinstance(value, int)
    return value


def _bool(value: object, file: Path, where: tuple) -> bool:
    _expect(isinstance(value, bool), file, where, "true or false", value)
    assert isinstance(value, bool)
    return value


def _queues(value: object, file: Path, where: tuple) -> None:
    if value is None:
        return
    ok = isinstance(value, list) and all(
        (_is_int(q) and q >= 0) or (isinstance(q, str) and q.isdecimal() and q.isascii())
        for q in value
    )
    _expect(ok, file, where, "null or a list of queue ordinals", value)


def _device(value: object, file: Path, where: tuple) -> None:
    _expect(isinstance(value, list) and len(value) == 2, file, where, "[ordinal, queues]", value)
    assert isinstance(value, list)
    _uint(value[0], file, (*where, 0))
    _queues(value[1], file, (*where, 1))


def _program_name(name: str, file: Path, where: tuple) -> None:
    if not name or any(c in name for c in "/\\\0") or name.startswith("."):
        fail(file, where, f"program name {name!r} cannot name a file")


def dtype_named(name: object) -> torch.dtype | None:
    """The torch dtype called ``name`` (``float32``), looked up without torch's lazy imports."""
    if not isinstance(name, str) or name.startswith("_"):
        return None
    dtype = vars(torch).get(name)
    return dtype if isinstance(dtype, torch.dtype) else None


def _tensor(info: object, file: Path, where: tuple) -> None:
    info = _dict(info, file, where)
    for field in ("dtype", "shape", "parameter", "requires_grad", "meta", "first_use"):
        if field not in info:
            fail(file, (*where, field), "missing")
    dtype = dtype_named(info["dtype"])
    _expect(dtype is not None, file, (*where, "dtype"), "a torch dtype name", info["dtype"])
    assert dtype is not None
    shape = info["shape"]
    _expect(isinstance(shape, list), file, (*where, "shape"), "a list of sizes", shape)
    for i, n in enumerate(shape):
        _uint(n, file, (*where, "shape", i))
    if math.prod(shape) * dtype.itemsize >= 2**62:
        fail(file, (*where, "shape"), f"{dtype}{shape} is larger than any tensor can be")
    parameter = _bool(info["parameter"], file, (*where, "parameter"))
    requires_grad = _bool(info["requires_grad"], file, (*where, "requires_grad"))
    if parameter and requires_grad and not (dtype.is_floating_point or dtype.is_complex):
        fail(file, (*where, "requires_grad"), f"a {dtype} parameter cannot require gradients")
    _bool(info["meta"], file, (*where, "meta"))
    _str(info["first_use"], file, (*where, "first_use"))
    external = info.get("external")
    if external is not None:
        _expect(
            isinstance(external, list)
            and len(external) == 2
            and all(isinstance(s, str) for s in external),
            file,
            (*where, "external"),
            "null or [scope, name]",
            external,
        )
    if info.get("device_trait") is not None:
        _device(info["device_trait"], file, (*where, "device_trait"))
    view = info.get("storage")
    if view is not None:
        view = _dict(view, file, (*where, "storage"))
        _str(view.get("data"), file, (*where, "storage", "data"))
        _uint(view.get("offset"), file, (*where, "storage", "offset"))
        stride = view.get("stride")
        _expect(
            isinstance(stride, list) and len(stride) == len(shape),
            file,
            (*where, "storage", "stride"),
            f"a list of {len(shape)} strides",
            stride,
        )
        assert isinstance(stride, list)
        for i, s in enumerate(stride):
            _uint(s, file, (*where, "storage", "stride", i))


def check_descriptor(path: Path, descriptor: dict[str, Any]) -> CheckedDescriptor:
    """Checks every field of ``descriptor`` (read from ``path``) and every file it names.

    Raises:
        FxProgramsError: naming ``path`` and the field (``programs.main.file``) at fault.
    """
    directory = path.parent
    for field in ("data_file", "programs", "tensors", "bindings"):
        if field not in descriptor:
            fail(path, (field,), "missing")
    programs = _dict(descriptor["programs"], path, ("programs",))
    tensors = _dict(descriptor["tensors"], path, ("tensors",))
    bindings = _dict(descriptor["bindings"], path, ("bindings",))
    for key, info in tensors.items():
        _tensor(info, path, ("tensors", key))
    if set(bindings) != set(programs):
        fail(
            path,
            ("bindings",),
            f"binds programs {sorted(bindings)}, the descriptor has programs {sorted(programs)}",
        )
    for name, info in programs.items():
        _program_name(name, path, ("programs", name))
        info = _dict(info, path, ("programs", name))
        arg_device = info.get("arg_device")
        if arg_device is not None:
            arg_device = _dict(arg_device, path, ("programs", name, "arg_device"))
            for index, device in arg_device.items():
                where = ("programs", name, "arg_device", index)
                if not (index.isdecimal() and index.isascii()):
                    fail(path, where, f"argument index {index!r} is not a number")
                _device(device, path, where)
        binding = _dict(bindings[name], path, ("bindings", name))
        for part in ("state_dict", "constants"):
            entries = _dict(binding.get(part), path, ("bindings", name, part))
            for entry, key in entries.items():
                where = ("bindings", name, part, entry)
                if _str(key, path, where) not in tensors:
                    fail(path, where, f"names tensor {key!r}, which is not in 'tensors'")
    # Paths last: nothing outside the structure above is looked at before they are checked.
    data_path = member_path(
        directory, descriptor["data_file"], path, ("data_file",), "the tensor data"
    )
    graph_paths = {
        name: member_path(
            directory,
            info.get("file"),
            path,
            ("programs", name, "file"),
            f"the graph of program {name!r}",
        )
        for name, info in programs.items()
    }
    return CheckedDescriptor(descriptor, data_path, graph_paths)


# -- graph files --------------------------------------------------------------------------------

_META_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,20}")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def check_graph(file: Path, data: bytes) -> None:
    """Checks a graph file (torch's ``*.ep.json``) before torch's deserializer may see it.

    Every string torch evaluates or resolves is checked with the strict parsers of
    ``_fx_programs_exprs``, wherever it is in the document: symbolic expressions (``expr_str``),
    range-constraint keys, ``guards_code``, node targets, ``as_operator`` arguments and the
    targets of ``source_fn_stack`` metadata.

    Raises:
        FxProgramsError: naming ``file`` and the JSON field path of the first bad string.
    """
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        fail(file, (), f"not a JSON document: {e}")
    if not isinstance(doc, dict):
        fail(file, (), f"expected an object, found {type(doc).__name__}")

    def check(where: tuple, value: object, checker, what: str) -> None:
        try:
            checker(value)
        except exprs.ExprError as e:
            fail(
                file,
                where,
                f"{what} {_shown(value)} is not one torch writes: {e}",
                "the file was altered or is not from FxPrograms.save; FxPrograms.load refuses "
                "it before torch's deserializer sees it: " + _RESAVE,
            )

    ranges = doc.get("range_constraints")
    if ranges is not None:
        ranges = _dict(ranges, file, ("range_constraints",))
        for key, bounds in ranges.items():
            where = ("range_constraints", key)
            check(where, key, exprs.check_sym_key, "the symbol")
            bounds = _dict(bounds, file, where)
            for end in ("min_val", "max_val"):
                v = bounds.get(end)
                _expect(v is None or _is_int(v), file, (*where, end), "null or an integer", v)
    guards = doc.get("guards_code")
    if guards is not None:
        _expect(isinstance(guards, list), file, ("guards_code",), "a list of guards", guards)
        assert isinstance(guards, list)
        for i, guard in enumerate(guards):
            check(("guards_code", i), guard, exprs.check_guard, "the guard")

    stack: list[tuple[object, tuple]] = [(doc, ())]
    while stack:
        value, where = stack.pop()
        if isinstance(value, list):
            stack.extend((v, (*where, i)) for i, v in enumerate(value))
            continue
        if not isinstance(value, dict):
            continue
        for key, v in value.items():
            at = (*where, key)
            if key == "expr_str":
                check(at, v, exprs.check_sym_expr, "the symbolic expression")
            elif key == "as_operator" or (key == "target" and "inputs" in value):
                check(at, v, exprs.check_target, "the operator")
            elif key == "source_fn_stack" and isinstance(v, str):
                for item in v.split(";"):
                    target = item.rpartition(",")[2]
                    if not _META_TARGET.fullmatch(target) or "__" in target:
                        fail(file, at, f"source function {_shown(target)} is not a name", _RESAVE)
            else:
                stack.append((v, at))
