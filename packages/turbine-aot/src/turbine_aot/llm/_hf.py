"""Adapters that run ``transformers`` causal LMs under turbine's calling convention.

An adapter owns the Hugging Face model as a submodule and runs the model's own modules
(embeddings, decoder layers, final norm, LM head), in the model's own order, with turbine's
cache (:mod:`._kv_cache`) in place of a ``transformers`` ``Cache`` and turbine's additive mask
in place of the one ``create_causal_mask`` builds. Everything numerical is the model's code, so
the exported programs compute what ``model.generate`` computes; only the bookkeeping around the
layers (the cache, the mask, which positions get logits) is turbine's. That bookkeeping is the
part of ``transformers`` that does not export into a static-shape two-entry-point module: its
mask builders branch on the cache class and on Python values of the sequence length.

Supported ``config.model_type``s are those whose decoder loop is exactly
``embed -> layers(hidden, mask, rotary(position)) -> norm -> lm_head`` (:data:`LLAMA_LIKE`) or
GPT-2's ``wte + wpe -> blocks -> ln_f -> lm_head``; anything else is refused with the list.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ._errors import LLMExportError
from ._kv_cache import KVCacheLayout

__all__ = ["LLAMA_LIKE", "GPT2Adapter", "LlamaLikeAdapter", "adapt_hf_model", "is_hf_causal_lm"]

# Families whose model.forward is the plain Llama loop (checked against transformers 5.24).
LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED = (*LLAMA_LIKE, "gpt2")


def is_hf_causal_lm(model: Any) -> bool:
    """A ``transformers`` ``PreTrainedModel`` (duck-typed: ``config.model_type``)."""
    config = getattr(model, "config", None)
    return isinstance(model, nn.Module) and isinstance(getattr(config, "model_type", None), str)


def _gather_rows(hidden: torch.Tensor, output_index: torch.Tensor | None) -> torch.Tensor:
    """``hidden[b, output_index[b]]`` as ``[batch, 1, H]`` (all positions when ``None``)."""
    if output_index is None:
        return hidden
    rows = torch.arange(hidden.shape[0], dtype=torch.int64)
    return hidden[rows, output_index].unsqueeze(1)


class LlamaLikeAdapter(nn.Module):
    """Llama-family decoder (``model.model.{embed_tokens,layers,rotary_emb,norm}``, ``lm_head``)."""

    supports_output_index = True

    hf: Any

    def __init__(self, hf_model: Any) -> None:
        super().__init__()
        self.hf = hf_model
        config = hf_model.config
        self.kv_cache_layout = KVCacheLayout(
            num_layers=config.num_hidden_layers,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            head_dim=getattr(config, "head_dim", None)
            or config.hidden_size // config.num_attention_heads,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Any,
        output_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        inner = self.hf.model
        hidden = inner.embed_tokens(input_ids)
        rotary = inner.rotary_emb(hidden, position_ids=position_ids)
        for layer in inner.layers[: self.hf.config.num_hidden_layers]:
            hidden = layer(
                hidden,
                attention_mask=attention_mask,
                position_embeddings=rotary,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
            )
        hidden = inner.norm(hidden)
        return self.hf.lm_head(_gather_rows(hidden, output_index))


class GPT2Adapter(nn.Module):
    """GPT-2 (``model.transformer.{wte,wpe,h,ln_f}``, ``lm_head``)."""

    supports_output_index = True

    hf: Any

    def __init__(self, hf_model: Any) -> None:
        super().__init__()
        self.hf = hf_model
        config = hf_model.config
        self.kv_cache_layout = KVCacheLayout(
            num_layers=config.n_layer,
            num_kv_heads=config.n_head,
            head_dim=config.n_embd // config.n_head,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Any,
        output_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        tr = self.hf.transformer
        hidden = tr.wte(input_ids) + tr.wpe(position_ids)
        hidden = tr.drop(hidden)
        for block in tr.h:
            hidden = block(hidden, cache, attention_mask, use_cache=True, position_ids=position_ids)
        hidden = tr.ln_f(hidden)
        return self.hf.lm_head(_gather_rows(hidden, output_index))


def _check_config(model: Any, max_seq_len: int) -> None:
    config = model.config
    kind = config.model_type
    name = type(model).__name__
    if kind not in SUPPORTED:
        raise LLMExportError(
            f"{name} (model_type {kind!r}) is not a supported transformers family; supported: "
            f"{', '.join(SUPPORTED)}. Other models can be exported as a plain nn.Module with a "
            "kv_cache_layout and forward(input_ids, *, position_ids, attention_mask, cache) "
            "(see docs/llms.md)"
        )
    if getattr(config, "is_encoder_decoder", False) or getattr(
        config, "add_cross_attention", False
    ):
        raise LLMExportError(f"{name}: encoder-decoder / cross-attention models are not supported")
    window = getattr(config, "sliding_window", None)
    if (
        window is not None
        and (getattr(config, "use_sliding_window", True))
        and window < max_seq_len
    ):
        raise LLMExportError(
            f"{name} uses sliding-window attention (window {window}) shorter than max_seq_len "
            f"{max_seq_len}; export with max_seq_len <= {window}"
        )
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit is not None and max_seq_len > limit:
        raise LLMExportError(
            f"max_seq_len {max_seq_len} exceeds {name}'s max_position_embeddings {limit}"
        )
    impl = getattr(config, "_attn_implementation", None)
    if impl not in (None, "sdpa", "eager"):
        raise LLMExportError(
            f"{name} uses attention implementation {impl!r}; export needs 'sdpa' or 'eager' "
            "(model.set_attn_implementation('sdpa'))"
        )


def adapt_hf_model(model: Any, max_seq_len: int) -> nn.Module:
    """The adapter for a supported ``transformers`` causal LM (checked first)."""
    _check_config(model, max_seq_len)
    if model.config.model_type == "gpt2":
        return GPT2Adapter(model)
    return LlamaLikeAdapter(model)
