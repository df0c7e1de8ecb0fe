"""Compiling an ``ExportOutput`` through the compile cache: the flags computed once (the
export's :meth:`~.output.ExportOutput._plan_compile`), looked up under the key of the module's
bytecode, those flags and the compile targets, compiled by the export itself on a miss."""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from iree.compiler.api import Output

from .._compiler.cache import CompileCache, resolve_cache
from .._compiler.targets import resolve_target

__all__ = ["compile_export_output", "export_output_ir"]

logger = logging.getLogger("turbine.aot.compile_cache")


class _PlannedCompile(Protocol):
    """What this module needs of an ``ExportOutput`` (which imports this module)."""

    @property
    def mlir_module(self) -> Any: ...

    def _plan_compile(
        self, *, target_device: str | Sequence[str] | None, extra_args: Any
    ) -> Any: ...

    def _compile_planned(self, plan: Any, save_to: None = None) -> Output | None: ...


def export_output_ir(export_output: Any) -> bytes:
    """The MLIR bytecode of an ``ExportOutput``'s module (at its current import phase)."""
    op = export_output.mlir_module
    op = getattr(op, "operation", op)
    buf = io.BytesIO()
    try:
        op.write_bytecode(buf)
        return buf.getvalue()
    except Exception:  # bindings without write_bytecode: fall back to text
        return str(op).encode()


def compile_export_output(
    export_output: Any,
    *,
    device: Sequence[str] | str = "local-task",
    compile_flags: Sequence[str] | None = None,
    cache: Any = True,
) -> bytes:
    """Compiles an ``ExportOutput`` for the given device URI(s) through the compile cache.

    The flags are those ``ExportOutput.compile(target_device=..., extra_args=compile_flags)``
    uses, computed once; on a miss the export compiles itself with them (so import phases,
    session flags and the compile-with-fallback rule are honoured), and the result is stored
    under the key of the module's bytecode, the flags, the compiler version and the compile
    targets the devices resolve to (``local-task`` and ``local-sync`` are both ``llvm-cpu``:
    one compile serves both).

    Returns:
        The ``.vmfb`` bytes.
    """
    eo: _PlannedCompile = export_output
    devices = [device] if isinstance(device, str) else list(device)
    targets = [resolve_target(d.split("://", 1)[0].split(":", 1)[0]).name for d in devices]
    target_device: str | list[str] = targets[0] if len(targets) == 1 else targets
    plan = eo._plan_compile(target_device=target_device, extra_args=list(compile_flags or ()))
    c = resolve_cache(cache)
    key = ""
    if c:
        key = CompileCache.key(export_output_ir(eo), plan.flags, target=",".join(targets))
        hit = c.get(key)
        if hit is not None:
            logger.info("compile cache hit %s", key[:16])
            return hit
    out = eo._compile_planned(plan, None)
    assert out is not None  # save_to=None returns the Output
    vmfb = bytes(out.map_memory())
    if c:
        c.put(key, vmfb)
    return vmfb
