"""The calling thread's Linux scheduling policy while a call runs on IREE's ``local-task``
workers (docs/running.md, "The calling thread during a call").

Why: a call on ``local-task`` hands the work to IREE's worker threads, one per core, and the
calling thread sleeps until the last worker signals the call's fence. The worker that signals
wakes the caller and then, inside the same callback, marks the wait's record complete; the woken
caller spins until it sees that mark before it returns (IREE 3.13's semaphore wait). When every
core has a worker, the caller wakes on a busy core, and Linux's wake-up preemption gives it the
core of the worker it is waiting for: that worker cannot set the mark, and the caller spins
until the scheduler takes the core back, about one scheduler tick (4 ms here). On a 2-core
machine 40 % of the 110M Llama's decode steps paid that (the gap between steps: mean 1.0-1.7 ms
against a median of 0.15 ms).

``SCHED_BATCH`` keeps the thread's share of the CPU (same nice value) but a woken batch thread
does not preempt the running one: the worker finishes its callback and goes to sleep, and the
caller runs. turbine switches the calling thread to ``SCHED_BATCH`` for the call and back to
``SCHED_OTHER`` after it (three system calls, a few microseconds; allowed without privileges),
only for modules on ``local-task`` and only for threads running under ``SCHED_OTHER`` (a policy
the user chose is left alone). ``TURBINE_CALLER_SCHED`` chooses: ``"auto"`` (default: as
described), ``"batch"`` (also for other drivers) or ``"normal"`` (never switch).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from types import TracebackType

from turbine_aot._errors import TurbineRuntimeError

__all__ = ["ENV_VAR", "MODES", "BatchWhileCalling", "resolve_mode", "switches_policy"]

#: The environment variable that chooses the mode.
ENV_VAR = "TURBINE_CALLER_SCHED"
#: ``auto``: batch while calling modules on ``local-task``; ``batch``: on every driver;
#: ``normal``: never switch.
MODES = ("auto", "batch", "normal")


def resolve_mode(value: str | None = None) -> str:
    """The mode: ``value``, else ``$TURBINE_CALLER_SCHED``, else ``"auto"``.

    Raises:
        TurbineRuntimeError: an unknown mode.
    """
    mode = value if value is not None else os.environ.get(ENV_VAR, "") or "auto"
    if mode not in MODES:
        raise TurbineRuntimeError(
            f"{ENV_VAR}={mode!r} is not a caller scheduling mode; use one of "
            f"{', '.join(MODES)} (docs/running.md, 'The calling thread during a call')"
        )
    return mode


def _supported() -> bool:
    return all(hasattr(os, n) for n in ("sched_setscheduler", "sched_getscheduler", "SCHED_BATCH"))


def switches_policy(drivers: Sequence[str], mode: str) -> bool:
    """Whether calls on devices of these drivers run with the caller under ``SCHED_BATCH``."""
    if mode == "normal" or not _supported():
        return False
    return mode == "batch" or "local-task" in drivers


class BatchWhileCalling:
    """Context manager: the calling thread under ``SCHED_BATCH`` inside, its ``SCHED_OTHER``
    back on exit. A thread under any other policy, or a refused switch, is left as it was."""

    __slots__ = ("_switched",)

    def __init__(self) -> None:
        self._switched = False

    def __enter__(self) -> BatchWhileCalling:
        self._switched = False
        try:
            if os.sched_getscheduler(0) == os.SCHED_OTHER:
                os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
                self._switched = True
        except OSError:  # a sandbox that refuses the call: run as the thread is
            pass
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._switched:
            self._switched = False
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
