"""``turbine_aot.builtins``: names procedures use — abstract argument types, the ``IREE`` emitter
(``IREE.tensor_dim``, ``IREE.tensor_slice``, ...), the global exporters and ``jittable``.

Example::

    from turbine_aot import CompiledModule
    from turbine_aot.builtins import IREE, AbstractTensor, AbstractIndex

    class Slicer(CompiledModule):
        def first_rows(self, x=AbstractTensor(None, 4), n=AbstractIndex):
            return IREE.tensor_slice(x, (0, n), 0)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from turbine_trace import (
    IREE,
    AbstractBool,
    AbstractF32,
    AbstractF64,
    AbstractI32,
    AbstractI64,
    AbstractIndex,
    AbstractScalar,
    AbstractTensor,
    abstractify,
    export_buffers,
    export_global,
    export_global_tree,
    export_parameters,
)

if TYPE_CHECKING:
    from turbine_fx import jittable

__all__ = [
    "IREE",
    "AbstractBool",
    "AbstractF32",
    "AbstractF64",
    "AbstractI32",
    "AbstractI64",
    "AbstractIndex",
    "AbstractScalar",
    "AbstractTensor",
    "abstractify",
    "export_buffers",
    "export_global",
    "export_global_tree",
    "export_parameters",
    "jittable",
]


def __getattr__(name: str) -> Any:
    if name == "jittable":
        from turbine_fx import jittable

        return jittable
    raise AttributeError(f"module 'turbine_aot.builtins' has no attribute {name!r}")
