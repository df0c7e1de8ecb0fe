"""A minimal progress line for long archive writes (stderr, only when it is a terminal)."""

from __future__ import annotations

import os
import sys
import time

__all__ = ["Progress"]

_MIN_BYTES = 256 << 20  # small writes finish before a progress line would help


class Progress:
    """``Progress(total, label)``; ``advance(n)`` per chunk; ``close()`` clears the line.

    Off when stderr is not a terminal, when ``TURBINE_PROGRESS=0``, or for small totals.
    """

    def __init__(self, total: int, label: str, *, enabled: bool | None = None):
        if enabled is None:
            enabled = (
                total >= _MIN_BYTES
                and os.environ.get("TURBINE_PROGRESS", "1") != "0"
                and sys.stderr.isatty()
            )
        self.enabled = enabled
        self.total = max(total, 1)
        self.label = label
        self.done = 0
        self._t0 = time.perf_counter()
        self._last = 0.0

    def advance(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last < 0.1 and self.done < self.total:
            return
        self._last = now
        rate = self.done / max(now - self._t0, 1e-9) / (1 << 30)
        sys.stderr.write(
            f"\r{self.label}: {100 * self.done / self.total:5.1f}% "
            f"{self.done / (1 << 30):.2f}/{self.total / (1 << 30):.2f} GB {rate:.2f} GB/s"
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 72 + "\r")
            sys.stderr.flush()
