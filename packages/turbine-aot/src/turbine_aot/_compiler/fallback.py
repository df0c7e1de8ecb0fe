"""The compile-with-fallback rule: a default that only buys speed must never turn a working
compile into a failure, so a compile that fails with turbine's defaults is tried again without
the speed-only ones (:data:`.flags.SPEED_ONLY_GROUPS`), in two steps (docs/performance.md, "When
a default makes the compile fail"):

1. without IREE's data tiling and ukernels only (:data:`.flags.DATA_TILING_GROUP`: what IREE
   3.13 fails on most), keeping the other groups and turbine's own CPU kernels as the first
   compile chose them (``--turbine-cpu-matmul=avx512`` pins them: their default follows the
   ukernel flag);
2. then without every speed-only group, with the kernels the flags then choose.

Step 1 is skipped where it would be step 2. Once a compile has crashed the ``iree-compile``
tool, the retries run the tool too (:func:`out_of_process`), even where their flags
would compile in process: the same crash in process would abort the caller's process."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import TypeVar

from .._errors import CompileError
from .flags import DATA_TILING_GROUP, SPEED_ONLY_GROUPS, SpeedOnlyGroup, flag_key
from .matmuls import CPU_MATMUL_FLAG, cpu_matmul_kernel
from .targets import flag_targets

__all__ = [
    "CRASHED",
    "compile_with_fallback",
    "compiler_crashed",
    "compiling_out_of_process",
    "fallback_flags",
    "fallback_stages",
    "out_of_process",
    "retry_flags",
]

T = TypeVar("T")
#: How :func:`.invoke.compile_with_tool`'s error for a crashed tool begins.
CRASHED = "iree-compile crashed (signal"
_out_of_process: ContextVar[bool] = ContextVar("turbine_compile_out_of_process", default=False)


@contextmanager
def out_of_process() -> Iterator[None]:
    """Compiles inside run the ``iree-compile`` tool in a subprocess whatever their flags
    (:func:`.invoke.compile_module`): the retries after a compile crashed the tool, since the
    same module in process would abort the caller's process where the tool was killed (an
    LLVM fatal error calls ``abort``)."""
    token = _out_of_process.set(True)
    try:
        yield
    finally:
        _out_of_process.reset(token)


def compiling_out_of_process() -> bool:
    """Whether compiles now must run the tool (inside :func:`out_of_process`)."""
    return _out_of_process.get()


def compiler_crashed(error: BaseException) -> bool:
    """Whether ``error`` is a compile whose ``iree-compile`` tool crashed (killed by a signal)."""
    return isinstance(error, CompileError) and any(
        d.message.startswith(CRASHED) for d in error.diagnostics
    )


def fallback_flags(
    flags: Sequence[str], user_flags: Sequence[str] = ()
) -> tuple[list[str], list[SpeedOnlyGroup]] | None:
    """The flags to compile with again after ``flags`` failed, and the groups dropped.

    Every :data:`SPEED_ONLY_GROUPS` group that is speed only for a target the flags compile for
    is removed, except flags the user named (``user_flags``, by flag name).

    Returns:
        ``(flags, dropped groups)``, or ``None`` when nothing can be dropped (the failure is not
        a speed-only default's).
    """
    targets = flag_targets(flags)
    user_keys = {flag_key(f) for f in user_flags}
    dropped: list[SpeedOnlyGroup] = []
    drop: set[str] = set()
    for group in SPEED_ONLY_GROUPS:
        if not targets.intersection(group.targets):
            continue
        present = [f for f in group.flags if f in flags and flag_key(f) not in user_keys]
        if present:
            dropped.append(group)
            drop.update(present)
    if not dropped:
        return None
    return [f for f in flags if f not in drop], dropped


def retry_flags(flags: Sequence[str], user_flags: Sequence[str]) -> list[str] | None:
    """The flags of the last retry after ``flags`` failed (every speed-only group dropped), or
    ``None`` (:func:`fallback_flags` without the dropped groups)."""
    fb = fallback_flags(flags, user_flags)
    return None if fb is None else fb[0]


def fallback_stages(
    flags: Sequence[str], user_flags: Sequence[str] = ()
) -> list[tuple[list[str], list[SpeedOnlyGroup]]]:
    """The retries after ``flags`` failed, in order: ``(flags, groups dropped)`` each (the
    module docstring's two steps; empty when nothing can be dropped)."""
    full = fallback_flags(flags, user_flags)
    if full is None:
        return []
    stages: list[tuple[list[str], list[SpeedOnlyGroup]]] = []
    if DATA_TILING_GROUP in full[1]:
        user_keys = {flag_key(f) for f in user_flags}
        drop = {f for f in DATA_TILING_GROUP.flags if flag_key(f) not in user_keys}
        first = [f for f in flags if f not in drop]
        kernel = cpu_matmul_kernel(flags)
        if cpu_matmul_kernel(first) != kernel:
            first.append(f"{CPU_MATMUL_FLAG}={kernel}")
        if first != full[0]:
            stages.append((first, [DATA_TILING_GROUP]))
    stages.append(full)
    return stages


def compile_with_fallback(
    compile_fn: Callable[[list[str]], T],
    flags: Sequence[str],
    user_flags: Sequence[str] = (),
    *,
    errors: tuple[type[BaseException], ...] = (Exception,),
    logger: logging.Logger | None = None,
) -> tuple[T, list[str]]:
    """Calls ``compile_fn(flags)``; if it fails, again without speed-only defaults
    (:func:`fallback_stages`: first without data tiling, then without every group).

    The rule for every compile path (``ExportOutput.compile``, ``turbine-aot compile``/``bundle``,
    the compile cache): a speed-only default (:data:`SPEED_ONLY_GROUPS`) must never turn a
    working compile into a failure. Each retry logs a warning naming the groups and flags
    dropped. When every retry fails too, the first error is raised (it is the one for the flags
    asked for).

    Args:
        compile_fn: compiles with the given flags; raises one of ``errors`` on failure.
        flags: turbine's defaults merged with the user's flags.
        user_flags: the flags the user named (never dropped).
        errors: the exceptions that mean "the compiler failed".
        logger: where the warning goes (``turbine.aot`` by default).

    Returns:
        ``(result, the flags it was compiled with)``.
    """
    flags = list(flags)
    log = logger or logging.getLogger("turbine.aot")
    try:
        return compile_fn(flags), flags
    except errors as first:
        stages = fallback_stages(flags, user_flags)
        if not stages:
            raise
        error: BaseException = first
        crashed = compiler_crashed(first)
        for i, (retry, dropped) in enumerate(stages):
            log.warning(
                "compiling with turbine's default flags failed (%s); compiling again without "
                "the speed-only defaults %s (%s)%s. The module works but may be slower; pass "
                "those flags yourself to see the failure.",
                _first_line(error),
                ", ".join(g.name for g in dropped),
                " ".join(f for f in flags if f not in retry),
                "" if i == len(stages) - 1 else "; the others and turbine's kernel choice kept",
            )
            try:
                with out_of_process() if crashed else nullcontext():
                    return compile_fn(retry), retry
            except errors as e:
                error = e
                crashed = crashed or compiler_crashed(e)
        raise first from None


def _first_line(error: BaseException) -> str:
    text = str(error)
    for line in text.splitlines():
        if "error:" in line:
            return line.strip()[:300]
    return (text.splitlines() or [type(error).__name__])[0][:300]
