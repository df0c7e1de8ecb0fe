"""A/B of compile-flag sets on one benchmark model, interleaved with eager PyTorch.

Each variant is turbine's defaults (``ExportOutput.compile()``) plus the flags given for it; all
variants and eager are timed round-robin in one process, and the medians and ratios to eager are
printed. One thread (``local-sync``, torch 1 thread, CPU time per call) unless ``--threads N``
(``local-task`` with N workers, torch N threads, wall time).

    python benchmarks/flags_ab.py gpt-dyn base= peel="--iree-llvmcpu-vector-pproc-strategy=peel"
    python benchmarks/flags_ab.py gpt --rounds 40 base= o3="--iree-opt-level=O3 \\
        --iree-llvmcpu-stack-allocation-limit=65536"

A variant is ``NAME=`` (the defaults) or ``NAME="--flag ..."``. Models: those of
``cuda_prebuilt._case`` (``mlp``, ``resnet18``, ``gpt``, ``gpt-dyn``; ``-bN`` batch and ``-f16``
suffixes). It is a benchmark: it prints figures and asserts nothing about time.
"""

from __future__ import annotations

import shlex
import statistics
import sys
import time
from pathlib import Path

import _harness

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument("model")
    p.add_argument("variants", nargs="+", help='NAME= or NAME="--flag ..."')
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    import cuda_prebuilt
    import iree.runtime as rt
    import numpy as np
    import torch

    import turbine_aot

    torch.set_num_threads(args.threads)
    variants = {}
    for v in args.variants:
        name, _, flags = v.partition("=")
        variants[name] = shlex.split(flags)
    case = cuda_prebuilt._case(args.model)
    eo = turbine_aot.export(case.module, args=case.args, dynamic_shapes=case.dynamic_shapes)
    config = rt.Config("local-sync" if args.threads == 1 else "local-task")
    if args.threads > 1:
        rt.flags.parse_flags(f"--task_topology_max_group_count={args.threads}")
    x = case.args[0]
    with torch.no_grad():
        ref = case.module(x).float().numpy()
    fns = {}
    for name, flags in variants.items():
        t0 = time.perf_counter()
        out = eo.compile(save_to=None, extra_args=flags)
        vm = rt.VmModule.copy_buffer(config.vm_instance, out.map_memory())
        ctx = rt.SystemContext(vm_modules=[vm], config=config)
        fn = ctx.modules.module["main"]
        x_dev = rt.asdevicearray(config.device, x.numpy())
        err = float(np.abs(np.asarray(fn(x_dev).to_host(), np.float32) - ref).max())
        print(f"{name}: compiled in {time.perf_counter() - t0:.1f} s, max abs err {err:.1e}")
        fns[name] = lambda fn=fn, x_dev=x_dev: fn(x_dev)

    def eager() -> None:
        with torch.no_grad():
            case.module(x)

    fns["eager"] = eager
    clock = time.process_time if args.threads == 1 else time.perf_counter
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(2):
        for f in fns.values():
            f()
    for _ in range(args.rounds):
        for k, f in fns.items():
            t0 = clock()
            f()
            times[k].append(clock() - t0)
    base = statistics.median(times["eager"])
    what = "CPU" if args.threads == 1 else "wall"
    for k, v in times.items():
        m = statistics.median(v)
        print(
            f"{args.model} {k:12s} {m * 1e3:8.2f} ms {what} ({m / base:.3f}× eager, "
            f"min {min(v) * 1e3:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
