"""Model benchmark: turbine (export -> IREE compile -> run) against eager PyTorch and AOTInductor.

Models are built in code with random weights (``benchmarks/_models.py``): an MLP 3×1024 (batch 8),
the ResNet-18 shape (1×3×224×224), a GPT-2-small shape (6 layers, d 512, seq 128) with static and
dynamic sequence, and the MLP and GPT in bf16 (``mlp-bf16``, ``gpt-bf16``: bf16 weights and
compute behind an fp32 interface). Each model runs in its own child process (so peak RSS figures are per model) and
is measured in one run: export time and peak RSS, compile time and peak RSS, module size, IREE
latency per compile variant, eager latency, AOTInductor latency, max abs error against eager.
Latencies are wall-clock time per call (what a caller waits for), medians of calls interleaved
round-robin with eager in the same process, with CPU time per call beside them (CPU time leaves
out the gaps in which the caller waits on IREE's workers, so it flatters IREE's multi-threaded
driver); the ratios hold on a busy machine even when absolute figures do not.

Compile variants (``--variants``):

* ``generic`` — portable CPU build, no data tiling (what a reference user gets by default);
* ``host`` — ``--iree-llvmcpu-target-cpu=host`` only;
* ``host-dt-uk`` — host + data tiling + ukernels;
* ``turbine`` — turbine's defaults: ``turbine_aot.export`` then ``ExportOutput.compile()`` with
  no arguments (``turbine_aot._compiler.flags.default_compile_flags``);
* ``attention-op`` — turbine's defaults *without* its linear decomposition and its CPU rewrite of
  attention (``extend_aot_decompositions(remove_ops=...)``, ``TURBINE_CPU_ATTENTION=keep``):
  IREE's own attention op and N-d linear, what the defaults bought
  (``benchmarks/NOTES-decompositions.md``); only for the models they change (GPT);
* ``export-sdpa`` — turbine's defaults with attention decomposed at export time
  (``extend_aot_decompositions(add_ops=[aten.scaled_dot_product_attention])``), the default
  before attention moved to compile time: it should time as ``turbine`` (GPT models only).

Usage::

    python benchmarks/models_bench.py                       # all models, CPU, default variants
    python benchmarks/models_bench.py --models gpt --variants turbine --threads 1
    python benchmarks/models_bench.py --device cuda --json out.json

It is a benchmark, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _harness

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

# "-bf16": the model in bf16 behind an fp32 interface (cuda_prebuilt._case), errors vs bf16 eager.
ALL_MODELS = ("mlp", "resnet18", "gpt", "gpt-dyn", "mlp-bf16", "gpt-bf16")
# Export-only cases, run when named in --models: the ~1.6e9-parameter bf16 Llama on meta.
EXPORT_ONLY_MODELS = ("llama-meta",)
ALL_VARIANTS = ("generic", "host", "host-dt-uk", "turbine", "attention-op", "export-sdpa")
# Variants that are an export choice compiled with turbine's default flags.
_EXPORT_VARIANTS = ("turbine", "attention-op", "export-sdpa")
ATTENTION_MODELS = ("gpt", "gpt-dyn")
# gpt-dyn: only turbine's default and eager by default (the static GPT covers the flag study).
DEFAULT_VARIANTS = {
    "gpt-dyn": ("turbine", "attention-op"),
    # bf16: turbine's defaults only (a generic CPU build emulates bf16: seconds per call).
    "mlp-bf16": ("turbine",),
    "gpt-bf16": ("turbine",),
}
# AOTInductor costs 30-100 s of compile per model on 2 cores: not for the dynamic GPT by default.
DEFAULT_AOTI = ("mlp", "resnet18", "gpt")


# ------------------------------------------------------------------------------------------ child
class _PeakRss:
    """Peak RSS (MiB) of this process while the ``with`` block runs (polled every 10 ms)."""

    def __enter__(self) -> _PeakRss:
        import psutil

        self._p = psutil.Process()
        self.base = self._p.memory_info().rss / 2**20
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._p.memory_info().rss / 2**20)
            self._stop.wait(0.01)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._p.memory_info().rss / 2**20)


# The "off" value of each optimisation flag turbine turns on by default, so that a variant can
# switch a default off through ExportOutput.compile's extra_args (which only replace or append).
_OFF = {
    "--iree-opt-data-tiling": ["--iree-opt-data-tiling=false"],
    "--iree-llvmcpu-enable-ukernels": ["--iree-llvmcpu-enable-ukernels=none"],
    "--iree-preprocessing-pass-pipeline": ["--iree-preprocessing-pass-pipeline="],
    "--iree-dispatch-creation-experimental-set-data-tiling-ops": [
        "--iree-dispatch-creation-experimental-set-data-tiling-ops=matmul",
        "--iree-dispatch-creation-experimental-set-data-tiling-ops=scaled_matmul",
    ],
}


def _variant_flags(variant: str, target: str) -> tuple[bool, list[str]]:
    """(host_cpu, extra_args) for ``ExportOutput.compile`` giving exactly this variant's flags."""
    from turbine_aot._compiler.flags import default_compile_flags

    if variant in _EXPORT_VARIANTS or target != "llvm-cpu":
        return True, []
    # The reference's flag sets: no channels-last conversion (that one is turbine's own).
    options = {
        "generic": dict(host=False, fast_matmul=False),
        "host": dict(host=True, fast_matmul=False),
        "host-dt-uk": dict(host=True, fast_matmul=True),
    }
    if variant not in options:
        raise SystemExit(f"unknown variant {variant!r}; choose from {', '.join(ALL_VARIANTS)}")
    opts = options[variant]
    wanted = default_compile_flags(target, channels_last_conv=False, use_env=False, **opts)
    keys = {f.split("=", 1)[0] for f in wanted}
    extra = list(wanted)
    for f in default_compile_flags(target, use_env=False):
        key = f.split("=", 1)[0]
        if key not in keys and key in _OFF:
            extra += _OFF[key]
            keys.add(key)
    return bool(opts["host"]), extra


def _build_case(model: str):
    import _models

    if model == "mlp":
        return _models.mlp()
    if model == "resnet18":
        return _models.resnet18()
    if model == "gpt":
        return _models.gpt()
    if model == "gpt-dyn":
        return _models.gpt(dynamic=True)
    if model == "llama-meta":
        return _models.llama_meta()
    if model.endswith(("-bf16", "-f16")):
        import cuda_prebuilt

        return cuda_prebuilt._case(model)
    raise SystemExit(f"unknown model {model!r}; choose from {', '.join(ALL_MODELS)}")


def _max_err(a: Any, b: Any) -> float:
    return float((a.detach().float().cpu() - b.detach().float().cpu()).abs().max())


def _aoti(case, device: str, td: str, row: dict) -> Any:
    """Builds an AOTInductor package; returns a callable or None (reason in ``row``)."""
    import torch

    try:
        t0 = time.perf_counter()
        ep = torch.export.export(case.module, case.args, dynamic_shapes=case.dynamic_shapes)
        path = torch._inductor.aoti_compile_and_package(ep, package_path=str(Path(td, "m.pt2")))
        row["aoti_compile_s"] = time.perf_counter() - t0
        return torch._inductor.aoti_load_package(path)
    except Exception as e:  # report why AOTI could not build
        row["aoti_note"] = f"AOTInductor did not build: {type(e).__name__}: {str(e)[:300]}"
        return None


def run_export_only(model: str) -> dict:
    """Export time and peak RSS of a model on the meta device (parameters externalized)."""
    import turbine_aot

    case = _build_case(model)
    turbine_aot.externalize_module_parameters(case.module)
    with _PeakRss() as rss:
        t0 = time.perf_counter()
        eo = turbine_aot.export(case.module, args=case.args)
        export_s = time.perf_counter() - t0
        text_bytes = len(str(eo.mlir_module))
    return {
        "model": case.name,
        "export_only": True,
        "params": sum(p.numel() for p in case.module.parameters()),
        "dtype": "bfloat16",
        "export_s": export_s,
        "export_peak_rss_mb": rss.peak,
        "export_rss_delta_mb": rss.peak - rss.base,
        "mlir_bytes": text_bytes,
    }


def run_child(args: argparse.Namespace) -> dict:
    import _harness
    import torch

    import turbine_aot
    from turbine_aot import runtime

    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    on_cuda = args.device == "cuda"
    target = "cuda" if on_cuda else "llvm-cpu"
    driver = "cuda" if on_cuda else ("local-sync" if threads == 1 else "local-task")
    if not on_cuda and threads > 1:
        runtime_flags = [f"--task_topology_max_group_count={threads}"]
    else:
        runtime_flags = []

    case = _build_case(args.child)
    dev = torch.device("cuda" if on_cuda else "cpu")
    module = case.module.to(dev)
    inputs = tuple(a.to(dev) for a in case.args)
    result: dict[str, Any] = {
        "model": case.name,
        "device": args.device,
        "threads": threads,
        "driver": driver,
        "params": sum(p.numel() for p in module.parameters()),
        "dtype": "float32",
        "variants": {},
    }
    with torch.no_grad():
        ref = module(*inputs)

    # Export (turbine's path). Parameters stay inline: the module is self-contained.
    export_case = case  # exported from CPU tensors; the target decides where it runs
    with _PeakRss() as rss:
        t0 = time.perf_counter()
        eo = turbine_aot.export(
            export_case.module.cpu(),
            args=export_case.args,
            dynamic_shapes=export_case.dynamic_shapes,
        )
        result["export_s"] = time.perf_counter() - t0
    result["export_peak_rss_mb"] = rss.peak
    result["export_rss_delta_mb"] = rss.peak - rss.base
    module = module.to(dev)

    variants = list(args.variants or DEFAULT_VARIANTS.get(args.child, ALL_VARIANTS))
    if on_cuda:
        variants = [v for v in variants if v in _EXPORT_VARIANTS]
    if args.child not in ATTENTION_MODELS:
        variants = [v for v in variants if v not in ("attention-op", "export-sdpa")]
    exports = {"turbine": eo}
    if "attention-op" in variants:
        import torch as _torch

        aten = _torch.ops.aten
        with _PeakRss():
            t0 = time.perf_counter()
            with turbine_aot.extend_aot_decompositions(
                remove_ops=[aten.scaled_dot_product_attention, aten.linear]
            ):
                exports["attention-op"] = turbine_aot.export(
                    case.module.cpu(), args=case.args, dynamic_shapes=case.dynamic_shapes
                )
            result["export_attention_op_s"] = time.perf_counter() - t0
        module = module.to(dev)
    if "export-sdpa" in variants:
        import torch as _torch

        with turbine_aot.extend_aot_decompositions(
            add_ops=[_torch.ops.aten.scaled_dot_product_attention]
        ):
            exports["export-sdpa"] = turbine_aot.export(
                case.module.cpu(), args=case.args, dynamic_shapes=case.dynamic_shapes
            )
        module = module.to(dev)
    calls: dict[str, Any] = {}
    td = tempfile.mkdtemp(prefix="turbine-bench-")
    for v in variants:
        row: dict[str, Any] = {}
        result["variants"][v] = row
        host_cpu, extra = _variant_flags(v, target)
        path = Path(td, f"{v}.vmfb")
        try:
            with _PeakRss() as rss:
                t0 = time.perf_counter()
                if v == "attention-op":  # IREE's attention op on CPU too
                    os.environ["TURBINE_CPU_ATTENTION"] = "keep"
                try:
                    exports.get(v, eo).compile(
                        save_to=path, target_device=target, host_cpu=host_cpu, extra_args=extra
                    )
                finally:
                    os.environ.pop("TURBINE_CPU_ATTENTION", None)
                row["compile_s"] = time.perf_counter() - t0
            row["compile_peak_rss_mb"] = rss.peak
            row["module_bytes"] = path.stat().st_size
            m = runtime.load_module(path, device=driver, runtime_flags=runtime_flags)
            out = m.main(*inputs)
            row["max_abs_err"] = _max_err(out, ref)
            fn = m.main
            calls[v] = lambda fn=fn: fn(*inputs)
        except Exception as e:  # a failed variant is a figure too
            row["error"] = f"{type(e).__name__}: {str(e)[:500]}"

    def eager() -> None:
        with torch.no_grad():
            module(*inputs)
        if on_cuda:
            torch.cuda.synchronize()

    calls["eager"] = eager
    if args.aoti and (args.child in DEFAULT_AOTI or args.models_explicit):
        row = {}
        fn = _aoti(case if not on_cuda else _on(case, dev), args.device, td, row)
        result["aoti"] = row
        if fn is not None:
            with torch.no_grad():
                row["max_abs_err"] = _max_err(fn(*inputs), ref)

            def aoti(fn=fn) -> None:
                with torch.no_grad():
                    fn(*inputs)

            calls["aoti"] = aoti
    else:
        result["aoti"] = {"aoti_note": "skipped (not requested for this model)"}

    timings = _harness.time_interleaved(calls, calls=args.calls, budget_s=args.budget_s)
    for k, v in timings.items():
        entry = result["variants"].get(k) if k in result["variants"] else None
        if k == "eager":
            result["eager_ms"] = v["wall"] * 1e3
            result["eager_cpu_ms"] = v["cpu"] * 1e3
        elif k == "aoti":
            result["aoti"]["ms"] = v["wall"] * 1e3
            result["aoti"]["cpu_ms"] = v["cpu"] * 1e3
        elif entry is not None:
            entry["ms"] = v["wall"] * 1e3
            entry["cpu_ms"] = v["cpu"] * 1e3
    result["rounds"] = min(len(x["all"]) for x in timings.values())
    result["loadavg_1m"] = os.getloadavg()[0]
    return result


def _on(case, dev):
    import _models

    return _models.ModelCase(
        case.name,
        case.module.to(dev),
        tuple(a.to(dev) for a in case.args),
        case.dynamic_shapes,
        case.atol,
    )


# ----------------------------------------------------------------------------------------- parent
def _fmt_ms(x: float | None) -> str:
    return "–" if x is None else (f"{x:.2f}" if x < 100 else f"{x:.0f}")


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if not a or not b else f"{a / b:.2f}×"


def print_table(results: list[dict], file=sys.stdout) -> None:
    """Prints one line per model: latency per variant and its ratio to eager (and AOTI)."""
    variants = [v for v in ALL_VARIANTS if any(v in r.get("variants", {}) for r in results)]
    head = ["model", "thr", *[f"{v} wall ms (×eager; CPU ×eager)" for v in variants]]
    head += ["eager wall ms", "AOTI wall ms"]
    head += ["turbine ×AOTI", "attention-op ×AOTI", "max err"]
    rows = [head]
    export_only = [r for r in results if r.get("export_only")]
    results = [r for r in results if not r.get("export_only")]
    for r in results:
        if "error" in r:
            rows.append([r.get("model", "?"), "", f"ERROR: {r['error'][:80]}"])
            continue
        eager = r.get("eager_ms")
        aoti = r.get("aoti", {}).get("ms")
        cells = [r["model"], str(r["threads"])]
        for v in variants:
            row = r["variants"].get(v)
            if row is None:
                cells.append("")
            elif "error" in row:
                cells.append("failed")
            else:
                wall = _ratio(row.get("ms"), eager)
                cpu = _ratio(row.get("cpu_ms"), r.get("eager_cpu_ms"))
                cells.append(f"{_fmt_ms(row.get('ms'))} ({wall}; CPU {cpu})")
        t = r["variants"].get("turbine", {})
        tp = r["variants"].get("attention-op", {})
        cells += [_fmt_ms(eager), _fmt_ms(aoti), _ratio(t.get("ms"), aoti)]
        cells.append(_ratio(tp.get("ms"), aoti) if tp else "")
        errs = [row["max_abs_err"] for row in (t, tp) if "max_abs_err" in row]
        cells.append(f"{max(errs):.1e}" if errs else "")
        rows.append(cells)
    widths = [
        max(len(str(row[i])) if i < len(row) else 0 for row in rows) for i in range(len(head))
    ]
    for row in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)), file=file)
    print(file=file)
    for r in results:
        if "error" in r:
            continue
        extra = [
            f"export {r['export_s']:.1f}s peak {r['export_peak_rss_mb']:.0f}MiB",
        ]
        t = r["variants"].get("turbine")
        if t and "compile_s" in t:
            extra.append(
                f"compile(turbine) {t['compile_s']:.1f}s peak {t['compile_peak_rss_mb']:.0f}MiB"
                f" vmfb {t['module_bytes'] / 2**20:.1f}MiB"
            )
        cpu = [
            f"{v} {row['cpu_ms']:.1f}ms ({row['cpu_ms'] / r['eager_cpu_ms']:.2f}×)"
            for v, row in r["variants"].items()
            if "cpu_ms" in row
        ]
        if cpu:
            extra.append(f"cpu-time/call: {', '.join(cpu)}, eager {r['eager_cpu_ms']:.1f}ms")
        a = r.get("aoti", {})
        if "aoti_compile_s" in a:
            extra.append(f"AOTI compile {a['aoti_compile_s']:.0f}s")
        if "aoti_note" in a:
            extra.append(a["aoti_note"][:100])
        for v, row in r["variants"].items():
            if "error" in row:
                extra.append(f"{v} failed: {row['error'][:160]}")
        extra.append(f"load {r['loadavg_1m']:.1f}, {r['rounds']} rounds")
        print(f"  {r['model']}: " + "; ".join(extra), file=file)
    for r in export_only:
        print(
            f"  {r['model']} ({r['params'] / 1e9:.2f}e9 {r['dtype']} params, meta device, "
            f"externalized): export {r['export_s']:.1f}s, peak RSS {r['export_peak_rss_mb']:.0f}MiB "
            f"(+{r['export_rss_delta_mb']:.0f}), MLIR {r['mlir_bytes'] / 2**20:.1f}MiB",
            file=file,
        )


def markdown_table(results: list[dict], *, cpu: bool = False) -> str:
    """A markdown table of the results: ms per call (× eager) per variant, eager, AOTI.

    ``cpu=True`` uses CPU time per call instead of wall time.
    """
    key = "cpu_ms" if cpu else "ms"
    ekey = "eager_cpu_ms" if cpu else "eager_ms"
    variants = [v for v in ALL_VARIANTS if any(v in r.get("variants", {}) for r in results)]
    head = [
        "model",
        *variants,
        "eager",
        "AOTI",
        "turbine ×AOTI",
        "attention-op ×AOTI",
        "max abs err",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if r.get("export_only") or "error" in r:
            continue
        eager = r.get(ekey)
        a = r.get("aoti", {})
        aoti = a.get(key)
        cells = [r["model"]]
        for v in variants:
            row = r["variants"].get(v)
            if row is None:
                cells.append("")
            elif "error" in row:
                cells.append("compile failed")
            else:
                cells.append(f"{_fmt_ms(row.get(key))} ({_ratio(row.get(key), eager)})")
        best = r["variants"].get("turbine", {})
        errs = [row["max_abs_err"] for row in r["variants"].values() if "max_abs_err" in row]
        prop = r["variants"].get("attention-op", {})
        cells += [_fmt_ms(eager), _fmt_ms(aoti), _ratio(best.get(key), aoti)]
        cells.append(_ratio(prop.get(key), aoti) if prop else "")
        cells.append(f"{max(errs):.1e}" if errs else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _child_cmd(model: str, args: argparse.Namespace, out: str) -> list[str]:
    cmd = [sys.executable, str(Path(__file__)), "--child", model, "--child-json", out]
    cmd += ["--calls", str(args.calls), "--budget-s", str(args.budget_s), "--device", args.device]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.variants:
        cmd += ["--variants", ",".join(args.variants)]
    if not args.aoti:
        cmd.append("--no-aoti")
    if args.models_explicit:
        cmd.append("--models-explicit")
    return cmd


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument(
        "--models",
        default=",".join(ALL_MODELS),
        help=f"comma list of {', '.join(ALL_MODELS + EXPORT_ONLY_MODELS)}",
    )
    p.add_argument("--variants", default=None, help=f"comma list of {', '.join(ALL_VARIANTS)}")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int, default=0, help="0: all cores; 1: local-sync + 1 thread")
    p.add_argument("--calls", type=int, default=20, help="timed calls per candidate")
    p.add_argument("--budget-s", type=float, default=20.0, help="timing budget per model")
    p.add_argument("--no-aoti", dest="aoti", action="store_false", help="skip AOTInductor")
    p.add_argument("--timeout-s", type=float, default=420.0, help="per-model child timeout")
    p.add_argument("--json", default=None, help="write results here")
    p.add_argument("--report", default=None, help="print the tables of a --json file and exit")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    p.add_argument("--models-explicit", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.variants = args.variants.split(",") if args.variants else None
    if args.report:
        results = json.loads(Path(args.report).read_text())["results"]
        print_table(results)
        print("\nwall time per call:\n" + markdown_table(results))
        print("\nCPU time per call:\n" + markdown_table(results, cpu=True))
        return 0
    if args.child:
        res = run_export_only(args.child) if args.child in EXPORT_ONLY_MODELS else run_child(args)
        _harness.write_json(args.child_json, res)
        return 0

    models = [m for m in args.models.split(",") if m]
    args.models_explicit = args.models != ",".join(ALL_MODELS)
    results: list[dict] = []
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="turbine-bench-") as td:
        for model in models:
            out = str(Path(td, f"{model}.json"))
            t0 = time.perf_counter()
            print(f"[models_bench] {model} ...", flush=True)
            child = _harness.run_json_child(
                _child_cmd(model, args, out), out, timeout=args.timeout_s
            )
            if child.result is not None and child.rc == 0:
                results.append(child.result)
            else:
                results.append({"model": model, "error": child.error or "no result"})
            results[-1]["wall_s"] = time.perf_counter() - t0
            print(f"[models_bench] {model} done in {results[-1]['wall_s']:.0f}s", flush=True)
    print()
    print_table(results)
    print(f"\n[models_bench] total {time.perf_counter() - t_all:.0f}s")
    if args.json:
        _harness.write_json(Path(args.json), {"benchmark": "models", "results": results})
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
