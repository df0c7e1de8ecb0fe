"""Exception types of turbine_trace."""

from __future__ import annotations

__all__ = ["ProcedureTraceError", "TraceError"]


class TraceError(Exception):
    """Root of every error raised by turbine_trace."""


class ProcedureTraceError(TraceError):
    """A procedure could not be traced into IR.

    The message names the procedure (the function symbol being built) and the argument or value
    at fault, and says what to do instead.

    Args:
        message: The full explanation.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
