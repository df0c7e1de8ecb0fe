"""The ``turbine-params`` command line."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("turbine-params: not implemented yet", file=sys.stderr)
    return 2
