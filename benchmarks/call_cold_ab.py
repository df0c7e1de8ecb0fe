"""The Python side of a call with cold caches: a zoo model's compiled module called with its
``ModelOutput`` result built from the signature's template (the default,
docs/running.md "What a call costs") and with the package's constructor, interleaved in one
process, each call right after a sweep of ``--sweep-mb`` MB (as a call that streams its weights,
or another runtime's, leaves the caches).

Usage::

    python benchmarks/call_cold_ab.py --models whisper-encoder,t5-encoder --rounds 600

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
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils._pytree import tree_unflatten  # noqa: E402

import turbine_aot  # noqa: E402
from turbine_aot import runtime  # noqa: E402


def measure(name: str, rounds: int, sweep_mb: int) -> dict:
    import zoo

    case = zoo.model_case(name)  # in eval mode
    inputs = zoo._flat_inputs(case.args, case.kwargs)
    eo = turbine_aot.export(
        case.module, args=case.args, kwargs=case.kwargs, dynamic_shapes=case.dynamic_shapes
    )
    with tempfile.TemporaryDirectory(prefix="turbine-call-cold-") as td:
        path = Path(td, "module.vmfb")
        eo.compile(save_to=path)
        mods = {k: runtime.load_module(path, device="local-sync") for k in ("template", "ctor")}
    for m in mods.values():
        m.main(*inputs)
    sig = mods["ctor"].main.signature.call
    if sig.return_schema is None or "_result_builder" not in sig.__dict__:
        return {"model": name, "note": "no ModelOutput result: nothing to compare"}
    spec = sig.tree("return_schema")
    sig.__dict__["_result_builder"] = lambda leaves: tree_unflatten(leaves, spec)
    sweep = np.ones(sweep_mb << 18, dtype=np.float32)
    times: dict[str, list[float]] = {k: [] for k in mods}
    for _ in range(rounds):
        for k, m in mods.items():
            sweep.sum()
            t0 = time.perf_counter()
            m.main(*inputs)
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    return {
        "model": name,
        "template_us": med["template"],
        "constructor_us": med["ctor"],
        "ratio": med["template"] / med["ctor"],
        "rounds": rounds,
        "sweep_mb": sweep_mb,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="whisper-encoder,t5-encoder,vit,gpt2")
    ap.add_argument("--rounds", type=int, default=600)
    ap.add_argument("--sweep-mb", type=int, default=32)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for name in args.models.split(","):
        r = measure(name, args.rounds, args.sweep_mb)
        results.append(r)
        if "ratio" in r:
            print(
                f"{name}: template {r['template_us']:.0f} us, constructor "
                f"{r['constructor_us']:.0f} us a call, {r['ratio']:.3f}x",
                flush=True,
            )
        else:
            print(f"{name}: {r['note']}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"benchmark": "call_cold_ab", "results": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
