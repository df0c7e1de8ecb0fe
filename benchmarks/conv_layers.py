"""ResNet's convolution layers one at a time on turbine's AVX-512 direct-convolution kernel, under
several blockings (``TURBINE_CPU_CONV_BLOCKING`` values), against eager (oneDNN): median CPU ms
per call and GFLOP/s, all candidates timed interleaved in one process (one thread: ``local-sync``,
``torch.set_num_threads(1)``; ``--threads 2``: ``local-task`` with two workers, wall time).

Usage::

    python benchmarks/conv_layers.py                              # ResNet-18's layers, batch 1
    python benchmarks/conv_layers.py --blockings "fixed;rows=32" --layers l4,l3
    python benchmarks/conv_layers.py --threads 2 --json out.json
    python benchmarks/conv_layers.py --variants "TURBINE_CPU_WINOGRAD=off;TURBINE_CPU_WINOGRAD=2"

It is a benchmark: nothing here asserts on time (docs/performance.md, section 10).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _p in (HERE, HERE.parent / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _harness  # noqa: E402

#: name: (C, F, kernel, stride, padding, H (= W)): ResNet-18's distinct convolutions at 224x224
LAYERS = {
    "stem": (3, 64, 7, 2, 3, 224),
    "l1": (64, 64, 3, 1, 1, 56),
    "l2s": (64, 128, 3, 2, 1, 56),
    "l2": (128, 128, 3, 1, 1, 28),
    "l2d": (64, 128, 1, 2, 0, 56),
    "l3s": (128, 256, 3, 2, 1, 28),
    "l3": (256, 256, 3, 1, 1, 14),
    "l3d": (128, 256, 1, 2, 0, 28),
    "l4s": (256, 512, 3, 2, 1, 14),
    "l4": (512, 512, 3, 1, 1, 7),
    "l4d": (256, 512, 1, 2, 0, 14),
}


def _gflop(c: int, f: int, k: int, s: int, p: int, h: int) -> float:
    o = (h + 2 * p - k) // s + 1
    return 2.0 * o * o * f * c * k * k / 1e9


def _settings(variant: str) -> dict[str, str]:
    """``KEY=VALUE KEY2=VALUE2`` as a dict (empty: the defaults)."""
    out = {}
    for part in variant.split():
        key, sep, value = part.partition("=")
        if not sep:
            raise SystemExit(f"--variants: expected KEY=VALUE, got {part!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument("--layers", default=",".join(LAYERS), help="comma list of " + ", ".join(LAYERS))
    p.add_argument(
        "--blockings", default="fixed;", help="';'-separated TURBINE_CPU_CONV_BLOCKING values"
    )
    p.add_argument(
        "--variants",
        default=None,
        help="';'-separated candidates, each space-separated KEY=VALUE environment settings "
        "(replaces --blockings)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--budget-s", type=float, default=8.0, help="timing budget per layer")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import torch

    import turbine_aot
    from turbine_aot import runtime

    torch.set_num_threads(args.threads)
    if args.variants is not None:
        variants = {v.strip(): _settings(v) for v in args.variants.split(";")}
    else:
        variants = {
            b or "default": {"TURBINE_CPU_CONV_BLOCKING": b} for b in args.blockings.split(";")
        }
    driver = "local-task" if args.threads > 1 else "local-sync"
    rt_flags = [f"--task_topology_max_group_count={args.threads}"] if args.threads > 1 else []
    rows = []
    with tempfile.TemporaryDirectory(prefix="turbine-conv-layers-") as td:
        for name in [n for n in args.layers.split(",") if n]:
            c, f, k, s, pad, h = LAYERS[name]
            torch.manual_seed(0)
            conv = torch.nn.Conv2d(c, f, k, s, pad, bias=False).eval()
            x = torch.randn(1, c, h, h)
            eo = turbine_aot.export(conv, args=(x,))
            with torch.no_grad():
                want = conv(x)
            fns = {}
            for label, settings in variants.items():
                old = {key: os.environ.get(key) for key in settings}
                os.environ.update(settings)
                try:
                    vmfb = Path(td, f"{name}-{len(fns)}.vmfb")
                    eo.compile(save_to=vmfb)
                finally:
                    for key, value in old.items():
                        if value is None:
                            os.environ.pop(key, None)
                        else:
                            os.environ[key] = value
                m = runtime.load_module(vmfb, device=driver, runtime_flags=rt_flags)
                got = m.main(x)
                err = float((got - want).abs().max())
                fns[label] = (lambda m=m, x=x: m.main(x), err)

            def eager(conv=conv, x=x):
                with torch.no_grad():
                    conv(x)

            timings = _harness.time_interleaved(
                {"eager": eager, **{b: fn for b, (fn, _) in fns.items()}},
                calls=args.calls,
                budget_s=args.budget_s,
            )
            gf = _gflop(c, f, k, s, pad, h)
            row = {"layer": name, "shape": LAYERS[name], "gflop": gf, "load": os.getloadavg()[0]}
            key = "cpu" if args.threads == 1 else "wall"
            for cand, t in timings.items():
                ms = t[key] * 1e3
                row[cand] = {"ms": ms, "gflops": gf / ms * 1e3}
                if cand in fns:
                    row[cand]["max_abs_err"] = fns[cand][1]
            rows.append(row)
            cells = "  ".join(
                f"{cand} {v['ms']:.3f} ms ({v['gflops']:.0f})"
                for cand, v in row.items()
                if isinstance(v, dict)
            )
            print(f"{name:5s} {gf:6.3f} GF  {cells}  load {row['load']:.1f}", flush=True)
    if args.json:
        meta = {"benchmark": "conv_layers", "date": time.strftime("%Y-%m-%d")}
        Path(args.json).write_text(json.dumps({**meta, "threads": args.threads, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
