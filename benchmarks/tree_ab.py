"""Before / after a change of the code, in one run: ``models_bench`` from two source trees.

A refactor must leave behaviour and speed as they were. This runs ``benchmarks/models_bench.py``
alternately from a git revision (``--before``, checked out as a detached worktree) and from this
tree, ``--rounds`` times each (before, after, before, after, ...), with the compile cache off (a
module compiled by one tree must not be served to the other), and prints per model and compile
variant: the module size in bytes and the max abs error against eager (each should be equal to
the digit when the compiled code is unchanged; a size can differ by the length of the source
path the module's debug locations name), the latency as a ratio to eager PyTorch measured in the
same child process, and turbine's CPU time per call, medians over rounds. On a loaded machine
eager's multi-threaded latency swings widely; ``-- --threads 1`` is the steadier comparison.

Both trees run with this environment's Python and packages; only the five turbine packages'
sources differ (``PYTHONPATH`` puts the tree's ``packages/*/src`` first).

Usage::

    python benchmarks/tree_ab.py --before 7a59952 -- --models mlp,resnet18,gpt --variants turbine
    python benchmarks/tree_ab.py --before HEAD~3 --rounds 3 --json ab.json -- --threads 1

It is a benchmark, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PACKAGES = ("params", "ir", "trace", "fx", "aot")


def _worktree(rev: str, where: Path) -> Path:
    """A detached worktree of ``rev`` under ``where`` (created once, reused)."""
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", rev],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    tree = where / f"tree-{sha}"
    if not (tree / "packages").is_dir():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha],
            check=True,
            capture_output=True,
        )
    return tree


def _run(tree: Path, bench_args: list[str], out: Path) -> dict[str, Any]:
    env = dict(os.environ)
    src = [str(tree / "packages" / f"turbine-{p}" / "src") for p in PACKAGES]
    env["PYTHONPATH"] = os.pathsep.join([*src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["TURBINE_COMPILE_CACHE"] = "0"
    cmd = [sys.executable, str(tree / "benchmarks" / "models_bench.py"), *bench_args]
    cmd += ["--json", str(out)]
    print(f"[tree_ab] {tree.name}: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, cwd=tree, env=env, check=False)
    return json.loads(out.read_text()) if out.exists() else {"results": []}


def _cells(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    cells = {}
    for r in result.get("results", []):
        eager = r.get("eager_ms")
        for name, v in (r.get("variants") or {}).items():
            cells[(r["model"], name)] = {
                "bytes": v.get("module_bytes"),
                "err": v.get("max_abs_err"),
                "ratio": v["ms"] / eager if eager and v.get("ms") else None,
                "cpu_ms": v.get("cpu_ms"),
                "error": v.get("error"),
            }
    return cells


def summarize(before: list[dict], after: list[dict]) -> list[dict[str, Any]]:
    """Per (model, variant): sizes and errors of each side (all rounds), median ratios."""
    rows = []
    b_cells = [_cells(r) for r in before]
    a_cells = [_cells(r) for r in after]
    keys = sorted({k for c in b_cells + a_cells for k in c})
    for key in keys:
        row: dict[str, Any] = {"model": key[0], "variant": key[1]}
        for side, cells in (("before", b_cells), ("after", a_cells)):
            got = [c[key] for c in cells if key in c]
            ratios = [g["ratio"] for g in got if g["ratio"] is not None]
            cpu = [g["cpu_ms"] for g in got if g.get("cpu_ms") is not None]
            row[side] = {
                "bytes": sorted({g["bytes"] for g in got if g["bytes"] is not None}),
                "err": sorted({g["err"] for g in got if g["err"] is not None}),
                "ratio": statistics.median(ratios) if ratios else None,
                "ratios": ratios,
                "cpu_ms": statistics.median(cpu) if cpu else None,
                "errors": [g["error"] for g in got if g["error"]],
            }
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]], before_rev: str) -> None:
    def fmt(v: Any) -> str:
        if isinstance(v, list):
            return "/".join(f"{x:.3g}" if isinstance(x, float) else str(x) for x in v) or "-"
        return "-" if v is None else f"{v:.3f}"

    print(f"\nbefore = {before_rev}, after = this tree; latency as × eager (same process)\n")
    print(
        "| model | variant | module bytes before / after | max abs err before / after "
        "| × eager before | × eager after | after / before | CPU ms before | CPU ms after |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        b, a = r["before"], r["after"]
        change = a["ratio"] / b["ratio"] if a["ratio"] and b["ratio"] else None
        same_bytes = "same " + fmt(a["bytes"]) if b["bytes"] == a["bytes"] else None
        size = same_bytes or f"{fmt(b['bytes'])} / {fmt(a['bytes'])}"
        err = (
            "same " + fmt(a["err"])
            if b["err"] == a["err"]
            else f"{fmt(b['err'])} / {fmt(a['err'])}"
        )
        print(
            f"| {r['model']} | {r['variant']} | {size} | {err} | {fmt(b['ratio'])} "
            f"| {fmt(a['ratio'])} | {fmt(change)} | {fmt(b['cpu_ms'])} | {fmt(a['cpu_ms'])} |"
        )
        for side in ("before", "after"):
            for e in r[side]["errors"]:
                print(f"  {side} failed: {e}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bench_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, bench_args = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--before", required=True, help="git revision of the 'before' tree")
    p.add_argument("--rounds", type=int, default=2, help="runs of each tree, alternating")
    p.add_argument("--workdir", default=None, help="where the worktree goes (default: a temp dir)")
    p.add_argument("--json", default=None, help="write the raw results and the summary here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="turbine-ab-") as td:
        where = Path(args.workdir) if args.workdir else Path(td)
        before_tree = _worktree(args.before, where)
        before: list[dict] = []
        after: list[dict] = []
        try:
            for i in range(args.rounds):
                before.append(_run(before_tree, bench_args, Path(td) / f"before-{i}.json"))
                after.append(_run(ROOT, bench_args, Path(td) / f"after-{i}.json"))
        finally:
            if not args.workdir:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before_tree)],
                    check=False,
                    capture_output=True,
                )
        rows = summarize(before, after)
        print_table(rows, args.before)
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "before": args.before,
                        "summary": rows,
                        "raw": {"before": before, "after": after},
                    },
                    indent=1,
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
