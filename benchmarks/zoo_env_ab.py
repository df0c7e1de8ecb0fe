"""An interleaved A/B of one environment setting over the zoo's models (``zoo.py``).

Each model is exported as the zoo exports it (its dynamic shapes too), compiled twice with
turbine's defaults, once as the environment is and once with ``--env KEY=VALUE`` set (for
example ``TURBINE_COMPILE_FLAGS=--iree-llvmcpu-vector-pproc-strategy=peel`` or
``TURBINE_CPU_PEEL=dynamic``), loaded on ``local-sync`` (one thread) and timed in interleaved
rounds (each round times both builds, ``--round-s`` seconds each); the medians, their ratio
and each build's max |error| against eager are printed, and written with ``--json``.

Usage::

    python benchmarks/zoo_env_ab.py --env TURBINE_CPU_PEEL=dynamic --models whisper-encoder,vit

A measurement, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _p in (HERE, HERE.parent / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _harness  # noqa: E402
import torch  # noqa: E402

import turbine_aot  # noqa: E402
from turbine_aot.runtime import load_module  # noqa: E402


def measure(name: str, key: str, value: str, rounds: int, round_s: float) -> dict[str, Any]:
    import zoo

    case = zoo.model_case(name)
    module = case.module.eval()
    eo = turbine_aot.export(
        module, args=case.args, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes
    )
    builds = []
    for setting in (os.environ.get(key), value):
        with _harness.environment(key, setting):
            builds.append(load_module(eo.compile(save_to=None), device="local-sync"))
    args = zoo._flat_inputs(case.args, case.kwargs)
    with torch.no_grad():
        want = module(*case.args, **case.kwargs)
    errors = [zoo._max_err(m.main(*args), want)[0] for m in builds]
    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for i, m in enumerate(builds):
            m.main(*args)
            start, calls = time.perf_counter(), 0
            while time.perf_counter() - start < round_s:
                m.main(*args)
                calls += 1
            times[i].append((time.perf_counter() - start) / calls)
    a, b = (statistics.median(t) * 1e3 for t in times)
    return {"model": name, "ms": a, "ms_with_env": b, "ratio": b / a, "max_abs_err": errors}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", required=True, help="KEY=VALUE set for the second build")
    p.add_argument("--models", default="whisper-encoder,vit,bert,gpt2")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--round-s", type=float, default=0.25)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    key, sep, value = args.env.partition("=")
    if not sep or not key:
        p.error(f"--env takes KEY=VALUE, not {args.env!r}")
    torch.set_num_threads(1)
    os.environ.setdefault("TURBINE_COMPILE_CACHE", "0")
    results = []
    for name in args.models.split(","):
        r = measure(name, key, value, args.rounds, args.round_s)
        results.append(r)
        print(
            f"{name:22s} {r['ms']:8.3f} ms  with {args.env}: {r['ms_with_env']:8.3f} ms  "
            f"ratio {r['ratio']:5.2f}  err {r['max_abs_err'][0]:.1e} / {r['max_abs_err'][1]:.1e}",
            flush=True,
        )
    if args.json:
        _harness.write_json(args.json, {"env": args.env, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
