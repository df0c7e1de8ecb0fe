"""Exception classes of turbine_ir."""

from __future__ import annotations

__all__ = [
    "IrBuildError",
    "TurbineIrError",
    "UnsupportedDtypeError",
]


class TurbineIrError(Exception):
    """Root of every error raised by turbine_ir."""


class UnsupportedDtypeError(TurbineIrError, TypeError):
    """A torch dtype (or MLIR element type) has no mapping in the requested direction."""


class IrBuildError(TurbineIrError):
    """Building or verifying IR failed.

    Attributes:
        dump_dir: The per-run directory the failing IR was written to, or ``None``.
    """

    def __init__(self, message: str, *, dump_dir: str | None = None):
        super().__init__(message)
        self.dump_dir = dump_dir
