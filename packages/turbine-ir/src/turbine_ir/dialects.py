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


def _stub_missing_dialect_modules() -> None:
    """Registers empty Python modules for the ``torch``/``torch_c`` MLIR dialects.

    MLIR's Python bindings look up a dialect's Python module every time an op of that dialect is
    created and cache only a successful lookup. iree-base-compiler ships no Python module for the
    torch dialects, so each ``Operation.create("torch....")`` re-ran a failing import: about half
    of the import time of a large program. An empty module (never replacing a real one) makes the
    lookup succeed once and be cached (≈ 8× faster FX import of large programs).
    """
    import importlib.util
    import sys
    import types

    for namespace in ("torch", "torch_c"):
        name = f"iree.compiler.dialects.{namespace}"
        if name in sys.modules:
            continue
        try:
            if importlib.util.find_spec(name) is not None:
                continue
        except (ImportError, ValueError):
            continue
        sys.modules[name] = types.ModuleType(
            name, f"turbine_ir placeholder: iree-base-compiler has no Python module for {namespace}"
        )


_stub_missing_dialect_modules()


def available_dialects() -> list[str]:
    """Names of the dialect modules this module re-exports (depends on the installed compiler)."""
    return sorted(n for n in __all__ if n != "available_dialects")
