"""``export_causal_lm``: a causal LM as two entry points, ``prefill`` and ``decode``.

The exported module (an :class:`~turbine_aot.ExportOutput`) holds

* ``prefill(input_ids [B, S], seq_lens [B]) -> logits [B, V]``: runs the prompts (right-padded;
  ``seq_lens`` valid tokens each, ``2 <= S <= max_seq_len``, dynamic), fills the cache at
  positions ``0..S-1`` and returns the logits of each sequence's last valid token;
* ``decode(token_ids [B, 1], position [B]) -> logits [B, V]``: one token per sequence at its
  own position, attending to the cache entries ``<= position``;
* ``decode_<W>`` for each of the info's ``decode_windows`` ``W`` (``< max_seq_len``): the same
  step attending to the cache's first ``W`` positions only, for steps whose positions are all
  below ``W`` (the runner picks the smallest that fits: a step's attention then reads ``W``
  positions of the cache instead of ``max_seq_len``; docs/llms.md, "Decode windows");

sharing one global per weight (one ``FxProgramsBuilder`` root: the weights are the same tensor
objects in both programs) and, for ``kv_cache="global"``, one mutable global per layer for keys
and values. With ``kv_cache="argument"`` both functions take the cache tensor
``[layers, 2, B, kv_heads, max_seq_len, head_dim]`` last and return it updated after the logits.

The function ``prefill`` carries the LLM's description (kind, sizes, cache mode) as the IREE
reflection attribute ``turbine.llm`` (JSON), so a compiled ``.vmfb`` or bundle is enough for
:func:`turbine_aot.llm.load`.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from turbine_aot import export as _aot_export
from turbine_fx import FxProgramsBuilder, check_quantized_module
from turbine_ir import ir
from turbine_params import archive_tensors, externalize_module_parameters, save_module_parameters

from ._errors import LLMExportError
from ._hf import adapt_hf_model, is_hf_causal_lm
from ._kv_cache import ArgumentKVCache, GlobalKVCache, KVCacheLayout
from ._quantize import quantized_copy

__all__ = ["CausalLMInfo", "export_causal_lm"]

REFLECTION_KEY = "turbine.llm"
_KV_MODES = ("global", "argument")


@dataclass(frozen=True)
class CausalLMInfo:
    """What a runner needs to know about an exported causal LM (stored in the module).

    Attributes:
        max_seq_len: positions in the KV cache (prompt + generated tokens).
        batch_size: sequences per call.
        kv_cache: ``"global"`` (state inside the module) or ``"argument"``.
        vocab_size: logits per position.
        num_layers, num_kv_heads, head_dim: the cache layout.
        dtype: the compute dtype (``"float32"``, ``"bfloat16"``, ...).
        min_prefill_len: prompts shorter than this are right-padded by the runner.
        decode_windows: the cache lengths of the module's ``decode_<W>`` functions, ascending.
    """

    max_seq_len: int
    batch_size: int
    kv_cache: str
    vocab_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    min_prefill_len: int = 2
    decode_windows: tuple[int, ...] = ()

    @property
    def layout(self) -> KVCacheLayout:
        return KVCacheLayout(self.num_layers, self.num_kv_heads, self.head_dim)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def cache_shape(self) -> tuple[int, ...]:
        return self.layout.shape(self.batch_size, self.max_seq_len)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CausalLMInfo:
        fields = json.loads(text)
        fields["decode_windows"] = tuple(fields.get("decode_windows", ()))
        return cls(**fields)

    def decode_function(self, max_position: int) -> str:
        """The decode function for a step whose largest position is ``max_position``."""
        window = next((w for w in self.decode_windows if max_position < w), None)
        return "decode" if window is None else f"decode_{window}"


#: ``decode_windows="auto"``: these cache lengths, those below ``max_seq_len``.
AUTO_DECODE_WINDOWS = (128, 512, 2048, 8192)


def _decode_windows(windows: Any, max_seq_len: int) -> tuple[int, ...]:
    if isinstance(windows, str) and windows == "auto":
        return tuple(w for w in AUTO_DECODE_WINDOWS if w < max_seq_len)
    try:
        chosen = tuple(sorted(set(windows)))
    except TypeError:
        chosen = None
    if chosen is None or not all(
        isinstance(w, int) and not isinstance(w, bool) and 1 <= w < max_seq_len for w in chosen
    ):
        raise LLMExportError(
            f"decode_windows must be 'auto' or ints in 1..max_seq_len-1 ({max_seq_len - 1}); "
            f"got {windows!r}"
        )
    return chosen


class _CacheBuffers(nn.Module):
    """Holds the per-layer key/value buffers of ``kv_cache="global"`` (``k0``, ``v0``, ...).

    Non-persistent: never externalized nor saved with the weights; the compiled module starts
    with them at zero.
    """

    def __init__(self, layout: KVCacheLayout, batch: int, max_seq_len: int, dtype: Any) -> None:
        super().__init__()
        shape = (batch, layout.num_kv_heads, max_seq_len, layout.head_dim)
        for i in range(layout.num_layers):
            self.register_buffer(f"k{i}", torch.zeros(shape, dtype=dtype), persistent=False)
            self.register_buffer(f"v{i}", torch.zeros(shape, dtype=dtype), persistent=False)
        self.num_layers = layout.num_layers

    def lists(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        keys = [getattr(self, f"k{i}") for i in range(self.num_layers)]
        values = [getattr(self, f"v{i}") for i in range(self.num_layers)]
        return keys, values


class _CausalLMRoot(nn.Module):
    """The root of the program set: the model (weights) and, for global caches, the buffers."""

    def __init__(self, lm: nn.Module, info: CausalLMInfo) -> None:
        super().__init__()
        self.lm = lm
        self.info = info
        if info.kv_cache == "global":
            self.kv_cache = _CacheBuffers(
                info.layout, info.batch_size, info.max_seq_len, info.torch_dtype
            )

    def _mask(self, positions: torch.Tensor, window: int | None = None) -> torch.Tensor:
        """Additive mask ``[B, 1, seq, window or max_seq_len]``: 0 where key position <= query
        position."""
        keys = torch.arange(window or self.info.max_seq_len, dtype=torch.int64)
        visible = keys.view(1, 1, -1) <= positions.unsqueeze(-1)
        zero = torch.zeros((), dtype=self.info.torch_dtype)
        lowest = torch.finfo(self.info.torch_dtype).min
        return torch.where(visible, zero, lowest).unsqueeze(1)

    def _run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: Any,
        output_index: torch.Tensor | None,
    ) -> torch.Tensor:
        if getattr(self.lm, "supports_output_index", False):
            logits = self.lm(
                input_ids,
                position_ids=positions,
                attention_mask=mask,
                cache=cache,
                output_index=output_index,
            )
            return logits[:, -1]
        logits = self.lm(input_ids, position_ids=positions, attention_mask=mask, cache=cache)
        if output_index is None:
            return logits[:, -1]
        rows = torch.arange(logits.shape[0], dtype=torch.int64)
        return logits[rows, output_index]

    def _cache(
        self,
        mode: str,
        positions: torch.Tensor,
        tensor: torch.Tensor | None,
        window: int | None = None,
    ) -> Any:
        if tensor is None:
            keys, values = self.kv_cache.lists()
            return GlobalKVCache(mode, positions, keys, values, window=window)
        return ArgumentKVCache(mode, positions, tensor, window=window)

    def prefill(
        self, input_ids: torch.Tensor, seq_lens: torch.Tensor, cache: torch.Tensor | None = None
    ) -> Any:
        batch, seq = input_ids.shape
        positions = torch.arange(seq, dtype=torch.int64).unsqueeze(0).expand(batch, seq)
        mask = self._mask(positions)
        kv = self._cache("prefill", positions, cache)
        logits = self._run(input_ids, positions, mask, kv, seq_lens - 1)
        return logits if cache is None else (logits, kv.tensor)

    def decode(
        self,
        token_ids: torch.Tensor,
        position: torch.Tensor,
        cache: torch.Tensor | None = None,
        window: int | None = None,
    ) -> Any:
        positions = position.unsqueeze(1)  # [B, 1]
        mask = self._mask(positions, window)
        kv = self._cache("decode", positions, cache, window)
        logits = self._run(token_ids, positions, mask, kv, None)
        return logits if cache is None else (logits, kv.tensor)


def _layout_of(lm: nn.Module) -> KVCacheLayout:
    layout = getattr(lm, "kv_cache_layout", None)
    if callable(layout):
        layout = layout()
    if not isinstance(layout, KVCacheLayout):
        raise LLMExportError(
            f"{type(lm).__name__} is neither a supported transformers causal LM nor a module "
            "following turbine's LLM calling convention: give it a kv_cache_layout "
            "(turbine_aot.llm.KVCacheLayout) and forward(input_ids, *, position_ids, "
            "attention_mask, cache) -> logits [batch, seq, vocab] (see docs/llms.md)"
        )
    return layout


def _vocab_size(lm: nn.Module, model: nn.Module) -> int:
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None) or getattr(lm, "vocab_size", None)
    if not isinstance(vocab, int):
        raise LLMExportError(
            f"{type(model).__name__}: cannot tell the vocabulary size; set a vocab_size attribute"
        )
    return vocab


def export_causal_lm(
    model: nn.Module,
    *,
    max_seq_len: int,
    batch_size: int = 1,
    dtype: torch.dtype | None = None,
    kv_cache: str = "global",
    external_parameters: bool = True,
    quantize: str | None = None,
    group_size: int | None = None,
    decode_windows: Any = "auto",
) -> Any:
    """Exports a causal LM as ``prefill`` + ``decode`` sharing one set of weights and a KV cache.

    Args:
        model: a ``transformers`` causal LM (``*ForCausalLM`` of a supported family, built from
            a config or loaded by the caller; nothing is downloaded), or a plain ``nn.Module``
            with a ``kv_cache_layout`` (:class:`KVCacheLayout`) and ``forward(input_ids, *,
            position_ids, attention_mask, cache) -> logits`` that calls
            ``cache.update(key, value, layer_idx)`` in each attention layer and adds
            ``attention_mask`` to the attention scores (``transformers``' convention).
        max_seq_len: positions in the cache: prompt plus generated tokens, per sequence.
        batch_size: sequences per call (prompts of different lengths are padded by the runner).
        dtype: compute dtype (e.g. ``torch.bfloat16``); ``None`` keeps the model's. The model
            is copied for a conversion, never changed.
        kv_cache: ``"global"`` (mutable globals inside the module) or ``"argument"`` (a tensor
            argument and result of both functions).
        external_parameters: weights as ``#flow.parameter.named<"model"::NAME>`` (NAME = the
            model's ``state_dict`` name), to be loaded from an ``.irpa``; ``False`` inlines them.
        quantize: ``"int8"``, ``"int4"``, ``"w8a8"`` (int8 weights and activations) or
            ``"w4a8"`` (int4 weights in groups, int8 activations): quantize
            a copy of the model's linear layers with torchao first (:func:`~turbine_aot.llm.quantized_copy`; needs ``torchao``). A model
            the caller quantized with torchao exports as it is, with ``quantize=None``. Quantized
            weights are stored as ``NAME.qdata`` / ``NAME.scale`` / ``NAME.zero_point``
            (int4 packed two per byte); see docs/quantization.md.
        group_size: inputs per int4 scale (default 128), for ``quantize="int4"`` and
            ``"w4a8"``.
        decode_windows: cache lengths ``W < max_seq_len`` to export ``decode_<W>`` for (a step
            at positions below ``W`` attends to ``W`` cache entries instead of
            ``max_seq_len``); ``"auto"``: those of 128, 512, 2048 and 8192 below
            ``max_seq_len``; ``()``: none. Each is one more decode function to compile.

    Returns:
        The :class:`~turbine_aot.ExportOutput` with public functions ``prefill``, ``decode``
        and ``decode_<W>`` for each decode window.
        Its attribute ``llm`` is the :class:`CausalLMInfo`, ``llm_parameters`` the weights by
        archive name (what :func:`turbine_aot.llm.load` binds when given the export) and
        ``save_parameters(path)`` writes them as an ``.irpa``.

    Raises:
        LLMExportError: an unsupported model or option (the message lists what is supported).
    """
    if kv_cache not in _KV_MODES:
        raise LLMExportError(f"kv_cache must be one of {', '.join(_KV_MODES)}; got {kv_cache!r}")
    if not isinstance(max_seq_len, int) or max_seq_len < 2:
        raise LLMExportError(f"max_seq_len must be an int >= 2; got {max_seq_len!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise LLMExportError(f"batch_size must be an int >= 1; got {batch_size!r}")
    if not isinstance(model, nn.Module):
        raise LLMExportError(f"export_causal_lm needs an nn.Module; got {type(model).__name__}")
    first = next(iter(model.parameters()), None)
    model_dtype = first.dtype if first is not None else torch.float32
    if dtype is not None and dtype != model_dtype:
        model = copy.deepcopy(model).to(dtype)
    compute_dtype = dtype or model_dtype
    if quantize is not None:
        model = quantized_copy(model, quantize, group_size=group_size)
    elif group_size is not None:
        raise LLMExportError(
            "group_size is for quantize='int4' or 'w4a8'; pass one of them with it"
        )
    check_quantized_module(model)  # torchao layouts IREE cannot run, refused before tracing
    model = model.eval()
    lm = adapt_hf_model(model, max_seq_len) if is_hf_causal_lm(model) else model
    layout = _layout_of(lm)
    info = CausalLMInfo(
        max_seq_len=max_seq_len,
        batch_size=batch_size,
        kv_cache=kv_cache,
        vocab_size=_vocab_size(lm, model),
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        dtype=str(compute_dtype).removeprefix("torch."),
        decode_windows=_decode_windows(decode_windows, max_seq_len),
    )
    root = _CausalLMRoot(lm, info)

    # Archive keys are the state_dict names of the caller's model (as
    # externalize_module_parameters marks them; the marks stay on the tensors).
    weights = dict(model.state_dict(keep_vars=True))
    if external_parameters:
        externalize_module_parameters(model)
    eo = _export_programs(root, info)
    _annotate(eo, info)
    eo.llm = info
    # A quantized weight is its inner tensors (NAME.qdata, ...), as the module names them.
    eo.llm_parameters = (
        {k: v.detach() for n, t in weights.items() for k, v in archive_tensors(n, t)}
        if external_parameters
        else None
    )
    eo.save_parameters = lambda path: _save_parameters(path, model)
    return eo


def _export_programs(root: _CausalLMRoot, info: CausalLMInfo) -> Any:
    fxb = FxProgramsBuilder(root)
    batch = info.batch_size
    seq = torch.export.Dim("seq", min=info.min_prefill_len, max=info.max_seq_len)
    example_ids = torch.zeros((batch, min(4, info.max_seq_len)), dtype=torch.int64)
    seq_lens = torch.full((batch,), example_ids.shape[1], dtype=torch.int64)
    token = torch.zeros((batch, 1), dtype=torch.int64)
    position = torch.zeros((batch,), dtype=torch.int64)
    dynamic = {"input_ids": {1: seq}}

    if info.kv_cache == "argument":
        cache = torch.zeros(info.cache_shape(), dtype=info.torch_dtype)
        prefill_args: tuple[Any, ...] = (example_ids, seq_lens, cache)
        decode_args: tuple[Any, ...] = (token, position, cache)

        def prefill(m: _CausalLMRoot, input_ids: Any, seq_lens: Any, cache: Any) -> Any:
            return m.prefill(input_ids, seq_lens, cache)

        def decode(
            m: _CausalLMRoot, token_ids: Any, position: Any, cache: Any, window: Any = None
        ) -> Any:
            return m.decode(token_ids, position, cache, window)

    else:
        prefill_args, decode_args = (example_ids, seq_lens), (token, position)

        def prefill(m: _CausalLMRoot, input_ids: Any, seq_lens: Any) -> Any:  # type: ignore[misc]
            return m.prefill(input_ids, seq_lens)

        def decode(  # type: ignore[misc]
            m: _CausalLMRoot, token_ids: Any, position: Any, window: Any = None
        ) -> Any:
            return m.decode(token_ids, position, None, window)

    with torch.no_grad():
        try:
            fxb.export_program(
                prefill, args=prefill_args, dynamic_shapes=dynamic, strict=False, name="prefill"
            )
            fxb.export_program(decode, args=decode_args, strict=False, name="decode")
            for window in info.decode_windows:
                fxb.export_program(
                    functools.partial(decode, window=window),
                    args=decode_args,
                    strict=False,
                    name=f"decode_{window}",
                )
        except LLMExportError:
            raise
        except Exception as e:
            raise LLMExportError(
                f"torch.export of {type(root.lm).__name__} as prefill/decode failed: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            ) from e
    return _aot_export(fxb)


def _annotate(eo: Any, info: CausalLMInfo) -> None:
    """Records ``info`` as the ``iree.reflection`` entry ``turbine.llm`` of ``@prefill``."""
    module_op = eo.mlir_module
    with module_op.context:
        for op in module_op.regions[0].blocks[0].operations:
            if op.operation.name != "func.func":
                continue
            if ir.StringAttr(op.attributes["sym_name"]).value != "prefill":
                continue
            entries = {REFLECTION_KEY: ir.StringAttr.get(info.to_json())}
            if "iree.reflection" in op.attributes:
                old = ir.DictAttr(op.attributes["iree.reflection"])
                for i in range(len(old)):
                    named = old[i]
                    entries.setdefault(named.name, named.attr)
            op.attributes["iree.reflection"] = ir.DictAttr.get(entries)
            return
    raise LLMExportError("internal: the exported module has no @prefill function")


def _save_parameters(path: Any, model: nn.Module) -> None:
    save_module_parameters(path, model)
