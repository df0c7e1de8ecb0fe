"""The errors of calling a compiled function with the wrong arguments, and of a module whose
records cannot be read."""

from __future__ import annotations

from turbine_aot._errors import TurbineRuntimeError

__all__ = [
    "CallArgumentTypeError",
    "CallArgumentValueError",
    "damaged_module_error",
    "type_error",
    "value_error",
]


class CallArgumentTypeError(TurbineRuntimeError, TypeError):
    """A call's arguments do not fit the function: count, an unknown, repeated or missing
    keyword, a structure other than the exported one, a non-tensor where a tensor is expected."""


class CallArgumentValueError(TurbineRuntimeError, ValueError):
    """An argument has the wrong dtype, rank or dimension, a dynamic dimension outside its
    exported range, or a constant specialized at export has another value."""


def type_error(msg: str) -> CallArgumentTypeError:
    return CallArgumentTypeError(msg)


def value_error(msg: str) -> CallArgumentValueError:
    return CallArgumentValueError(msg)


def damaged_module_error(where: str, what: str, error: BaseException) -> TurbineRuntimeError:
    """The error for a module whose records cannot be read: ``where`` (the file, and the
    function), ``what`` is damaged, and what IREE or the reader said."""
    said = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return TurbineRuntimeError(
        f"{where}: {what} is unreadable ({type(error).__name__}: {said}); the module is "
        "damaged: rebuild it (or get an intact copy)"
    )
