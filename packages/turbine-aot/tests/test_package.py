"""Package metadata and public surface of turbine_aot."""

from __future__ import annotations

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from importlib.resources import files
from pathlib import Path

import turbine_aot


def test_version_matches_pyproject():
    meta = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert turbine_aot.__version__ == meta["project"]["version"]


def test_all_names_exist():
    missing = [n for n in turbine_aot.__all__ if not hasattr(turbine_aot, n)]
    assert missing == []


def test_ships_py_typed():
    """PEP 561: the package says it is typed, so mypy/pyright read its annotations (hatchling
    ships every file under the package directory, py.typed included)."""
    assert files(turbine_aot).joinpath("py.typed").is_file()


def test_every_error_a_user_sees_is_a_turbine_aot_error():
    """One root (turbine_aot/_errors.py says which internal ones stay outside, and why); each
    keeps the built-in base that existing ``except`` clauses catch."""
    import importlib

    from turbine_aot._cli.inputs import CliError
    from turbine_aot._compiler.targets import TargetError
    from turbine_aot._runtime.numerics import NumericsError

    public = ["turbine_aot", "turbine_aot.runtime", "turbine_aot.build_actions", "turbine_aot.llm"]
    errors = {
        obj
        for name in public
        for obj in vars(importlib.import_module(name)).values()
        if isinstance(obj, type) and issubclass(obj, BaseException)
    }
    assert len(errors) >= 10, errors
    errors |= {CliError, TargetError, NumericsError}  # raised to users from private modules
    outside = sorted(e.__name__ for e in errors if not issubclass(e, turbine_aot.TurbineAotError))
    assert not outside, f"not under TurbineAotError: {outside}"
    assert issubclass(turbine_aot.runtime.TurbineRuntimeError, RuntimeError)
    assert issubclass(TargetError, ValueError) and issubclass(NumericsError, AssertionError)
