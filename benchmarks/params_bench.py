"""turbine-params: streaming writes and zero-copy reads of .irpa archives, against baselines.

Everything is measured in one process and one directory, interleaved round by round (the order
rotating each round), and reported as best-of-rounds and median times; ratios compare best times
(on a shared machine other processes' disk and CPU load only ever add time, so the best of a few
rounds is the steadiest estimate) against a baseline from the same run:

Writing a state dict of ``--size-gb`` (default 1 GB; the issue's figure is 4 GB):

* baseline: a plain sequential write of the same tensor bytes to one file, then fsync;
* turbine_params: ``ParameterArchiveBuilder.add_tensor`` for each + ``save`` (atomic, fsynced);
* ``torch.save`` and safetensors ``save_file`` side by side.

Goals: throughput >= 0.8x the baseline; peak RSS during the save <= RSS before it + 256 MB
(sampled with psutil every few milliseconds).

Reading:

* opening a 10,000-entry archive (goal: milliseconds), and IREE's own ``ParameterIndex.load``
  of the same file when iree-base-runtime is installed;
* ``as_tensor()`` with ``mmap=True`` is zero-copy (its data pointer lies inside the mapping);
* reading every tensor of the archive (one reduction over each, the same numpy reduction for
  every reader) against the same byte ranges through ``np.memmap`` (goal: >= 0.8x), with
  ``torch.load(mmap=True)`` and safetensors ``load_file`` side by side. The files were just
  written, so all readers see a warm page cache.

Run: ``python benchmarks/params_bench.py [--size-gb 1] [--rounds 3] [--dir DIR]`` (or through
``benchmarks/run.py``). Prints figures; never asserts on time.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import _harness
import numpy as np

MB = 1 << 20


class RssSampler:
    """Samples this process's RSS in a thread; ``peak`` is the maximum seen while running."""

    def __init__(self, interval_s: float = 0.002):
        import psutil

        self._proc = psutil.Process()
        self.interval_s = interval_s
        self.before = self._proc.memory_info().rss
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(self.interval_s)

    def __enter__(self) -> RssSampler:
        self.before = self._proc.memory_info().rss
        self.peak = self.before
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def delta_mb(self) -> float:
        return (self.peak - self.before) / MB


def _state_dict(size_gb: float, tensors: int):
    import torch

    total = int(size_gb * (1 << 30))
    per = max(total // tensors // 4, 1)
    gen = torch.Generator().manual_seed(0)
    return {f"layers.{i}.weight": torch.rand(per, generator=gen) for i in range(tensors)}


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _plain_write(sd, path: Path) -> None:
    with open(path, "wb", buffering=0) as f:
        for t in sd.values():
            view = memoryview(t.numpy()).cast("B")
            while view:
                n = f.write(view)
                view = view[n:]
        os.fsync(f.fileno())


def _turbine_save(sd, path: Path) -> None:
    from turbine_params import ParameterArchiveBuilder

    b = ParameterArchiveBuilder()
    for k, t in sd.items():
        b.add_tensor(k, t)
    b.save(path)


def _torch_save(sd, path: Path) -> None:
    import torch

    torch.save(sd, path)
    _fsync_path(path)


def _safetensors_save(sd, path: Path) -> None:
    from safetensors.torch import save_file

    save_file(sd, str(path))
    _fsync_path(path)


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def bench_write(sd, workdir: Path, rounds: int) -> dict[str, dict[str, float]]:
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    writers: dict[str, tuple[Callable, str]] = {
        "plain write (baseline)": (_plain_write, "plain.bin"),
        "turbine_params save": (_turbine_save, "model.irpa"),
        "torch.save": (_torch_save, "model.pt"),
    }
    if _have("safetensors"):
        writers["safetensors save_file"] = (_safetensors_save, "model.safetensors")
    times: dict[str, list[float]] = {k: [] for k in writers}
    rss: dict[str, float] = {k: 0.0 for k in writers}
    # Warm-up (untimed): the first large write of a process is slower whoever does it.
    _plain_write(sd, workdir / "warmup.bin")
    (workdir / "warmup.bin").unlink()
    order = list(writers)
    for r in range(rounds):
        # Rotate the order each round so no writer always follows the same one.
        for name in order[r % len(order) :] + order[: r % len(order)]:
            fn, fname = writers[name]
            path = workdir / fname
            if path.exists() and r < rounds - 1:
                path.unlink()
            with RssSampler() as s:
                t0 = time.perf_counter()
                fn(sd, path)
                dt = time.perf_counter() - t0
            times[name].append(dt)
            rss[name] = max(rss[name], s.delta_mb)
            if r < rounds - 1:
                path.unlink()
    base = min(times["plain write (baseline)"])
    out = {}
    for name in writers:
        best = min(times[name])
        out[name] = {
            "seconds": best,
            "median_s": statistics.median(times[name]),
            "GB/s": nbytes / best / (1 << 30),
            "ratio": base / best,
            "rss_mb": rss[name],
        }
    return out


def bench_open(workdir: Path, entries: int, rounds: int) -> dict[str, float]:
    from turbine_params import ParameterArchive, ParameterArchiveBuilder

    b = ParameterArchiveBuilder()
    arr = np.arange(64, dtype=np.float32)
    for i in range(entries):
        b.add_blob(f"blk.{i}.weight", arr, metadata=b"PYTORCH:{}")
    path = b.save(workdir / "many.irpa")
    opened, looked_up, listed = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        with ParameterArchive(path) as archive:
            t1 = time.perf_counter()
            archive[f"blk.{entries // 2}.weight"].as_flat_array()
            t2 = time.perf_counter()
        with ParameterArchive(path) as archive:
            t3 = time.perf_counter()
            n = len(archive.items())
            t4 = time.perf_counter()
        opened.append(t1 - t0)
        looked_up.append(t2 - t0)
        listed.append(t4 - t3 + (t1 - t0))
    assert n == entries
    out = {
        "turbine_params open (ms)": statistics.median(opened) * 1e3,
        "turbine_params open + one lookup (ms)": statistics.median(looked_up) * 1e3,
        "turbine_params open + items() (ms)": statistics.median(listed) * 1e3,
    }
    if _have("iree.runtime"):
        import iree.runtime as rt

        theirs = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            idx = rt.ParameterIndex()
            idx.load(str(path))
            theirs.append(time.perf_counter() - t0)
        out["iree.runtime ParameterIndex.load (ms)"] = statistics.median(theirs) * 1e3
    return out


def _reduce(a: np.ndarray) -> float:
    # The same work for every reader: touch every byte once.
    return float(np.add.reduce(a, dtype=np.float64))


def bench_read(workdir: Path, rounds: int) -> tuple[dict[str, dict[str, float]], bool]:
    import torch

    from turbine_params import ParameterArchive

    irpa = workdir / "model.irpa"
    nbytes = 0
    ranges = []
    with ParameterArchive(irpa) as archive:
        for _, e in archive.items():
            ranges.append((e.raw.offset, e.length // 4))
            nbytes += e.length
        # Zero-copy check: the tensor's memory lies inside the file mapping.
        first = archive.items()[0][1]
        mapping = first.raw.file.mapping
        start = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        t = first.as_tensor()
        zero_copy = start <= t.data_ptr() < start + len(mapping)
        del t

    def ours() -> float:
        s = 0.0
        with ParameterArchive(irpa) as archive:
            for _, e in archive.items():
                s += _reduce(e.as_tensor().numpy())
        return s

    def memmap() -> float:
        s = 0.0
        mm = np.memmap(irpa, dtype=np.uint8, mode="r")
        for off, n in ranges:
            s += _reduce(mm[off : off + 4 * n].view(np.float32))
        del mm
        return s

    def torch_mmap() -> float:
        sd = torch.load(workdir / "model.pt", mmap=True, weights_only=True)
        return sum(_reduce(t.numpy()) for t in sd.values())

    def st_load() -> float:
        from safetensors.torch import load_file

        sd = load_file(str(workdir / "model.safetensors"))
        return sum(_reduce(t.numpy()) for t in sd.values())

    readers: dict[str, Callable[[], float]] = {
        "np.memmap (baseline)": memmap,
        "turbine_params as_tensor (mmap)": ours,
        "torch.load(mmap=True)": torch_mmap,
    }
    if _have("safetensors") and (workdir / "model.safetensors").exists():
        readers["safetensors load_file"] = st_load
    times: dict[str, list[float]] = {k: [] for k in readers}
    rss: dict[str, float] = {k: 0.0 for k in readers}
    sums = {}
    rorder = list(readers)
    for r in range(rounds):
        for name in rorder[r % len(rorder) :] + rorder[: r % len(rorder)]:
            fn = readers[name]
            with RssSampler() as s:
                t0 = time.perf_counter()
                sums[name] = fn()
                times[name].append(time.perf_counter() - t0)
            rss[name] = max(rss[name], s.delta_mb)
    ref = sums["np.memmap (baseline)"]
    for name, v in sums.items():
        if not np.isclose(v, ref, rtol=1e-6):
            print(f"WARNING: {name} read different data ({v} vs {ref})", file=sys.stderr)
    base = min(times["np.memmap (baseline)"])
    out = {}
    for name in readers:
        best = min(times[name])
        out[name] = {
            "seconds": best,
            "median_s": statistics.median(times[name]),
            "GB/s": nbytes / best / (1 << 30),
            "ratio": base / best,
            "rss_mb": rss[name],
        }
    return out, zero_copy


def _table(title: str, rows: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(
        f"  {'':34s} {'best s':>8s} {'median s':>9s} {'GB/s':>7s} {'vs base':>8s} "
        f"{'peak RSS +MB':>13s}"
    )
    for name, r in rows.items():
        print(
            f"  {name:34s} {r['seconds']:8.3f} {r['median_s']:9.3f} {r['GB/s']:7.2f} "
            f"{r['ratio']:7.2f}x {r['rss_mb']:13.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument("--size-gb", type=float, default=1.0, help="state dict size (default 1 GB)")
    p.add_argument("--tensors", type=int, default=64, help="number of tensors (default 64)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    p.add_argument("--entries", type=int, default=10_000, help="entries for the open benchmark")
    p.add_argument("--dir", default=None, help="directory for the files (default: a temp dir)")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    try:
        import psutil  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print(f"params_bench: skipped ({e.name} is not installed)")
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="turbine-params-bench-", dir=args.dir))
    try:
        print(
            f"turbine-params benchmark: {args.size_gb:g} GB in {args.tensors} float32 tensors, "
            f"{args.rounds} rounds, files in {workdir}"
        )
        sd = _state_dict(args.size_gb, args.tensors)
        writes = bench_write(sd, workdir, args.rounds)
        _table("write (throughput ratio vs plain write; goal >= 0.80x, RSS + <= 256 MB)", writes)
        del sd
        opened = bench_open(workdir, args.entries, max(args.rounds, 5))
        print(f"\nopen a {args.entries}-entry archive (goal: milliseconds)")
        for k, v in opened.items():
            print(f"  {k:40s} {v:8.2f}")
        reads, zero_copy = bench_read(workdir, args.rounds)
        _table("read every tensor (ratio vs np.memmap; goal >= 0.80x)", reads)
        print(
            f"\nas_tensor() with mmap=True is zero-copy (pointer inside the mapping): {zero_copy}"
        )
        w = writes["turbine_params save"]
        r = reads["turbine_params as_tensor (mmap)"]
        print("\nsummary")
        print(
            f"  write ratio {w['ratio']:.2f}x (goal >= 0.80): "
            f"{'met' if w['ratio'] >= 0.8 else 'NOT met'}"
        )
        print(
            f"  write peak RSS +{w['rss_mb']:.0f} MB (goal <= 256): "
            f"{'met' if w['rss_mb'] <= 256 else 'NOT met'}"
        )
        ms = opened["turbine_params open (ms)"]
        print(f"  open {args.entries} entries {ms:.1f} ms")
        print(
            f"  read ratio {r['ratio']:.2f}x (goal >= 0.80): "
            f"{'met' if r['ratio'] >= 0.8 else 'NOT met'}"
        )
        print(f"  zero-copy: {zero_copy}")
        if args.json:
            _harness.write_json(
                Path(args.json),
                {
                    "size_gb": args.size_gb,
                    "tensors": args.tensors,
                    "rounds": args.rounds,
                    "write": writes,
                    "open_ms": opened,
                    "read": reads,
                    "zero_copy": zero_copy,
                },
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
