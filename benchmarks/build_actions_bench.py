"""Benchmark: N model variants exported by ``turbine_generate`` out of process vs in process.

Runs the same ``iree.build`` file twice as a user would (a fresh ``python build.py`` each time,
so both pay the torch import and torch.export's first-call warm-up in every process that
exports): once with ``out_of_process=False`` (all exports in the build process, one after the
other), once with the default worker pool (``--turbine-generate-jobs``, default: usable cores).
The model is a stack of transformer encoder layers; variants differ in sequence length. Prints
wall times, the speed-up, and whether both modes produced byte-identical .mlir files.

    python benchmarks/build_actions_bench.py [--variants 6] [--jobs 2] [--layers 4]
"""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import _harness

BUILD_FILE = textwrap.dedent(
    """
    from __future__ import annotations

    import torch
    from iree.build import cl_arg, entrypoint, iree_build_main

    from turbine_aot import ExportOutput, export
    from turbine_aot.build_actions import turbine_generate

    VARIANTS = {variants}
    LAYERS = {layers}
    D_MODEL = 64


    class EncoderStack(torch.nn.Module):
        def __init__(self, layers: int, d_model: int):
            super().__init__()
            self.layers = torch.nn.ModuleList(
                torch.nn.TransformerEncoderLayer(
                    d_model, 4, 4 * d_model, dropout=0.0, batch_first=True
                )
                for _ in range(layers)
            )

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x


    def export_variant(seq_len: int) -> ExportOutput:
        torch.manual_seed(0)
        model = EncoderStack(LAYERS, D_MODEL).eval()
        return export(model, args=(torch.randn(1, seq_len, D_MODEL),))


    @entrypoint
    def variants(mode=cl_arg("generate-mode", default="pool", help="pool or in-process")):
        return [
            turbine_generate(
                export_variant, seq, name=f"encoder_s{{seq}}", out_of_process=mode == "pool"
            )
            for seq in VARIANTS
        ]


    if __name__ == "__main__":
        iree_build_main()
    """
)


def _run(build_file: Path, out: Path, *extra: str, timeout: float) -> tuple[float, float]:
    """Runs one build; returns (wall seconds, CPU seconds of it and its workers)."""
    cmd = [sys.executable, str(build_file), "--output-dir", str(out), *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise RuntimeError(f"build failed ({' '.join(cmd)}):\n{result.stderr[-4000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def _digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*.mlir"))
    }


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument("--variants", type=int, default=6, help="number of variants (default 6)")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: cores)")
    p.add_argument("--layers", type=int, default=8, help="encoder layers in the model (default 8)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per build")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args(argv)

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    jobs = args.jobs or cores
    seq_lens = [16 + 8 * i for i in range(args.variants)]
    with tempfile.TemporaryDirectory(prefix="turbine-build-bench-") as tmp:
        tmp_path = Path(tmp)
        build_file = tmp_path / "build_variants.py"
        build_file.write_text(BUILD_FILE.format(variants=seq_lens, layers=args.layers))
        load_before = os.getloadavg()[0]
        in_process_s, in_process_cpu = _run(
            build_file, tmp_path / "in", "--generate-mode=in-process", timeout=args.timeout
        )
        pool_s, pool_cpu = _run(
            build_file,
            tmp_path / "pool",
            "--turbine-generate-jobs",
            str(jobs),
            timeout=args.timeout,
        )
        same = _digests(tmp_path / "in") == _digests(tmp_path / "pool")
        count = len(_digests(tmp_path / "pool"))

    print(
        f"build_actions: {args.variants} variants of a {args.layers}-layer encoder stack, "
        f"{cores} usable cores, load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    print(
        f"  in process (out_of_process=False): {in_process_s:7.2f} s  ({in_process_cpu:.1f} CPU s)"
    )
    print(f"  worker pool, {jobs} jobs:            {pool_s:7.2f} s  ({pool_cpu:.1f} CPU s)")
    print(f"  speed-up (in process / pool):      {in_process_s / pool_s:7.2f}x")
    print(f"  outputs: {count} .mlir files, identical in both modes: {same}")
    if args.json is not None:
        _harness.write_json(
            args.json,
            {
                "variants": args.variants,
                "layers": args.layers,
                "cores": cores,
                "jobs": jobs,
                "load_average_before": load_before,
                "in_process_s": in_process_s,
                "in_process_cpu_s": in_process_cpu,
                "pool_s": pool_s,
                "pool_cpu_s": pool_cpu,
                "speedup": in_process_s / pool_s,
                "outputs_identical": same,
            },
        )
    return 0 if same and count == args.variants else 1


if __name__ == "__main__":
    sys.exit(main())
