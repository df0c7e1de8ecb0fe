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
