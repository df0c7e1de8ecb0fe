"""Where a decode step's time goes: one LLM decode step per dispatch, by kind, against its wall time.

For a model of ``llm_bench.MODELS`` (default the ~110M Llama) and each weight variant (fp32,
torchao int8 / int4 / w8a8 / w4a8, as ``llama_cpp_side_by_side.py`` builds them): export with
``llm.export_causal_lm``, compile with turbine's defaults, then run the ``decode`` function
alone in ``iree-benchmark-module`` (``local-sync`` for one thread, ``local-task`` with N
workers otherwise; the KV cache is the module's global, the position fixed):

* the step's wall time (a run without profiling; with two threads or more the tool runs under
  ``SCHED_BATCH``, as turbine's runtime runs its calls);
* from a run with ``--device_profiling_mode=host-execution`` (``iree-profile statistics``), per
  step: that run's wall time, the command buffer's execution (what is left of the wall time is
  the call around it: the queue's allocations and waits, the VM), the sum of its dispatches
  (what is left of the execution is the time between dispatches), and the dispatches by kind:
  the weight products (turbine's kernels and IREE's matmuls whose operand is a weight), the
  attention products, the int4 rows prepared once per call, and IREE's own dispatches (norms,
  RoPE, softmax, cache writes, ...);
* the weight bytes a step reads (the archive's entries the products read) and the rate the
  products read them at.

So "the step is N % slower than llama.cpp" splits into the products' own speed (GB/s of
weights, comparable with llama.cpp's whole-step rate) and everything around them
(docs/quantization.md, "Where a decode step's time goes").

Usage::

    python benchmarks/llm_step_profile.py --weights int4 --threads 1 2
    python benchmarks/llm_step_profile.py --weights fp32 int8 int4 --json out.json

A measurement, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _p in (HERE, HERE.parent / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _harness  # noqa: E402
from peer_profile import _STAT, _UNIT, _runtime_tool, profile_statistics  # noqa: E402

WEIGHTS = ("fp32", "int8", "int4", "w8a8", "w4a8")
_REAL = re.compile(r"BM_decode/process_time/real_time\s+([\d.]+) (ms|us)")
_QUEUE = re.compile(
    r"host_execute_queue \S+ \S+ (\w+)\s+count=(\d+)\s+total=([\d.]+) (ns|us|ms|s)\b"
)


def kind_of(name: str) -> str:
    """The kind of a dispatch, by its executable's name."""
    if name.startswith("__turbine_avx2_i4_row"):
        return "int4 rows prepared"
    if name.startswith(("__turbine_f32_dot_gemm", "__turbine_f32_dyn_gemm")):
        return "attention products"
    if name.startswith("__turbine_") and ("gemm" in name or "gemv" in name):  # AMX: gemv
        return "weight products"
    if re.search(r"matmul|mmt4d", name):
        return "IREE products"
    return "IREE other"


def _benchmark(vmfb: Path, irpa: Path, threads: int, steps: int, profile: Path | None) -> str:
    cmd = [
        _runtime_tool("iree-benchmark-module"),
        f"--module={vmfb}",
        f"--parameters=model={irpa}",
        "--function=decode",
        "--input=1x1xi64=5",
        "--input=1xi64=20",
        f"--device={'local-sync' if threads == 1 else 'local-task'}",
        f"--benchmark_min_time={steps}x",
    ]
    if threads > 1:
        cmd.append(f"--task_topology_max_group_count={threads}")
    if profile is not None:
        cmd += ["--device_profiling_mode=host-execution", f"--device_profiling_output={profile}"]
    return subprocess.run(
        cmd,
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
        preexec_fn=_batch if threads > 1 else None,
    ).stdout


def _batch() -> None:
    """The tool's threads under ``SCHED_BATCH``, as turbine's runtime runs its calling thread
    on ``local-task`` (docs/running.md, "The calling thread during a call"): without it the
    tool's caller, woken onto a worker's core, waits out a scheduler tick (two threads: 4.2-4.5
    ms a step of the int4 Llama against 3.5-3.7)."""
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def _ms(value: str, unit: str) -> float:
    return float(value) * _UNIT[unit]


def profile_step(vmfb: Path, irpa: Path, threads: int, steps: int, td: Path) -> dict[str, Any]:
    """The step's wall ms and its profile per step (ms), by kind and by queue operation."""
    wall = _REAL.search(_benchmark(vmfb, irpa, threads, steps, None))
    prof = td / f"step-{threads}.ireeprof"
    profiled = _REAL.search(_benchmark(vmfb, irpa, threads, steps, prof))
    stats = profile_statistics(prof)
    queue = {m.group(1): _ms(m.group(3), m.group(4)) / steps for m in _QUEUE.finditer(stats)}
    kinds: dict[str, float] = collections.defaultdict(float)
    top: dict[str, float] = {}
    for m in _STAT.finditer(stats):
        name, _count, total, unit = m.groups()
        ms = _ms(total, unit) / steps
        kinds[kind_of(name)] += ms
        top[name] = ms
    return {
        "threads": threads,
        "wall_ms": _ms(*wall.groups()) if wall else None,
        "profiled_wall_ms": _ms(*profiled.groups()) if profiled else None,
        "execute_ms": queue.get("execute"),
        "dispatch_ms": queue.get("dispatch"),
        "queue_ms": queue,
        "kinds_ms": dict(kinds),
        "top": dict(sorted(top.items(), key=lambda kv: -kv[1])[:12]),
    }


def export_variant(
    name: str, weights: str, group_size: int = 128, max_seq_len: int = 48
) -> tuple[Any, Any]:
    """``(model, export)``: the model of ``llm_bench.MODELS`` from seed 0 with ``weights``
    (``llm.quantized_copy``, int4 / w4a8 in groups of ``group_size``), as
    ``llama_cpp_side_by_side.py`` makes it, exported by ``llm.export_causal_lm``."""
    import llm_bench
    import torch

    from turbine_aot import llm

    torch.manual_seed(0)
    model = llm_bench._build(name)
    if weights != "fp32":
        gs = group_size if weights in ("int4", "w4a8") else None
        model = llm.quantized_copy(model, weights, group_size=gs)
    return model, llm.export_causal_lm(model, max_seq_len=max_seq_len)


def run_variant(name: str, weights: str, args: argparse.Namespace, td: Path) -> dict:
    model, eo = export_variant(name, weights, args.group_size, args.max_seq_len)
    irpa, vmfb = td / f"{weights}.irpa", td / f"{weights}.vmfb"
    eo.save_parameters(irpa)
    eo.compile(save_to=vmfb)
    del eo
    nbytes = _harness.decode_read_bytes(model, irpa)
    row: dict[str, Any] = {"model": name, "weights": weights, "weight_bytes": nbytes, "runs": []}
    for threads in args.threads:
        r = profile_step(vmfb, irpa, threads, args.steps, td)
        products = r["kinds_ms"].get("weight products", 0.0) + r["kinds_ms"].get(
            "IREE products", 0.0
        )
        r["products_gbs"] = nbytes / products / 1e6 if products else None
        r["step_gbs"] = nbytes / r["wall_ms"] / 1e6 if r["wall_ms"] else None
        row["runs"].append(r)
        print(report_line(row, r), flush=True)
    return row


def report_line(row: dict, r: dict) -> str:
    k = r["kinds_ms"]
    parts = ", ".join(f"{n} {v:.3f}" for n, v in sorted(k.items(), key=lambda kv: -kv[1]))
    inside = (r["execute_ms"] or 0) - (r["dispatch_ms"] or 0)
    outside = (r["profiled_wall_ms"] or 0) - (r["execute_ms"] or 0)
    return (
        f"[step] {row['model']} {row['weights']} x{r['threads']}: wall {r['wall_ms']:.3f} ms, "
        f"execute {r['execute_ms']:.3f} (dispatches {r['dispatch_ms']:.3f}: {parts}; between "
        f"dispatches {inside:.3f}); outside the execute {outside:.3f} (of the profiled run's "
        f"{r['profiled_wall_ms']:.3f}); weights "
        f"{row['weight_bytes'] / 2**20:.1f} MiB a step: products read {r['products_gbs']:.2f} "
        f"GB/s, the whole step {r['step_gbs']:.2f} GB/s"
    )


def main(argv: list[str] | None = None) -> int:
    import llm_bench

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-110m", choices=list(llm_bench.MODELS))
    p.add_argument("--weights", nargs="*", default=["int4"], choices=list(WEIGHTS))
    p.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--max-seq-len", type=int, default=48)
    p.add_argument("--steps", type=int, default=300, help="decode calls per benchmark run")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="turbine-step-") as tmp:
        for weights in args.weights:
            rows.append(run_variant(args.model, weights, args, Path(tmp)))
    if args.json:
        _harness.write_json(
            args.json, {"rows": rows, "cpu": platform.processor() or platform.machine()}
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
