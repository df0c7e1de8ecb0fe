"""turbine against the CPU runtimes users pick instead: ONNX Runtime, OpenVINO, AOTInductor, eager.

``nox -s bench-peers`` runs this. For each thread count (default 1 and 2) one child process builds
every runtime once per model (build time reported; turbine's module and the ONNX file are built
by the first child and reused by the next, AOTInductor is rebuilt per thread count because its
OpenMP threads are fixed at compile time), checks each one's outputs against eager (max abs
error; a runtime that fails to build or run is reported with its error, not left out), then times
all of them interleaved in that process (median wall time per call): each round calls each
runtime ``--block`` times in a row (default 5) and times all but the first, the order rotating
from round to round, after a pause of ``--gap-ms`` (``_harness.time_interleaved``: a runtime
called right after another pays for the other's threads still spinning; ``--block 1 --gap-ms 0``
is strict round-robin). Threads are the
same everywhere: ``torch.set_num_threads`` (eager, AOTInductor), ORT ``intra_op_num_threads``,
OpenVINO ``INFERENCE_NUM_THREADS``, IREE task workers (``local-sync`` for one thread).

The table's ratio column is turbine's latency over the faster fp32 peer (ONNX Runtime or
OpenVINO with ``INFERENCE_PRECISION_HINT=f32``): below 1.00 turbine is faster. OpenVINO's default
precision (bf16 where the CPU has it) is a column of its own, with its error against eager, and
so is ``turbine-bf16`` (``compile(precision="bf16")``, AMX CPUs only), with its ratio to it.
``turbine-prepared`` is the same module as ``turbine`` called as the peers are (inputs prepared
once, numpy results; ``runtime.PreparedCall``), with its own ratio to the faster fp32 peer.
Runtimes are described in ``benchmarks/_peers.py``.

Usage::

    python benchmarks/peer_runtimes.py                          # every model, 1 and 2 threads
    python benchmarks/peer_runtimes.py --models mlp,bert --threads 2 --no-aoti
    python benchmarks/peer_runtimes.py --json benchmarks/results/peers.json
    python benchmarks/peer_runtimes.py --report benchmarks/results/peers.json
    python benchmarks/peer_runtimes.py --models resnet18 --baseline-env TURBINE_CPU_CONV_MATMUL=iree
    python benchmarks/peer_runtimes.py --models resnet50 --runtimes openvino,turbine-bf16 \
        --baseline-env TURBINE_CPU_AMX_CONV=off --baseline-precision bf16

It is a benchmark: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _p in (HERE, HERE.parent / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _harness  # noqa: E402
import _peers  # noqa: E402


# ------------------------------------------------------------------------------------ the models
def _mlp():
    import _models

    c = _models.mlp()
    return c.module, c.args, {}, "3x Linear(1024), batch 8"


def _resnet18():
    import _models

    c = _models.resnet18()
    return c.module, c.args, {}, "ResNet-18 shape (BasicBlock x[2,2,2,2]), 1x3x224x224"


def _gpt():
    import _models

    c = _models.gpt()
    return c.module, c.args, {}, "GPT-2-small shape (6 layers, d 512, 8 heads), seq 128"


def _resnet50():
    import _models
    import torch
    import zoo

    torch.manual_seed(0)
    model = zoo._torchvision().models.resnet50(weights=None)
    _models._randomize_bn(model)
    return model.eval(), (torch.randn(1, 3, 224, 224),), {}, "torchvision ResNet-50, 1x3x224x224"


def _bert():
    import zoo

    tf = zoo._transformers()
    cfg = tf.BertConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        vocab_size=8192,
    )
    model = tf.BertModel(cfg).eval()
    ids, mask = zoo._text_inputs(1, 128, cfg.vocab_size, pad=0)
    what = "transformers BertModel (hidden 256, 4 layers), seq 128, attention_mask"
    return model, (), {"input_ids": ids, "attention_mask": mask}, what


MODELS: dict[str, Callable[[], tuple]] = {
    "mlp": _mlp,
    "resnet18": _resnet18,
    "gpt": _gpt,
    "resnet50": _resnet50,
    "bert": _bert,
}


# ------------------------------------------------------------------------------------- child
def run_model(name: str, threads: int, workdir: Path, args: argparse.Namespace) -> dict:
    """Builds, checks and times every runtime on one model in this process."""
    import torch

    torch.manual_seed(0)
    module, margs, mkwargs, what = MODELS[name]()
    res: dict[str, Any] = {"model": name, "what": what, "threads": threads, "runtimes": {}}
    workdir.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        expected = [_peers._np(t) for t in _peers.flat_tensors(module(*margs, **mkwargs))]
    res["eager_max_abs"] = max(float(abs(e).max()) for e in expected)

    built: dict[str, _peers.Built] = {}

    def attempt(rt: str, build: Callable[[], _peers.Built]) -> None:
        row: dict[str, Any] = {}
        res["runtimes"][rt] = row
        try:
            b = build()
            row["build_s"] = b.build_s
            row["notes"] = b.notes
            row["max_abs_err"] = _peers.max_abs_err(b.outputs(), expected)
            built[rt] = b
        except Exception as e:  # a runtime that fails is a result
            row["error"] = f"{type(e).__name__}: {str(e)[:800]}"
        print(f"[peers] {name} x{threads} {rt}: {_cell_note(row)}", flush=True)

    wanted = [r for r in _peers.RUNTIMES if r in args.runtimes]
    if "eager" in wanted:
        attempt("eager", lambda: _peers.build_eager(module, margs, mkwargs))
    if "turbine" in wanted:
        attempt("turbine", lambda: _peers.build_turbine(module, margs, mkwargs, threads, workdir))
    if "turbine-prepared" in wanted:
        attempt(
            "turbine-prepared",
            lambda: _peers.build_turbine(module, margs, mkwargs, threads, workdir, prepared=True),
        )
    if args.baseline_env:  # turbine built under other rewrite choices: before/after in one run
        key, _, value = args.baseline_env.partition("=")

        def baseline() -> _peers.Built:
            with _harness.environment(key, value):
                return _peers.build_turbine(
                    module,
                    margs,
                    mkwargs,
                    threads,
                    workdir,
                    compile_kw=(
                        {"precision": "bf16"} if args.baseline_precision == "bf16" else None
                    ),
                    name="turbine-baseline",
                )

        attempt("turbine-baseline", baseline)
    if "turbine-bf16" in wanted:
        attempt(
            "turbine-bf16",
            lambda: _peers.build_turbine(
                module,
                margs,
                mkwargs,
                threads,
                workdir,
                compile_kw={"precision": "bf16"},
                name="turbine-bf16",
            ),
        )
    onnx: dict[str, Any] = {}

    def onnx_path() -> Path:
        if "path" not in onnx:
            onnx["path"], onnx["export_s"] = _peers.export_onnx(module, margs, mkwargs, workdir)
        return onnx["path"]

    if "ort" in wanted:
        attempt(
            "ort",
            lambda: _peers.build_ort(onnx_path(), margs, mkwargs, threads, onnx["export_s"]),
        )
    ov_wanted = [r for r in ("openvino-f32", "openvino") if r in wanted]
    if ov_wanted:
        try:
            fallback = onnx_path()
        except Exception:
            fallback = None
        conv: dict[str, Any] = {}

        def converted():
            if "model" not in conv:
                conv["model"], conv["s"], conv["notes"] = _peers.convert_openvino(
                    module, margs, mkwargs, fallback
                )
            return conv["model"]

        for rt in ov_wanted:
            attempt(
                rt,
                lambda rt=rt: _peers.build_openvino(
                    converted(),
                    conv["s"],
                    conv["notes"],
                    margs,
                    mkwargs,
                    threads,
                    f32=rt == "openvino-f32",
                ),
            )
    if "aoti" in wanted:
        aoti_dir = workdir / f"aoti-{threads}"
        aoti_dir.mkdir(exist_ok=True)
        attempt("aoti", lambda: _peers.build_aoti(module, margs, mkwargs, aoti_dir))

    timings = _harness.time_interleaved(
        {rt: b.call for rt, b in built.items()},
        calls=args.calls,
        budget_s=args.budget_s,
        block=args.block,
        gap_s=args.gap_ms / 1e3,
    )
    for rt, t in timings.items():
        res["runtimes"][rt]["ms"] = t["wall"] * 1e3
        res["runtimes"][rt]["cpu_ms"] = t["cpu"] * 1e3
    res["rounds"] = min((len(t["all"]) for t in timings.values()), default=0)
    res["block"], res["gap_ms"] = args.block, args.gap_ms
    res["loadavg_1m"] = os.getloadavg()[0]
    return res


def run_child(args: argparse.Namespace) -> list[dict]:
    import logging
    import warnings

    import torch

    warnings.filterwarnings("ignore")  # the exporters' deprecation chatter, once per model
    logging.getLogger("onnxscript").setLevel(logging.ERROR)

    torch.set_num_threads(args.threads[0])
    results = []
    for name in args.models:
        t0 = time.perf_counter()
        try:
            r = run_model(name, args.threads[0], Path(args.workdir, name), args)
        except Exception as e:  # the model itself failed to build: a row with the reason
            r = {"model": name, "threads": args.threads[0], "error": f"{type(e).__name__}: {e}"}
        r["wall_s"] = time.perf_counter() - t0
        results.append(r)
        _harness.write_json(args.child_json, results)  # what is done survives a later crash
    return results


# ------------------------------------------------------------------------------------ parent
def _cell_note(row: dict) -> str:
    if "error" in row:
        return "FAILED " + row["error"][:200]
    return f"built in {row['build_s']:.1f}s, max abs err {row['max_abs_err']:.1e}"


def _ms(row: dict | None) -> float | None:
    return None if not row or "error" in row else row.get("ms")


def _fmt(x: float | None) -> str:
    return "–" if x is None else (f"{x:.2f}" if x < 100 else f"{x:.0f}")


def best_fp32_peer(r: dict) -> tuple[str | None, float | None]:
    """The faster of the fp32 peers that ran, and its latency."""
    cands = [(rt, _ms(r["runtimes"].get(rt))) for rt in _peers.FP32_PEERS]
    cands = [(rt, ms) for rt, ms in cands if ms]
    return min(cands, key=lambda c: c[1]) if cands else (None, None)


def markdown_table(results: list[dict]) -> str:
    """Median ms per call per runtime, turbine over the faster fp32 peer, errors."""
    baseline = any("turbine-baseline" in r.get("runtimes", {}) for r in results)
    runtimes = [*_peers.RUNTIMES, *(["turbine-baseline"] if baseline else [])]
    head = ["model", "threads", *runtimes, "turbine / best fp32 peer"]
    head += ["turbine-prepared / best fp32 peer"]
    head += ["turbine / turbine-baseline"] if baseline else []
    head += ["turbine-bf16 / openvino", "max abs err"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['threads']} | failed: {r['error'][:120]} |")
            continue
        cells = [r["model"], str(r["threads"])]
        for rt in runtimes:
            row = r["runtimes"].get(rt)
            cells.append("" if row is None else ("failed" if "error" in row else _fmt(_ms(row))))
        peer, peer_ms = best_fp32_peer(r)
        t = _ms(r["runtimes"].get("turbine"))
        cells.append(f"**{t / peer_ms:.2f}** ({peer})" if t and peer_ms else "–")
        tp = _ms(r["runtimes"].get("turbine-prepared"))
        cells.append(f"**{tp / peer_ms:.2f}**" if tp and peer_ms else "–")
        if baseline:
            tb0 = _ms(r["runtimes"].get("turbine-baseline"))
            cells.append(f"{t / tb0:.2f}" if t and tb0 else "–")
        tb, ov = _ms(r["runtimes"].get("turbine-bf16")), _ms(r["runtimes"].get("openvino"))
        cells.append(f"**{tb / ov:.2f}**" if tb and ov else "–")
        errs = [
            f"{rt} {row['max_abs_err']:.0e}"
            for rt, row in r["runtimes"].items()
            if "max_abs_err" in row and rt != "eager"
        ]
        cells.append(", ".join(errs))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def print_details(results: list[dict]) -> None:
    for r in results:
        if "error" in r:
            continue
        parts = [f"{rt} {_cell_note(row)}" for rt, row in r["runtimes"].items()]
        print(f"  {r['model']} x{r['threads']}: " + "; ".join(parts))
        print(f"    load {r['loadavg_1m']:.1f}, {r['rounds']} rounds, {r['wall_s']:.0f}s")


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    p.add_argument("--threads", default="1,2", help="comma list of thread counts (a child each)")
    p.add_argument(
        "--runtimes", default=",".join(_peers.RUNTIMES), help="comma list of runtimes to build"
    )
    p.add_argument("--no-aoti", action="store_true", help="leave AOTInductor out (slow builds)")
    p.add_argument(
        "--baseline-env",
        default=None,
        metavar="KEY=VALUE",
        help="also build turbine with this environment variable set ('turbine-baseline', e.g. "
        "TURBINE_CPU_CONV_MATMUL=iree: today's convolutions), timed in the same rounds",
    )
    p.add_argument(
        "--baseline-precision",
        default="fp32",
        choices=("fp32", "bf16"),
        help="the precision the baseline is compiled with (bf16: against turbine-bf16, e.g. "
        "with --baseline-env TURBINE_CPU_AMX_CONV=off)",
    )
    p.add_argument("--calls", type=int, default=20, help="timed rounds per model")
    p.add_argument("--budget-s", type=float, default=40.0, help="timing budget per model")
    p.add_argument(
        "--block",
        type=int,
        default=5,
        help="calls of each runtime in a row per round, the first untimed (1: strict "
        "round-robin, which lets one runtime's spinning threads slow the next)",
    )
    p.add_argument(
        "--gap-ms",
        type=float,
        default=0.0,
        help="pause before each block, for the previous runtime's threads to stop spinning",
    )
    p.add_argument("--timeout-s", type=float, default=3000.0, help="per-child timeout")
    p.add_argument("--workdir", default=None, help="where built artifacts are kept (default: tmp)")
    p.add_argument("--json", default=None, help="write all results here")
    p.add_argument("--report", default=None, help="print the table of a --json file and exit")
    p.add_argument("--child-json", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.threads = [int(t) for t in args.threads.split(",") if t]
    args.runtimes = [
        r for r in args.runtimes.split(",") if r and not (args.no_aoti and r == "aoti")
    ]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    if args.report:
        results = json.loads(Path(args.report).read_text())["results"]
        print(markdown_table(results))
        return 0
    if args.child_json:
        run_child(args)
        return 0

    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="turbine-peers-") as td:
        workdir = args.workdir or td
        for threads in args.threads:
            out = Path(td, f"child-{threads}.json")
            cmd = [sys.executable, str(Path(__file__)), "--child-json", str(out)]
            cmd += ["--threads", str(threads), "--models", ",".join(args.models)]
            cmd += ["--runtimes", ",".join(args.runtimes), "--workdir", workdir]
            cmd += ["--calls", str(args.calls), "--budget-s", str(args.budget_s)]
            cmd += ["--block", str(args.block), "--gap-ms", str(args.gap_ms)]
            cmd += ["--baseline-env", args.baseline_env] if args.baseline_env else []
            cmd += ["--baseline-precision", args.baseline_precision]
            print(f"[peers] {threads} thread(s): {' '.join(args.models)}", flush=True)
            child = _harness.run_json_child(cmd, out, timeout=args.timeout_s, capture=False)
            done = child.result or []
            results += done
            for m in args.models[len(done) :]:
                results.append(
                    {"model": m, "threads": threads, "error": child.error or "no result"}
                )
    print()
    print(markdown_table(results))
    print()
    print_details(results)
    if args.json:
        meta = {"benchmark": "peer_runtimes", "date": time.strftime("%Y-%m-%d"), "cpu": _cpu()}
        _harness.write_json(args.json, {**meta, "results": results})
    return 0 if all("error" not in r for r in results) else 1


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                flags = Path("/proc/cpuinfo").read_text()
                extra = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
                return line.split(":", 1)[1].strip() + f" ({', '.join(extra)})"
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
