"""``turbine-aot demo``: the whole job on an embedded small transformer.

A GPT-style decoder (token + position embeddings, pre-LayerNorm blocks with causal self-attention
and a GELU MLP, tied LM head) is built with seeded random weights, its weights are externalized
and saved to an ``.irpa`` archive, the model is exported with ``turbine_aot.export``, compiled for
the host CPU through the compile cache, loaded with the archive, run, and checked against eager
PyTorch. A table of stage timings and the IREE vs eager latency follow.

Attention is written as matmul + mask + softmax + matmul: on CPU IREE runs that form much faster
than the fused ``scaled_dot_product_attention`` op (see PERF-NOTES).
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turbine_aot._compiler.flags import default_runtime_flags
from turbine_params import externalize_module_parameters, save_module_parameters

__all__ = ["DemoConfig", "build_demo_model", "run_demo"]


@dataclass(frozen=True)
class DemoConfig:
    vocab: int = 512
    d_model: int = 128
    heads: int = 4
    layers: int = 2
    seq: int = 32
    batch: int = 1


def build_demo_model(cfg: DemoConfig = DemoConfig()) -> Any:
    """The embedded transformer (an ``nn.Module`` in eval mode, seeded weights)."""
    import torch
    from torch import nn

    class Block(nn.Module):
        mask: torch.Tensor  # a registered buffer (nn.Module's __getattr__ types it loosely)

        def __init__(self) -> None:
            super().__init__()
            d = cfg.d_model
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc = nn.Linear(d, 4 * d)
            self.out = nn.Linear(4 * d, d)
            mask = torch.full((cfg.seq, cfg.seq), float("-inf")).triu(1)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            h, hd = cfg.heads, d // cfg.heads
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q = q.view(b, t, h, hd).transpose(1, 2)
            k = k.view(b, t, h, hd).transpose(1, 2)
            v = v.view(b, t, h, hd).transpose(1, 2)
            att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd)) + self.mask[:t, :t]
            y = att.softmax(dim=-1) @ v
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))

    class TinyGpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
            self.pos = nn.Embedding(cfg.seq, cfg.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.layers))
            self.ln_f = nn.LayerNorm(cfg.d_model)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            t = ids.shape[1]
            x = self.tok(ids) + self.pos.weight[:t]
            for blk in self.blocks:
                x = blk(x)
            return self.ln_f(x) @ self.tok.weight.t()  # tied LM head

    torch.manual_seed(0)
    return TinyGpt().eval()


def _interleaved_medians(fns: list[Any], *args: Any, repeat: int) -> list[float]:
    """Median seconds per call of each function, timed round-robin (one call of each per round)
    so that load changes on a shared machine hit all of them alike."""
    for fn in fns:
        fn(*args)  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn(*args)
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def run_demo(
    *,
    stages: Any,
    device: str = "local-task",
    workdir: str | Path | None = None,
    repeat: int = 20,
    cache: Any = True,
    cfg: DemoConfig = DemoConfig(),
    threads: int | None = None,
) -> dict[str, Any]:
    """Runs the demo; returns a JSON-able result (the caller prints it).

    Args:
        stages: a :class:`~turbine_aot._cli.progress.Stages` that times each stage.
        device: the IREE device to run on (``local-task`` compiles for the host CPU).
        workdir: where the ``.irpa`` and ``.vmfb`` are written (default: a temporary directory).
        repeat: timed calls for the latency medians.
        cache: the compile cache setting.
        threads: CPU threads for both eager (``torch.set_num_threads``) and IREE's
            ``local-task`` workers; ``None`` keeps each library's default. On a loaded machine
            torch's default threads can spin-wait against other processes: ``threads=1``
            compares like with like.
    """
    import torch

    import turbine_aot
    from turbine_aot import runtime as R

    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="turbine-demo-")
        workdir = tmp.name
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    runtime_flags: list[str] = []
    if threads is not None:
        torch.set_num_threads(threads)
        runtime_flags = default_runtime_flags(device, workers=threads)
    try:
        with stages("build model"):
            model = build_demo_model(cfg)
            ids = torch.randint(
                0, cfg.vocab, (cfg.batch, cfg.seq), generator=torch.Generator().manual_seed(1)
            )
            n_params = sum(p.numel() for p in model.parameters())
        stages.note("build model", f"{n_params / 1e6:.2f} M parameters")
        with stages("save weights"):
            externalize_module_parameters(model)
            irpa = work / "tiny_gpt.irpa"
            save_module_parameters(irpa, model)
        stages.note("save weights", f"{irpa.stat().st_size / 1e6:.1f} MB .irpa")
        with stages("export"):
            eo = turbine_aot.export(model, args=(ids,))
        cc = R.default_compile_cache() if cache is True else cache
        hits_before = cc.stats.hits if isinstance(cc, R.CompileCache) else 0
        with stages("compile"):
            vmfb = R.compile_export_output(eo, device=device, cache=cache)
            (work / "tiny_gpt.vmfb").write_bytes(vmfb)
        hit = isinstance(cc, R.CompileCache) and cc.stats.hits > hits_before
        stages.note("compile", f"{'cache hit' if hit else 'host CPU'}, {len(vmfb) / 1e3:.0f} kB")
        with stages("load"):
            m = R.load_module(
                vmfb,
                device=device,
                parameters=irpa,
                signatures=R.signatures_from_mlir(eo),
                runtime_flags=runtime_flags,
            )
        with stages("run + check"):
            report = R.check_numerics(m.main, model, ids)
        stages.note("run + check", "ok" if report.ok else "MISMATCH")
        with stages("benchmark"), torch.no_grad():
            t_iree, t_eager = _interleaved_medians([m.main, model], ids, repeat=repeat)
        load = (
            f", load avg {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
            if hasattr(os, "getloadavg")
            else ""
        )
        stages.note("benchmark", f"median of {repeat} interleaved calls each{load}")
        return {
            "model": {
                "name": "tiny-gpt",
                "parameters": n_params,
                "config": cfg.__dict__,
                "inputs": [f"{cfg.batch}x{cfg.seq}xi64"],
            },
            "device": device,
            "threads": threads,
            "compile_cache_hit": hit,
            "numerics": report.to_json(),
            "latency_ms": {"iree": 1e3 * t_iree, "eager": 1e3 * t_eager, "ratio": t_iree / t_eager},
            "artifacts": {"irpa": str(irpa), "vmfb": str(work / "tiny_gpt.vmfb")}
            if tmp is None
            else {},
            "report": str(report),
            "ok": report.ok,
        }
    finally:
        if tmp is not None:
            tmp.cleanup()
