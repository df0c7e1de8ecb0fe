"""The errors of turbine's build actions."""

from __future__ import annotations

from .._errors import TurbineAotError

__all__ = [
    "BuildActionError",
    "GenerationError",
    "GeneratorNotRemotableError",
    "GeneratorSignatureError",
]


class BuildActionError(TurbineAotError):
    """Root of the errors raised by turbine's build actions."""


class GeneratorNotRemotableError(BuildActionError, TypeError):
    """The generator or its arguments cannot be sent to a worker process (not picklable)."""


class GeneratorSignatureError(BuildActionError, TypeError):
    """The generator does not declare (or does not return) what ``turbine_generate`` can save."""


class GenerationError(BuildActionError):
    """A generator failed: it raised, returned the wrong thing, or its worker process died.

    The message carries the worker's traceback; ``__cause__`` is the underlying error.
    """
