"""How evenly IREE's ``local-task`` workers share each dispatch of a benchmark model.

The model of ``peer_runtimes.py`` or of the zoo (``zoo.py --list``) is compiled with turbine's defaults (or ``--precision bf16``),
run by ``iree-benchmark-module --device_profiling_mode=host-execution`` on ``--threads``
workers, and each dispatch's events read back with ``iree-profile dispatch``: its duration, the
sum of its workgroups' times and their count. ``share`` is that sum over ``threads`` times the
duration: 1.00 when every worker was busy from the dispatch's start to its end. IREE 3.13 hands
a dispatch's workgroups out 8 at a time from 8 a worker on, so 24 workgroups on two workers show
0.75 (docs/performance.md, section 28; ``turbine_aot._compiler.workgroups``). The last line sums
the idle worker time of the rows printed. A profile, not a test: nothing asserts on time.

Usage::

    python benchmarks/dispatch_shares.py gpt --threads 2
    python benchmarks/dispatch_shares.py resnet50 --precision bf16 --top 40
    python benchmarks/dispatch_shares.py whisper-encoder --threads 2
    # a decode step of an LLM of llm_bench.MODELS, weights as llama_cpp_side_by_side.py's
    python benchmarks/dispatch_shares.py llama-110m --weights int4
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _p in (HERE, HERE.parent / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _harness  # noqa: E402
import peer_profile  # noqa: E402


def dispatch_events(vmfb: Path, inputs: list, threads: int, calls: int, td: Path) -> list[dict]:
    """The host-execution dispatch events of ``calls`` calls on ``threads`` workers."""
    prof = peer_profile.host_execution_profile(vmfb, inputs, threads, calls, td, "local-task")
    return profile_events(prof)


def profile_events(prof: Path) -> list[dict]:
    """The dispatch events of the host-execution profile ``prof`` (``iree-profile dispatch``)."""
    show = [peer_profile._runtime_tool("iree-profile"), "dispatch", "--format=jsonl"]
    out = subprocess.run(
        [*show, "--dispatch_events", str(prof)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if '"host_dispatch_event"' in line]


def llm_decode_events(name: str, weights: str, threads: int, calls: int, td: Path) -> list[dict]:
    """The host-execution dispatch events of ``calls`` decode steps of ``name`` (a model of
    ``llm_bench.MODELS``) with ``weights`` as ``llm_step_profile.py`` builds it (the KV cache a
    global, the step at position 20), on ``threads`` workers."""
    import llm_step_profile

    _, eo = llm_step_profile.export_variant(name, weights)
    irpa, vmfb, prof = td / "m.irpa", td / "m.vmfb", td / "p.ireeprof"
    eo.save_parameters(irpa)
    eo.compile(save_to=vmfb)
    llm_step_profile._benchmark(vmfb, irpa, threads, calls, prof)
    return profile_events(prof)


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument("model", help="a model of peer_runtimes.py or of zoo.py, or of llm_bench.py")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument(
        "--weights",
        choices=("fp32", "int8", "int4", "w8a8", "w4a8"),
        default=None,
        help="an LLM's decode step with these weights (model: one of llm_bench.MODELS)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    import turbine_aot

    if args.weights is not None:
        import llm_bench

        if args.model not in llm_bench.MODELS:
            p.error(f"--weights: {args.model!r} is not a model of llm_bench.MODELS")
        what = f"{args.model} decode step, {args.weights} weights"
        with tempfile.TemporaryDirectory(prefix="turbine-shares-") as tmp:
            events = llm_decode_events(
                args.model, args.weights, args.threads, args.calls, Path(tmp)
            )
    else:
        try:
            module, margs, mkwargs, what, dynamic = peer_profile.model_for(args.model)
        except KeyError:
            p.error(f"unknown model {args.model!r}: see --help")
        kw = {"precision": "bf16"} if args.precision == "bf16" else {}
        with tempfile.TemporaryDirectory(prefix="turbine-shares-") as tmp:
            td = Path(tmp)
            vmfb = td / "m.vmfb"
            eo = turbine_aot.export(module, args=margs, kwargs=mkwargs, dynamic_shapes=dynamic)
            eo.compile(save_to=vmfb, **kw)
            events = dispatch_events(
                vmfb, [*margs, *mkwargs.values()], args.threads, args.calls, td
            )
    per: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
    for ev in events:
        row = per[ev["key"]]
        row[0] += 1
        row[1] += ev["duration_ns"]
        row[2] += ev["tile_duration_sum_ns"]
        row[3] = ev["tile_count"]
    calls = min(r[0] for r in per.values())
    total = sum(r[1] for r in per.values()) / calls / 1e6
    kind = "" if args.weights else f", {args.precision}"
    print(f"{what}{kind}, {args.threads} workers: {total:.3f} ms a call in dispatches")
    idle = 0.0
    for key, (_, dur, tiles, count) in sorted(per.items(), key=lambda kv: -kv[1][1])[: args.top]:
        idle += (dur - tiles / args.threads) / calls / 1e6
        share = tiles / args.threads / dur
        print(f"  {dur / calls / 1e3:9.1f} us  share {share:.2f}  {count:4d} workgroups  {key}")
    print(f"idle worker time in the rows above: {idle:.3f} ms a call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
