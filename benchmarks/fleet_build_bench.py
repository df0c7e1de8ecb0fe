"""Decode tokens/s of a quantized Llama built for a named CPU (a fleet build, e.g.
``--iree-llvmcpu-target-cpu=x86-64-v3``) against the host build and against the same fleet build
on IREE's own quantized products (``--turbine-cpu-matmul=iree``), interleaved in one process.

Each weight scheme (``llm.quantized_copy`` of the random-init model, as
``llama_cpp_side_by_side.py`` makes it) is exported once and compiled three ways: turbine's
defaults for this machine (``host``), the same flags with the target CPU replaced
(``--cpu``), and that with ``--turbine-cpu-matmul=iree``. Reported: median decode tokens/s
(``generate`` of 1 + ``--new-tokens`` tokens minus a one-token ``generate``, per round), each
build's greedy ids, and each build's tokens/s over the host build's. It is a benchmark: nothing
asserts on time (docs/quantization.md, "Builds for a named CPU").

Usage::

    python benchmarks/fleet_build_bench.py --weights int4 int8 w4a8 --cpu x86-64-v3
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _harness  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument("--model", default="llama-110m")
    p.add_argument("--weights", nargs="+", default=["int4", "int8", "w4a8"])
    p.add_argument("--cpu", default="x86-64-v3", help="the named target CPU of the fleet build")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--prompt", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import llm_bench
    import torch

    from turbine_aot import llm
    from turbine_aot._compiler.flags import default_compile_flags

    torch.set_num_threads(1)
    fp32 = llm_bench._build(args.model)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, fp32.config.vocab_size, (1, args.prompt), generator=g)
    host = default_compile_flags("llvm-cpu", use_env=False)
    other = [f for f in host if not f.startswith("--iree-llvmcpu-target-cpu=")]
    fleet = [*other, f"--iree-llvmcpu-target-cpu={args.cpu}"]
    builds = {
        "host": host,
        args.cpu: fleet,
        f"{args.cpu}, --turbine-cpu-matmul=iree": [*fleet, "--turbine-cpu-matmul=iree"],
    }
    res: dict = {"model": args.model, "cpu": args.cpu, "weights": {}}
    for weights in args.weights:
        gs = args.group_size if weights in ("int4", "w4a8") else None
        model = fp32 if weights == "fp32" else llm.quantized_copy(fp32, weights, group_size=gs)
        eo = llm.export_causal_lm(model, max_seq_len=args.prompt + args.new_tokens + 8)
        lms, row = {}, {}
        for name, flags in builds.items():
            lms[name] = llm.load(eo, device="local-sync", compile_flags=flags)
            ids = lms[name].generate(prompt, args.new_tokens)[0, args.prompt :].tolist()
            row[name] = {"greedy": ids}
        rates: dict[str, list[float]] = {name: [] for name in lms}
        for _ in range(args.rounds):
            for name, lm in lms.items():
                t0 = time.perf_counter()
                lm.generate(prompt, 1)
                one = time.perf_counter() - t0
                t0 = time.perf_counter()
                lm.generate(prompt, 1 + args.new_tokens)
                rates[name].append(args.new_tokens / (time.perf_counter() - t0 - one))
        base = statistics.median(rates["host"])
        for name, r in rates.items():
            row[name].update(
                tokens_per_s=statistics.median(r), over_host=statistics.median(r) / base, rounds=r
            )
            print(
                f"{weights} {name}: {statistics.median(r):.1f} tokens/s "
                f"({statistics.median(r) / base:.2f}x the host build), greedy == host's: "
                f"{row[name]['greedy'] == row['host']['greedy']}",
                flush=True,
            )
        res["weights"][weights] = row
    if args.json:
        _harness.write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
