"""Exceptions of turbine_params."""

from __future__ import annotations

import os

__all__ = ["ParameterArchiveError"]


class ParameterArchiveError(ValueError):
    """A parameter archive is malformed, or an archive operation cannot proceed.

    The message names the file, the byte offset (when one applies), what was found and what was
    expected. ``path`` and ``offset`` are also available as attributes for tools.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike | None = None,
        offset: int | None = None,
    ):
        self.path = None if path is None else os.fspath(path)
        self.offset = offset
        self.reason = message
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if offset is not None:
            where.append(f"byte offset {offset}")
        prefix = ": ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)
