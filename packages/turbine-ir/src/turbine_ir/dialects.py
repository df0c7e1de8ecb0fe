"""The MLIR dialect op builders IREE ships, re-exported so that only turbine_ir imports them.

``from turbine_ir.dialects import func, util, flow, arith, tensor`` gives the same modules as
``iree.compiler.dialects.<name>``. A dialect absent from the installed iree-base-compiler is
simply missing here (``available_dialects()`` lists what is present). The ``torch`` dialect has
no Python op builders in iree-base-compiler: build torch ops with ``Operation.create`` (as
``iree.compiler.extras.fx_importer`` does) and torch types with ``Type.parse``.
"""

from __future__ import annotations

import importlib

from iree.compiler.dialects import (
    arith,
    builtin,
    cf,
    flow,
    func,
    hal,
    linalg,
    math,
    scf,
    stream,
    tensor,
    util,
)

__all__ = [
    "arith",
    "available_dialects",
    "builtin",
    "cf",
    "flow",
    "func",
    "hal",
    "linalg",
    "math",
    "scf",
    "stream",
    "tensor",
    "util",
]

# Present in IREE 3.x releases; tolerated as absent so that an older compiler still imports.
_OPTIONAL = ("iree_tensor_ext", "complex", "iree_codegen", "iree_gpu", "vector", "memref")
for _name in _OPTIONAL:
    try:
        globals()[_name] = importlib.import_module(f"iree.compiler.dialects.{_name}")
        __all__.append(_name)
    except ImportError:  # pragma: no cover - depends on the installed compiler
        pass


def available_dialects() -> list[str]:
    """Names of the dialect modules this module re-exports (depends on the installed compiler)."""
    return sorted(n for n in __all__ if n != "available_dialects")
