"""What runs in a worker: the picklable :class:`RemoteGenerator` thunk, and the pickler that sends
generators defined in build files (modules a worker cannot import by name) by file."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import io
import os
import pickle
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import GeneratorSignatureError
from .returns import ReturnMarshaller

__all__ = [
    "RemoteGenerator",
    "callable_name",
    "remote_dumps",
]


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


def remote_dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _RemotePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


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
                f"generator {callable_name(self.generation_thunk)} declares {count} outputs "
                f"but returned {got}; return a tuple of {count} ExportOutput"
            )
        written = []
        for (marshaller, path), result in zip(self.return_info, results):
            marshaller.save_remote_result(result, Path(path))
            written.append(str(path))
        return written

    def __repr__(self) -> str:
        return (
            f"RemoteGenerator({callable_name(self.generation_thunk)}, args={self.thunk_args!r}, "
            f"kwargs={self.thunk_kwargs!r}, outputs={[str(p) for _, p in self.return_info]})"
        )


def callable_name(fn: Any) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not isinstance(fn, (types.FunctionType, type, types.MethodType)):
        fn = type(fn)
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
