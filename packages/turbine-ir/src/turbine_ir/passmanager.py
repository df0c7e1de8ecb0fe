"""The MLIR pass manager (``iree.compiler.passmanager``), for running pass pipelines on a module::

from turbine_ir.passmanager import PassManager

with module.context:
    PassManager.parse("builtin.module(canonicalize)").run(module.operation)
"""

from __future__ import annotations

from iree.compiler.passmanager import PassManager

__all__ = ["PassManager"]
