"""Llama decode side by side: turbine (fp32 / torchao int8 / int4 / w8a8 / w4a8) against llama.cpp
(F32 / Q8_0 / Q4_0) on the same random-init model, converted here to GGUF.

For each model (``llama-110m``, ``llama-2.5m`` of ``llm_bench.MODELS``) and thread count, in its
own child process:

* turbine: ``llm.export_causal_lm`` of the model and of its ``llm.quantized_copy`` (int8 per
  channel, int4 groups of ``--group-size``, w8a8: int8 weights per channel and int8 activations
  per row, integer products like llama.cpp's Q8_0 path, compared with Q8_0; ``w8a8-iree`` the
  same on IREE's integer matmul; w4a8: int4 weights in groups of ``--group-size`` and int8
  activations per row, integer products like llama.cpp's Q4_0 path, compared with Q4_0;
  ``w4a8-int4`` the same module on the weight-only int4 kernel), ``llm.load`` (``local-sync`` for 1 thread, ``local-task``
  limited to N workers otherwise);
* llama.cpp (``llama-cpp-python``): the same weights written to GGUF by :func:`write_gguf` (this
  file's own converter, built on the ``gguf`` package's ``GGUFWriter`` and its numpy
  quantizers): F32, Q8_0 and Q4_0 (every 2-D weight in the type, blocks of 32; norms F32),
  ``Llama(n_threads=N, n_threads_batch=N)``, driven by token ids (``eval``; no text).

Both decode greedily after the same ``--prompt``-token prompt. Per round every variant generates
``--new-tokens`` tokens (interleaved, so load from other processes hits all alike); a round's
decode tokens/s is 1000 / the mean wall ms of its decode steps (turbine: ``generate``'s steps,
``CausalLM.timings``: the call and the argmax of its logits, read in place by the prepared step
unless ``--baseline-env TURBINE_LLM_STEP=generic`` asks for the loop over ``decode`` beside it;
llama.cpp: ``eval`` of one token and the argmax of its logits, read in place);
the figure is the median over rounds. Correctness: llama.cpp F32's greedy ids and turbine fp32's
against HF eager's for the same prompt ids, and each GGUF's logits (token by token over the prompt
and 8 greedy tokens) against HF eager fp32's, relative RMS (llama.cpp keeps its KV cache in f16:
about 2e-4 for F32).

Against the bandwidth limit (issue 26): each row's "limit / turbine" and "limit / llama.cpp" are
the fraction of the machine's read bandwidth (``_harness.read_bandwidth_gbs`` at the run's
threads, measured after the rounds) a side's decode reaches, from the weight bytes a step reads
(``_harness.decode_read_bytes`` for turbine's archive, :func:`gguf_decode_read_bytes` for the
GGUF: every weight, one row of the token embedding). Above 1 the weights are served from the
cache, not from memory.

``llama-cpp-python`` and ``gguf`` are benchmark-only requirements
(``tools/requirements-bench-llm.txt``, ``nox -s bench-llm``); without them this prints a skip
line and exits 0.

Usage::

    python benchmarks/llama_cpp_side_by_side.py                       # both models, 1 and 2 threads
    python benchmarks/llama_cpp_side_by_side.py --models llama-2.5m --threads 2 --json out.json
    python benchmarks/llama_cpp_side_by_side.py --models llama-110m --max-seq-len 1024  # a real context
    python benchmarks/llama_cpp_side_by_side.py --models llama-110m --weights fp32 \\
        --baseline-env TURBINE_CPU_MATMUL_PREFETCH=off   # a compile choice A/B, same rounds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _harness  # noqa: E402

MODELS = ("llama-110m", "llama-2.5m")
#: turbine -> llama.cpp. w8a8 (int8 activations, integer dot products) beside Q8_0, whose CPU
#: path quantizes the activations to int8 blocks too; ``w8a8-iree``: the same module compiled
#: with ``TURBINE_CPU_INT8_MATMUL=iree`` (IREE's integer matmul: what the VNNI kernel replaced).
#: w4a8 (int4 weights, int8 activations) beside Q4_0 (llama.cpp's Q4_0 x Q8_0 dot products);
#: ``w4a8-int4``: the same module with ``TURBINE_CPU_INT8_MATMUL=iree`` (the weight-only int4
#: kernel on the dequantized activations: what the VNNI w4a8 kernel replaced).
WEIGHTS = {
    "fp32": "F32",
    "int8": "Q8_0",
    "int4": "Q4_0",
    "w8a8": "Q8_0",
    "w8a8-iree": "Q8_0",
    "w4a8": "Q4_0",
    "w4a8-int4": "Q4_0",
}
#: The variants compiled with TURBINE_CPU_INT8_MATMUL=iree.
_INT8_MATMUL_IREE = ("-iree", "-int4")
#: turbine_aot._compiler.quant_int8_matmuls.CPU_INT8_MATMUL_ENV (not imported: private)
INT8_MATMUL_ENV = "TURBINE_CPU_INT8_MATMUL"


def missing_requirements() -> str | None:
    """Why llama.cpp cannot run here (``None``: it can)."""
    try:
        import gguf  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError as e:
        return (
            f"{e.name or e} is not importable: pip install -r tools/requirements-bench-llm.txt "
            "(or nox -s bench-llm)"
        )
    return None


# ---------------------------------------------------------------------- HF -> GGUF


def rope_permute(w: Any, heads: int) -> Any:
    """HF's rotary layout of a Q / K projection's rows to GGML's.

    HF rotates halves: within a head of ``d`` rows, row ``i`` pairs with ``i + d/2``. GGML's
    llama rotates adjacent rows ``2i, 2i + 1``. Row ``(h, half, i)`` of HF becomes row
    ``(h, i, half)``.
    """
    rows = w.shape[0]
    d = rows // heads
    return w.reshape(heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope_theta(cfg: Any) -> float:
    theta = getattr(cfg, "rope_theta", None)
    if theta is None:
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return float(theta)


def _vocab(n: int) -> tuple[list[bytes], list[float], list[int]]:
    """A SentencePiece-style vocabulary of ``n`` tokens: ``<unk>``, ``<s>``, ``</s>``, the 256
    byte tokens llama.cpp looks up (``<0x0A>``: its newline), then placeholders."""
    import gguf

    tt = gguf.TokenType
    tokens = [b"<unk>", b"<s>", b"</s>"]
    types = [tt.UNKNOWN, tt.CONTROL, tt.CONTROL]
    tokens += [f"<0x{b:02X}>".encode() for b in range(256)]
    types += [tt.BYTE] * 256
    if n < len(tokens):
        raise ValueError(f"vocabulary of {n} tokens: needs at least {len(tokens)}")
    tokens += [f"tok{i}".encode() for i in range(len(tokens), n)]
    types += [tt.NORMAL] * (n - len(types))
    return tokens, [0.0] * n, [int(t) for t in types]


def write_gguf(model: Any, path: str | os.PathLike[str], weights: str = "F32") -> int:
    """Writes an HF ``LlamaForCausalLM``'s weights to a GGUF file llama.cpp loads.

    Args:
        model: the ``transformers`` Llama (fp32, not quantized).
        path: the ``.gguf`` to write.
        weights: ``"F32"``, ``"Q8_0"`` or ``"Q4_0"``: the type of every 2-D weight (embedding,
            projections, output); the RMS norms' weights stay F32.

    Returns:
        The file's size in bytes.
    """
    import gguf
    import numpy as np

    cfg = model.config
    qtype = gguf.GGMLQuantizationType[weights]
    file_type = {"F32": gguf.LlamaFileType.ALL_F32, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}.get(
        weights, gguf.LlamaFileType.MOSTLY_Q4_0
    )
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    w = gguf.GGUFWriter(os.fspath(path), "llama")
    w.add_name("turbine-random-llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(_rope_theta(cfg))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(file_type)
    tokens, scores, types = _vocab(cfg.vocab_size)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)

    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    out: list[tuple[str, Any]] = [("token_embd.weight", sd["model.embed_tokens.weight"])]
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                t = rope_permute(t, heads)
            elif gg == "attn_k":
                t = rope_permute(t, kv_heads)
            out.append((f"blk.{i}.{gg}.weight", t))
    out.append(("output_norm.weight", sd["model.norm.weight"]))
    lm_head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])  # tied: the embedding
    out.append(("output.weight", lm_head))
    for name, t in out:
        t = np.ascontiguousarray(t, dtype=np.float32)
        if t.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path).stat().st_size


def gguf_decode_read_bytes(path: str | os.PathLike[str]) -> int:
    """The tensor bytes a llama.cpp decode step of the GGUF at ``path`` reads: every tensor's,
    of the token embedding one row (:func:`_harness.decode_read_bytes`'s count for turbine)."""
    import gguf

    reader = gguf.GGUFReader(os.fspath(path))
    total = 0
    for t in reader.tensors:
        n = int(t.n_bytes)
        # GGUF's shape is (row length, rows): the embedding's rows are its last dimension
        total += n // int(t.shape[-1]) if t.name == "token_embd.weight" else n
    return total


# ---------------------------------------------------------------------- llama.cpp driver


class LlamaCpp:
    """A GGUF loaded by ``llama-cpp-python``, driven by token ids."""

    def __init__(self, path: str, threads: int, n_ctx: int) -> None:
        import llama_cpp

        self.llm = llama_cpp.Llama(
            model_path=path,
            n_ctx=n_ctx,
            n_batch=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        self.decode_ms: list[float] = []
        self.n_vocab = self.llm.n_vocab()

    def _argmax(self) -> int:
        """The last evaluated token's greedy successor (``Llama.eval`` keeps no logits unless
        ``logits_all``: read llama.cpp's last row in place)."""
        import numpy as np

        row = self.llm._ctx.get_logits_ith(-1)
        return int(np.argmax(np.ctypeslib.as_array(row, shape=(self.n_vocab,))))

    def logits_error(self, seq: list[int], ref: Any) -> float:
        """Relative RMS error of the logits, one token at a time along ``seq``, against
        ``ref`` (``[len(seq), vocab]``, HF eager fp32). A wrong rotary layout shows here
        (about 100x larger on the 2.5M model) even where greedy ids agree."""
        import numpy as np

        self.llm.reset()
        rows = []
        for t in seq:
            self.llm.eval([t])
            row = self.llm._ctx.get_logits_ith(-1)
            rows.append(np.ctypeslib.as_array(row, shape=(self.n_vocab,)).copy())
        got = np.stack(rows).astype(np.float64)
        return float(np.sqrt(((got - ref) ** 2).mean() / (ref.astype(np.float64) ** 2).mean()))

    def generate(self, prompt: list[int], n: int) -> list[int]:
        """Greedy: the prompt, then ``n`` tokens (the first from the prompt's logits)."""
        llm = self.llm
        llm.reset()
        llm.eval(prompt)
        out = [self._argmax()]
        self.decode_ms = []
        for _ in range(n - 1):
            t0 = time.perf_counter()
            llm.eval([out[-1]])
            out.append(self._argmax())
            self.decode_ms.append((time.perf_counter() - t0) * 1e3)
        return out


# ---------------------------------------------------------------------- the child


def run_child(name: str, threads: int, args: argparse.Namespace) -> dict:
    import llm_bench
    import torch

    torch.set_num_threads(threads)
    device = "local-sync" if threads == 1 else "local-task"
    if threads > 1:
        _harness.set_runtime_flags([f"--task_topology_max_group_count={threads}"])
    from turbine_aot import llm

    fp32 = llm_bench._build(name)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, fp32.config.vocab_size, (1, args.prompt), generator=g)
    n = args.new_tokens
    # the KV cache's positions: turbine's max_seq_len (its decode windows: "auto"), llama.cpp's
    # n_ctx; by default just what the prompt and the new tokens need
    context = args.max_seq_len or args.prompt + n + 8
    with torch.no_grad():
        eager = fp32.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )[0, args.prompt :].tolist()
    tmp = Path(tempfile.mkdtemp(prefix="turbine-llamacpp-"))
    res: dict = {
        "model": name,
        "threads": threads,
        "prompt": args.prompt,
        "new_tokens": n,
        "max_seq_len": context,
        "params_m": sum(p.numel() for p in fp32.parameters()) / 1e6,
        "eager_greedy": eager,
        "variants": {},
    }
    runners: dict[str, Any] = {}
    for weights in args.weights:
        model = fp32
        if weights != "fp32":
            scheme = weights.removesuffix("-iree").removesuffix("-int4")
            gs = args.group_size if scheme in ("int4", "w4a8") else None
            model = llm.quantized_copy(fp32, scheme, group_size=gs)
        t0 = time.perf_counter()
        eo = llm.export_causal_lm(model, max_seq_len=context)
        archive = tmp / f"{weights}.irpa"
        eo.save_parameters(archive)
        # IREE's integer matmul for the -iree / -int4 variants; the caller's setting for the rest
        int8_matmul = (
            "iree" if weights.endswith(_INT8_MATMUL_IREE) else os.environ.get(INT8_MATMUL_ENV)
        )
        with _harness.environment(INT8_MATMUL_ENV, int8_matmul):
            lm = llm.load(eo, device=device)
        tokens = lm.generate(prompt, n)[0, args.prompt :].tolist()
        res["variants"][f"turbine/{weights}"] = {
            "file_mib": archive.stat().st_size / 2**20,
            "read_mb": _harness.decode_read_bytes(model, archive) / 1e6,
            "compile_load_s": time.perf_counter() - t0,
            "greedy": tokens,
            "greedy_equal_eager": tokens == eager if weights == "fp32" else None,
        }
        runners[f"turbine/{weights}"] = lm
        if args.baseline_env:  # the same export compiled under the baseline's environment
            key, _, value = args.baseline_env.partition("=")
            with _harness.environment(key, value):
                base = llm.load(eo, device=device)
            base_tokens = base.generate(prompt, n)[0, args.prompt :].tolist()
            res["variants"][f"turbine-baseline/{weights}"] = {
                "file_mib": archive.stat().st_size / 2**20,
                "env": args.baseline_env,
                "greedy": base_tokens,
                "greedy_equal_eager": base_tokens == eager if weights == "fp32" else None,
                "greedy_equal_turbine": base_tokens == tokens,
            }
            runners[f"turbine-baseline/{weights}"] = base
        del eo
    ids = prompt[0].tolist()
    seq = ids + eager[:8]
    with torch.no_grad():
        ref = fp32(torch.tensor([seq])).logits[0].numpy()
    for gt in dict.fromkeys(WEIGHTS[w] for w in args.weights):  # each GGUF once
        path = tmp / f"{gt}.gguf"
        size = write_gguf(fp32, path, gt)
        lc = LlamaCpp(str(path), threads, n_ctx=context)
        tokens = lc.generate(ids, n)
        res["variants"][f"llama.cpp/{gt}"] = {
            "file_mib": size / 2**20,
            "read_mb": gguf_decode_read_bytes(path) / 1e6,
            "greedy": tokens,
            "greedy_equal_eager": tokens == eager if gt == "F32" else None,
            "logits_rel_rms_vs_hf_fp32": lc.logits_error(seq, ref),
        }
        runners[f"llama.cpp/{gt}"] = lc
    tps: dict[str, list[float]] = {k: [] for k in runners}
    t_start = time.perf_counter()
    for r in range(args.rounds + 1):
        for k, run in runners.items():
            if k.startswith(("turbine/", "turbine-baseline/")):
                run.generate(prompt, n)
                ms = statistics.fmean(run.timings.decode_ms)
            else:
                run.generate(ids, n)
                ms = statistics.fmean(run.decode_ms)
            if r:  # the first round warms up
                tps[k].append(1e3 / ms)
        if r >= 3 and time.perf_counter() - t_start > args.budget_s:
            break
    for k, v in tps.items():
        res["variants"][k]["decode_tokens_per_s"] = statistics.median(v) if v else float("nan")
        res["variants"][k]["rounds"] = v
    res["load_avg"] = os.getloadavg()
    res["read_bw_gbs"] = _harness.read_bandwidth_gbs(threads)
    return res


# ---------------------------------------------------------------------- report


def table(rows: list[dict]) -> str:
    head = (
        "| model | threads | weights (turbine / llama.cpp) | turbine tok/s | llama.cpp tok/s | "
        "turbine / llama.cpp | archive / GGUF (MiB) | read a step, turbine / llama.cpp (MB) | "
        "limit / turbine | limit / llama.cpp |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        v = r["variants"]
        for weights, gt in WEIGHTS.items():
            t, c = v.get(f"turbine/{weights}"), v.get(f"llama.cpp/{gt}")
            if not t or not c:
                continue
            tt, ct = t["decode_tokens_per_s"], c["decode_tokens_per_s"]
            # the fraction of the bandwidth limit: bytes read a second / the read bandwidth
            bw = r["read_bw_gbs"] * 1e3
            lines.append(
                f"| {r['model']} | {r['threads']} | {weights} / {gt} | {tt:.1f} | {ct:.1f} | "
                f"{tt / ct:.2f}x | {t['file_mib']:.1f} / {c['file_mib']:.1f} | "
                f"{t['read_mb']:.1f} / {c['read_mb']:.1f} | {tt * t['read_mb'] / bw:.2f} | "
                f"{ct * c['read_mb'] / bw:.2f} |"
            )
    base = [
        (r, w, r["variants"][f"turbine-baseline/{w}"], r["variants"][f"turbine/{w}"])
        for r in rows
        for w in WEIGHTS
        if f"turbine-baseline/{w}" in r["variants"]
    ]
    if base:
        lines += [
            "",
            "| model | threads | weights | baseline | turbine tok/s | baseline tok/s | "
            "turbine / baseline | same greedy |",
            "|" + "---|" * 8,
        ]
        for r, w, b, t in base:
            tt, bt = t["decode_tokens_per_s"], b["decode_tokens_per_s"]
            lines.append(
                f"| {r['model']} | {r['threads']} | {w} | {b['env']} | {tt:.1f} | {bt:.1f} | "
                f"{tt / bt:.2f}x | {b['greedy_equal_turbine']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    p.add_argument("--weights", nargs="*", default=list(WEIGHTS), choices=list(WEIGHTS))
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help="KV cache positions on both sides (turbine max_seq_len, llama.cpp n_ctx; default: "
        "prompt + new tokens + 8)",
    )
    p.add_argument(
        "--baseline-env",
        default=None,
        metavar="KEY=VALUE",
        help="also each turbine variant compiled with this environment variable set "
        "('turbine-baseline', e.g. TURBINE_CPU_MATMUL_PREFETCH=off), timed in the same rounds",
    )
    _harness.add_llm_run_arguments(p, prompt=8, timeout_s=900.0)
    args = p.parse_args(argv)
    if args.baseline_env is not None and "=" not in args.baseline_env:
        p.error(f"--baseline-env {args.baseline_env!r}: expected KEY=VALUE")
    why = missing_requirements()
    if why:
        print(f"[llama.cpp side-by-side] skipped: {why}", flush=True)
        return 0
    if args.child:
        _harness.write_json(args.child_json, run_child(args.child, args.child_threads, args))
        return 0
    rows = []
    for name in args.models:
        for threads in args.threads:
            print(f"[llama.cpp side-by-side] {name}, {threads} thread(s) ...", flush=True)
            child = _harness.run_llm_child(
                __file__,
                name,
                threads,
                args,
                ["--weights", *args.weights]
                + (["--max-seq-len", str(args.max_seq_len)] if args.max_seq_len else [])
                + (["--baseline-env", args.baseline_env] if args.baseline_env else []),
            )
            if child.result is None:
                print(f"[llama.cpp side-by-side] {name}/{threads}: {child.error}", flush=True)
                continue
            rows.append(child.result)
            print(json.dumps(child.result), flush=True)
    if rows:
        print()
        for r in rows:
            v = r["variants"]
            same = {
                k: x["greedy_equal_eager"]
                for k, x in v.items()
                if x["greedy_equal_eager"] is not None
            }
            print(
                f"{r['model']} {r['threads']}t: greedy == HF eager: {same}; load {r['load_avg']}; "
                f"read bandwidth {r['read_bw_gbs']:.1f} GB/s"
            )
        print(table(rows))
    if args.json:
        _harness.write_json(
            args.json,
            {
                "benchmark": "llama-cpp-side-by-side",
                "date": time.strftime("%Y-%m-%d"),
                "runs": rows,
            },
        )
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
