"""Exception types of turbine_aot: one root, ``TurbineAotError``, for export, compile and
running (``TurbineRuntimeError``).

Every error turbine_aot raises to a user is a ``TurbineAotError``: ``ExportError``,
``CompileError``, ``CompiledModuleError``, ``TurbineRuntimeError`` (and ``BundleError``, the call
argument errors), ``TargetError`` (``_compiler.targets``), ``NumericsError``
(``_runtime.numerics``), ``CliError`` (``_cli.inputs``), ``CustomOpExpansionError``, the build
actions' ``BuildActionError`` family and ``llm``'s ``LLMError``. Each keeps the built-in base it
had (``RuntimeError``, ``ValueError``, ``AssertionError``, ``TypeError``...), so ``except`` clauses
written for those still catch them. Left outside, because no user sees them: the worker pool's
``RemoteJobError``, ``WorkerDiedError`` and ``WorkerTimeoutError`` (a build action wraps each in
a ``GenerationError``) and ``_compiler.amx.AmxUnavailableError`` (the load turns it into a
``TurbineRuntimeError``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "CompileError",
    "CompiledModuleError",
    "Diagnostic",
    "ExportError",
    "TurbineAotError",
    "TurbineRuntimeError",
]


class TurbineAotError(Exception):
    """Root of the errors raised by turbine_aot (export, compile, run, the command line).

    Attributes:
        cli_message: the one-line message worded with ``turbine-aot``'s options, where the
            fix differs from the Python API's (the CLI prints it instead of the first line).
    """

    cli_message: str | None = None


class ExportError(TurbineAotError, ValueError):
    """An export could not be performed (bad arguments, torch.export failure, bad IR).

    Attributes (when ``torch.export`` failed):
        torch_message: torch's whole message.
        specialized: each dynamic dimension the model's code fixed to a constant -> that constant.
        non_strict_may_help: strict export's tracer gave up on a Python construct that
            non-strict export traces.
    """

    torch_message: str = ""
    specialized: Mapping[str, int] = MappingProxyType({})
    non_strict_may_help: bool = False


class CompiledModuleError(TurbineAotError):
    """A ``CompiledModule`` class or instance is malformed or used incorrectly."""


@dataclass(frozen=True)
class Diagnostic:
    """One diagnostic reported by the IREE compiler.

    Attributes:
        severity: ``"error"``, ``"warning"``, ``"note"`` or ``"remark"``.
        message: the full text IREE printed for it (location, message and attached notes).
    """

    severity: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.message}"


class CompileError(TurbineAotError):
    """IREE failed to run a pipeline (import phase, pass pipeline or full compile).

    Attributes:
        diagnostics: every diagnostic IREE reported during the failed step, in order.
        stage: what was being done (e.g. ``"compile for llvm-cpu"``).
        flags: the compiler flags in effect.
    """

    def __init__(
        self,
        stage: str,
        diagnostics: Sequence[Diagnostic],
        *,
        flags: Sequence[str] = (),
        hint: str = "",
    ):
        self.stage = stage
        self.diagnostics = list(diagnostics)
        self.flags = list(flags)
        errors = [d for d in self.diagnostics if d.severity == "error"] or self.diagnostics
        shown = "\n".join(str(d) for d in errors[:5])
        more = f"\n... and {len(errors) - 5} more" if len(errors) > 5 else ""
        body = shown + more if shown else "(IREE reported no diagnostic)"
        flag_line = f"\nflags: {' '.join(self.flags)}" if self.flags else ""
        hint_line = f"\n{hint}" if hint else ""
        super().__init__(f"IREE failed during {stage}:\n{body}{flag_line}{hint_line}")

    @property
    def errors(self) -> list[Diagnostic]:
        """The error diagnostics only."""
        return [d for d in self.diagnostics if d.severity == "error"]


class TurbineRuntimeError(TurbineAotError, RuntimeError):
    """Loading or calling a compiled module failed; the message says what, where and what to do.

    Attributes:
        cli_message: as for :class:`TurbineAotError` (set where the CLI words the fix otherwise).
    """

    cli_message: str | None = None
