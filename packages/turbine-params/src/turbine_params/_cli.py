"""The ``turbine-params`` command line: inspect, convert, strip, verify.

Errors print one line (``turbine-params: error: ...``) and exit with status 2, without a
traceback (``--debug`` shows it).
"""

from __future__ import annotations

import argparse
import json
import sys

from ._errors import ParameterArchiveError
from ._file_operations import convert_parameters, describe_archive, strip_archive, verify_archive
from ._versions import versions_text


def _fmt_shape(shape: tuple[int, ...] | None) -> str:
    return "-" if shape is None else "[" + ",".join(str(s) for s in shape) + "]"


def _inspect(args: argparse.Namespace) -> int:

    rows = describe_archive(args.archive, include_skipped=args.all)
    if args.json:
        json.dump(
            [
                {
                    "key": r.key,
                    "type": r.type,
                    "dtype": r.dtype,
                    "shape": None if r.shape is None else list(r.shape),
                    "bytes": r.nbytes,
                    "offset": r.offset,
                }
                for r in rows
            ],
            sys.stdout,
            indent=1,
        )
        sys.stdout.write("\n")
        return 0
    table = [("KEY", "DTYPE", "SHAPE", "BYTES", "OFFSET", "TYPE")]
    for r in rows:
        table.append(
            (
                r.key,
                (r.dtype or "-").removeprefix("torch."),
                _fmt_shape(r.shape),
                str(r.nbytes),
                "-" if r.offset is None else str(r.offset),
                r.type,
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(6)]
    for row in table:
        print(
            "  ".join(
                c.ljust(w) if i in (0, 1, 2, 5) else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths))
            ).rstrip()
        )
    print(f"{len(rows)} entries, {sum(r.nbytes for r in rows)} bytes")
    return 0


def _convert(args: argparse.Namespace) -> int:

    out = convert_parameters(args.src, args.dst, data_alignment=args.alignment)
    print(f"wrote {out}")
    return 0


def _strip(args: argparse.Namespace) -> int:

    out = strip_archive(args.src, args.dst, keep=tuple(args.keep))
    print(f"wrote {out}")
    return 0


def _verify(args: argparse.Namespace) -> int:

    n, total = verify_archive(args.archive, against=args.against)
    extra = f", identical to {args.against}" if args.against else ""
    print(f"OK: {args.archive}: {n} entries, {total} bytes{extra}")
    return 0


class _VersionAction(argparse.Action):
    """``--version``, read from package metadata (imports neither torch nor IREE)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        print(versions_text("turbine-params", ["numpy", "torch", "iree-base-runtime"]))
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="turbine-params", description="Inspect, convert, strip and verify .irpa archives."
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    p.add_argument(
        "--version",
        action=_VersionAction,
        help="print the turbine-params, numpy, torch and IREE versions (torch and IREE are "
        "optional: 'not installed' when missing)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("inspect", help="list entries: key, dtype, shape, bytes, offset, type")
    s.add_argument("archive")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.add_argument("--all", action="store_true", help="include SKIP (erased) entries")
    s.set_defaults(fn=_inspect)
    s = sub.add_parser(
        "convert",
        help="convert .safetensors <-> .irpa, torch checkpoint -> .irpa, .irpa -> .irpa (repack)",
    )
    s.add_argument("src")
    s.add_argument("dst")
    s.add_argument("--alignment", type=int, default=64, help="data alignment (default 64)")
    s.set_defaults(fn=_convert)
    s = sub.add_parser("strip", help="replace data by zero splats (for test builds)")
    s.add_argument("src")
    s.add_argument("dst")
    s.add_argument("--keep", action="append", default=[], metavar="KEY", help="keep this entry")
    s.set_defaults(fn=_strip)
    s = sub.add_parser("verify", help="check structure and metadata of every entry")
    s.add_argument("archive")
    s.add_argument("--against", help="also compare keys and bytes with this .safetensors/.irpa")
    s.set_defaults(fn=_verify)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ParameterArchiveError, OSError, ImportError) as e:
        if args.debug:
            raise
        if isinstance(e, ImportError):
            print(f"turbine-params: error: {e} (install the missing package)", file=sys.stderr)
            return 2
        msg = " ".join(str(e).split())
        print(f"turbine-params: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
