"""Thin helpers over ``iree.compiler.api`` (the in-process compiler): invocations whose
diagnostics are captured into Python (so errors carry IREE's messages instead of "see stderr"),
compile-to / compile-from phases, and atomic output files.

``iree.compiler.api`` exposes console diagnostics only; the embedding C API also has
``ireeCompilerInvocationEnableCallbackDiagnostics`` and ``ireeCompilerInvocationSetCompile{To,From}
Phase``, which we bind here with ctypes (a ctypes callback takes the GIL itself, unlike an MLIR
Python diagnostic handler, which crashes when IREE calls it from a GIL-released pipeline).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from iree.compiler.api import Invocation, Output, Session

from turbine_params import atomic_output_file

from .._errors import CompileError, Diagnostic
from .text import split_top_level_commas

__all__ = [
    "CapturedInvocation",
    "TrackedSession",
    "new_session",
    "session_context",
    "session_flags",
]

_SEVERITY = {0: "note", 1: "warning", 2: "error", 3: "remark"}
_DIAG_CALLBACK = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p
)
_bound = False


def _dylib() -> Any:
    """The compiler shared library, with the extra entry points typed."""
    global _bound
    from iree.compiler.api import ctypes_dl

    dl = ctypes_dl._dylib
    if dl is None:  # pragma: no cover - the API initializes it on import
        raise RuntimeError("the IREE compiler library is not loaded")
    if not _bound:
        f = dl.ireeCompilerInvocationEnableCallbackDiagnostics
        f.argtypes = [ctypes.c_void_p, ctypes.c_int, _DIAG_CALLBACK, ctypes.c_void_p]
        f.restype = None
        for name in (
            "ireeCompilerInvocationSetCompileToPhase",
            "ireeCompilerInvocationSetCompileFromPhase",
        ):
            g = getattr(dl, name)
            g.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            g.restype = None
        _bound = True
    return dl


class TrackedSession(Session):
    """A compiler ``Session`` that remembers the flags set on it, in order.

    ``Session.get_flags`` prints a list option once with its values joined by commas
    (``--iree-hal-target-device=__device_0=local,__device_1=local``), and that text set on
    another session is ONE value of the list, not two. Replaying the recorded ``set_flags``
    arguments instead reproduces the session's options exactly (:func:`session_flags`).
    """

    def __init__(self) -> None:
        super().__init__()
        self.recorded_flags: list[str] = []

    def set_flags(self, *flags: str) -> None:
        super().set_flags(*flags)
        self.recorded_flags.extend(flags)


# List options whose values are not split at commas when set: the joined text `get_flags` prints
# must be split back into one flag per value.
_UNJOINED_LIST_FLAGS = ("--iree-hal-target-device",)


def session_flags(session: Session) -> list[str]:
    """The flags set on ``session``, as flags that reproduce them on a new session.

    For a :class:`TrackedSession` (every session turbine creates) the recorded ``set_flags``
    arguments, in order; for another session its non-default flags, with the joined values of
    list options such as ``--iree-hal-target-device`` split back into one flag each.
    """
    recorded = getattr(session, "recorded_flags", None)
    if recorded is not None:
        return list(recorded)
    out: list[str] = []
    for flag in session.get_flags(non_default_only=True):
        name, eq, value = flag.partition("=")
        if eq and name in _UNJOINED_LIST_FLAGS:
            out.extend(f"{name}={v}" for v in split_top_level_commas(value))
        else:
            out.append(flag)
    return out


def new_session(flags: Sequence[str] = ()) -> Session:
    """A compiler session (a :class:`TrackedSession`) for torch-dialect input with ``flags``
    applied.

    Raises:
        CompileError: a flag is unknown or malformed (IREE's message is included).
    """
    session = TrackedSession()
    all_flags = ["--iree-input-type=torch", *flags]
    try:
        session.set_flags(*all_flags)
    except ValueError as e:
        raise CompileError(
            "flag parsing",
            [Diagnostic("error", str(e))],
            flags=all_flags,
            hint="Check the flag names with `iree-compile --help`.",
        ) from None
    return session


def session_context(session: Session) -> Any:
    """The session's MLIR context, ready for building IR from Python.

    A session's context has IREE's dialects registered but not loaded; the Python op builders
    (e.g. ``util.GlobalOp``) crash on a dialect that is not loaded, so load them all once.
    """
    context = session.context
    if not getattr(session, "_turbine_dialects_loaded", False):
        context.load_all_available_dialects()
        session._turbine_dialects_loaded = True  # type: ignore[attr-defined]
    return context


class CapturedInvocation:
    """An ``Invocation`` whose diagnostics are collected into :attr:`diagnostics`.

    Use as a context manager; call :meth:`check` after each step to raise a
    :class:`CompileError` carrying the diagnostics when the step failed.
    """

    def __init__(self, session: Session, *, stage: str, flags: Sequence[str] = ()):
        self.session = session
        self.stage = stage
        self.flags = list(flags)
        self.diagnostics: list[Diagnostic] = []
        self.inv: Invocation = session.invocation()
        dl = _dylib()

        def _on_diag(severity: int, message: int, size: int, _user: int) -> None:
            text = ctypes.string_at(message, size).decode("utf-8", errors="replace")
            self.diagnostics.append(Diagnostic(_SEVERITY.get(severity, "error"), text.strip()))

        # Keep the callback alive as long as the invocation.
        self._callback = _DIAG_CALLBACK(_on_diag)
        dl.ireeCompilerInvocationEnableCallbackDiagnostics(self.inv._inv_p, 0, self._callback, None)

    def __enter__(self) -> CapturedInvocation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.inv.close()

    def set_compile_to(self, phase: str) -> None:
        _dylib().ireeCompilerInvocationSetCompileToPhase(self.inv._inv_p, phase.encode())

    def set_compile_from(self, phase: str) -> None:
        _dylib().ireeCompilerInvocationSetCompileFromPhase(self.inv._inv_p, phase.encode())

    def check(self, ok: bool, *, hint: str = "") -> None:
        """Raises :class:`CompileError` when ``ok`` is false (or an error was reported)."""
        if not ok or any(d.severity == "error" for d in self.diagnostics):
            raise CompileError(self.stage, self.diagnostics, flags=self.flags, hint=hint)

    def parse_bytes(self, data: bytes, *, name: str = "module.mlirbc") -> None:
        from iree.compiler.api import Source

        source = Source.wrap_buffer(self.session, _aligned_copy(data), buffer_name=name)
        self.check(self.inv.parse_source(source))

    def run_pipeline(
        self, *, compile_to: str | None = None, compile_from: str | None = None
    ) -> None:
        if compile_to:
            self.set_compile_to(compile_to)
        if compile_from:
            self.set_compile_from(compile_from)
        self.check(self.inv.execute())

    def run_text_pipeline(self, pipeline: str) -> None:
        self.check(
            self.inv.execute_text_pass_pipeline(pipeline),
            hint="Check the pipeline text (pass names: `iree-opt --help`).",
        )


def _aligned_copy(data: bytes, alignment: int = 64) -> Any:
    """``data`` copied into memory aligned to ``alignment`` bytes: MLIR bytecode with resources
    must be parsed from memory aligned like its sections (64 bytes for dense resources).

    The result is a uint8 numpy array (so ``memoryview`` works) that ctypes also accepts as a
    ``char *`` argument (through ``_as_parameter_``).
    """

    n = len(data)
    raw = np.empty(n + alignment, dtype=np.uint8)
    offset = (-raw.ctypes.data) % alignment
    buf: Any = raw[offset : offset + n].view(_char_buffer_type())
    buf[:] = np.frombuffer(data, dtype=np.uint8)
    return buf


def _char_buffer_type() -> type:

    class CharBuffer(np.ndarray):
        @property
        def _as_parameter_(self) -> Any:
            return ctypes.cast(self.ctypes.data, ctypes.POINTER(ctypes.c_char))

    return CharBuffer


def output_to_file(inv: CapturedInvocation, path: Path, *, bytecode: str = "vm") -> None:
    """Writes the invocation's result to ``path`` through IREE's file output, atomically."""
    with atomic_output_file(path, parents=True) as tmp:
        out = Output.open_file(str(tmp))
        try:
            if bytecode == "vm":
                inv.inv.output_vm_bytecode(out)
            elif bytecode == "mlirbc":
                inv.inv.output_ir_bytecode(out)
            else:
                inv.inv.output_ir(out)
            out.keep()
        finally:
            out.close()
