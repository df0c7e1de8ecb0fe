"""``turbine_aot.passes``: FX graph passes used by the export paths (re-exported from
``turbine_fx``)."""

from __future__ import annotations

from typing import Any

__all__ = ["functorch_functionalize"]


def functorch_functionalize(gm_callable: Any, *args: Any) -> Any:
    """Functionalizes ``gm_callable`` traced on ``args`` (see ``turbine_fx.passes``).

    Returns:
        A ``torch.fx.GraphModule`` without in-place ops.
    """
    from turbine_fx.passes import functorch_functionalize as impl

    return impl(gm_callable, *args)
