"""Export speed and memory of a Llama-shaped decoder with meta-device, externalized weights.

Measures, interleaved in one process (medians over rounds):

* baseline: ``torch.export.export(module)`` alone;
* turbine_fx: ``torch.export.export`` + ``turbine_fx.import_exported_program`` into a
  ``ModuleBuilder`` (with the current AOT decompositions) + printing the module;
* turbine_aot: ``turbine_aot.export(module)`` when that exists and accepts the model.

and reports each as a ratio to the baseline (goal: ≤ 1.3×), plus the peak RSS of the process
(goal: < 1 GB although the model has ~29 billion parameters: weights live on the meta device and
are externalized, so no data is ever materialized).

Run: ``python benchmarks/fx_export_bench.py [--layers 32] [--rounds 2]``.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time

import _harness


def _build_model(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.head_dim = hidden // heads
            self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
            self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
            self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
            self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            q = self.q_proj(x).view(b, t, heads, self.head_dim).transpose(1, 2)
            k = self.k_proj(x).view(b, t, kv_heads, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, t, kv_heads, self.head_dim).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return self.o_proj(a.transpose(1, 2).reshape(b, t, hidden))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(hidden, ffn, bias=False)
            self.up_proj = nn.Linear(hidden, ffn, bias=False)
            self.down_proj = nn.Linear(ffn, hidden, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = nn.RMSNorm(hidden, eps=1e-5)
            self.self_attn = Attention()
            self.post_attention_layernorm = nn.RMSNorm(hidden, eps=1e-5)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, hidden)
            self.layers = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.RMSNorm(hidden, eps=1e-5)
            self.lm_head = nn.Linear(hidden, vocab, bias=False)

        def forward(self, ids):
            x = self.embed_tokens(ids)
            for layer in self.layers:
                x = layer(x)
            return self.lm_head(self.norm(x))

    with torch.device("meta"):
        return Llama()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> int:
    parser = _harness.argument_parser(__doc__)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--ffn", type=int, default=28672)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--strict", action="store_true", help="also measure strict (TorchDynamo) export paths"
    )
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    import torch

    from turbine_fx import import_exported_program
    from turbine_ir import ModuleBuilder
    from turbine_ir.ir import Context, Location, Module
    from turbine_params import externalize_module_parameters

    model = _build_model(args.layers, args.hidden, args.heads, args.kv_heads, args.ffn, args.vocab)
    externalize_module_parameters(model)
    n_params = sum(p.numel() for p in model.parameters())
    ids = torch.zeros(1, args.seq, dtype=torch.int64, device="meta")
    print(
        f"fx_export_bench: Llama-shaped decoder, {args.layers} layers, hidden {args.hidden}, "
        f"{n_params / 1e9:.1f} B parameters on the meta device (externalized), seq {args.seq}"
    )

    def baseline():
        torch.export.export(model, (ids,), strict=False)

    def baseline_strict():
        torch.export.export(model, (ids,), strict=True)

    def turbine_fx_path():
        ep = torch.export.export(model, (ids,), strict=False)
        with Context(), Location.unknown():
            module = Module.create()
            mb = ModuleBuilder(module.operation)
            import_exported_program(mb, ep, symbol_name="main")
            text = str(module)
        assert "#flow.parameter.named" in text and "dense_resource" not in text
        return text

    candidates = {
        "torch.export (strict=False)": baseline,
        "torch.export + turbine_fx import": turbine_fx_path,
    }
    baselines = {"torch.export + turbine_fx import": "torch.export (strict=False)"}
    if args.strict:
        candidates["torch.export (strict=True)"] = baseline_strict
    try:
        import turbine_aot

        if hasattr(turbine_aot, "export"):

            def aot_export_nonstrict():
                out = turbine_aot.export(model, args=(ids,), strict_export=False)
                str(out.mlir_module)

            candidates["turbine_aot.export(strict_export=False)"] = aot_export_nonstrict
            baselines["turbine_aot.export(strict_export=False)"] = "torch.export (strict=False)"
            if args.strict:

                def aot_export():
                    out = turbine_aot.export(model, args=(ids,))
                    str(out.mlir_module)

                candidates["turbine_aot.export (strict)"] = aot_export
                baselines["turbine_aot.export (strict)"] = "torch.export (strict=True)"
    except Exception as e:  # pragma: no cover - optional layer
        print(f"  (turbine_aot.export not measured: {e})")

    # Warm up once each (first torch.export pays one-time import/registration costs).
    failed: set[str] = set()
    for name, fn in candidates.items():
        try:
            fn()
        except Exception as e:
            print(f"  {name}: failed ({type(e).__name__}: {e}); not measured")
            failed.add(name)
    times: dict[str, list[float]] = {n: [] for n in candidates if n not in failed}
    for _ in range(args.rounds):
        for name in times:
            t0 = time.perf_counter()
            candidates[name]()
            times[name].append(time.perf_counter() - t0)

    for name, ts in times.items():
        med = statistics.median(ts)
        base_name = baselines.get(name)
        if base_name in times:
            ratio = med / statistics.median(times[base_name])
            print(f"  {name:42s} {med:7.2f} s   {ratio:5.2f}x {base_name}")
        else:
            print(f"  {name:42s} {med:7.2f} s")
    rss = _peak_rss_mb()
    print(f"  peak RSS of the whole run: {rss:.0f} MiB (goal < 1024 MiB)")
    if args.json:
        data = {
            "benchmark": "fx_export",
            "layers": args.layers,
            "parameters": n_params,
            "median_s": {n: statistics.median(ts) for n, ts in times.items()},
            "ratios": {
                n: statistics.median(ts) / statistics.median(times[baselines[n]])
                for n, ts in times.items()
                if baselines.get(n) in times
            },
            "peak_rss_mib": rss,
        }
        _harness.write_json(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
