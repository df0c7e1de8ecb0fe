"""Optional Dask backend for ``turbine_generate``: run the RemoteGenerator thunks on a cluster.

Selected with ``--turbine-generate-dask ADDRESS`` (a running scheduler, e.g.
``tcp://host:8786``) or ``--turbine-generate-dask local`` (a ``LocalCluster`` of
``--turbine-generate-jobs`` single-threaded worker processes, for trying it on one machine).
Everything else about the action (up-front pickling check, fingerprints, atomic outputs, error
reporting) is unchanged: only where the thunk runs differs. Outputs are written by the workers
at the build's paths, so with a remote cluster the output directory must be on a file system
the workers share. Needs ``pip install distributed``.

A worker process that dies while running a variant (a native crash, SIGKILL, the out-of-memory
killer) does not fail the build at once: the variant is submitted again, up to
:data:`WORKER_DEATH_RETRIES` times, and runs on another worker (a local cluster's nanny restarts
the dead one). A variant whose worker dies on every attempt fails with a
:class:`WorkerDiedError` naming it; the other variants are built. The local cluster listens on
127.0.0.1 only, runs single-threaded workers and leaves retrying to this module
(``allowed-failures`` 0). Dask may hand a worker a second variant while it runs one; when that
worker dies, Dask fails both (and one that just finished there, its result not yet reported).
On a local cluster each attempt leaves marker files when it starts and when it finishes, so a
variant that was not running on the dead worker is submitted again without using one of its
attempts (at most :data:`_FREE_RESUBMITS` times): only the variant that was running pays for
the death. On a remote cluster (no shared marker directory) every death counts.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from .errors import BuildActionError
from .pool import WorkerDiedError

__all__ = ["WORKER_DEATH_RETRIES", "submit_to_dask"]

#: How many more times a variant is run after the worker process running it died.
WORKER_DEATH_RETRIES = 2
_CLOSE_TIMEOUT_S = 20
#: How many times a variant that was not running when its worker died (queued behind the
#: attempt that died, or finished with its result not yet fetched) is resubmitted without
#: counting as an attempt.
_FREE_RESUBMITS = 10

logger = logging.getLogger("turbine.aot.build_actions")

_lock = threading.Lock()
_clients: dict[tuple[str, int], Any] = {}
_marker_dir: Path | None = None


def _local_marker_dir() -> Path:
    """A directory, private to this build process, where local workers mark the attempts they
    start and finish."""
    global _marker_dir
    with _lock:
        if _marker_dir is None:
            _marker_dir = Path(tempfile.mkdtemp(prefix="turbine-dask-started-"))
        return _marker_dir


class _MarkStarted:
    """Runs ``thunk`` between ``<marker>.started`` and ``<marker>.finished`` (picklable: it
    travels to the worker)."""

    def __init__(self, thunk: Any, marker: str):
        self.thunk = thunk
        self.marker = marker

    def __call__(self) -> Any:
        Path(self.marker + ".started").touch()
        try:
            return self.thunk()
        finally:  # returned or raised: whatever kills the worker later is not this attempt
            Path(self.marker + ".finished").touch()


class DaskUnavailableError(BuildActionError):
    """``--turbine-generate-dask`` was given but dask's distributed scheduler is not installed."""


def _client(address: str, workers: int) -> Any:
    try:
        import dask
        from dask.distributed import Client, LocalCluster
    except ImportError as e:
        raise DaskUnavailableError(
            "--turbine-generate-dask needs dask's distributed scheduler: pip install distributed "
            f"(import failed: {e})"
        ) from e
    key = (address, workers if address == "local" else 0)
    with _lock:
        client = _clients.get(key)
        if client is None:
            # iree.compiler's import calls logging.debug() at module level, which installs a
            # root handler; without this, every scheduler INFO line would land in the build log.
            # Local workers inherit the environment, and read dask's config from it at import.
            os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
            logging.getLogger("distributed").setLevel(logging.WARNING)
            if address == "local":
                with dask.config.set(
                    {
                        # A death fails the task at once; submit_to_dask retries it itself.
                        "distributed.scheduler.allowed-failures": 0,
                        # One task per worker: a death never hits a variant queued behind.
                        "distributed.scheduler.worker-saturation": 1.0,
                    }
                ):
                    cluster = LocalCluster(
                        n_workers=workers,
                        threads_per_worker=1,  # torch.export is not thread-safe.
                        processes=True,
                        host="127.0.0.1",  # reachable from this machine only
                        dashboard_address=None,
                    )
                client = Client(cluster)
            else:
                client = Client(address)
            _clients[key] = client
        return client


def submit_to_dask(
    address: str,
    workers: int,
    thunk: Any,
    *,
    key: str,
    desc: str | None = None,
    retries: int = WORKER_DEATH_RETRIES,
) -> concurrent.futures.Future:
    """Runs ``thunk()`` on the cluster; the returned future resolves to its result or error.

    When the worker running it dies, ``thunk`` is submitted again (``retries`` times at most,
    under a new key); then the future fails with :class:`WorkerDiedError` naming ``desc``.
    """
    from dask.distributed import KilledWorker

    client = _client(address, workers)
    result: concurrent.futures.Future = concurrent.futures.Future()
    result.set_running_or_notify_cancel()
    what = desc or key

    markers = _local_marker_dir() if address == "local" else None
    resubmits = [0]

    def submit(attempt: int) -> None:
        name = key if attempt == 0 else f"{key}-retry{attempt}"
        if resubmits[0]:
            name += f"-resubmit{resubmits[0]}"
        job = thunk if markers is None else _MarkStarted(thunk, str(markers / name))
        client.submit(job, pure=False, key=name).add_done_callback(lambda f: done(f, attempt, name))

    def died_running(name: str) -> bool:
        """Whether this attempt was running when its worker died (not queued behind the
        attempt that died, nor finished with its result still on that worker)."""
        if markers is None:
            return True
        started = (markers / f"{name}.started").exists()
        return started and not (markers / f"{name}.finished").exists()

    def done(f: Any, attempt: int, name: str) -> None:
        try:
            value = f.result()
        except KilledWorker as e:
            if not died_running(name) and resubmits[0] < _FREE_RESUBMITS:
                # Queued on the worker that died, or done with its result lost with it: not
                # this variant's death.
                resubmits[0] += 1
                logger.info(
                    "%s: its Dask worker died while it was not running; submitting it again", what
                )
                try:
                    submit(attempt)
                except BaseException as again:  # the client closed meanwhile
                    result.set_exception(again)
                return
            if attempt < retries:
                logger.warning(
                    "%s: its Dask worker died (attempt %d of %d); running it again on another "
                    "worker",
                    what,
                    attempt + 1,
                    retries + 1,
                )
                try:
                    submit(attempt + 1)
                except BaseException as again:  # the client closed meanwhile
                    result.set_exception(again)
                return
            err = WorkerDiedError(
                f"{what}: the Dask worker process running it died on each of {attempt + 1} "
                "attempts (a native crash, a kill signal or the out-of-memory killer), each time "
                "on another worker; it was not built. The workers' logs may say why; build it "
                f"without --turbine-generate-dask to debug it in one process. Dask said: {e}"
            )
            result.set_exception(err)
        except BaseException as e:  # The worker's exception, re-raised with its traceback.
            result.set_exception(e)
        else:
            result.set_result(value)

    submit(0)
    return result


def close_dask_clients() -> None:
    """Closes the clients (and local clusters) this process opened."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
    global _marker_dir
    with _lock:
        markers, _marker_dir = _marker_dir, None
    if markers is not None:
        shutil.rmtree(markers, ignore_errors=True)
    for client in clients:
        cluster = getattr(client, "cluster", None)
        # Bounded: closing a local cluster while a nanny restarts a killed worker can wait
        # forever (distributed 2026.8), which would hang the build at exit.
        with contextlib.suppress(Exception):  # best effort at exit
            client.close(timeout=_CLOSE_TIMEOUT_S)
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close(timeout=_CLOSE_TIMEOUT_S)


atexit.register(close_dask_clients)
