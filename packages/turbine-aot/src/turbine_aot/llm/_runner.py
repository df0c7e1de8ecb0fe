"""``load`` and :class:`CausalLM`: greedy generation on a compiled ``prefill`` + ``decode``.

The runner keeps everything per token outside Python's way: one call of ``decode`` per token
(the compiled step holds the whole forward and the cache write), the argmax on the returned
logits, and the loop. Prompts of different lengths share one call: each is packed to the left
of its row (right padding, positions ``0..len-1``), ``prefill`` returns each row's logits at its
own last token, and ``decode`` gets each row's own position, so every sequence is computed
exactly as if it were alone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import runtime as R
from ._errors import LLMError
from ._export import REFLECTION_KEY, CausalLMInfo

__all__ = ["STEP_ENV", "CausalLM", "GenerationTimings", "load"]

#: ``TURBINE_LLM_STEP=generic`` when a model is loaded (``load``, ``reset``): its ``generate``
#: decodes through :meth:`CausalLM.decode` (torch tensors in and out, each call bound and
#: checked) instead of the prepared step (A/B measurements: docs/llms.md, "The decode loop").
STEP_ENV = "TURBINE_LLM_STEP"
#: The compute dtypes whose logits the prepared step reads (numpy has no other float type
#: turbine's LLMs compute in; bfloat16 is widened from its bits).
_STEP_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class GenerationTimings:
    """Wall-clock times of the last :meth:`CausalLM.generate` (host tensors in and out).

    Attributes:
        prefill_ms: the ``prefill`` call(s).
        decode_ms: every ``decode`` call, one per generated token after the first.
        decode_steps: how many ``decode`` calls.
        new_tokens: tokens generated per sequence (the first comes from ``prefill``).
    """

    prefill_ms: float = 0.0
    decode_ms: list[float] = field(default_factory=list)
    new_tokens: int = 0

    @property
    def decode_steps(self) -> int:
        return len(self.decode_ms)

    @property
    def decode_ms_per_token(self) -> float:
        return sum(self.decode_ms) / len(self.decode_ms) if self.decode_ms else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        ms = self.decode_ms_per_token
        return 1000.0 / ms if ms == ms and ms > 0 else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {
            "prefill_ms": self.prefill_ms,
            "decode_ms_per_token": self.decode_ms_per_token,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "decode_steps": self.decode_steps,
            "new_tokens": self.new_tokens,
        }


class CausalLM:
    """A loaded causal LM: greedy :meth:`generate`, the raw :meth:`prefill`/:meth:`decode`.

    Made by :func:`load`. Attributes: ``info`` (:class:`CausalLMInfo`), ``module`` (the
    ``LoadedModule``), ``timings`` (:class:`GenerationTimings` of the last generate).
    """

    def __init__(self, factory: Any, info: CausalLMInfo) -> None:
        self._factory = factory
        self.info = info
        self.module = factory()
        self.timings = GenerationTimings()
        self._cache: torch.Tensor | None = None
        self._bind()

    def _bind(self) -> None:
        self._prefill = self.module["prefill"]
        self._decode = self.module["decode"]
        # decode_<W>: the same step over the cache's first W positions (docs/llms.md)
        self._decodes = {
            name: self.module[name] for name in (f"decode_{w}" for w in self.info.decode_windows)
        }
        # the prepared decode (:meth:`_prepared_step`): False until the first generation, None
        # where it does not apply or the module was loaded with $TURBINE_LLM_STEP=generic
        generic = os.environ.get(STEP_ENV, "").strip().lower() == "generic"
        self._step: _PreparedDecode | bool | None = None if generic else False

    def reset(self) -> None:
        """Starts from a fresh module state: a zero KV cache, no timings.

        ``generate`` does not need it (a prefill starts every sequence at position 0 and never
        reads older cache entries); it is for callers of :meth:`prefill`/:meth:`decode`.
        """
        self.module = self._factory()
        self._bind()
        self._cache = None
        self.timings = GenerationTimings()

    # ------------------------------------------------------------------ raw entry points
    def prefill(self, input_ids: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """``prefill`` of the module: right-padded ``[batch, S]`` prompts -> last logits."""
        if self.info.kv_cache == "argument":
            if self._cache is None:
                self._cache = torch.zeros(self.info.cache_shape(), dtype=self.info.torch_dtype)
            logits, self._cache = self._prefill(input_ids, seq_lens, self._cache)
            return logits
        return self._prefill(input_ids, seq_lens)

    def decode(self, token_ids: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """``decode`` of the module: ``[batch, 1]`` tokens at ``[batch]`` positions -> logits
        (through the smallest ``decode_<W>`` whose window holds every position, if any)."""
        decode = self._decode
        if self._decodes:
            name = self.info.decode_function(int(position.max()))
            decode = self._decodes.get(name, decode)
        if self.info.kv_cache == "argument":
            if self._cache is None:
                raise LLMError("decode before prefill: call prefill (or generate) first")
            logits, self._cache = decode(token_ids, position, self._cache)
            return logits
        return decode(token_ids, position)

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        attention_mask: torch.Tensor | None = None,
        pad_token_id: int | None = None,
    ) -> torch.Tensor:
        """Greedy decoding, as ``model.generate(..., do_sample=False)`` does it.

        Args:
            input_ids: ``[batch, S]`` token ids (a tensor or nested lists); rows may be padded
                (left, as ``transformers`` does, or right) when ``attention_mask`` marks the
                real tokens with 1. A list of lists of different lengths is left-padded here.
            max_new_tokens: tokens to generate per sequence.
            eos_token_id: a sequence that produced it is finished: it gets ``pad_token_id``
                afterwards, and generation stops when all are finished.
            attention_mask: ``[batch, S]``, 1 for real tokens, 0 for padding.
            pad_token_id: what finished sequences are filled with (default ``eos_token_id``,
                else 0), also used to left-pad lists of different lengths.

        Returns:
            ``[batch, S + n]``: the input (with its padding) followed by the ``n <=
            max_new_tokens`` generated tokens.

        Raises:
            LLMError: an empty prompt, or prompt + new tokens beyond ``max_seq_len``.
        """
        pad = pad_token_id if pad_token_id is not None else (eos_token_id or 0)
        ids, mask = _as_batch(input_ids, attention_mask, pad)
        if max_new_tokens < 1:
            return ids
        prompts = [row[m.bool()] for row, m in zip(ids, mask)]
        if any(p.numel() == 0 for p in prompts):
            raise LLMError("generate: a prompt has no tokens (attention_mask is all 0 in a row)")
        longest = max(p.numel() for p in prompts)
        needed = longest + max_new_tokens - 1
        if needed > self.info.max_seq_len:
            raise LLMError(
                f"generate: a {longest}-token prompt plus {max_new_tokens} new tokens needs "
                f"{needed} cache positions; this model was exported with max_seq_len "
                f"{self.info.max_seq_len} (export with a larger max_seq_len or generate fewer)"
            )
        self.timings = GenerationTimings()
        chunks = []
        b = self.info.batch_size
        for start in range(0, len(prompts), b):
            chunks.append(
                self._generate_batch(prompts[start : start + b], max_new_tokens, eos_token_id, pad)
            )
        new = torch.cat(chunks, dim=0)
        return torch.cat([ids, new], dim=1)

    def _generate_batch(
        self, prompts: list[torch.Tensor], max_new: int, eos: int | None, pad: int
    ) -> torch.Tensor:
        info = self.info
        n = len(prompts)
        rows = prompts + [prompts[0]] * (info.batch_size - n)  # fill a partial batch
        lens = torch.tensor([p.numel() for p in rows], dtype=torch.int64)
        width = max(int(lens.max()), info.min_prefill_len)
        packed = torch.zeros((info.batch_size, width), dtype=torch.int64)
        for i, p in enumerate(rows):
            packed[i, : p.numel()] = p
        t0 = time.perf_counter()
        logits = self.prefill(packed, lens)
        self.timings.prefill_ms += (time.perf_counter() - t0) * 1e3
        token = logits.argmax(-1)
        done = torch.zeros(info.batch_size, dtype=torch.bool)
        done[n:] = True  # filler rows never stop generation
        if eos is not None:
            done |= token == eos
        # the tokens, positions and finished rows as numpy arrays: the prepared step writes them
        # into its argument buffers in place (docs/llms.md, "The decode loop")
        step = self._prepared_step() or self._decode_step
        tok, pos, fin = token.numpy().copy(), lens.numpy().copy(), done.numpy().copy()
        top = int(pos.max())  # the furthest position: it picks the decode window
        ids = [tok]
        timings = self.timings.decode_ms
        clock = time.perf_counter
        for _ in range(max_new - 1):
            if fin.all():
                break
            t0 = clock()
            tok = step(tok, pos, top)
            timings.append((clock() - t0) * 1e3)
            if eos is not None:
                tok = np.where(fin, pad, tok)
                fin |= tok == eos
            ids.append(tok)
            pos += 1
            top += 1
        self.timings.new_tokens = max(self.timings.new_tokens, len(ids))
        return torch.from_numpy(np.stack(ids, axis=1)[:n])

    # ------------------------------------------------------------------ decode steps
    def _prepared_step(self) -> _PreparedDecode | None:
        """The decode functions as one prepared call (docs/llms.md, "The decode loop"), made
        at the first generation of a module: None where it does not apply (an ``argument``
        cache, a device other than the CPU's, logits torch reads as another dtype) or where
        the module was loaded with ``$TURBINE_LLM_STEP=generic``."""
        if self._step is False:
            self._step = _PreparedDecode.create(self)
        return self._step if isinstance(self._step, _PreparedDecode) else None

    def _decode_step(self, tok: np.ndarray, pos: np.ndarray, top: int) -> np.ndarray:
        """One step through :meth:`decode` (torch tensors in and out, each call bound and
        checked; it picks the window from ``pos`` itself): the next greedy token of each row."""
        del top
        logits = self.decode(torch.from_numpy(tok).unsqueeze(1), torch.from_numpy(pos))
        return logits.argmax(-1).numpy()


class _PreparedDecode:
    """A :class:`CausalLM`'s ``decode`` and ``decode_<W>`` functions as one
    :class:`~turbine_aot.runtime.PreparedCall`: per token, the token ids and positions written
    into the call's argument buffers, the function of the window chosen, the call, and the
    argmax of the logits read in place (numpy)."""

    __slots__ = ("_call", "_function_at", "_pos", "_tok", "_widen")

    def __init__(self, call: Any, info: CausalLMInfo, names: list[str]) -> None:
        self._call = call
        index = {name: i for i, name in enumerate(names)}
        # the function for each furthest position (a list: one index per step, no search)
        self._function_at = [index.get(info.decode_function(p), 0) for p in range(info.max_seq_len)]
        self._tok, self._pos = call.inputs
        # bfloat16 logits arrive as their uint16 bits: widened to float32 before the argmax
        self._widen = info.torch_dtype == torch.bfloat16

    @classmethod
    def create(cls, lm: CausalLM) -> _PreparedDecode | None:
        """The prepared decode of ``lm``, or None where it does not apply."""
        info = lm.info
        if info.kv_cache != "global" or info.torch_dtype not in _STEP_DTYPES:
            return None
        names = ["decode", *lm._decodes]
        functions = [lm._decode, *lm._decodes.values()]
        b = info.batch_size
        try:
            call = R.PreparedCall(functions, [np.zeros((b, 1), np.int64), np.zeros((b,), np.int64)])
        except (ValueError, TypeError):  # not a local driver, or another signature
            return None
        return cls(call, info, names)

    def __call__(self, tok: np.ndarray, pos: np.ndarray, top: int) -> np.ndarray:
        """One decode step at positions ``pos`` (``top`` the furthest): the next greedy token
        of each row (``[batch]`` int64)."""
        self._tok[:, 0] = tok
        self._pos[...] = pos
        (logits,) = self._call(self._function_at[top])
        if self._widen:
            logits = (logits.astype(np.uint32) << 16).view(np.float32)
        return logits.argmax(-1).astype(np.int64)


def _as_batch(
    input_ids: Any, attention_mask: torch.Tensor | None, pad: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(input_ids, torch.Tensor):
        ids = input_ids.to(torch.int64)
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
    else:
        rows = list(input_ids)
        if not rows:
            raise LLMError("generate: input_ids is empty")
        if not isinstance(rows[0], (list, tuple, torch.Tensor)):
            rows = [rows]  # one prompt as a flat list of ids
        seqs = [[int(t) for t in row] for row in rows]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad, dtype=torch.int64)
        mask = torch.zeros((len(seqs), width), dtype=torch.int64)
        for i, s in enumerate(seqs):
            if s:
                ids[i, width - len(s) :] = torch.tensor(s)
                mask[i, width - len(s) :] = 1
        if attention_mask is None:
            return ids, mask
    if ids.dim() != 2:
        raise LLMError(f"generate: input_ids must be [batch, seq]; got shape {list(ids.shape)}")
    if attention_mask is None:
        return ids, torch.ones_like(ids)
    if tuple(attention_mask.shape) != tuple(ids.shape):
        raise LLMError(
            f"generate: attention_mask shape {list(attention_mask.shape)} differs from "
            f"input_ids {list(ids.shape)}"
        )
    return ids, attention_mask.to(torch.int64)


def _info_of(module: Any) -> CausalLMInfo:
    try:
        fn = module._vm_module.lookup_function("prefill")
        text = (fn.reflection or {}).get(REFLECTION_KEY)
    except Exception:
        text = None
    if not text:
        raise LLMError(
            f"module {module.name!r} is not a turbine causal-LM export (no prefill with a "
            f"{REFLECTION_KEY!r} description); export it with turbine_aot.llm.export_causal_lm"
        )
    return CausalLMInfo.from_json(text)


def load(
    source: Any,
    *,
    device: str = "local-task",
    parameters: Any = None,
    compile_flags: Any = None,
    parameter_memory: str | None = None,
) -> CausalLM:
    """Loads an exported causal LM for generation.

    Args:
        source: what :func:`~turbine_aot.llm.export_causal_lm` returned (compiled here for
            ``device`` through the compile cache, weights bound from memory), a bundle
            directory or archive (``turbine-aot llm export``), or a ``.vmfb`` path.
        device: IREE device URI (``local-task``, ``local-sync``, ``cuda``, ...).
        parameters: the weights: an ``.irpa`` path (scope ``model``) or a scope mapping as for
            ``turbine_aot.runtime.load_module``; default the export's in-memory weights or the
            bundle's archive.
        compile_flags: for an export only: flags replacing turbine's defaults.
        parameter_memory: where the weights' archive bytes live: ``"auto"`` (default: on Linux
            CPUs with transparent huge pages, read into huge-page memory, which decodes faster),
            ``"mmap"`` or ``"huge-pages"``; None: ``$TURBINE_PARAMETER_MEMORY``, else
            ``"auto"``. See ``turbine_aot.runtime.load_module`` and docs/running.md.

    Returns:
        A :class:`CausalLM`.

    Raises:
        LLMError: ``source`` is not a causal-LM export.
    """
    if hasattr(source, "mlir_module"):
        info = getattr(source, "llm", None)
        if not isinstance(info, CausalLMInfo):
            raise LLMError("load: this ExportOutput is not from turbine_aot.llm.export_causal_lm")
        vmfb = R.compile_export_output(source, device=device, compile_flags=compile_flags)
        signatures = R.signatures_from_mlir(source)
        params = parameters
        if params is None and getattr(source, "llm_parameters", None) is not None:
            params = {R.DEFAULT_PARAMETER_SCOPE: source.llm_parameters}

        def factory() -> Any:
            return R.load_module(
                vmfb,
                device=device,
                parameters=params,
                signatures=signatures,
                parameter_memory=parameter_memory,
            )

        return CausalLM(factory, info)
    path = Path(os.fspath(source))
    if not path.exists():
        raise LLMError(f"load: {str(path)!r} does not exist")
    if path.is_dir() or not path.name.endswith(".vmfb"):
        overrides = (
            {R.DEFAULT_PARAMETER_SCOPE: parameters}
            if isinstance(parameters, (str, os.PathLike))
            else parameters
        )

        def factory() -> Any:
            return R.load_bundle(
                path, device=device, parameters=overrides, parameter_memory=parameter_memory
            )

    else:

        def factory() -> Any:
            return R.load_module(
                path, device=device, parameters=parameters, parameter_memory=parameter_memory
            )

    module = factory()
    llm = CausalLM(lambda: module, _info_of(module))
    llm._factory = factory
    return llm
