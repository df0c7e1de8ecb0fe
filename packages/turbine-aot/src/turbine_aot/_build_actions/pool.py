"""A small, crash-tolerant pool of worker processes for out-of-process generation.

Why not ``concurrent.futures.ProcessPoolExecutor`` (what ``iree.build`` uses)? Three reasons that
all showed up as hangs or lost work in a build graph:

* one worker dying (``os._exit``, a segfault in a torch op, the OOM killer) breaks the whole
  executor: every queued job fails with ``BrokenProcessPool`` and the pool cannot be used again;
  here only the job that was running on the dead worker fails, and the worker is replaced;
* its workers are joined at interpreter exit, so a worker stuck in a generator blocks exit; here
  workers are killed by an ``atexit`` hook that runs before ``multiprocessing``'s own one;
* it has no per-job timeout; here a job can have one, and the worker running it is killed.

Each worker is a process of the chosen start method (``spawn`` by default: torch and threads do not
mix with ``fork``) owned by one handler thread in the parent. The two talk over a pipe: the parent
sends a pickled no-argument thunk, the worker sends back ``("ok", result)`` or ``("error", type
name, message, formatted traceback)``. The parent waits on the pipe and the process sentinel at
once, so a worker that dies is noticed immediately, never waited on.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import signal
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GeneratorPool",
    "RemoteJobError",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "get_generator_pool",
    "shutdown_generator_pools",
]

logger = logging.getLogger("turbine.aot")

#: Extra seconds a job's timeout allows for starting its worker process (spawn, imports).
WORKER_STARTUP_ALLOWANCE_S = 300.0

#: Seconds an idle worker process is kept before it is stopped (it is restarted on demand).
DEFAULT_IDLE_TIMEOUT_S = 120.0


class RemoteJobError(RuntimeError):
    """The thunk raised in the worker process.

    Attributes:
        exc_type: qualified name of the exception type raised in the worker.
        remote_traceback: the worker's formatted traceback.
    """

    def __init__(self, message: str, *, exc_type: str, remote_traceback: str):
        super().__init__(message)
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback


class WorkerDiedError(RuntimeError):
    """The worker process exited (crash, ``os._exit``, signal) while running a job."""


class WorkerTimeoutError(TimeoutError):
    """A job ran longer than its timeout; its worker process was killed."""


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "did not report an exit status"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _worker_main(conn: multiprocessing.connection.Connection) -> None:
    """Entry point of a worker process: run thunks until told to stop or the parent goes away."""
    # The parent decides when workers stop: Ctrl-C in a terminal reaches the whole process group,
    # and a worker dying of it mid-job would only turn one interrupt into N confusing failures.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return  # The parent closed the pipe or died.
        if message == b"exit":
            return
        try:
            # Unpickling may import the build file and torch: still worker startup.
            thunk = pickle.loads(message)
            conn.send_bytes(pickle.dumps(("started",)))
            result = thunk()
            reply: tuple[Any, ...] = ("ok", result)
        except BaseException as e:
            exc_type = f"{type(e).__module__}.{type(e).__qualname__}"
            reply = ("error", exc_type, str(e), traceback.format_exc())
        try:
            payload = pickle.dumps(reply)
        except Exception as e:
            payload = pickle.dumps(
                ("error", "pickle.PicklingError", f"result could not be sent back: {e}", "")
            )
        try:
            conn.send_bytes(payload)
        except (BrokenPipeError, OSError):
            return


@dataclass
class _Job:
    future: concurrent.futures.Future
    payload: bytes
    desc: str
    timeout: float | None


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, name: str):
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.conn = parent_conn
        self.process = ctx.Process(target=_worker_main, args=(child_conn,), name=name, daemon=False)
        self.process.start()
        # The child holds its own end now; closing ours makes EOF visible to both sides.
        child_conn.close()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def stop(self, grace_s: float = 2.0) -> None:
        """Asks the worker to exit, then terminates and finally kills it; never blocks long."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send_bytes(b"exit")
        with contextlib.suppress(OSError):
            self.conn.close()
        self.process.join(grace_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(grace_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(grace_s)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5.0)


class GeneratorPool:
    """A pool of worker processes running pickled no-argument thunks.

    Args:
        max_workers: the most worker processes alive at once.
        mp_context: a ``multiprocessing`` start method (``"spawn"``, ``"forkserver"``, ``"fork"``).
        idle_timeout_s: a worker idle this long is stopped (and restarted when work arrives).
    """

    def __init__(
        self,
        *,
        max_workers: int,
        mp_context: str = "spawn",
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self.mp_context = mp_context
        self.idle_timeout_s = idle_timeout_s
        self._ctx = multiprocessing.get_context(mp_context)
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._workers: set[_Worker] = set()
        self._closed = False
        _ALL_POOLS.add(self)

    def submit(
        self, payload: bytes, *, desc: str = "job", timeout: float | None = None
    ) -> concurrent.futures.Future:
        """Queues a pickled thunk; the future resolves to what the thunk returned.

        The future fails with :class:`RemoteJobError` (the thunk raised),
        :class:`WorkerDiedError` or :class:`WorkerTimeoutError`.
        """
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("GeneratorPool is shut down; create a new one")
            self._jobs.put(_Job(future, payload, desc, timeout))
            # Handler threads are cheap and start their worker process only when they take a
            # job, so all of them start with the first job.
            while len(self._threads) < self.max_workers:
                thread = threading.Thread(
                    target=self._handler_loop,
                    name=f"turbine-generate-{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()
        return future

    def shutdown(self) -> None:
        """Stops every worker (killing those that do not exit promptly); fails queued jobs."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
            workers = list(self._workers)
        while True:  # Fail what never started...
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None and job.future.set_running_or_notify_cancel():
                job.future.set_exception(RuntimeError("GeneratorPool was shut down"))
        for worker in workers:  # ...stop what runs...
            worker.kill()
        for _ in threads:  # ...and wake the handler threads so that they return.
            self._jobs.put(None)
        for thread in threads:
            thread.join(5.0)

    # -- handler threads ---------------------------------------------------------------------

    def _handler_loop(self) -> None:
        worker: _Worker | None = None
        try:
            while True:
                try:
                    job = self._jobs.get(timeout=self.idle_timeout_s)
                except queue.Empty:
                    if worker is not None:
                        self._forget(worker)
                        worker.stop()
                        worker = None
                    continue
                if job is None:
                    return
                if not job.future.set_running_or_notify_cancel():
                    continue
                try:
                    worker = self._run_job(worker, job)
                except BaseException as e:
                    # Whatever went wrong here, the job's future must resolve: a waiter on it
                    # is a build that would otherwise hang.
                    if not job.future.done():
                        job.future.set_exception(e)
                    if worker is not None:
                        self._forget(worker)
                        worker.kill()
                        worker = None
        finally:
            if worker is not None:
                self._forget(worker)
                worker.stop()

    def _forget(self, worker: _Worker) -> None:
        with self._lock:
            self._workers.discard(worker)

    def _start_worker(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("GeneratorPool is shut down")
            worker = _Worker(self._ctx, name="turbine-generate-worker")
            self._workers.add(worker)
        logger.debug("started generator worker pid %s (%s)", worker.pid, self.mp_context)
        return worker

    def _run_job(self, worker: _Worker | None, job: _Job) -> _Worker | None:
        """Runs one job; returns the worker to reuse (None when it died or was killed)."""
        try:
            if worker is None or not worker.process.is_alive():
                if worker is not None:
                    self._forget(worker)
                worker = self._start_worker()
        except Exception as e:
            job.future.set_exception(e)
            return None
        # The timeout is for the job, not for starting a worker (imports of torch and the build
        # file take seconds, more on a loaded machine): until the worker says it has started
        # the job, the deadline has a startup allowance on top.
        deadline = None
        if job.timeout is not None:
            deadline = time.monotonic() + job.timeout + WORKER_STARTUP_ALLOWANCE_S

        # Sent from a helper thread: a large payload blocks until the worker reads it, and a
        # worker stuck before reading (or dead) must not block this thread past the timeout.
        # If it dies, the send fails quietly and the wait below reports how the worker died.
        def send(conn=worker.conn, payload=job.payload) -> None:
            with contextlib.suppress(OSError, ValueError):
                conn.send_bytes(payload)

        threading.Thread(target=send, name="turbine-generate-send", daemon=True).start()
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = multiprocessing.connection.wait(
                [worker.conn, worker.process.sentinel], timeout=remaining
            )
            if worker.conn in ready:
                try:
                    reply = pickle.loads(worker.conn.recv_bytes())
                except (EOFError, OSError):
                    reply = None  # The worker died; handled below.
                if reply is not None and reply[0] == "started":
                    if job.timeout is not None:
                        deadline = time.monotonic() + job.timeout
                    continue
                if reply is not None:
                    if reply[0] == "ok":
                        job.future.set_result(reply[1])
                    else:
                        _, exc_type, message, tb = reply
                        job.future.set_exception(
                            RemoteJobError(
                                f"{job.desc} raised {exc_type}: {message}\n"
                                f"Traceback in the worker process (pid {worker.pid}):\n{tb}",
                                exc_type=exc_type,
                                remote_traceback=tb,
                            )
                        )
                    return worker
            if worker.process.sentinel in ready or worker.conn in ready:
                worker.process.join(5.0)
                self._forget(worker)
                worker.kill()
                logger.debug("generator worker pid %s died running %s", worker.pid, job.desc)
                job.future.set_exception(
                    WorkerDiedError(
                        f"{job.desc}: the worker process (pid {worker.pid}) "
                        f"{_describe_exit(worker.process.exitcode)} before returning a result. "
                        "Its stderr above may say why; a native crash or the out-of-memory "
                        "killer are the usual causes. Re-run with out_of_process=False to debug "
                        "it in the main process."
                    )
                )
                return None
            if not ready:
                self._forget(worker)
                worker.kill()
                job.future.set_exception(
                    WorkerTimeoutError(
                        f"{job.desc} did not finish within {job.timeout:g} s; its worker process "
                        f"(pid {worker.pid}) was killed. Raise the limit with "
                        "--turbine-generate-timeout or TURBINE_GENERATE_TIMEOUT (0 disables it)."
                    )
                )
                return None


_ALL_POOLS: weakref.WeakSet[GeneratorPool] = weakref.WeakSet()
_SHARED_POOLS: dict[tuple[str, int], GeneratorPool] = {}
_SHARED_LOCK = threading.Lock()


def get_generator_pool(*, max_workers: int, mp_context: str) -> GeneratorPool:
    """Returns the process-wide pool for this configuration, creating it on first use.

    Workers outlive one build (a second build in the same process reuses warm workers) and stop
    after being idle for a while or at interpreter exit.
    """
    key = (mp_context, max_workers)
    with _SHARED_LOCK:
        pool = _SHARED_POOLS.get(key)
        if pool is None or pool._closed:
            pool = GeneratorPool(max_workers=max_workers, mp_context=mp_context)
            _SHARED_POOLS[key] = pool
        return pool


def shutdown_generator_pools() -> None:
    """Stops every worker process of every pool (also run automatically at interpreter exit)."""
    with _SHARED_LOCK:
        _SHARED_POOLS.clear()
    for pool in list(_ALL_POOLS):
        pool.shutdown()


def default_worker_count() -> int:
    """Usable CPU cores (affinity-aware)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


# Registered after `multiprocessing.util` (imported above) registered its own exit hook, so this
# runs first (atexit is LIFO): workers are gone before multiprocessing would join them.
atexit.register(shutdown_generator_pools)
