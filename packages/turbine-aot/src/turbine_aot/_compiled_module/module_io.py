"""Verifying and saving an MLIR module (shared by ``CompiledModule`` and ``ExportOutput``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from turbine_params import atomic_output_file

from .._errors import ExportError

__all__ = [
    "save_module",
    "verify_module",
]


# ---------------------------------------------------------------------------------------------
# Module helpers shared with ExportOutput
# ---------------------------------------------------------------------------------------------
def verify_module(module_op: Any, *, what: str = "the module") -> None:
    """Verifies ``module_op``; raises :class:`ExportError` with the verifier's diagnostics.

    Besides MLIR's verifiers, checks what IREE 3.13's do not: a ``flow.tensor.reshape``
    (``IREE.tensor_reshape``) between static shapes of different element counts.
    """
    from turbine_ir import reshape_element_count_errors
    from turbine_ir.ir import MLIRError

    try:
        module_op.verify()
    except MLIRError as e:
        details = "\n".join(str(d) for d in e.error_diagnostics) or str(e)
        raise ExportError(f"{what} failed verification:\n{details}") from None
    errors = reshape_element_count_errors(module_op)
    if errors:
        raise ExportError(f"{what} failed verification:\n" + "\n".join(errors))


def save_module(module_op: Any, path: str | Path) -> None:
    """Writes ``module_op`` to ``path``: MLIR bytecode for ``.mlirbc``, text otherwise."""
    path = Path(path)
    with atomic_output_file(path, parents=True) as tmp:
        if path.suffix == ".mlirbc":
            with open(tmp, "wb") as f:
                module_op.write_bytecode(f)
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                module_op.print(file=f)
