"""turbine's own decompositions, preferred over torch's registry for these ops.

torch registers no decomposition for ``scaled_dot_product_attention`` that IREE compiles well,
and none for ``linear``. These forms were measured by the performance work
(``benchmarks/NOTES-decompositions.md``) on IREE 3.13's
llvm-cpu backend: SDPA as matmul + mask + softmax + matmul takes a GPT-2-small-shaped model from
2.40× to 1.15× eager CPU time, and N-d ``linear`` as a 2-d ``mm`` brings it to 0.97×. Both are in
the default table (``DEFAULT_DECOMPOSITION_OPS``); a target that prefers IREE's attention op
(GPUs) opts out with::

    with extend_aot_decompositions(remove_ops=[torch.ops.aten.scaled_dot_product_attention,
                                               torch.ops.aten.linear]):
        ...
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["TURBINE_DECOMPOSITIONS", "linear_as_2d", "sdpa_as_matmul_softmax"]

aten = torch.ops.aten


def sdpa_as_matmul_softmax(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """``scaled_dot_product_attention`` as matmul + mask + softmax + matmul (inference only).

    Declines (returns ``NotImplemented``, keeping the op) when ``dropout_p`` is not 0.
    """
    if dropout_p != 0.0:
        return NotImplemented
    scale_f = scale if scale is not None else 1.0 / math.sqrt(query.size(-1))
    if enable_gqa and key.size(-3) != query.size(-3):
        rep = query.size(-3) // key.size(-3)
        key = key.repeat_interleave(rep, dim=-3)
        value = value.repeat_interleave(rep, dim=-3)
    scores = torch.matmul(query * scale_f, key.transpose(-2, -1))
    if is_causal:
        keep = torch.ones(
            query.size(-2), key.size(-2), dtype=torch.bool, device=query.device
        ).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    return torch.matmul(torch.softmax(scores, dim=-1), value)


def linear_as_2d(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``linear`` on an N-d input as a 2-d ``mm`` over the flattened leading dimensions."""
    if input.dim() <= 2:
        out = torch.matmul(input, weight.t())
        return out if bias is None else out + bias
    lead = input.shape[:-1]
    out = torch.mm(input.reshape(-1, input.shape[-1]), weight.t())
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, weight.shape[0])


#: Op → turbine decomposition; preferred over torch's registry when these ops are added.
TURBINE_DECOMPOSITIONS: dict[Any, Callable] = {
    aten.scaled_dot_product_attention.default: sdpa_as_matmul_softmax,
    aten.linear.default: linear_as_2d,
}
