"""turbine_aot.llm: causal language models as ``prefill`` + ``decode`` with a KV cache.

* :func:`export_causal_lm` exports a ``transformers`` causal LM (GPT-2, Llama, Mistral,
  Qwen2/3 families) or a plain ``nn.Module`` following the same calling convention as two entry
  points sharing one set of weights and a static KV cache (mutable globals, or a tensor
  argument); ``quantize="int8" | "int4"`` exports torchao-quantized weights
  (:func:`quantized_copy`);
* :func:`load` loads such an export (an ``ExportOutput``, a ``.vmfb`` or a bundle) and gives a
  :class:`CausalLM` with greedy :meth:`~CausalLM.generate`, ``reset()`` and per-call timings.

See ``docs/llms.md``.
"""

from __future__ import annotations

from ._errors import LLMError, LLMExportError
from ._export import CausalLMInfo, export_causal_lm
from ._kv_cache import ArgumentKVCache, GlobalKVCache, KVCacheLayout
from ._quantize import QUANTIZATIONS, quantized_copy
from ._runner import CausalLM, GenerationTimings, load

__all__ = [
    "QUANTIZATIONS",
    "ArgumentKVCache",
    "CausalLM",
    "CausalLMInfo",
    "GenerationTimings",
    "GlobalKVCache",
    "KVCacheLayout",
    "LLMError",
    "LLMExportError",
    "export_causal_lm",
    "load",
    "quantized_copy",
]
