"""Version reports for the command lines (``turbine-params --version``, ``turbine-aot
--version``), read from the installed distributions' metadata: nothing is imported, so a
missing torch or IREE is reported as such instead of failing."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from importlib import metadata

__all__ = ["package_version", "versions_text"]


def package_version(distribution: str) -> str | None:
    """The installed version of a distribution (``"torch"``, ``"iree-base-runtime"``), or None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def versions_text(tool: str, others: Sequence[str]) -> str:
    """``tool X.Y.Z`` then one indented line per other distribution (``not installed`` where
    it is missing) and the Python version."""
    width = max(len(n) for n in [*others, "python"])
    lines = [f"{tool} {package_version(tool) or '(not installed as a distribution)'}"]
    for name in others:
        lines.append(f"  {name:<{width}}  {package_version(name) or 'not installed'}")
    lines.append(f"  {'python':<{width}}  {platform.python_version()}")
    return "\n".join(lines)
