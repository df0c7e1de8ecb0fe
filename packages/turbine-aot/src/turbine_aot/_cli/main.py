"""``turbine-aot``'s entry point: parse, run the command, print its result; errors a user can
fix (missing file, bad shape string, unknown device, compile failure) print one line
``turbine-aot: error: ...`` and exit with status 2, without a traceback (``--debug`` shows it).
``--json`` prints one JSON object on stdout instead of text; progress goes to stderr."""

from __future__ import annotations

import json
import sys

from turbine_aot._compiler.cache import CompileError as CacheCompileError
from turbine_aot._compiler.targets import TargetError
from turbine_aot._errors import TurbineAotError, TurbineRuntimeError

from .commands import COMMANDS
from .errors import with_root_cause
from .inputs import CliError
from .output import print_text
from .parser import build_parser
from .progress import Stages

__all__ = ["main"]


def _user_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [CliError, FileNotFoundError]
    types += [TurbineRuntimeError, CacheCompileError, TargetError, TurbineAotError]
    return tuple(types)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``turbine-aot``; returns the exit status."""
    args = build_parser().parse_args(argv)
    st = Stages(quiet=args.json)
    try:
        result = COMMANDS[args.command](args, st)
    except _user_error_types() as e:
        if args.debug:
            raise
        # A CompileError's first line only names the stage; its first error says what failed.
        text = getattr(e, "cli_message", None) or (
            e.errors[0].message  # type: ignore[attr-defined]  # a CompileError's diagnostics
            if getattr(e, "errors", None)
            else str(e)
        )
        first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
        if not isinstance(e, CliError):
            # An export's cli_message says what torch.export said; a kernel's own error at the
            # root (a shape mismatch) is added, torch's wrapping exception types are not.
            first = with_root_cause(e, first, builtin_only=bool(getattr(e, "cli_message", None)))
        if args.json:
            print(json.dumps({"ok": False, "error": first}))
        print(f"turbine-aot: error: {first}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("turbine-aot: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result, default=str))
    else:
        print_text(args.command, result, st)
    return 0 if result.get("ok", True) else 1
