"""One compile of an imported module with final flags: in process, or with the ``iree-compile``
tool in a subprocess when the flags or the module need it, or after the tool crashed
(:func:`.fallback.out_of_process`: a crash of LLVM in process would end the caller's
process)."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from iree.compiler.api import Output, Session

from turbine_params import atomic_write_bytes

from .._errors import CompileError, Diagnostic, ExportError
from .bf16 import strip_precision_flags
from .fallback import CRASHED, compiling_out_of_process
from .rewrites import module_for_compile
from .session import CapturedInvocation, new_session, output_to_file

__all__ = ["compile_module"]

_log = logging.getLogger("turbine.aot")


def compile_module(
    module: Any,
    flags: list[str],
    save_to: str | Path | Output | None,
    *,
    compile_from: str | None = None,
    stage: str = "compile",
) -> Output | None:
    """Compiles ``module`` (left unchanged) with ``flags`` to a VM module.

    The module handed to IREE is :func:`.rewrites.module_for_compile`'s (a rewritten copy
    when a target fix applies). Flags an in-process session rejects, and modules placing
    globals on devices (iree-compile 3.13 crashes on some), compile with the ``iree-compile``
    tool in a subprocess, so that a compiler crash is a :class:`CompileError`; so does every
    compile inside :func:`.fallback.out_of_process`.

    Args:
        save_to: ``None`` (returns an in-memory ``Output``), a path (written atomically) or an
            ``Output`` to write into.
        compile_from: IREE's ``--compile-from`` phase, if the module is past input.
        stage: names the step in a :class:`CompileError`.
    """
    start = time.perf_counter()
    module_op, owned = module_for_compile(module, flags)
    flags = strip_precision_flags(flags)  # turbine's own flag: read by the rewrites only
    try:
        if (
            compiling_out_of_process()
            or tool_only_flags(flags)
            or places_globals_on_devices(module_op)
        ):
            _log.info("compiling with the iree-compile tool (flags %s)", flags)
            result = compile_with_tool(module_op, flags, save_to, compile_from)
            _log.info("compiled in %.2f s", time.perf_counter() - start)
            return result
        module_bytes = module_bytecode(getattr(module_op, "operation", module_op))
    finally:
        if owned:
            getattr(module_op, "operation", module_op).erase()
    session = new_session(flags)
    with CapturedInvocation(session, stage=stage, flags=flags) as inv:
        inv.parse_bytes(module_bytes)
        inv.run_pipeline(compile_from=compile_from)
        if save_to is None:
            out = Output.open_membuffer()
            inv.inv.output_vm_bytecode(out)
            return out
        if isinstance(save_to, Output):
            inv.inv.output_vm_bytecode(save_to)
            return None
        output_to_file(inv, Path(save_to))
        _log.info("compiled to %s in %.2f s", save_to, time.perf_counter() - start)
        return None


def tool_only_flags(flags: list[str]) -> list[str]:
    """The flags an in-process session rejects (global options of the iree-compile tool, or
    unknown flags): those need the tool."""
    probe = Session()
    try:
        probe.set_flags(*flags)
        return []
    except ValueError:
        pass
    rejected = []
    for flag in flags:
        try:
            Session().set_flags(flag)
        except ValueError:
            rejected.append(flag)
    return rejected


def places_globals_on_devices(module_op: Any) -> bool:
    """Whether any global carries a device placement (``stream.affinity``, from a
    ``DeviceTensorTrait``): iree-compile 3.13 crashes on some of those (a global placed on a
    second device), so such modules compile out of process."""
    op = getattr(module_op, "operation", module_op)
    body = op.regions[0].blocks[0]
    return any(
        child.operation.name == "util.global" and "stream.affinity" in child.operation.attributes
        for child in body.operations
    )


def compile_with_tool(
    module_op: Any, flags: list[str], save_to: Any, compile_from: str | None
) -> Output | None:
    """Compiles with the ``iree-compile`` tool in a subprocess (for tool-only flags)."""
    from iree.compiler.tools.binaries import find_tool

    with tempfile.TemporaryDirectory(prefix="turbine-compile-") as tmp:
        src, dst = Path(tmp) / "module.mlirbc", Path(tmp) / "module.vmfb"
        with open(src, "wb") as f:
            # Bytecode: keeps the user's locations, and weights are not hex-printed.
            getattr(module_op, "operation", module_op).write_bytecode(f)
        cmd = [find_tool("iree-compile"), str(src), "--iree-input-type=torch", *flags]
        if compile_from:
            cmd.append(f"--compile-from={compile_from}")
        cmd += ["-o", str(dst)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode < 0:
            raise CompileError(
                "compile (iree-compile tool)",
                [
                    Diagnostic(
                        "error",
                        f"{CRASHED} {-proc.returncode}); this is a compiler "
                        "bug, not a problem in your program. Its report:\n"
                        + "\n".join(proc.stderr.strip().splitlines()[:12]),
                    )
                ],
                flags=flags,
            )
        if proc.returncode != 0:
            raise CompileError(
                "compile (iree-compile tool)",
                _tool_diagnostics(proc.stderr) or [Diagnostic("error", proc.stderr)],
                flags=flags,
            )
        data = dst.read_bytes()
    if save_to is None:
        out = Output.open_membuffer()
        out.write(data)
        return out
    if isinstance(save_to, Output):
        save_to.write(data)
        return None
    atomic_write_bytes(save_to, data, parents=True)
    return None


def _tool_diagnostics(stderr: str) -> list[Diagnostic]:
    blocks = re.split(r"\n(?=\S[^\n]*(?:error|warning|note): )", stderr.strip())
    return [
        Diagnostic("error" if " error: " in b or b.startswith("error") else "warning", b.strip())
        for b in blocks
        if b.strip()
    ]


def module_bytecode(module_op: Any) -> bytes:
    """The module as MLIR bytecode (an :class:`ExportError` when it cannot be written)."""
    buf = io.BytesIO()
    try:
        module_op.write_bytecode(buf)
    except Exception as e:  # e.g. the module does not verify
        raise ExportError(
            f"cannot serialize the exported module for compilation: {e}. "
            "Run export_output.verify() to see what is wrong."
        ) from e
    return buf.getvalue()
