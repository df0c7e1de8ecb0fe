"""``turbine_generate`` and friends: torch export as an action of an ``iree.build`` graph.

Model variants (batch sizes, sequence buckets, dtypes) are exported by a user *generator*: a
module-level function (or an instance of a module-level class with ``__call__``) that returns one
or more ``ExportOutput``. ``turbine_generate`` turns one call of it into a
:class:`TurbineBuilderAction` whose outputs are ``{name}.mlir`` (or ``{name}_{n}.mlir``) files in
the build's gen files, each ready for ``iree.build``'s ``compile`` action.

Out of process (the default), the generator runs in a worker of a crash-tolerant process pool
(:mod:`turbine_aot._build_actions_pool`), several at once, without holding any of the scheduler's
threads (``iree.build`` sizes its pools to 40 % of the cores: one on a two-core machine). In
process, it runs under a lock on one of the scheduler's threads (torch.export is not thread-safe).

Outputs are written atomically and recorded, with a fingerprint of what produced them, in the
build's metadata; a later build whose fingerprint and file hashes match reuses them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import io
import os
import pickle
import sys
import threading
import time
import types
import typing
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from iree.build.args import current_args_namespace, register_arg_parser_callback
from iree.build.executor import (
    ActionConcurrency,
    BuildAction,
    BuildContext,
    BuildFile,
    FileNamespace,
)
from iree.build.metadata import CompileSourceMeta

from turbine_params import atomic_output_file, remove_stale_temps

from ._build_actions_pool import (
    RemoteJobError,
    WorkerDiedError,
    WorkerTimeoutError,
    default_worker_count,
    get_generator_pool,
)
from ._errors import TurbineAotError
from ._exporter import ExportOutput

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

#: Environment defaults for the command-line options of the same meaning.
JOBS_ENV = "TURBINE_GENERATE_JOBS"
TIMEOUT_ENV = "TURBINE_GENERATE_TIMEOUT"
MP_CONTEXT_ENV = "TURBINE_GENERATE_MP_CONTEXT"
DASK_ENV = "TURBINE_GENERATE_DASK"

_METADATA_FINGERPRINT = "turbine_generate.fingerprint"
_METADATA_SHA256 = "turbine_generate.sha256"


class BuildActionError(TurbineAotError):
    """Root of the errors raised by turbine's build actions."""


class GeneratorNotRemotableError(BuildActionError, TypeError):
    """The generator or its arguments cannot be sent to a worker process (not picklable)."""


class GeneratorSignatureError(BuildActionError, TypeError):
    """The generator does not declare (or does not return) what ``turbine_generate`` can save."""


class GenerationError(BuildActionError):
    """A generator failed: it raised, returned the wrong thing, or its worker process died.

    The message carries the worker's traceback; ``__cause__`` is the underlying error.
    """


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


def _resolve_jobs() -> int:
    jobs = _option("turbine_generate_jobs")
    if jobs is None and os.environ.get(JOBS_ENV):
        jobs = _parse_env(JOBS_ENV, int)
    jobs = default_worker_count() if jobs is None else jobs
    if jobs < 1:
        raise BuildActionError(f"--turbine-generate-jobs / ${JOBS_ENV} must be >= 1, got {jobs}")
    return jobs


def _resolve_timeout() -> float | None:
    timeout = _option("turbine_generate_timeout")
    if timeout is None and os.environ.get(TIMEOUT_ENV):
        timeout = _parse_env(TIMEOUT_ENV, float)
    return timeout if timeout else None


def _resolve_mp_context() -> str:
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


def _resolve_dask() -> str | None:
    return _option("turbine_generate_dask") or os.environ.get(DASK_ENV) or None


def _parse_env(name: str, kind: type) -> Any:
    raw = os.environ[name]
    try:
        return kind(raw)
    except ValueError:
        raise BuildActionError(
            f"${name}={raw!r} is not a valid {kind.__name__}; unset it or give a number"
        ) from None


# -- pickling generators from build files -----------------------------------------------------

_importable_cache: dict[tuple[str, str], bool] = {}


def _module_file_ref(obj: Any) -> tuple[str, str, str] | None:
    """For a function/class whose module a worker cannot import by name, (module, file, qualname).

    Build files run by ``iree-build file.py`` are loaded as module ``__iree_build__`` (not in
    ``sys.modules``), and pytest's importlib mode gives test files names no child can import.
    Standard pickle refers to globals by module name only; this adds the file to load it from.
    """
    module_name = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module_name or not qualname or module_name in ("__main__", "builtins"):
        return None
    if "<locals>" in qualname or "<lambda>" in qualname:
        return None  # Standard pickle reports these with a clear message.
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None) if module is not None else None
    if file is None:
        # Not in sys.modules: find the file through a function's globals (a class's methods).
        functions = [obj] if isinstance(obj, types.FunctionType) else list(vars(obj).values())
        for fn in functions:
            if isinstance(fn, types.FunctionType) and fn.__globals__.get("__file__"):
                file = fn.__globals__["__file__"]
                break
    if file is None:
        return None
    file = os.path.abspath(file)
    key = (module_name, file)
    importable = _importable_cache.get(key)
    if importable is None:
        try:
            spec = importlib.util.find_spec(module_name)
            origin = spec.origin if spec is not None else None
            importable = origin is not None and os.path.abspath(origin) == file
        except (ImportError, ValueError, AttributeError):
            importable = False
        _importable_cache[key] = importable
    if importable:
        return None
    return module_name, file, qualname


def _load_global_from_file(module_name: str, file: str, qualname: str) -> Any:
    """Unpickling side of :func:`_module_file_ref`: loads the module from its file if needed."""
    module = sys.modules.get(module_name)
    if module is None or os.path.abspath(getattr(module, "__file__", "") or "") != file:
        spec = importlib.util.spec_from_file_location(module_name, file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load module {module_name!r} from {file}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
    value: Any = module
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


class _RemotePickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (types.FunctionType, type)):
            ref = _module_file_ref(obj)
            if ref is not None:
                return _load_global_from_file, ref
        return NotImplemented


def _remote_dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _RemotePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


# -- return marshalling -----------------------------------------------------------------------


class ReturnMarshaller:
    """Turns one declared return value of a generator into a file of the build.

    Subclasses say which file an output becomes (:meth:`prepare_action`, at graph-definition time,
    in the build process) and how a returned value is written to it (:meth:`save_remote_result`,
    in whichever process ran the generator). Instances must be picklable.
    """

    #: File name suffix of the output, including the dot.
    suffix = ""

    def prepare_action(
        self, context: BuildContext, stem: str, action: TurbineBuilderAction
    ) -> BuildFile:
        """Allocates the output file ``{stem}{suffix}`` and makes ``action`` produce it."""
        output = context.allocate_file(f"{stem}{self.suffix}", namespace=FileNamespace.GEN)
        output.deps.add(action)
        action.return_marshallers.append((self, output))
        return output

    def save_remote_result(self, result: Any, path: Path) -> None:
        """Writes ``result`` to ``path`` (atomically)."""
        raise NotImplementedError


class ExportOutputMarshaller(ReturnMarshaller):
    """Saves an ``ExportOutput`` (anything with ``save_mlir(path)``) as ``.mlir`` source.

    The file is marked as torch-dialect input for ``iree.build``'s ``compile`` action.
    """

    suffix = ".mlir"

    def prepare_action(
        self, context: BuildContext, stem: str, action: TurbineBuilderAction
    ) -> BuildFile:
        output = super().prepare_action(context, stem, action)
        CompileSourceMeta.get(output).input_type = "torch"
        return output

    def save_remote_result(self, result: Any, path: Path) -> None:
        save_mlir = getattr(result, "save_mlir", None)
        if not callable(save_mlir):
            raise GeneratorSignatureError(
                f"the generator returned {type(result).__module__}.{type(result).__qualname__} "
                f"where an ExportOutput (the result of turbine_aot.export(...)) was declared for "
                f"{path.name}; return what the annotation says"
            )
        # A temp file beside ``path``, renamed over it on success: never a half-written ``path``.
        with atomic_output_file(path, parents=True) as tmp:
            save_mlir(tmp)
            if not tmp.exists() or tmp.stat().st_size == 0:
                raise GenerationError(f"saving {path.name} wrote nothing (expected data in {tmp})")


def _remove_stale_temps(path: Path) -> None:
    """Removes temp files a crashed (killed) worker left beside ``path``; those of writers that
    still run, here or on another host, stay (``turbine_params.remove_stale_temps``)."""
    remove_stale_temps(path)


def _annotated_callable(generator: Callable) -> Callable:
    target: Any = generator
    while isinstance(target, functools.partial):
        target = target.func
    if isinstance(target, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return target
    if isinstance(target, type):
        raise GeneratorSignatureError(
            f"turbine_generate got the class {target.__qualname__}; pass an instance of it "
            f"(its __call__ returns the ExportOutput), e.g. {target.__qualname__}()"
        )
    if not callable(target):
        raise GeneratorSignatureError(f"generator {target!r} is not callable")
    return type(target).__call__


def _declared_return_marshallers(generator: Callable) -> list[ReturnMarshaller]:
    """Reads the generator's return annotation into one marshaller per declared output."""
    target = _annotated_callable(generator)
    where = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}"
    try:
        hints = typing.get_type_hints(target)
    except Exception as e:
        raise GeneratorSignatureError(
            f"cannot resolve the type annotations of generator {where}: {e}. Import the types "
            "it names (e.g. ExportOutput) at module level, not under TYPE_CHECKING"
        ) from e
    if "return" not in hints:
        raise GeneratorSignatureError(
            f"generator {where} has no return annotation; declare what it returns so the build "
            "knows its outputs up front: '-> ExportOutput' for one, "
            "'-> tuple[ExportOutput, ExportOutput]' for two (files {name}_0.mlir, {name}_1.mlir)"
        )
    declared = hints["return"]
    if typing.get_origin(declared) is tuple:
        items = typing.get_args(declared)
        if not items or Ellipsis in items:
            raise GeneratorSignatureError(
                f"generator {where} returns {declared}; the number of outputs must be fixed: "
                "write tuple[ExportOutput, ExportOutput] rather than tuple[ExportOutput, ...]"
            )
    else:
        items = (declared,)
    marshallers: list[ReturnMarshaller] = []
    for item in items:
        if isinstance(item, type) and (
            issubclass(item, ExportOutput) or callable(getattr(item, "save_mlir", None))
        ):
            marshallers.append(ExportOutputMarshaller())
        else:
            raise GeneratorSignatureError(
                f"generator {where} declares a return of {item!r}, which turbine_generate cannot "
                "save; supported: ExportOutput (or a type with save_mlir(path)), or a tuple of them"
            )
    return marshallers


# -- the remote thunk -------------------------------------------------------------------------


class RemoteGenerator:
    """A picklable, argument-free thunk: run the generator, save its returns to their paths.

    This is what runs in a worker process (or in the build process when ``out_of_process=False``);
    it is equally what one would hand to a distributed executor (``dask``'s ``client.submit``,
    ``ray.remote``) to export on other machines with a shared file system.

    Args:
        generation_thunk: the generator.
        thunk_args: its positional arguments.
        thunk_kwargs: its keyword arguments.
        return_info: per declared return value, the marshaller that saves it and the path.
    """

    def __init__(
        self,
        generation_thunk: Callable,
        thunk_args: Sequence[Any],
        thunk_kwargs: dict[str, Any],
        return_info: list[tuple[ReturnMarshaller, Path]],
    ):
        self.generation_thunk = generation_thunk
        self.thunk_args = tuple(thunk_args)
        self.thunk_kwargs = dict(thunk_kwargs)
        self.return_info = list(return_info)

    def __call__(self) -> list[str]:
        """Runs the generator and writes its outputs; returns the paths written."""
        results = self.generation_thunk(*self.thunk_args, **self.thunk_kwargs)
        count = len(self.return_info)
        if count == 1:
            results = (results,)
        elif not isinstance(results, (tuple, list)) or len(results) != count:
            got = f"{len(results)} values" if isinstance(results, (tuple, list)) else "one value"
            raise GeneratorSignatureError(
                f"generator {_callable_name(self.generation_thunk)} declares {count} outputs "
                f"but returned {got}; return a tuple of {count} ExportOutput"
            )
        written = []
        for (marshaller, path), result in zip(self.return_info, results):
            marshaller.save_remote_result(result, Path(path))
            written.append(str(path))
        return written

    def __repr__(self) -> str:
        return (
            f"RemoteGenerator({_callable_name(self.generation_thunk)}, args={self.thunk_args!r}, "
            f"kwargs={self.thunk_kwargs!r}, outputs={[str(p) for _, p in self.return_info]})"
        )


def _callable_name(fn: Any) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not isinstance(fn, (types.FunctionType, type, types.MethodType)):
        fn = type(fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


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
            payload = _remote_dumps(remote)
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
                if not path.is_file() or meta.get(_METADATA_SHA256) != _sha256_file(path):
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
            digest = _sha256_file(path)

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
                    from ._build_actions_dask import submit_to_dask

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
    name = _callable_name(action.thunk)
    return (
        f"turbine_generate({name}, ...) for {action.desc!r} cannot run out of process: "
        f"the generator or its arguments cannot be pickled ({type(e).__name__}: {e}). "
        "Make the generator a plain function (or a class with __call__) defined at module "
        "level, not a lambda, a nested function or a decorated one, and pass only picklable "
        "arguments (numbers, strings, tuples...): build models and tensors inside the "
        "generator. Or pass out_of_process=False to run it in the build process."
    )


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    marshallers = _declared_return_marshallers(generator)
    concurrency = ActionConcurrency.PROCESS if out_of_process else ActionConcurrency.THREAD
    where = "out of process" if out_of_process else "in process"
    action = TurbineBuilderAction(
        generator,
        args,
        kwargs,
        concurrency,
        desc=f"Generating {name} with {_callable_name(generator)} ({where})",
        executor=context.executor,
    )
    outputs = []
    for index, marshaller in enumerate(marshallers):
        stem = name if len(marshallers) == 1 else f"{name}_{index}"
        outputs.append(marshaller.prepare_action(context, stem, action))
    if out_of_process:
        action.jobs = _resolve_jobs()
        action.timeout = _resolve_timeout()
        action.mp_context = _resolve_mp_context()
        action.dask_address = _resolve_dask()
    action.prepare()
    return outputs[0] if len(outputs) == 1 else tuple(outputs)
