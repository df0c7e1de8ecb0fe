"""Optional Dask backend for ``turbine_generate``: run the RemoteGenerator thunks on a cluster.

Selected with ``--turbine-generate-dask ADDRESS`` (a running scheduler, e.g.
``tcp://host:8786``) or ``--turbine-generate-dask local`` (a ``LocalCluster`` of
``--turbine-generate-jobs`` single-threaded worker processes, for trying it on one machine).
Everything else about the action (up-front pickling check, fingerprints, atomic outputs, error
reporting) is unchanged: only where the thunk runs differs. Outputs are written by the workers
at the build's paths, so with a remote cluster the output directory must be on a file system
the workers share. Needs ``pip install distributed``.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import os
import threading
from typing import Any

from ._build_actions import BuildActionError

__all__ = ["submit_to_dask"]

_lock = threading.Lock()
_clients: dict[tuple[str, int], Any] = {}


class DaskUnavailableError(BuildActionError):
    """``--turbine-generate-dask`` was given but dask's distributed scheduler is not installed."""


def _client(address: str, workers: int) -> Any:
    try:
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
                cluster = LocalCluster(
                    n_workers=workers,
                    threads_per_worker=1,  # torch.export is not thread-safe.
                    processes=True,
                    dashboard_address=None,
                )
                client = Client(cluster)
            else:
                client = Client(address)
            _clients[key] = client
        return client


def submit_to_dask(
    address: str, workers: int, thunk: Any, *, key: str
) -> concurrent.futures.Future:
    """Runs ``thunk()`` on the cluster; the returned future resolves to its result or error."""
    client = _client(address, workers)
    result: concurrent.futures.Future = concurrent.futures.Future()
    result.set_running_or_notify_cancel()
    dask_future = client.submit(thunk, pure=False, key=key)

    def done(f: Any) -> None:
        try:
            result.set_result(f.result())
        except BaseException as e:  # The worker's exception, re-raised with its traceback.
            result.set_exception(e)

    dask_future.add_done_callback(done)
    return result


def close_dask_clients() -> None:
    """Closes the clients (and local clusters) this process opened."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        cluster = getattr(client, "cluster", None)
        try:
            client.close()
            if cluster is not None:
                cluster.close()
        except Exception:  # Best effort at exit.
            pass


atexit.register(close_dask_clients)
