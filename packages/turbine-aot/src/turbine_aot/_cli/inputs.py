"""The ``turbine-aot`` command line's inputs: the model source loader (``file.py[:NAME]``,
``package.module:NAME``) and example-input specs (``SHAPExDTYPE[=V1,V2,...]``, ``file.npy``),
shared by :mod:`.commands` and :mod:`.llm_commands`; ``CliError`` for what a user got wrong."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from turbine_aot._errors import TurbineAotError

from .errors import input_tensor, user_code


class CliError(TurbineAotError):
    """A user error on the command line; printed as one line, exit status 2."""


# ----------------------------------------------------------------------------- parsing helpers
_DTYPE_ALIASES = {
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "bf16": "bfloat16",
    "i1": "bool",
    "i8": "int8",
    "si8": "int8",
    "ui8": "uint8",
    "u8": "uint8",
    "i16": "int16",
    "i32": "int32",
    "si32": "int32",
    "i64": "int64",
    "si64": "int64",
    "f8e4m3fn": "float8_e4m3fn",
    "f8e5m2": "float8_e5m2",
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "long": "int64",
    "int": "int32",
}


def _torch_dtype(name: str) -> Any:
    import torch

    key = _DTYPE_ALIASES.get(name.lower(), name)
    dt = getattr(torch, key, None)
    if not isinstance(dt, torch.dtype):
        raise CliError(
            f"unknown dtype {name!r}; use an MLIR or torch name such as f32, bf16, f16, i64, i32, "
            "i8, i1, float32, int64"
        )
    return dt


def parse_input_spec(spec: str) -> tuple[tuple[int, ...], Any]:
    """``"2x8xf32"`` -> ((2, 8), torch.float32); ``"f32"`` is a scalar tensor.

    Raises:
        CliError: the string is not dims separated by ``x`` followed by a dtype.
    """
    parts = spec.strip().split("x")
    *dims, dtype = parts
    # dtypes never start with a digit; "2x8" (no dtype) or "2xx8" are errors.
    if not dtype or dtype[0].isdigit() or any(not re.fullmatch(r"\d+", d) for d in dims):
        raise CliError(
            f"bad shape string {spec!r}: expected dimensions separated by 'x' and a dtype, "
            "e.g. 2x8xf32, 1x128xi64, f32"
        )
    return tuple(int(d) for d in dims), _torch_dtype(dtype)


def _make_input(spec: str, generator: Any) -> Any:
    """An input tensor from ``SHAPExDTYPE`` (random values), iree-run-module's value syntax
    ``SHAPExDTYPE=V1,V2,...`` (or one value, repeated; spaces work as separators too), or a
    ``.npy`` file (``file.npy`` or ``@file.npy``)."""
    import torch

    if spec.endswith(".npy"):
        path = Path(spec.removeprefix("@"))
        if not path.is_file():
            raise CliError(f"input file {str(path)!r} does not exist")
        return torch.from_numpy(np.load(path))
    type_part, eq, values = spec.partition("=")
    shape, dtype = parse_input_spec(type_part)

    def make() -> Any:
        if eq:
            return _values_tensor(spec, shape, dtype, values)
        if dtype.is_floating_point:
            return torch.randn(shape, generator=generator).to(dtype)
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=generator).to(torch.bool)
        return torch.randint(0, 10, shape, generator=generator).to(dtype)

    return input_tensor(spec, make, shape, dtype, CliError)


def _values_tensor(spec: str, shape: tuple[int, ...], dtype: Any, text: str) -> Any:
    import math

    import torch

    items = [v for v in re.split(r"[,\s]+", text.strip()) if v]
    count = math.prod(shape)
    if len(items) not in (1, count):
        raise CliError(
            f"--input {spec!r}: {len(items)} values for shape {list(shape)} ({count} elements); "
            f"give {count} values or one value for all"
        )
    try:
        if dtype == torch.bool:
            vals: list[Any] = [v.lower() in ("1", "true") for v in items]
            bad = [v for v in items if v.lower() not in ("0", "1", "true", "false")]
            if bad:
                raise ValueError(bad[0])
        elif dtype.is_floating_point or dtype.is_complex:
            vals = [float(v) for v in items]
        else:
            vals = [int(v, 0) for v in items]
    except ValueError as e:
        raise CliError(
            f"--input {spec!r}: {str(e).split(': ')[-1]} is not a "
            f"{str(dtype).removeprefix('torch.')} value"
        ) from None
    wide = torch.float64 if dtype.is_floating_point else None
    t = torch.tensor(vals, dtype=wide) if wide is not None else torch.tensor(vals)
    if len(vals) == 1:
        t = t.reshape(()).expand(shape).clone()
    return t.reshape(shape).to(dtype)


def _load_source(spec: str) -> Any:
    """``file.py[:attr]`` or ``package.module:attr`` -> the object (instantiated if a class)."""
    path_part, _, attr = (
        spec.partition(":") if not re.match(r"^[A-Za-z]:\\", spec) else (spec, "", "")
    )
    if path_part.endswith(".py"):
        path = Path(path_part)
        if not path.is_file():
            raise CliError(f"source file {path_part!r} does not exist")
        mod_spec = importlib.util.spec_from_file_location(f"_turbine_cli_src_{path.stem}", path)
        assert mod_spec and mod_spec.loader
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = module  # torch.export resolves classes by module name
        sys.path.insert(0, str(path.parent.resolve()))
        try:
            loader = mod_spec.loader
            user_code(f"importing {path_part}", path, lambda: loader.exec_module(module), CliError)
        finally:
            sys.path.pop(0)
    else:
        try:
            module = user_code(
                f"importing {path_part}", None, lambda: importlib.import_module(path_part), CliError
            )
        except CliError as e:
            if isinstance(e.__cause__, ImportError):
                raise CliError(f"cannot import {path_part!r}: {e.__cause__}") from e.__cause__
            raise
    import torch

    if not attr:
        found = [
            k
            for k, v in vars(module).items()
            if not k.startswith("_") and isinstance(v, torch.nn.Module)
        ]
        if "model" in vars(module):
            attr = "model"
        elif len(found) == 1:
            attr = found[0]
        else:
            raise CliError(
                f"{spec!r}: name the object to export as {path_part}:NAME "
                f"(nn.Module instances found: {', '.join(found) or 'none'})"
            )
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise CliError(f"{path_part!r} has no attribute {attr!r}") from None
    if (isinstance(obj, type) and issubclass(obj, torch.nn.Module)) or (
        callable(obj) and not isinstance(obj, (torch.nn.Module, type))  # a factory function
    ):
        factory = obj
        obj = user_code(f"calling {path_part}:{attr}()", path_part, factory, CliError)
    return obj
