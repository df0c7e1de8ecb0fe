"""Graph passes usable before export (``turbine_aot.passes`` re-exports this module).

Example:
    >>> import torch
    >>> from turbine_fx.passes import functorch_functionalize
    >>> def f(x):
    ...     y = x.clone()
    ...     y.add_(1)
    ...     return y
    >>> gm = functorch_functionalize(f, torch.zeros(2))
    >>> any("add_" in str(n.target) for n in gm.graph.nodes)
    False
"""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule

__all__ = ["functorch_functionalize"]


def functorch_functionalize(gm_callable: Any, *args) -> GraphModule:
    """Traces ``gm_callable(*args)`` into a GraphModule with mutations and views removed.

    In-place ops become their out-of-place forms (``add_`` → ``add``); mutations of the inputs
    are applied at the end with ``copy_``, so the graph computes the same thing.

    Args:
        gm_callable: A function or GraphModule/nn.Module taking tensors.
        *args: Example arguments (real, fake or meta tensors).

    Returns:
        The functionalized ``torch.fx.GraphModule``.
    """
    from torch.func import functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(functionalize(gm_callable, remove="mutations_and_views"))(*args)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm
