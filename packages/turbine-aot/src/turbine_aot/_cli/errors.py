"""Turning ordinary mistakes on the ``turbine-aot`` command line into one-line errors.

The CLI prints ``turbine-aot: error: <one line>`` and exits with status 2 for every error a user
can fix; a traceback (``--debug``) is for bugs. This module holds the checks and translations
that need more than a ``raise CliError``: user code that fails while being imported, inputs too
large to allocate, torch's own logging of failed fake-tensor calls, and example inputs whose
dtype the program does not expect (which torch.export accepts silently).
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "check_input_dtypes",
    "first_line",
    "input_tensor",
    "quiet_torch_export_logs",
    "root_cause",
    "user_code",
]

# Loggers through which torch reports a failed export a second time, with ~20 lines of
# traceback, before raising the exception the CLI reports in one line.
_TORCH_EXPORT_LOGGERS = (
    "torch._subclasses.fake_tensor",
    "torch.export._trace",
    "torch._dynamo",
    "torch.fx.experimental.symbolic_shapes",
)


def first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def root_cause(e: BaseException) -> BaseException:
    """The innermost exception of ``e``'s ``__cause__`` / ``__context__`` chain."""
    seen = {id(e)}
    while True:
        nxt = e.__cause__ or e.__context__
        if nxt is None or id(nxt) in seen:
            return e
        seen.add(id(nxt))
        e = nxt


def with_root_cause(e: BaseException, text: str, *, builtin_only: bool = False) -> str:
    """``text`` plus the innermost cause's first line when it says something ``text`` does not
    (torch wraps "a and b must have same reduction dim" in "RuntimeError when making fake tensor
    call"); with ``builtin_only``, only a cause of a builtin type (a kernel's RuntimeError)."""
    cause = root_cause(e)
    said = first_line(str(cause))
    if cause is e or not said or said in text or type(cause).__module__.startswith("turbine"):
        return text  # turbine's own errors already say it
    if builtin_only and type(cause).__module__ != "builtins":
        return text
    return f"{text} (cause: {type(cause).__name__}: {said})"


@contextlib.contextmanager
def quiet_torch_export_logs(enabled: bool = True) -> Iterator[None]:
    """Mutes torch's logged tracebacks of a failing export (the exception still says what
    failed, in one line; ``--debug`` keeps them)."""
    if not enabled:
        yield
        return
    loggers = [logging.getLogger(n) for n in _TORCH_EXPORT_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def user_code(what: str, path: str | os.PathLike | None, fn: Callable[[], Any], error: type) -> Any:
    """Runs ``fn`` (importing a model file, calling a factory); an exception it raises becomes
    ``error`` with one line: the file and line in the user's code, and what was raised."""
    try:
        return fn()
    except SyntaxError as e:
        where = f"{e.filename or path}:{e.lineno}" if e.lineno else str(e.filename or path)
        raise error(f"{where}: syntax error while {what}: {e.msg}") from e
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:
        raise error(
            f"{_user_frame(e, path)}{what} raised {type(e).__name__}: {first_line(str(e))}"
        ) from e


def _user_frame(e: BaseException, path: str | os.PathLike | None) -> str:
    """``"file.py:12: "`` for the innermost frame in ``path`` (else in any file outside
    turbine, torch and importlib), or ``""``."""
    frames = traceback.extract_tb(e.__traceback__)
    if path is not None:
        target = os.path.realpath(path)
        mine = [f for f in frames if os.path.realpath(f.filename) == target]
        if mine:
            return f"{mine[-1].filename}:{mine[-1].lineno}: "
    here = str(Path(__file__).resolve().parent)
    outside = [
        f
        for f in frames
        if not f.filename.startswith((here, "<frozen"))
        and os.sep + "torch" + os.sep not in f.filename
    ]
    return f"{outside[-1].filename}:{outside[-1].lineno}: " if outside else ""


def input_tensor(
    spec: str, make: Callable[[], Any], shape: Sequence[int], dtype: Any, error: type
) -> Any:
    """Creates an example input; a size larger than the memory there is to give is ``error``
    before anything is allocated (a 4e16-byte request would otherwise raise deep in torch)."""
    import torch

    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * (torch.finfo(dtype).bits if dtype.is_floating_point else _bits(dtype)) // 8
    available = _available_memory()
    if available is not None and nbytes > available:
        raise error(
            f"input {spec!r} needs {nbytes} bytes ({numel} elements), more than the "
            f"{available} bytes of memory available; give a smaller shape"
        )
    try:
        return make()
    except (RuntimeError, MemoryError) as e:
        raise error(
            f"input {spec!r}: cannot allocate it ({first_line(str(e))}); give a smaller shape"
        ) from e


def _bits(dtype: Any) -> int:
    import torch

    if dtype == torch.bool:
        return 8
    try:
        return torch.iinfo(dtype).bits
    except TypeError:
        return 8 * torch.empty(0, dtype=dtype).element_size()


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


# Ops whose tensor operands must share one element type: torch.export's fake kernels do not
# check that (an i64 input into a float Linear exports "fine" and fails or computes garbage
# later), so the CLI checks the imported program.
_SAME_DTYPE_OPS = {
    "torch.aten.mm",
    "torch.aten.matmul",
    "torch.aten.bmm",
    "torch.aten.addmm",
    "torch.aten.baddbmm",
    "torch.aten.linear",
    "torch.aten.convolution",
    "torch.aten.conv1d",
    "torch.aten.conv2d",
    "torch.aten.conv3d",
}


def _element_type(type_str: str) -> str | None:
    """``!torch.vtensor<[2,4],si64>`` -> ``si64``."""
    if not type_str.startswith(("!torch.vtensor<", "!torch.tensor<")) or "," not in type_str:
        return None
    return type_str.rsplit(",", 1)[1].rstrip(">").strip()


def _is_int(et: str) -> bool:
    return et.startswith(("si", "ui", "i")) and et[-1].isdigit()


def check_input_dtypes(mlir_module: Any, specs: Sequence[str], error: type) -> None:
    """Raises ``error`` when an integer example input meets a floating-point tensor in an op
    that needs one dtype (matmul, linear, convolution): the model expects floats there.

    ``specs`` are the ``--input`` strings, for the message."""
    from turbine_ir import ir

    module_op = getattr(mlir_module, "operation", mlir_module)
    for func in module_op.regions[0].blocks[0].operations:
        if func.operation.name != "func.func" or not func.regions[0].blocks:
            continue
        entry = func.regions[0].blocks[0]

        def arg_number(v: Any, entry: Any = entry) -> int | None:
            block_argument = ir.BlockArgument  # type: ignore[attr-defined]  # from the `*` import
            if isinstance(v, block_argument):  # values come downcast to their kind
                arg = v
            elif hasattr(block_argument, "isinstance") and block_argument.isinstance(v):
                arg = block_argument(v)
            else:
                return None
            return arg.arg_number if arg.owner == entry else None

        for op in _ops_in(func):
            if op.operation.name not in _SAME_DTYPE_OPS:
                continue
            types = [(v, _element_type(str(v.type))) for v in op.operands]
            floats = [et for _, et in types if et and et.startswith(("f", "bf"))]
            if not floats:
                continue
            for v, et in types:
                i = arg_number(v)
                if i is None or not et or not _is_int(et):
                    continue
                spec = specs[i] if i < len(specs) else f"input {i}"
                expected = _torch_name(floats[0])
                raise error(
                    f"input {i} ({spec}) is {_torch_name(et)} but the model uses it in "
                    f"{op.operation.name.removeprefix('torch.aten.')} with {expected} tensors: "
                    f"it expects {expected} there; give --input with that dtype (e.g. "
                    f"{_respec(spec, floats[0])})"
                )


def _torch_name(et: str) -> str:
    return {
        "f32": "float32",
        "f16": "float16",
        "bf16": "bfloat16",
        "f64": "float64",
        "si64": "int64",
        "si32": "int32",
        "si16": "int16",
        "si8": "int8",
        "ui8": "uint8",
        "i1": "bool",
    }.get(et, et)


def _respec(spec: str, et: str) -> str:
    if spec.endswith(".npy") or "x" not in spec:
        return et
    return spec.rsplit("x", 1)[0] + "x" + et


def _ops_in(op: Any) -> Iterator[Any]:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner
                yield from _ops_in(inner)
