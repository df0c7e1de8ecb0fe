"""``turbine_generate`` and friends: torch export as an action of an ``iree.build`` graph.

Model variants (batch sizes, sequence buckets, dtypes) are exported by a user *generator*: a
module-level function (or an instance of a module-level class with ``__call__``) that returns one
or more ``ExportOutput``. ``turbine_generate`` turns one call of it into a
:class:`TurbineBuilderAction` whose outputs are ``{name}.mlir`` (or ``{name}_{n}.mlir``) files in
the build's gen files, each ready for ``iree.build``'s ``compile`` action.

Out of process (the default), the generator runs in a worker of a crash-tolerant process pool
(:mod:`turbine_aot._build_actions.pool`), several at once, without holding any of the scheduler's
threads (``iree.build`` sizes its pools to 40 % of the cores: one on a two-core machine). In
process, it runs under a lock on one of the scheduler's threads (torch.export is not thread-safe).

Outputs are written atomically and recorded, with a fingerprint of what produced them, in the
build's metadata; a later build whose fingerprint and file hashes match reuses them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import threading
import time
import types
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from iree.build.executor import (
    ActionConcurrency,
    BuildAction,
    BuildContext,
    BuildFile,
)

from turbine_params import remove_stale_temps

from .._hashing import sha256_file
from .errors import (
    BuildActionError,
    GenerationError,
    GeneratorNotRemotableError,
    GeneratorSignatureError,
)
from .options import (
    resolve_dask,
    resolve_jobs,
    resolve_mp_context,
    resolve_timeout,
)
from .pool import (
    RemoteJobError,
    WorkerDiedError,
    WorkerTimeoutError,
    get_generator_pool,
)
from .remote import RemoteGenerator, callable_name, remote_dumps
from .returns import (
    ExportOutputMarshaller,
    ReturnMarshaller,
    declared_return_marshallers,
)

__all__ = [
    "BuildActionError",
    "ExportOutputMarshaller",
    "GenerationError",
    "GeneratorNotRemotableError",
    "GeneratorSignatureError",
    "RemoteGenerator",
    "ReturnMarshaller",
    "TurbineBuilderAction",
    "turbine_generate",
]

_METADATA_FINGERPRINT = "turbine_generate.fingerprint"
_METADATA_SHA256 = "turbine_generate.sha256"


def _remove_stale_temps(path: Path) -> None:
    """Removes temp files a crashed (killed) worker left beside ``path``; those of writers that
    still run, here or on another host, stay (``turbine_params.remove_stale_temps``)."""
    remove_stale_temps(path)


# -- the action -------------------------------------------------------------------------------

# torch.export keeps global state (fake modes, dynamo config); in-process generators take turns.
_IN_PROCESS_LOCK = threading.Lock()


class TurbineBuilderAction(BuildAction):
    """The ``iree.build`` action that runs one generator call and saves its outputs.

    With ``ActionConcurrency.PROCESS`` the generator runs in turbine's worker pool: the scheduler
    thread only submits it, and the action completes when the worker does (so N exports run at
    once whatever the size of ``iree.build``'s own pools). Otherwise it runs in this process.

    Args:
        thunk: the generator.
        thunk_args: its positional arguments.
        thunk_kwargs: its keyword arguments.
        concurrency: ``ActionConcurrency.PROCESS`` (worker pool) or ``THREAD``/``NONE``
            (build process).
        **kwargs: ``desc`` and ``executor``, as for any ``BuildAction``.
    """

    failure: BaseException | None  # iree.build's BuildDependency sets it (not typed there)

    def __init__(
        self,
        thunk: Callable,
        thunk_args: Sequence[Any],
        thunk_kwargs: dict[str, Any],
        concurrency: ActionConcurrency,
        **kwargs: Any,
    ):
        super().__init__(concurrency=concurrency, **kwargs)
        self.thunk = thunk
        self.thunk_args = tuple(thunk_args)
        self.thunk_kwargs = dict(thunk_kwargs)
        self.return_marshallers: list[tuple[ReturnMarshaller, BuildFile]] = []
        self.timeout: float | None = None
        self.jobs = 1
        self.mp_context = "spawn"
        self.dask_address: str | None = None
        self.reused_outputs = False
        self._payload: bytes | None = None
        self._fingerprint: str | None = None
        self._job: concurrent.futures.Future | None = None

    # Absolute (workers may run elsewhere), and not through get_fs_path(), which creates
    # directories (not wanted at analysis time, e.g. for --list).
    def _output_paths(self) -> list[Path]:
        return [
            Path(os.path.abspath(self.executor.get_root(output.namespace) / output.path))
            for _, output in self.return_marshallers
        ]

    def _remotable_thunk(self) -> RemoteGenerator:
        return RemoteGenerator(
            self.thunk,
            self.thunk_args,
            self.thunk_kwargs,
            [(m, p) for (m, _), p in zip(self.return_marshallers, self._output_paths())],
        )

    def prepare(self) -> None:
        """Checks up front that the generator can run as configured; computes the fingerprint.

        Raises:
            GeneratorNotRemotableError: out of process, and the generator or an argument cannot
                be pickled.
        """
        remote = self._remotable_thunk()
        try:
            payload = remote_dumps(remote)
        except Exception as e:
            if self.concurrency == ActionConcurrency.PROCESS:
                raise GeneratorNotRemotableError(_not_picklable_message(self, e)) from e
            payload = None
        self._payload = payload if self.concurrency == ActionConcurrency.PROCESS else None
        self._fingerprint = None if payload is None else _fingerprint(self.thunk, payload)

    # -- up-to-date checks --------------------------------------------------------------------

    def _is_up_to_date(self) -> bool:
        if self._fingerprint is None:
            return False
        try:
            for (_, output), path in zip(self.return_marshallers, self._output_paths()):
                meta = output.access_metadata()
                if meta.get(_METADATA_FINGERPRINT) != self._fingerprint:
                    return False
                if not path.is_file() or meta.get(_METADATA_SHA256) != sha256_file(path):
                    return False
        except (OSError, ValueError):  # Unreadable or corrupt metadata: rebuild.
            return False
        return True

    def _invalidate(self) -> None:
        def drop(meta: dict) -> bool:
            changed = _METADATA_FINGERPRINT in meta or _METADATA_SHA256 in meta
            meta.pop(_METADATA_FINGERPRINT, None)
            meta.pop(_METADATA_SHA256, None)
            return changed

        for (_, output), path in zip(self.return_marshallers, self._output_paths()):
            path.parent.mkdir(parents=True, exist_ok=True)
            _remove_stale_temps(path)
            _access_metadata(output, drop)

    def _commit(self) -> None:
        if self._fingerprint is None:
            return
        for (_, output), path in zip(self.return_marshallers, self._output_paths()):
            digest = sha256_file(path)

            def record(meta: dict, digest: str = digest) -> bool:
                meta[_METADATA_FINGERPRINT] = self._fingerprint
                meta[_METADATA_SHA256] = digest
                return True

            _access_metadata(output, record)

    def _wrap_failure(self, e: BaseException) -> GenerationError:
        """The action's failure: what failed, which outputs, and the worker's traceback."""
        if isinstance(e, GenerationError):
            return e
        outputs = ", ".join(p.name for p in self._output_paths())
        if isinstance(e, (RemoteJobError, WorkerDiedError, WorkerTimeoutError)):
            # The message already holds the worker's traceback; chaining would print it twice.
            err = GenerationError(f"[outputs {outputs}] {e}")
            err.remote_error = e  # type: ignore[attr-defined]
            return err
        err = GenerationError(f"{self.desc} (outputs {outputs}) failed: {type(e).__name__}: {e}")
        err.__cause__ = e
        return err

    # -- in-process path ----------------------------------------------------------------------

    def _invoke(self) -> None:
        if self._is_up_to_date():
            self.reused_outputs = True
            return
        self._invalidate()
        try:
            with _IN_PROCESS_LOCK:
                self._remotable_thunk()()
        except (Exception, SystemExit) as e:  # sys.exit() in a generator fails only its action.
            raise self._wrap_failure(e) from e
        self._commit()

    # -- out-of-process path ------------------------------------------------------------------

    def invoke(self, scheduler: Any) -> None:
        if self.concurrency != ActionConcurrency.PROCESS:
            super().invoke(scheduler)
            return
        # Runs on a scheduler thread: submit and return at once; `start` chains completion.
        self.invoke_time = time.time()
        job: concurrent.futures.Future = concurrent.futures.Future()
        try:
            if self._is_up_to_date():
                self.reused_outputs = True
                job.set_result(None)
            else:
                self._invalidate()
                assert self._payload is not None, "prepare() was not called"
                if self.dask_address:
                    from .dask_executor import submit_to_dask

                    key = f"turbine-generate-{self._output_paths()[0].stem}-{uuid.uuid4().hex[:8]}"
                    job = submit_to_dask(
                        self.dask_address,
                        self.jobs,
                        self._remotable_thunk(),
                        key=key,
                        desc=self.desc,
                    )
                else:
                    pool = get_generator_pool(max_workers=self.jobs, mp_context=self.mp_context)
                    job = pool.submit(self._payload, desc=self.desc, timeout=self.timeout)
        except Exception as e:
            job = concurrent.futures.Future()
            job.set_exception(e)
        self._job = job

    def start(self, future: concurrent.futures.Future) -> None:
        super().start(future)
        if self.concurrency != ActionConcurrency.PROCESS or self.failure is not None:
            return
        # The scheduler waits on `self.future`: make it complete when the worker's job does,
        # not when the (brief) submitting invocation does.
        done: concurrent.futures.Future = concurrent.futures.Future()
        self.future = done

        def job_done(job: concurrent.futures.Future) -> None:
            try:
                exc = job.exception()
                if exc is not None:
                    self.failure = self._wrap_failure(exc)
                    for path in self._output_paths():
                        _remove_stale_temps(path)
                elif not self.reused_outputs:
                    self._commit()
            except Exception as e:
                self.failure = self._wrap_failure(e)
            finally:
                self.finish_time = time.time()
                done.set_result(self)

        def invoked(f: concurrent.futures.Future) -> None:
            exc = f.exception()
            if exc is not None or self._job is None:
                self.failure = self._wrap_failure(exc or RuntimeError("action was not invoked"))
                self.finish_time = time.time()
                done.set_result(self)
                return
            self._job.add_done_callback(job_done)

        future.add_done_callback(invoked)


def _access_metadata(output: BuildFile, mutate: Callable[[dict], bool]) -> None:
    """``output.access_metadata(mutate)``, starting afresh if the metadata file is corrupt.

    ``iree.build`` rewrites ``.metadata.json`` in place; a build killed mid-write leaves invalid
    JSON that would otherwise fail every later build. Dropping it only costs a regeneration.
    """
    try:
        output.access_metadata(mutate)
    except ValueError:
        with output.executor.metadata_lock:
            (output.executor.output_dir / ".metadata.json").unlink(missing_ok=True)
        output.access_metadata(mutate)


def _not_picklable_message(action: TurbineBuilderAction, e: Exception) -> str:
    name = callable_name(action.thunk)
    return (
        f"turbine_generate({name}, ...) for {action.desc!r} cannot run out of process: "
        f"the generator or its arguments cannot be pickled ({type(e).__name__}: {e}). "
        "Make the generator a plain function (or a class with __call__) defined at module "
        "level, not a lambda, a nested function or a decorated one, and pass only picklable "
        "arguments (numbers, strings, tuples...): build models and tensors inside the "
        "generator. Or pass out_of_process=False to run it in the build process."
    )


def _fingerprint(generator: Callable, payload: bytes) -> str:
    """What an output depends on: the call (pickled), its module's source, the tool versions."""
    digest = hashlib.sha256(payload)
    target: Any = generator
    while isinstance(target, functools.partial):
        target = target.func
    if not isinstance(target, (types.FunctionType, type)):
        target = type(target)
    try:
        source_file = inspect.getsourcefile(target)
    except TypeError:
        source_file = None
    if source_file and os.path.isfile(source_file):
        digest.update(Path(source_file).read_bytes())
    for dist in ("torch", "iree-base-compiler", "turbine-aot", "turbine-fx"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            digest.update(f"{dist}={importlib.metadata.version(dist)}".encode())
    return digest.hexdigest()


def turbine_generate(
    generator: Callable,
    *args: Any,
    name: str,
    out_of_process: bool = True,
    **kwargs: Any,
) -> BuildFile | tuple[BuildFile, ...]:
    """Invokes a generator as a build action and stores the ``ExportOutput``s it returns.

    The generator must declare its return type: ``-> ExportOutput`` makes ``{name}.mlir``,
    ``-> tuple[ExportOutput, ExportOutput]`` makes ``{name}_0.mlir`` and ``{name}_1.mlir`` (in the
    build's gen files, marked as torch input for ``iree.build``'s ``compile``).

    Out of process (the default), the generator runs in a pool of worker processes so several
    exports proceed at once; the generator must then be picklable (a function or a class with
    ``__call__`` at module level, not decorated) and so must the arguments (plain values).
    This is checked here, up front. Worker count, per-generator timeout and start method come
    from ``--turbine-generate-jobs``, ``--turbine-generate-timeout``,
    ``--turbine-generate-mp-context`` (or ``$TURBINE_GENERATE_JOBS``, ``$TURBINE_GENERATE_TIMEOUT``,
    ``$TURBINE_GENERATE_MP_CONTEXT``).

    A generator that raises, or whose worker dies, fails its action (with the worker's traceback)
    and the build reports it; outputs are written atomically, and a later build reuses outputs
    whose generator call, module source and tool versions are unchanged.

    Args:
        generator: the callable that exports, e.g. a function calling ``turbine_aot.export``.
        *args: positional arguments for the generator.
        name: stem of the output file names.
        out_of_process: run in the worker pool (True) or in the build process (False).
        **kwargs: keyword arguments for the generator.

    Returns:
        The output ``BuildFile`` (one declared return) or a tuple of them.

    Raises:
        GeneratorSignatureError: the return annotation is missing or names nothing savable.
        GeneratorNotRemotableError: out of process, and the generator or arguments cannot be
            pickled.

    Example::

        from iree.build import compile, entrypoint, iree_build_main
        from turbine_aot import ExportOutput, export
        from turbine_aot.build_actions import turbine_generate

        def export_model(batch: int) -> ExportOutput:
            return export(MyModel(), torch.randn(batch, 16))

        @entrypoint
        def models():
            return [
                compile(name=f"model_b{b}", source=turbine_generate(export_model, b, name=f"b{b}"))
                for b in (1, 4)
            ]

        if __name__ == "__main__":
            iree_build_main()
    """
    if not isinstance(name, str) or not name:
        raise BuildActionError(f"turbine_generate needs a non-empty name=, got {name!r}")
    if not callable(generator):
        raise GeneratorSignatureError(f"turbine_generate: generator {generator!r} is not callable")
    context = BuildContext.current()
    marshallers = declared_return_marshallers(generator)
    concurrency = ActionConcurrency.PROCESS if out_of_process else ActionConcurrency.THREAD
    where = "out of process" if out_of_process else "in process"
    action = TurbineBuilderAction(
        generator,
        args,
        kwargs,
        concurrency,
        desc=f"Generating {name} with {callable_name(generator)} ({where})",
        executor=context.executor,
    )
    outputs = []
    for index, marshaller in enumerate(marshallers):
        stem = name if len(marshallers) == 1 else f"{name}_{index}"
        outputs.append(marshaller.prepare_action(context, stem, action))
    if out_of_process:
        action.jobs = resolve_jobs()
        action.timeout = resolve_timeout()
        action.mp_context = resolve_mp_context()
        action.dask_address = resolve_dask()
    action.prepare()
    return outputs[0] if len(outputs) == 1 else tuple(outputs)
