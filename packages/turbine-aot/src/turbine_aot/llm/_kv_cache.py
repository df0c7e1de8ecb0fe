"""The KV cache seen by a model while it is exported: written at each sequence's positions.

A model (an adapter of a ``transformers`` model or a plain ``nn.Module`` following the
protocol of :mod:`turbine_aot.llm`) calls ``cache.update(key, value, layer_idx)`` in every
attention layer, as ``transformers``' ``Cache`` classes are called, and attends over what it
returns with the additive mask it was given. The cache is static: ``max_seq_len`` positions per
sequence, laid out ``[batch, kv_heads, max_seq_len, head_dim]`` per layer for keys and values,
so every call of the compiled module has one shape whatever the position.

Two storages, chosen at export:

* ``GlobalKVCache``: the per-layer tensors are buffers of the exported root module, mutated in
  place (``index_put_``); the importer makes them mutable globals, so the cache lives inside
  the compiled module between calls.
* ``ArgumentKVCache``: one tensor ``[layers, 2, batch, kv_heads, max_seq_len, head_dim]`` taken
  as an argument and returned updated (out of place), for a caller that owns the memory.

Both write the new entries at ``positions`` (``[batch, seq]``, each row its own positions) and
return the whole cache of the layer (with a ``window``, its first ``window`` positions: a decode
step whose positions are all below it attends to no more); the mask the model is given hides
every position after the query's own, so stale or padding entries there are never read before
they are overwritten.
Attending over all ``max_seq_len`` positions also in ``prefill`` keeps the reduction dimensions
of attention static (IREE 3.13 fails to compile the data-tiled ``softmax @ V`` matmul whose
reduction is the dynamic prompt length) and lets a prefill start at any position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ArgumentKVCache", "GlobalKVCache", "KVCacheLayout"]


@dataclass(frozen=True)
class KVCacheLayout:
    """What the cache of a model holds: one key and one value tensor per attention layer.

    Args:
        num_layers: attention layers calling ``cache.update`` (``layer_idx`` 0..num_layers-1).
        num_kv_heads: key/value heads per layer (fewer than query heads for GQA).
        head_dim: size of each head.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int

    def shape(self, batch_size: int, max_seq_len: int) -> tuple[int, ...]:
        """Shape of the cache tensor of ``kv_cache="argument"``."""
        return (self.num_layers, 2, batch_size, self.num_kv_heads, max_seq_len, self.head_dim)


class _KVCacheBase:
    """Common part: positions, mode and the index tensors of the writes."""

    def __init__(self, mode: str, positions: torch.Tensor, num_kv_heads: int) -> None:
        if mode not in ("prefill", "decode"):
            raise ValueError(f"KV cache mode must be 'prefill' or 'decode', not {mode!r}")
        self.mode = mode
        self.positions = positions  # [batch, seq] int64
        batch = positions.shape[0]
        # index_put_ indices broadcast to [batch, kv_heads, seq]; head_dim stays a slice.
        self._rows = torch.arange(batch, dtype=torch.int64).view(batch, 1, 1)
        self._heads = torch.arange(num_kv_heads, dtype=torch.int64).view(1, num_kv_heads, 1)
        self._cols = positions.unsqueeze(1)

    # transformers' Cache API pieces the HF attention modules touch.
    def get_seq_length(self, layer_idx: int = 0) -> int:  # pragma: no cover - HF API shim
        return 0

    @property
    def is_compileable(self) -> bool:  # pragma: no cover - HF API shim
        return True


class GlobalKVCache(_KVCacheBase):
    """Writes into per-layer buffers in place (they become mutable globals of the module).

    Args:
        mode: ``"prefill"`` or ``"decode"``.
        positions: ``[batch, seq]`` positions of the new entries.
        keys, values: the per-layer buffers ``[batch, kv_heads, max_seq_len, head_dim]``.
    """

    def __init__(
        self,
        mode: str,
        positions: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        window: int | None = None,
    ) -> None:
        super().__init__(mode, positions, keys[0].shape[1])
        self.keys, self.values = keys, values
        self.window = window

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores ``key``/``value`` (``[batch, kv_heads, seq, head_dim]``) at the positions."""
        k_buf, v_buf = self.keys[layer_idx], self.values[layer_idx]
        index = (self._rows, self._heads, self._cols)
        k_buf.index_put_(index, key.to(k_buf.dtype))
        v_buf.index_put_(index, value.to(v_buf.dtype))
        if self.window is not None:
            return k_buf[:, :, : self.window], v_buf[:, :, : self.window]
        return k_buf, v_buf


class ArgumentKVCache(_KVCacheBase):
    """Updates one cache tensor ``[layers, 2, batch, kv_heads, max_seq_len, head_dim]`` out of
    place; :attr:`tensor` is the updated cache after the model ran.

    Args:
        mode: ``"prefill"`` or ``"decode"``.
        positions: ``[batch, seq]`` positions of the new entries.
        cache: the cache tensor given to the program.
    """

    def __init__(
        self,
        mode: str,
        positions: torch.Tensor,
        cache: torch.Tensor,
        window: int | None = None,
    ) -> None:
        super().__init__(mode, positions, cache.shape[3])
        self.tensor = cache
        self.window = window

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores ``key``/``value`` (``[batch, kv_heads, seq, head_dim]``) at the positions."""
        layer = torch.full((1, 1, 1), layer_idx, dtype=torch.int64)
        dtype = self.tensor.dtype
        for kind, new in ((0, key), (1, value)):
            which = torch.full((1, 1, 1), kind, dtype=torch.int64)
            index = (layer, which, self._rows, self._heads, self._cols)
            self.tensor = self.tensor.index_put(index, new.to(dtype))
        end = self.window or self.tensor.shape[4]
        return self.tensor[layer_idx, 0, :, :, :end], self.tensor[layer_idx, 1, :, :, :end]
