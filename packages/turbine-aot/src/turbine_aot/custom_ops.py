"""``turbine_aot.custom_ops``: custom ops with an MLIR expansion.

Define the op with ``torch.library.custom_op`` (its eager implementation is used for tracing and
testing), register an expansion that writes its body in MLIR; ``export()`` keeps the op as a
``torch.operator`` and the ``custom_op_expansion`` import phase (the default ``import`` phase of
``export``) replaces it with a call of the expansion. See ``docs/turbine-aot.md``.
"""

from __future__ import annotations

from ._custom_ops import (
    CustomOpExpansionError,
    CustomOpSignature,
    custom_op_expansion,
    register_custom_op_expansion,
    registered_custom_ops,
    unregister_custom_op_expansion,
)

__all__ = [
    "CustomOpExpansionError",
    "CustomOpSignature",
    "custom_op_expansion",
    "register_custom_op_expansion",
    "registered_custom_ops",
    "unregister_custom_op_expansion",
]
