"""Runs turbine's benchmarks (``nox -s bench``): every ``benchmarks/*_bench.py`` module.

A benchmark module exposes ``main(argv: list[str] | None) -> int``; each runs in its own child
process (so one crash or memory peak does not affect the others), with what is left of the time
budget as its timeout. ``models_bench`` runs first: it prints the main table (turbine's default
compile against eager PyTorch and AOTInductor). Modules whose command line has ``--json`` get
``--json <dir>/<name>.json``; the runner merges those into the file given by its own ``--json``.

Usage::

    python benchmarks/run.py                          # everything, default sizes (< 10 min)
    python benchmarks/run.py --list
    python benchmarks/run.py --only models --json results.json
    python benchmarks/run.py --args models="--models gpt --threads 1"

Benchmarks print figures and ratios against baselines measured in the same run; none asserts on
time.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _harness  # noqa: E402

FIRST = ("models",)


def discover() -> list[str]:
    """Benchmark names (``<name>_bench.py`` -> ``name``), ``models`` first, then sorted."""
    names = sorted(p.name[: -len("_bench.py")] for p in HERE.glob("*_bench.py"))
    return [n for n in FIRST if n in names] + [n for n in names if n not in FIRST]


def _accepts_json(name: str) -> bool:
    return '"--json"' in (HERE / f"{name}_bench.py").read_text(encoding="utf-8")


def _run_in_child(name: str, argv: list[str]) -> int:
    """Child side: import ``<name>_bench`` and call its ``main(argv)``."""
    sys.path.insert(0, str(HERE))
    mod = importlib.import_module(f"{name}_bench")
    main = getattr(mod, "main", None)
    if not callable(main):
        print(f"[run] {name}_bench.py has no main(argv) -> int; skipped", file=sys.stderr)
        return 2
    rc = main(argv)
    return int(rc or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--_child"]:
        return _run_in_child(argv[1], argv[2:])
    p = argparse.ArgumentParser(description="Run turbine's benchmarks (benchmarks/*_bench.py).")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--only", default="", help="comma list of benchmark names to run")
    p.add_argument("--skip", default="", help="comma list of benchmark names to skip")
    p.add_argument(
        "--args",
        action="append",
        default=[],
        metavar='NAME="ARGS"',
        help="extra command line for one benchmark (repeatable)",
    )
    p.add_argument("--budget-s", type=float, default=570.0, help="time budget for all benchmarks")
    p.add_argument("--json", default=None, help="write all results (merged) here")
    args = p.parse_args(argv)

    names = discover()
    if args.list:
        print("\n".join(names))
        return 0
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            p.error(f"unknown benchmark(s) {unknown}; available: {', '.join(names)}")
        names = [n for n in names if n in wanted]
    skip = {n.strip() for n in args.skip.split(",") if n.strip()}
    names = [n for n in names if n not in skip]
    extra: dict[str, list[str]] = {}
    for spec in args.args:
        name, _, line = spec.partition("=")
        extra.setdefault(name.strip(), []).extend(shlex.split(line))

    t_start = time.perf_counter()
    summary: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="turbine-bench-run-") as td:
        for name in names:
            left = args.budget_s - (time.perf_counter() - t_start)
            if left < 10:
                summary[name] = {"rc": None, "note": "skipped: time budget spent"}
                print(f"\n=== {name}: skipped (time budget of {args.budget_s:.0f}s spent)")
                continue
            cmd = [sys.executable, str(Path(__file__)), "--_child", name, *extra.get(name, [])]
            out_json = Path(td, f"{name}.json")
            if _accepts_json(name) and "--json" not in extra.get(name, []):
                cmd += ["--json", str(out_json)]
            print(f"\n=== {name} (budget left {left:.0f}s): {' '.join(cmd[2:])}", flush=True)
            child = _harness.run_json_child(cmd, out_json, timeout=left, capture=False)
            if child.rc is None:
                print(f"=== {name}: {child.error}")
            entry: dict[str, Any] = {"rc": child.rc, "wall_s": child.wall_s}
            if child.result is not None:
                entry["results"] = child.result
            if child.rc is None or child.error.startswith("unreadable JSON"):
                entry["note"] = child.error
            summary[name] = entry
    total = time.perf_counter() - t_start
    print("\n=== summary")
    for name, e in summary.items():
        wall = f"{e['wall_s']:.0f}s" if "wall_s" in e else ""
        status = "ok" if e.get("rc") == 0 else (e.get("note") or f"rc={e.get('rc')}")
        print(f"  {name:20s} {status:30s} {wall}")
    print(f"  total {total:.0f}s")
    if args.json:
        _harness.write_json(Path(args.json), {"total_s": total, "benchmarks": summary})
        print(f"  results: {args.json}")
    return 0 if all(e.get("rc") == 0 for e in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
