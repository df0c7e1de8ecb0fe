"""The command-line options and environment variables of ``turbine_generate`` (registered with
``iree.build``'s argument parser), resolved to values."""

from __future__ import annotations

import argparse
import os
from typing import Any

from iree.build.args import current_args_namespace, register_arg_parser_callback

from .errors import BuildActionError
from .pool import (
    default_worker_count,
)

__all__ = [
    "DASK_ENV",
    "JOBS_ENV",
    "MP_CONTEXT_ENV",
    "TIMEOUT_ENV",
    "resolve_dask",
    "resolve_jobs",
    "resolve_mp_context",
    "resolve_timeout",
]


#: Environment defaults for the command-line options of the same meaning.
JOBS_ENV = "TURBINE_GENERATE_JOBS"
TIMEOUT_ENV = "TURBINE_GENERATE_TIMEOUT"
MP_CONTEXT_ENV = "TURBINE_GENERATE_MP_CONTEXT"
DASK_ENV = "TURBINE_GENERATE_DASK"


# -- command-line options ---------------------------------------------------------------------


@register_arg_parser_callback
def _define_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        title="turbine generate options",
        description="Options of turbine_aot.build_actions.turbine_generate",
    )
    g.add_argument(
        "--turbine-generate-jobs",
        type=int,
        default=None,
        help=f"Worker processes for out-of-process generation (default ${JOBS_ENV} or the "
        "number of usable cores).",
    )
    g.add_argument(
        "--turbine-generate-timeout",
        type=float,
        default=None,
        help=f"Seconds one generator may run out of process before its worker is killed and the "
        f"action fails (default ${TIMEOUT_ENV}; 0 or unset: no limit).",
    )
    g.add_argument(
        "--turbine-generate-dask",
        default=None,
        metavar="ADDRESS",
        help=f"Run out-of-process generators on a Dask cluster: a scheduler address "
        f"(tcp://host:8786) or 'local' for a LocalCluster of --turbine-generate-jobs workers "
        f"(default ${DASK_ENV}; needs `pip install distributed`).",
    )
    g.add_argument(
        "--turbine-generate-mp-context",
        choices=("spawn", "forkserver", "fork"),
        default=None,
        help=f"multiprocessing start method of the workers (default ${MP_CONTEXT_ENV}, else "
        "$IREE_BUILD_MP_CONTEXT, else spawn).",
    )


def _option(dest: str) -> Any:
    try:
        return getattr(current_args_namespace(), dest, None)
    except AssertionError:  # Not inside an iree.build command line.
        return None


def resolve_jobs() -> int:
    jobs = _option("turbine_generate_jobs")
    if jobs is None and os.environ.get(JOBS_ENV):
        jobs = _parse_env(JOBS_ENV, int)
    jobs = default_worker_count() if jobs is None else jobs
    if jobs < 1:
        raise BuildActionError(f"--turbine-generate-jobs / ${JOBS_ENV} must be >= 1, got {jobs}")
    return jobs


def resolve_timeout() -> float | None:
    timeout = _option("turbine_generate_timeout")
    if timeout is None and os.environ.get(TIMEOUT_ENV):
        timeout = _parse_env(TIMEOUT_ENV, float)
    return timeout if timeout else None


def resolve_mp_context() -> str:
    ctx = (
        _option("turbine_generate_mp_context")
        or os.environ.get(MP_CONTEXT_ENV)
        or os.environ.get("IREE_BUILD_MP_CONTEXT")
        or "spawn"
    )
    valid = ("spawn", "forkserver", "fork")
    if ctx not in valid:
        raise BuildActionError(
            f"multiprocessing start method {ctx!r} (from --turbine-generate-mp-context, "
            f"${MP_CONTEXT_ENV} or $IREE_BUILD_MP_CONTEXT) is not one of {', '.join(valid)}"
        )
    return ctx


def resolve_dask() -> str | None:
    return _option("turbine_generate_dask") or os.environ.get(DASK_ENV) or None


def _parse_env(name: str, kind: type) -> Any:
    raw = os.environ[name]
    try:
        return kind(raw)
    except ValueError:
        raise BuildActionError(
            f"${name}={raw!r} is not a valid {kind.__name__}; unset it or give a number"
        ) from None
