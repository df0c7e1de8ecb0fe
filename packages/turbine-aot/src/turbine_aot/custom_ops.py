"""``turbine_aot.custom_ops``: custom ops with an MLIR expansion.

Define the op with ``torch.library.custom_op`` (its eager implementation is used for tracing and
testing), register an expansion that writes its body in MLIR; ``export()`` keeps the op as a
``torch.operator`` and the ``custom_op_expansion`` import phase (the default ``import`` phase of
``export``) replaces it with a call of the expansion. See ``docs/turbine-aot.md``.
"""

from __future__ import annotations

from ._compiled_module import custom_ops as _custom_ops
from ._compiled_module.custom_ops import *  # noqa: F403  (the public names are its __all__)

__all__ = list(_custom_ops.__all__)
