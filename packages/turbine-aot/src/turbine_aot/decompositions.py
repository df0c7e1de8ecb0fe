"""``turbine_aot.decompositions``: the AOT decomposition table every export path applies
(re-exported from ``turbine_fx``).

Example::

    import torch
    from turbine_aot.decompositions import extend_aot_decompositions

    with extend_aot_decompositions(add_ops=[torch.ops.aten.gelu]):
        output = turbine_aot.export(model, args=(x,))  # gelu decomposed before import
"""

from __future__ import annotations

from turbine_fx import (
    DEFAULT_DECOMPOSITION_OPS,
    current_aot_decompositions,
    extend_aot_decompositions,
)

__all__ = [
    "DEFAULT_DECOMPOSITION_OPS",
    "current_aot_decompositions",
    "extend_aot_decompositions",
]
