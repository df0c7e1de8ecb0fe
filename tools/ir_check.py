"""FileCheck-style assertions on printed MLIR for the tests (the root conftest puts tools/ on
sys.path, as it does for iree_devices)."""

from __future__ import annotations

import re


def check_ir(asm: str, *patterns: str) -> None:
    """FileCheck-style: each pattern (a regex) must match a line, in order, after the previous."""
    lines = asm.splitlines()
    pos = 0
    for pattern in patterns:
        rx = re.compile(pattern)
        for i in range(pos, len(lines)):
            if rx.search(lines[i]):
                pos = i + 1
                break
        else:
            raise AssertionError(
                f"no line matching {pattern!r} after line {pos} in:\n"
                + "\n".join(f"{n:3}: {line}" for n, line in enumerate(lines))
            )
