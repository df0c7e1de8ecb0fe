"""Stage progress and timings for the ``turbine-aot`` CLI.

On a terminal each running stage shows a live spinner with its elapsed time (a background thread
redraws one line while the blocking work runs); otherwise each stage prints one plain line when it
ends. ``--json`` silences both: timings go into the JSON result instead.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO

__all__ = ["Stages"]


@dataclass
class Stages:
    """Times named stages; ``with stages("compile"): ...``."""

    quiet: bool = False
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    timings: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def _tty(self) -> bool:
        return not self.quiet and hasattr(self.stream, "isatty") and self.stream.isatty()

    @contextlib.contextmanager
    def __call__(self, name: str, note: str = "") -> Iterator[None]:
        t0 = time.perf_counter()
        stop = threading.Event()
        spinner = None
        if self._tty:

            def spin() -> None:
                frames = "|/-\\"
                i = 0
                while not stop.wait(0.1):
                    el = time.perf_counter() - t0
                    self.stream.write(f"\r  {frames[i % 4]} {name:<12} {el:7.1f} s")
                    self.stream.flush()
                    i += 1

            spinner = threading.Thread(target=spin, daemon=True)
            spinner.start()
        failed = True
        try:
            yield
            failed = False
        finally:
            stop.set()
            if spinner is not None:
                spinner.join()
                if failed:
                    self.stream.write("\r\033[K")  # the error line replaces the spinner
            elapsed = time.perf_counter() - t0
            self.timings[name] = self.timings.get(name, 0.0) + elapsed
            if note:
                self.notes[name] = note
            if not self.quiet and not failed:
                prefix = "\r" if self._tty else ""
                extra = f"  ({self.notes[name]})" if name in self.notes else ""
                self.stream.write(f"{prefix}  done {name:<12} {elapsed:7.2f} s{extra}\n")
                self.stream.flush()

    def note(self, name: str, text: str) -> None:
        self.notes[name] = text

    def table(self) -> str:
        """A table of stage timings."""
        total = sum(self.timings.values())
        lines = [f"{'stage':<14}{'seconds':>10}{'share':>8}  note", "-" * 52]
        for k, v in self.timings.items():
            share = f"{100 * v / total:6.1f}%" if total else "   -  "
            lines.append(f"{k:<14}{v:>10.3f}{share:>8}  {self.notes.get(k, '')}")
        lines.append(f"{'total':<14}{total:>10.3f}")
        return "\n".join(lines)
