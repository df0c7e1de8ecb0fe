"""What ``export()`` says when ``torch.export`` fails: torch's whole message, plus a hint only
where one applies, worded for the Python API or for the ``turbine-aot`` CLI."""

from __future__ import annotations

import re
from typing import Any

from .._errors import ExportError

__all__ = ["DOCS_EXPORT_ERRORS", "cli_message", "torch_export_error"]

#: The docs section that explains export failures (linked from every such error).
DOCS_EXPORT_ERRORS = "docs/turbine-aot.md#when-torchexport-fails"

_SPECIALIZED = re.compile(
    r"You marked (?P<dim>\S+) as dynamic but your code specialized it to be a constant "
    r"\((?P<value>-?\d+)\)"
)


def _dynamo_gave_up(error: BaseException) -> bool:
    """Strict mode's tracer (TorchDynamo) could not trace a Python construct.

    Non-strict export runs ``forward()`` as plain Python, so it gets past these, unless the
    construct is data-dependent control flow, which fails in both modes.
    """
    try:
        from torch._dynamo.exc import Unsupported
    except ImportError:  # pragma: no cover - torch without dynamo
        return False
    return isinstance(error, Unsupported) and "data-dependent" not in str(error).lower()


def torch_export_error(model: Any, error: BaseException, *, strict: bool) -> ExportError:
    """The ``ExportError`` for ``torch.export.export(model, ...)`` having raised ``error``.

    The message is ``torch.export.export of <Model> failed: <Type>: <torch's message, whole>``,
    then the hint, if one applies, then the docs link. Attributes for callers that word things
    differently (the CLI): ``torch_message``, ``specialized`` (dynamic dim name -> the constant
    the code fixed it to) and ``non_strict_may_help``.
    """
    name = type(model).__name__
    text = str(error).strip() or "(no message)"
    specialized = {m["dim"]: int(m["value"]) for m in _SPECIALIZED.finditer(text)}
    non_strict_may_help = strict and _dynamo_gave_up(error)
    hints = []
    if non_strict_may_help:
        hints.append(
            "hint: strict export (TorchDynamo) could not trace this; export(..., "
            "strict_export=False) traces forward() as plain Python and may get past it"
        )
    message = "\n".join(
        [
            f"torch.export.export of {name} failed: {type(error).__name__}: {text}",
            *hints,
            f"(export errors are explained in {DOCS_EXPORT_ERRORS})",
        ]
    )
    err = ExportError(message)
    err.torch_message = text
    err.specialized = specialized
    err.non_strict_may_help = non_strict_may_help
    return err


def cli_message(error: ExportError, dynamic_flags: dict[str, str]) -> str:
    """One line for ``turbine-aot export``, worded with its options.

    Args:
        error: from :func:`torch_export_error`.
        dynamic_flags: the name the CLI gave each dynamic dimension -> the ``--dynamic`` value
            that made it (``{"arg0_dim1": "0:1:512"}``).
    """
    for dim, value in error.specialized.items():
        if dim in dynamic_flags:
            arg, axis = dynamic_flags[dim].split(":")[:2]
            return (
                f"--dynamic {dynamic_flags[dim]}: the model's code makes dimension {axis} of "
                f"input {arg} the constant {value}, so it cannot be dynamic; drop this --dynamic "
                f"or change the code (see {DOCS_EXPORT_ERRORS})"
            )
    first = error.torch_message.splitlines()[0] if error.torch_message else str(error)
    hint = "; try --non-strict" if error.non_strict_may_help else ""
    return f"torch.export failed: {first}{hint} (see {DOCS_EXPORT_ERRORS})"
