"""What the benchmarks share: their argument parser, child processes reporting JSON, atomic JSON
output, and the measurements (export, compile, load, interleaved timing).

Timings on a shared machine are noisy: every comparison measures the candidates interleaved in
the same process (round-robin, one call each per round) and reports medians and ratios. New
benchmarks use these helpers instead of copying them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def argument_parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's parser, described by the first paragraph of its module docstring."""
    return argparse.ArgumentParser(description=(doc or "").strip().split("\n\n")[0])


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Writes ``data`` as indented JSON, atomically (turbine_params' one atomic-write helper:
    temp file beside it, fsync, rename), creating the directory."""
    from turbine_params import atomic_write_bytes

    text = json.dumps(data, indent=1, default=str) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"), parents=True)


@dataclass
class ChildResult:
    """What a child process of a benchmark reported."""

    rc: int | None  # None: killed at the timeout
    result: Any  # the JSON it wrote, or None
    error: str  # "" when it exited 0 and its JSON (if any) was read; else what went wrong
    wall_s: float


def run_json_child(
    cmd: Sequence[str], json_path: str | os.PathLike[str], *, timeout: float, capture: bool = True
) -> ChildResult:
    """Runs ``cmd`` (which writes its figures as JSON to ``json_path``) and reads them back.

    A child process per model or benchmark keeps their memory, threads and compile caches
    apart. ``capture=False`` lets its output through (progress lines); with ``capture=True`` the
    tail of its stderr becomes ``error`` when it fails.
    """
    t0 = time.perf_counter()
    out = Path(json_path)
    try:
        proc = subprocess.run(list(cmd), timeout=timeout, capture_output=capture, text=True)
    except subprocess.TimeoutExpired:
        return ChildResult(None, None, f"timed out after {timeout:.0f}s", time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    result, error = None, ""
    if out.exists():  # also after a failure: a benchmark may report figures and exit 1
        try:
            result = json.loads(out.read_text())
        except json.JSONDecodeError as e:
            error = f"unreadable JSON: {e}"
    if proc.returncode != 0 and not error:
        tail = (proc.stderr or "").strip()[-1500:] if capture else ""
        error = tail or f"exit status {proc.returncode}"
    return ChildResult(proc.returncode, result, error, wall)


def add_llm_run_arguments(
    p: argparse.ArgumentParser, *, prompt: int, timeout_s: float, group_size: int = 128
) -> None:
    """The options of the LLM decode benchmarks (``llm_bench.py``, ``llama_cpp_side_by_side.py``)
    that :func:`run_llm_child` forwards to their children, and the hidden child options."""
    p.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    p.add_argument("--group-size", type=int, default=group_size, help="inputs per int4 scale")
    p.add_argument("--prompt", type=int, default=prompt, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--budget-s", type=float, default=60.0, help="timing budget per child")
    p.add_argument("--timeout-s", type=float, default=timeout_s, help="per-child timeout")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--child-json", default=None, help=argparse.SUPPRESS)


def run_llm_child(
    script: str, name: str, threads: int, args: argparse.Namespace, extra: Sequence[str] = ()
) -> ChildResult:
    """Runs ``script`` as a child measuring model ``name`` on ``threads`` threads, with the
    options of :func:`add_llm_run_arguments` from ``args`` (and ``extra``); its progress
    lines go through, its JSON comes back."""
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / "r.json"
        cmd = [sys.executable, script, "--child", name, "--child-threads", str(threads)]
        cmd += ["--child-json", str(out), "--prompt", str(args.prompt)]
        cmd += ["--new-tokens", str(args.new_tokens), "--rounds", str(args.rounds)]
        cmd += ["--budget-s", str(args.budget_s), "--group-size", str(args.group_size), *extra]
        return run_json_child(cmd, out, timeout=args.timeout_s, capture=False)


def read_bandwidth_gbs(threads: int, mib: int = 1024) -> float:
    """The machine's read bandwidth, the denominator of the bandwidth limits (issue 26): a
    parallel read of a ``mib`` MiB buffer (one chunk and one thread per worker), bytes read / s
    in GB/s, the best of 5 rounds of each of three reads: numpy's ``sum`` of float32, numpy's
    ``sum`` of the same bytes as uint64, and torch's ``sum`` of float32 on one intra-op thread.
    The fastest read is the measure: on a slow core numpy's pairwise float32 sum is bound by its
    own arithmetic (16.4 GB/s on one Zen 3 core where torch's sum read 23.0), and a limit it
    measured let decode steps run "above the limit" (docs/quantization.md, "The read-bandwidth
    probe"). A copy (read + write) understates it further: the 110M Llama's fp32 step stood "at
    the limit" by a copy and at about 0.75 of it by a read (docs/llms.md, "Benchmark")."""
    import torch

    buf = np.ones(mib * 2**20 // 4, dtype=np.float32)
    chunks = np.array_split(buf, threads)
    as_u64 = [c[: c.size // 2 * 2].view(np.uint64) for c in chunks]
    as_torch = [torch.from_numpy(c) for c in chunks]
    reads: list[tuple[Callable[[Any], Any], list[Any]]] = [
        (np.sum, chunks),
        (np.sum, as_u64),
        (torch.sum, as_torch),
    ]
    intra = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread per chunk, as numpy's
    best = float("inf")
    try:
        for fn, parts in reads:
            for _ in range(5):
                ts = [threading.Thread(target=fn, args=(c,)) for c in parts]
                t0 = time.perf_counter()
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(intra)
    return buf.nbytes / best / 1e9


def decode_read_bytes(model: Any, irpa: str | os.PathLike[str]) -> int:
    """The weight bytes one decode step of ``model`` reads, from the archive ``irpa`` its export
    saved (``llm.export_causal_lm(model).save_parameters(irpa)``): every entry in full, except
    an embedding table's (a step looks up one row of each: that row counts), unless the table is
    tied to the output layer, which reads all of it. Quantized weights count as stored (their
    integer data, scales and zero points: the entries ``<param>.<inner>``); tied names, which
    share their stored bytes, and splats, which are not stored, count once and not at all."""
    import torch

    from turbine_params import ParameterArchive

    tied = model.get_output_embeddings()
    tied_weight = getattr(tied, "weight", None)
    tables = {
        f"{name}.weight": m.num_embeddings
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Embedding) and m.weight is not tied_weight
    }
    total, seen = 0, set()
    with ParameterArchive(irpa) as archive:
        for key, entry in archive.items():
            storage = (entry.raw.offset, entry.length)
            if entry.is_splat or storage in seen:  # tied names share their stored bytes
                continue
            seen.add(storage)
            table = next((t for t in tables if key == t or key.startswith(t + ".")), None)
            total += entry.length // tables[table] if table else entry.length
    return total


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass
class Exported:
    mlir: str
    export_s: float
    import_s: float
    rss_mb: float


def export_mlir(module, args, *, dynamic_shapes=None, decompositions=None) -> Exported:
    """torch.export + FX import to torch-dialect MLIR text.

    Uses ``turbine_aot.export`` when it exists, else ``iree.compiler.extras.fx_importer`` directly.
    """
    import torch

    t0 = time.perf_counter()
    prog = torch.export.export(module, args, dynamic_shapes=dynamic_shapes, strict=False)
    if decompositions is not None:
        prog = prog.run_decompositions(decompositions)
    t1 = time.perf_counter()
    from iree.compiler.extras.fx_importer import FxImporter

    importer = FxImporter()
    importer.import_frozen_program(prog, func_name="main")
    text = str(importer.module)
    t2 = time.perf_counter()
    return Exported(text, t1 - t0, t2 - t1, peak_rss_mb())


@dataclass
class Compiled:
    vmfb: bytes
    compile_s: float
    rss_mb: float
    flags: list[str] = field(default_factory=list)


def compile_mlir(mlir: str, flags: Sequence[str], *, input_type: str = "torch") -> Compiled:
    """Runs ``iree-compile`` as a child process, measuring wall time and its peak RSS."""
    from iree.compiler.tools.binaries import find_tool

    tool = find_tool("iree-compile")
    with tempfile.TemporaryDirectory(prefix="turbine-bench-") as td:
        src = Path(td, "in.mlir")
        src.write_text(mlir)
        out = Path(td, "out.vmfb")
        cmd = [tool, str(src), f"--iree-input-type={input_type}", *flags, "-o", str(out)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        peak = [0.0]
        stop = threading.Event()

        def _poll() -> None:
            try:
                import psutil

                p = psutil.Process(proc.pid)
                while not stop.is_set():
                    try:
                        peak[0] = max(peak[0], p.memory_info().rss / 2**20)
                    except psutil.Error:
                        return
                    stop.wait(0.02)
            except ImportError:
                return

        th = threading.Thread(target=_poll, daemon=True)
        th.start()
        _, err = proc.communicate()
        stop.set()
        th.join()
        dt = time.perf_counter() - t0
        if proc.returncode != 0:
            msg = err.decode(errors="replace")
            raise RuntimeError(f"iree-compile failed ({' '.join(flags)}):\n{msg[-3000:]}")
        return Compiled(out.read_bytes(), dt, peak[0], list(flags))


class IreeCallable:
    """A compiled module's ``main`` loaded on a driver; called with numpy arrays."""

    def __init__(self, vmfb: bytes, driver: str = "local-task", *, function: str = "main"):
        import iree.runtime as rt

        self.config = rt.Config(driver)
        vm_module = rt.VmModule.copy_buffer(self.config.vm_instance, vmfb)
        self.ctx = rt.SystemContext(vm_modules=[vm_module], config=self.config)
        self.fn = self.ctx.modules.module[function]

    def __call__(self, *args: np.ndarray) -> np.ndarray:
        res = self.fn(*args)
        if isinstance(res, (list, tuple)):
            res = res[0]
        return res.to_host()


def time_interleaved(
    fns: dict[str, Callable[[], object]],
    *,
    calls: int = 20,
    warmup: int = 2,
    budget_s: float = 30,
    block: int = 1,
    gap_s: float = 0.0,
) -> dict[str, dict]:
    """Median wall and CPU seconds per call of each function, measured round-robin.

    One call of each function per round (``block=1``), so that load from other processes hits
    every candidate alike. Stops early (after at least 5 rounds) when ``budget_s`` is spent. CPU
    time is this process's (all threads): on a busy machine it shows the work done, free of
    waiting.

    ``block > 1``: each round calls each function ``block`` times in a row and times all but the
    first of them, and the order of the functions rotates from round to round. For runtimes with
    thread pools of their own (ONNX Runtime, OpenVINO, IREE's task workers), the first call after
    another runtime's pays for that runtime's threads still spinning and for the caches it
    evicted: measured back to back, OpenVINO's ResNet-18 call took 33 ms at two threads against
    17.5 ms of its own layers (docs/performance.md, section 10). A block measures each runtime as
    a user calls it, repeatedly, while the rounds still interleave them. ``gap_s``: a pause
    before each block, so that the previous block's spinning threads have gone to sleep (they
    otherwise keep both cores of a 2-core machine busy well past a short call: turbine's MLP at
    two threads took 1.6 ms per call right after ONNX Runtime's block and 0.56 ms alone).

    Returns:
        name -> {"wall": median s, "cpu": median s, "all": [wall s, ...]}.
    """
    for _ in range(warmup):
        for f in fns.values():
            f()
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    t_start = time.perf_counter()
    for i in range(calls):
        order = names[i % len(names) :] + names[: i % len(names)] if block > 1 else names
        for k in order:
            f = fns[k]
            if gap_s:
                time.sleep(gap_s)
            for j in range(block):
                c0 = time.process_time()
                t0 = time.perf_counter()
                f()
                if block == 1 or j > 0:
                    wall[k].append(time.perf_counter() - t0)
                    cpu[k].append(time.process_time() - c0)
        if i >= 4 and time.perf_counter() - t_start > budget_s:
            break
    return {
        k: {"wall": statistics.median(wall[k]), "cpu": statistics.median(cpu[k]), "all": wall[k]}
        for k in fns
    }


@dataclass
class KernelVariant:
    """One variant of a hand-written kernel for :func:`kernel_ab`: its name and the MLIR module
    (text) whose ``main`` runs it on the benchmark's operands."""

    name: str
    mlir: str


def kernel_main(mlir: str, src: Path, cfg: Any) -> Callable[..., Any]:
    """``main`` of the MLIR module ``mlir`` (a hand-written kernel's benchmark module), written
    to ``src`` and compiled beside it for this CPU (``llvm-cpu``), loaded on ``cfg`` (an
    ``iree.runtime.Config``)."""
    import iree.runtime as rt
    from iree.compiler.tools.binaries import find_tool

    src.write_text(mlir)
    vmfb = src.with_suffix(".vmfb")
    cmd = [find_tool("iree-compile"), str(src), "--iree-hal-target-device=local"]
    cmd += ["--iree-hal-local-target-device-backends=llvm-cpu"]
    cmd += ["--iree-llvmcpu-target-cpu=host", "-o", str(vmfb)]
    subprocess.run(cmd, check=True)
    vm = rt.VmModule.copy_buffer(cfg.vm_instance, vmfb.read_bytes())
    return rt.SystemContext(vm_modules=[vm], config=cfg).modules.module["main"]


def kernel_ab(
    variants: Sequence[KernelVariant],
    operands: Sequence[np.ndarray],
    check: Callable[[str, np.ndarray], None],
    *,
    weight_bytes: int,
    calls: int,
    budget_s: float,
    json_path: str | None,
    meta: dict[str, Any],
    threads: int = 1,
) -> dict[str, dict]:
    """The kernel A/B benchmarks' body (``vnni_kernel_ab.py``, ``quant_kernel_ab.py``,
    ``amx_quant_ablation.py``): compiles each variant's module for this CPU (``llvm-cpu``;
    ``local-sync`` for one thread, else ``local-task`` with ``threads`` workers), checks its
    first result with ``check(name, result)`` (which raises on a wrong one), times the variants
    round-robin (:func:`time_interleaved`), prints median ms per call, the weights' read rate
    and calls/s against the first variant, and writes them with ``meta`` to ``json_path``.

    Returns:
        name -> {"ms", "gb_per_s", "default_over_this"}.
    """
    import iree.runtime as rt

    if threads > 1:
        set_runtime_flags([f"--task_topology_max_group_count={threads}"])
    cfg = rt.Config("local-sync" if threads == 1 else "local-task")
    dev = [rt.asdevicearray(cfg.device, a) for a in operands]
    fns: dict[str, Callable[[], object]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="turbine-kernel-ab-"))
    for v in variants:
        fn = kernel_main(v.mlir, tmp / f"{v.name}.mlir", cfg)
        check(v.name, np.asarray(fn(*dev)[0].to_host()))
        fns[v.name] = functools.partial(fn, *dev)
    t = time_interleaved(fns, calls=calls, budget_s=budget_s)
    base = t[variants[0].name]["wall"]
    rows = {
        n: {
            "ms": t[n]["wall"] * 1e3,
            "gb_per_s": weight_bytes / t[n]["wall"] / 1e9,
            "default_over_this": t[n]["wall"] / base,
        }
        for n in fns
    }
    for n, r in rows.items():
        print(
            f"{n}: {r['ms']:.3f} ms, {r['gb_per_s']:.1f} GB/s of weights, "
            f"calls/s {1 / r['default_over_this']:.2f}x the default"
        )
    print(f"load average: {', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    if json_path:
        write_json(
            json_path,
            {
                **meta,
                "threads": threads,
                "date": time.strftime("%Y-%m-%d"),
                "variants": rows,
                "loadavg": os.getloadavg(),
            },
        )
    return rows


def set_runtime_flags(flags: Sequence[str]) -> None:
    """Applies IREE runtime flags (e.g. ``--task_topology_max_group_count=2``) process-wide.

    Must run before the first driver of that kind is created.
    """
    if flags:
        import iree.runtime as rt

        rt.flags.parse_flags(*flags)


def python() -> str:
    return sys.executable


@contextlib.contextmanager
def environment(key: str, value: str | None) -> Iterator[None]:
    """``$key`` set to ``value`` (``None``: removed) inside the block, as it was after it: a
    build under another rewrite or runtime choice (the benchmarks' ``--baseline-env``)."""
    old = os.environ.get(key)
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def env_threads() -> int:
    return len(os.sched_getaffinity(0))
