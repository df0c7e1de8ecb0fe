"""Compile cache: compiling the same exported GPT a second time (same IR, flags, compiler
version, target) against the first compile, measured in one run.

The first compile fills an empty cache directory (a miss: a real iree-compile), the second is
served from it. A third compile with the cache off shows the baseline again, so the ratio is
checked against a cold compile measured in the same run. The figure to meet: second / first
<= 10 %.

Usage::

    python benchmarks/compile_cache_bench.py [--model gpt|demo] [--json out.json]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import _harness

HERE = Path(__file__).resolve().parent


def _model(name: str):
    if name == "gpt":
        sys.path.insert(0, str(HERE))
        from _models import gpt

        case = gpt()
        return case.name, case.module, case.args
    import torch

    from turbine_aot._cli.demo import build_demo_model

    model = build_demo_model()
    return "tiny-gpt", model, (torch.zeros(1, 32, dtype=torch.int64),)


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument("--model", default="gpt", choices=["gpt", "demo"])
    p.add_argument("--device", default="local-task")
    p.add_argument("--json", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)

    import turbine_aot
    from turbine_aot import runtime as R

    name, model, example = _model(args.model)
    t0 = time.perf_counter()
    eo = turbine_aot.export(model, args=example)
    export_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="turbine-cc-bench-") as tmp:
        cache = R.CompileCache(Path(tmp) / "cache")
        t0 = time.perf_counter()
        first = R.compile_export_output(eo, device=args.device, cache=cache)
        first_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        second = R.compile_export_output(eo, device=args.device, cache=cache)
        second_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        R.compile_export_output(eo, device=args.device, cache=False)
        uncached_s = time.perf_counter() - t0
        stats = cache.stats
        size = cache.size_bytes()
    ok = first == second and stats.hits == 1 and stats.misses == 1
    ratio = second_s / first_s
    print(f"compile cache benchmark: {name} exported in {export_s:.2f} s, device {args.device}")
    print(f"{'compile':<28}{'seconds':>10}")
    print(f"{'first (miss, fills cache)':<28}{first_s:>10.3f}")
    print(f"{'second (hit)':<28}{second_s:>10.3f}")
    print(f"{'third (cache off)':<28}{uncached_s:>10.3f}")
    print(
        f"second / first = {100 * ratio:.2f} %  (target <= 10 %); "
        f"second / cache-off = {100 * second_s / uncached_s:.2f} %"
    )
    print(f"entry {size / 1e6:.2f} MB, identical bytes: {first == second}, stats: {stats}")
    if args.json:
        _harness.write_json(
            args.json,
            {
                "model": name,
                "export_s": export_s,
                "first_compile_s": first_s,
                "second_compile_s": second_s,
                "uncached_compile_s": uncached_s,
                "second_over_first": ratio,
                "identical": first == second,
            },
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
