"""Decompositions measured by the benchmarks (proposals for turbine_fx's table).

See ``benchmarks/NOTES-decompositions.md`` for the figures.
"""

from __future__ import annotations

import math

import torch

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
) -> torch.Tensor:
    """``scaled_dot_product_attention`` written as matmul + mask + softmax + matmul (inference).

    IREE 3.13 lowers the SDPA op to ``iree_linalg_ext.attention``, whose llvm-cpu code is ~100×
    slower than eager for 8×128×64 heads; the matmul form reaches IREE's matmul codegen
    (data tiling + mmt4d ukernels) instead.
    """
    if dropout_p != 0.0:
        raise NotImplementedError("sdpa_as_matmul_softmax is for inference (dropout_p=0)")
    e = query.size(-1)
    scale_f = scale if scale is not None else 1.0 / math.sqrt(e)
    if enable_gqa and key.size(-3) != query.size(-3):
        rep = query.size(-3) // key.size(-3)
        key = key.repeat_interleave(rep, dim=-3)
        value = value.repeat_interleave(rep, dim=-3)
    scores = torch.matmul(query * scale_f, key.transpose(-2, -1))
    if is_causal:
        lq, lk = query.size(-2), key.size(-2)
        keep = torch.ones(lq, lk, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, value)


def sdpa_table() -> dict:
    """A decomposition table entry: SDPA -> matmul/softmax."""
    return {aten.scaled_dot_product_attention.default: sdpa_as_matmul_softmax}


def linear_as_2d(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``linear`` on an N-d input (N > 2) as a 2-d matmul over the flattened leading dims.

    IREE 3.13 lowers a 3-d ``linear`` to a ``batch_matmul`` against the broadcast weight; the
    2-d form reaches the plain matmul (mmt4d) path, 1.2-1.5x faster on the GPT shapes.
    """
    if input.dim() <= 2:
        out = torch.matmul(input, weight.t())
        return out if bias is None else out + bias
    lead = input.shape[:-1]
    flat = input.reshape(-1, input.shape[-1])
    out = torch.mm(flat, weight.t())
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, weight.shape[0])


def linear_table() -> dict:
    """A decomposition table entry: N-d linear -> 2-d matmul."""
    return {aten.linear.default: linear_as_2d}


def proposed_table() -> dict:
    """Both proposals."""
    return {**sdpa_table(), **linear_table()}
