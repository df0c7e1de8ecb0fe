"""Per-dispatch profile of a benchmark model on any IREE device, from IREE's dispatch benchmarks.

Where a whole-module profile is not available (IREE 3.13's CUDA HAL has no
``--device_profiling_mode``), this measures every dispatch of the model on its own:

* ``python benchmarks/dispatch_profile.py prepare DIR --model gpt --target cuda`` (where the
  compiler is): exports the model with turbine's defaults, compiles it with
  ``--iree-hal-dump-executable-benchmarks-to``, compiles each dumped dispatch benchmark to its
  own ``.vmfb``, and records how many times each dispatch runs per call (``counts.json``, from
  the program's ``stream.cmd.dispatch`` sites: the model is straight-line code).
* ``python benchmarks/dispatch_profile.py run DIR --device cuda`` (where the device is; needs only
  iree-base-runtime): runs ``iree-benchmark-module`` on each, and prints per-dispatch time, count
  per call, total per call and share, largest first (``--json`` for the rows).

``--dtype float16`` casts the model to fp16 first. Names ending in ``-f16`` in ``--model`` do the
same (``gpt-f16``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import _harness

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

_SITE = re.compile(r"stream\.cmd\.dispatch\s+(?:\{)?\s*@([\w$.-]+)::")
_HEADER = re.compile(
    r"^\s*(util\.initializer|util\.func\s+(?:public\s+|private\s+)?@([\w$.-]+))", re.M
)


def dispatch_sites(stream_ir: str, function: str = "main") -> dict[str, int]:
    """Executable name -> dispatch sites in ``function`` (and its ``$async`` body), not in
    initializers (weights packed once at load do not count per call)."""
    counts: dict[str, int] = {}
    heads = [(m.start(), m.group(2) or "") for m in _HEADER.finditer(stream_ir)]
    for i, (start, name) in enumerate(heads):
        if name != function and not name.startswith(function + "$"):
            continue
        end = heads[i + 1][0] if i + 1 < len(heads) else len(stream_ir)
        for exe in _SITE.findall(stream_ir[start:end]):
            counts[exe] = counts.get(exe, 0) + 1
    return counts


def prepare(out: Path, model: str, target: str, extra: list[str]) -> None:
    import cuda_prebuilt
    from iree.compiler.tools.binaries import find_tool

    import turbine_aot
    from turbine_aot._compiler.flags import default_compile_flags

    case = cuda_prebuilt._case(model)
    turbine_aot.externalize_module_parameters(case.module)
    eo = turbine_aot.export(case.module, args=case.args, dynamic_shapes=case.dynamic_shapes)
    flags = default_compile_flags(target, overrides=extra, use_env=False)
    out.mkdir(parents=True, exist_ok=True)
    src = out / f"src-{model}"
    shutil.rmtree(src, ignore_errors=True)
    eo.compile(
        save_to=out / f"{model}.whole.vmfb",
        extra_args=[*flags, f"--iree-hal-dump-executable-benchmarks-to={src}"],
    )
    # Dispatch sites per call: the stream-level program names each executable once per site.
    stream = out / f"{model}.stream.mlir"
    eo.compile(save_to=stream, extra_args=[*flags, "--compile-to=stream"])
    counts = dispatch_sites(stream.read_text())
    stream.unlink()
    tool = find_tool("iree-compile")
    built = 0
    for mlir in sorted(src.glob("*.mlir")):
        vmfb = out / f"{model}.{mlir.stem}.vmfb"
        r = subprocess.run(
            [tool, str(mlir), *flags, "-o", str(vmfb)], capture_output=True, text=True
        )
        if r.returncode:
            print(f"FAILED {mlir.name}: {r.stderr[:300]}")
        else:
            built += 1
    shutil.rmtree(src)
    (out / f"{model}.counts.json").write_text(json.dumps(counts, indent=1))
    print(f"{model}: {built} dispatch benchmarks, {sum(counts.values())} dispatch sites per call")


def _benchmark_tool() -> str:
    try:
        from iree._runtime_libs import __file__ as libs

        tool = Path(libs).parent / "iree-benchmark-module"
        if tool.exists():
            tool.chmod(tool.stat().st_mode | 0o111)
            return str(tool)
    except ImportError:
        pass
    return shutil.which("iree-benchmark-module") or "iree-benchmark-module"


def run(src: Path, device: str, batch: int, json_out: str | None) -> int:
    tool = _benchmark_tool()
    rows = []
    for counts_file in sorted(src.glob("*.counts.json")):
        model = counts_file.name.removesuffix(".counts.json")
        counts = json.loads(counts_file.read_text())
        for vmfb in sorted(src.glob(f"{model}.module_*.vmfb")):
            cmd = [
                tool,
                f"--module={vmfb}",
                f"--device={device}",
                f"--batch_size={batch}",
                "--benchmark_format=json",
                "--benchmark_min_time=0.2s",
            ]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if r.returncode:
                print(f"FAILED {vmfb.name}: {r.stderr[-300:]}")
                continue
            doc = json.loads(r.stdout[r.stdout.index("{") :])
            stem = vmfb.name.split(".module_", 1)[1]
            # The executable this benchmark was dumped from: the longest name it starts with.
            exe = max((k for k in counts if stem.startswith(k + "_")), key=len, default=stem)
            for b in doc["benchmarks"]:
                name = b["name"].split("/")[0].removeprefix("BM_")
                at = name.find(exe, len(exe))  # BM_<exe>_<variant>_<entry point>
                rows.append(
                    {
                        "model": model,
                        "dispatch": name[at:] if at > 0 else name,
                        "us": 1e6 / b["items_per_second"],
                        "per_call": counts.get(exe, 0),
                    }
                )
                rows[-1]["total_us"] = rows[-1]["us"] * rows[-1]["per_call"]
    for model in sorted({r["model"] for r in rows}):
        mine = sorted((r for r in rows if r["model"] == model), key=lambda r: -r["total_us"])
        total = sum(r["total_us"] for r in mine)
        print(f"\n{model} on {device}: sum of dispatches {total / 1e3:.3f} ms per call")
        print(f"{'dispatch':70s} {'us':>9s} {'n':>3s} {'ms/call':>8s} {'share':>6s}")
        for r in mine:
            share = r["total_us"] / total if total else 0
            print(
                f"{r['dispatch'][:70]:70s} {r['us']:9.1f} {r['per_call']:3d} "
                f"{r['total_us'] / 1e3:8.3f} {share:6.1%}"
            )
    if json_out:
        _harness.write_json(json_out, {"device": device, "rows": rows})
    return 0


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("dir")
    a.add_argument("--model", default="gpt")
    a.add_argument("--target", default="llvm-cpu")
    a.add_argument("--flag", action="append", default=[], help="extra compiler flag (repeatable)")
    b = sub.add_parser("run")
    b.add_argument("dir")
    b.add_argument("--device", default="local-sync")
    b.add_argument("--batch", type=int, default=20, help="dispatches per benchmark iteration")
    b.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.cmd == "prepare":
        prepare(Path(args.dir), args.model, args.target, args.flag)
        return 0
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return run(Path(args.dir), args.device, args.batch, args.json)


if __name__ == "__main__":
    sys.exit(main())
