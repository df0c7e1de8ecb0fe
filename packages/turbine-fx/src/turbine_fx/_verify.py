"""Checking that an imported module lowers through IREE's torch input conversion.

Import catches ops IREE's torch dialect does not know; some known ops still have no lowering for
particular arguments (``cross_entropy``'s scalar plumbing, SDPA with a 2-D boolean mask). Those
surface only when compiling. :func:`verify_lowering` runs just IREE's input conversion
(``iree-compile --compile-to=input``) on the module printed with locations, so the failure can be
reported with the user's source line, early and cheaply.
"""

from __future__ import annotations

import linecache
import re
import tempfile
from pathlib import Path
from typing import Any

from ._errors import UnsupportedOpError

__all__ = ["verify_lowering"]

_DIAG = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): error: (?P<msg>.*)$", re.M)


def verify_lowering(module: Any, *, extra_args: tuple[str, ...] = ()) -> None:
    """Runs IREE's torch input conversion on ``module``; raises if an op does not lower.

    Args:
        module: A ``turbine_ir.ModuleBuilder`` or an MLIR module operation.
        extra_args: More ``iree-compile`` flags.

    Raises:
        UnsupportedOpError: Naming the op that failed to lower, the user's source line (from the
            op's location) and a dump directory with the IR and IREE's diagnostics.
    """
    import iree.compiler as ic

    module_op = getattr(module, "module_op", module)
    module_op = getattr(module_op, "operation", module_op)
    asm = module_op.get_asm(enable_debug_info=True)
    try:
        ic.compile_str(asm, input_type="torch", extra_args=["--compile-to=input", *extra_args])
        return
    except ic.CompilerToolError as e:
        diagnostics = str(e)
    maker = getattr(module, "make_dump_dir", None)
    dump_dir = Path(maker()) if maker else Path(tempfile.mkdtemp(prefix="turbine-dump-"))
    (dump_dir / "module.mlir").write_text(asm)
    (dump_dir / "diagnostics.txt").write_text(diagnostics + "\n")
    match = _DIAG.search(diagnostics)
    msg = match.group("msg") if match else diagnostics.strip().splitlines()[0]
    op_match = re.search(r"operation '([^']+)'", msg)
    op = op_match.group(1) if op_match else None
    if op == "torch.operator":
        named = re.search(r'name = "([^"]+)"', msg)
        op = named.group(1) if named else op
    source = None
    if match and match.group("file") not in ("<stdin>", "<unknown>", "-"):
        code = linecache.getline(match.group("file"), int(match.group("line"))).strip()
        source = f"{match.group('file')}:{match.group('line')}" + (f": {code}" if code else "")
    aten = op[len("torch.") :] if op and op.startswith("torch.aten.") else None
    hints = [
        "What to try:",
        "  - decompose the op that produces it: "
        + (
            f"`with extend_aot_decompositions(add_ops=[torch.ops.{aten}]):`"
            if aten
            else "`extend_aot_decompositions(add_ops=[...])` with the ATen op at that line"
        ),
        "  - export with strict_export=False, or rewrite that line with ops IREE supports",
    ]
    raise UnsupportedOpError(
        f"IREE cannot lower {op or 'an op'}"
        + (f" (from {source})" if source else "")
        + f": {msg}\n"
        + "\n".join(hints)
        + f"\nThe IR and IREE's diagnostics are in {dump_dir}.",
        op=op,
        node=None,
        source_line=source,
        dump_dir=str(dump_dir),
    )
