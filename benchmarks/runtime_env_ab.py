"""An interleaved A/B of one runtime environment setting (read when a module is loaded, e.g.
``TURBINE_CPU_ALLOCATOR=iree``) over ``peer_runtimes.py``'s models.

Each model is exported and compiled once per precision (fp32, and ``precision="bf16"`` with
``--bf16``), then loaded twice in one process: once with ``--env KEY=VALUE`` set, once as the
environment is; the two loads are called in turn (``--rounds`` rounds) and the medians, their
ratio (as the environment is / with the setting) and the largest difference between the two
loads' results are printed, and written with ``--json``.

Usage::

    python benchmarks/runtime_env_ab.py --env TURBINE_CPU_ALLOCATOR=iree --driver local-sync \\
        --models mlp,resnet18,gpt,resnet50,bert --bf16

A measurement, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _p in (HERE, HERE.parent / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _harness  # noqa: E402


def measure(name: str, precision: str, key: str, value: str, args: argparse.Namespace) -> dict:
    import peer_runtimes
    from _peers import flat_tensors

    import turbine_aot
    from turbine_aot import runtime

    module, margs, kwargs, what = peer_runtimes.MODELS[name]()
    inputs = [*margs, *kwargs.values()]
    with tempfile.TemporaryDirectory() as tmp:
        vmfb = Path(tmp) / "m.vmfb"
        eo = turbine_aot.export(module, args=margs, kwargs=kwargs)
        eo.compile(save_to=vmfb, **({"precision": "bf16"} if precision == "bf16" else {}))
        flags = [f"--task_topology_max_group_count={args.threads}"] if args.threads > 1 else []
        with _harness.environment(key, value):
            with_setting = runtime.load_module(vmfb, device=args.driver, runtime_flags=flags)
        as_is = runtime.load_module(vmfb, device=args.driver, runtime_flags=flags)
        times: dict[str, list[float]] = {"with": [], "as_is": []}
        outs = {}
        for r in range(args.rounds + 3):
            for label, m in (("with", with_setting), ("as_is", as_is)):
                t0 = time.perf_counter()
                out = m.main(*inputs)
                dt = time.perf_counter() - t0
                if r >= 3:  # the first rounds warm up
                    times[label].append(dt)
                outs[label] = out
        diff = max(
            float((a.float() - b.float()).abs().max())
            for a, b in zip(flat_tensors(outs["with"]), flat_tensors(outs["as_is"]))
        )
        del with_setting, as_is
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {
        "model": name,
        "what": what,
        "precision": precision,
        "driver": args.driver,
        "threads": args.threads,
        f"ms_{key}={value}": ms["with"],
        "ms_as_is": ms["as_is"],
        "as_is_over_setting": ms["as_is"] / ms["with"],
        "max_abs_diff": diff,
        "rounds": args.rounds,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", required=True, help="KEY=VALUE set for the first load")
    p.add_argument("--models", default="mlp,resnet18,gpt,resnet50,bert")
    p.add_argument("--driver", default="local-sync", choices=("local-sync", "local-task"))
    p.add_argument("--threads", type=int, default=1, help="local-task workers")
    p.add_argument("--bf16", action="store_true", help="also precision='bf16' builds")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    key, _, value = args.env.partition("=")
    import torch
    import torchvision_compat

    torchvision_compat.install()
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models.split(","):
        for precision in ("fp32", "bf16") if args.bf16 else ("fp32",):
            row = measure(name, precision, key, value, args)
            rows.append(row)
            print(
                f"{args.driver} x{args.threads} {name:9s} {precision}: {args.env} "
                f"{row[f'ms_{args.env}']:.3f} ms, as is {row['ms_as_is']:.3f} ms, "
                f"as is / {args.env} {row['as_is_over_setting']:.3f}, "
                f"max |diff| {row['max_abs_diff']:.1e}",
                flush=True,
            )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
