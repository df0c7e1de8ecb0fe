"""Where the time goes, per operation, in turbine and in the runtimes it is compared with.

For one model of ``peer_runtimes.py`` and one thread count, in one process:

* turbine: the module compiled with the defaults (or ``--flags``), run by
  ``iree-benchmark-module --device_profiling_mode=host-execution``, then ``iree-profile
  statistics``: time per dispatch per call (weights packed at load are not counted);
* ONNX Runtime: ``SessionOptions.enable_profiling`` (kernel time per node);
* OpenVINO f32: ``PERF_COUNT`` (real time per executed layer, with the kernel it chose).

Each runtime's top operations are printed with their shapes and time per call, and the totals
by op kind, so the same layer can be compared across runtimes (docs/performance.md's tables are
made from this). Timings are per-op sums; the whole call also has runtime overhead.

Usage::

    python benchmarks/peer_profile.py resnet18
    python benchmarks/peer_profile.py mlp --threads 2 --top 10
    python benchmarks/peer_profile.py resnet18 --flags "--iree-opt-data-tiling=false"
    python benchmarks/peer_profile.py mobilenet-v3          # a model of the zoo

A profile, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import collections
import json
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _p in (HERE, HERE.parent / "tools"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _harness  # noqa: E402
import _peers  # noqa: E402
import peer_runtimes  # noqa: E402

_STAT = re.compile(r"host_execute (\S+)\s+count=(\d+)\s+total=([\d.]+) (ns|us|ms|s)\b")
_UNIT = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def _runtime_tool(name: str) -> str:
    try:
        from iree._runtime_libs import __file__ as libs

        tool = Path(libs).parent / name
        if tool.exists():
            return str(tool)
    except ImportError:
        pass
    return name


def profile_statistics(profile: Path) -> str:
    """``iree-profile statistics`` of a host-execution profile (its text)."""
    return subprocess.run(
        [_runtime_tool("iree-profile"), "statistics", str(profile)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout


def host_execution_profile(
    vmfb: Path, inputs: list, threads: int, calls: int, td: Path, device: str | None = None
) -> Path:
    """``iree-benchmark-module``'s host-execution profile of ``calls`` calls of ``main`` on
    ``inputs`` (written to ``td``): on ``device`` (default: ``local-sync`` for one thread,
    else ``local-task``), ``local-task`` with ``threads`` workers. Returns the profile's path."""
    import numpy as np

    device = device or ("local-sync" if threads == 1 else "local-task")
    args = []
    for i, x in enumerate(inputs):
        p = td / f"in{i}.npy"
        np.save(p, x.numpy() if hasattr(x, "numpy") else np.asarray(x))
        args.append(f"--input=@{p}")
    prof = td / "p.ireeprof"
    cmd = [_runtime_tool("iree-benchmark-module"), f"--module={vmfb}", "--function=main"]
    cmd += [f"--device={device}", *args]
    cmd += ["--device_profiling_mode=host-execution", f"--device_profiling_output={prof}"]
    cmd += [f"--benchmark_min_time={calls}x"]
    if device == "local-task":
        cmd.append(f"--task_topology_max_group_count={threads}")
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    return prof


def iree_dispatch_times(vmfb: Path, inputs: list, threads: int, calls: int, td: Path) -> dict:
    """Dispatch name -> ms per call, from a host-execution profile of ``calls`` calls."""
    out = profile_statistics(host_execution_profile(vmfb, inputs, threads, calls, td))
    rows: dict[str, float] = collections.defaultdict(float)
    counts = [int(m.group(2)) for m in _STAT.finditer(out)]
    runs = min(counts) if counts else 1  # the dispatch that runs once per call
    for m in _STAT.finditer(out):
        name, _, total, unit = m.groups()
        rows[name] += float(total) * _UNIT[unit] / runs
    return dict(rows)


def ort_node_times(onnx_path: Path, args: tuple, kwargs: dict, threads: int, calls: int, td: Path):
    """(node description -> ms per call, op type -> ms per call) from ORT's profiler."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = str(td / "ort")
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    feeds = _peers._feeds([i.name for i in sess.get_inputs()], args, kwargs)
    for _ in range(calls):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    nodes: dict[str, float] = collections.defaultdict(float)
    kinds: dict[str, float] = collections.defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        op = e["args"].get("op_name", "?")
        shapes = [next(iter(d.values())) for d in e["args"].get("input_type_shape", [])]
        key = f"{op} {e['name'][: -len('_kernel_time')]} {shapes[:2]}"
        nodes[key] += e["dur"] / 1e3 / calls
        kinds[op] += e["dur"] / 1e3 / calls
    return dict(nodes), dict(kinds)


def openvino_layer_times(
    module, args: tuple, kwargs: dict, onnx_path, threads: int, calls: int, f32: bool = True
):
    """(layer description -> ms per call, layer type -> ms per call), OpenVINO f32 (or, with
    ``f32=False``, its default precision: bf16 on CPUs that have it)."""
    import openvino as ov

    model, _, _ = _peers.convert_openvino(module, args, kwargs, onnx_path)
    config: dict[str, Any] = {
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": threads,
        "PERF_COUNT": True,
    }
    if f32:
        config["INFERENCE_PRECISION_HINT"] = "f32"
    compiled = ov.Core().compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    names = [next(iter(p.get_names()), f"arg{i}") for i, p in enumerate(compiled.inputs)]
    feeds = _peers._feeds(names, args, kwargs)
    inputs = [feeds[n] for n in names]
    layers: dict[str, float] = collections.defaultdict(float)
    kinds: dict[str, float] = collections.defaultdict(float)
    for _ in range(calls):
        request.infer(inputs)
        for info in request.profiling_info:
            ms = info.real_time.total_seconds() * 1e3 / calls
            layers[f"{info.node_type} [{info.exec_type}] {info.node_name[:50]}"] += ms
            kinds[info.node_type] += ms
    return dict(layers), dict(kinds)


def _iree_kind(dispatch: str) -> str:
    """A dispatch's op kind from its name (``main$async_dispatch_5_conv_56x56x64x3x3x64_f32``)."""
    if dispatch.startswith("_encoding"):
        return "relayout (data tiling)"
    m = re.search(r"dispatch_\d+_([a-z_]+?)(?:_\d|_f\d|_i\d|_bf|$)", dispatch)
    return m.group(1) if m else dispatch


def _print(title: str, rows: dict[str, float], kinds: dict[str, float], top: int) -> None:
    print(f"\n{title}: {sum(rows.values()):.2f} ms per call in its ops")
    for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]):
        if v >= 0.005:
            print(f"  {k:28s} {v:8.2f} ms")
    print(f"  top {top}:")
    for k, v in sorted(rows.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {v:8.3f} ms  {k[:110]}")


def model_for(name: str) -> tuple[Any, tuple, dict, str, Any]:
    """``(module, args, kwargs, description, dynamic shapes)`` of a model of
    ``peer_runtimes.py`` or of the zoo (exported as ``zoo.py`` does: a dynamic sequence...);
    ``KeyError`` for another name."""
    if name in peer_runtimes.MODELS:
        module, margs, mkwargs, what = peer_runtimes.MODELS[name]()
        return module, margs, mkwargs, what, None
    import zoo

    if name not in zoo.ZOO:
        raise KeyError(name)
    case = zoo.model_case(name)
    return case.module.eval(), case.args, case.kwargs, case.what, case.dynamic_shapes


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument(
        "model",
        help=f"one of {', '.join(sorted(peer_runtimes.MODELS))}, or a model of zoo.py "
        "(python benchmarks/zoo.py --list)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--flags", default="", help="extra iree-compile flags for turbine's module")
    p.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="bf16: turbine compiled with precision='bf16' against OpenVINO's default precision "
        "(bf16 where the CPU has it); ONNX Runtime (fp32 only) is left out",
    )
    p.add_argument("--json", default=None, help="write the per-op rows here")
    args = p.parse_args(argv)

    import torch

    import turbine_aot

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    try:
        module, margs, mkwargs, what, dynamic = model_for(args.model)
    except KeyError:
        p.error(f"unknown model {args.model!r}: see --help")
    result: dict[str, Any] = {"model": args.model, "what": what, "threads": args.threads}
    with tempfile.TemporaryDirectory(prefix="turbine-peer-profile-") as tdir:
        td = Path(tdir)
        eo = turbine_aot.export(module, args=margs, kwargs=mkwargs, dynamic_shapes=dynamic)
        vmfb = td / "m.vmfb"
        precision = {"precision": "bf16"} if args.precision == "bf16" else {}
        eo.compile(save_to=vmfb, extra_args=shlex.split(args.flags), **precision)
        rows = iree_dispatch_times(vmfb, [*margs, *mkwargs.values()], args.threads, args.calls, td)
        kinds: dict[str, float] = collections.defaultdict(float)
        for k, v in rows.items():
            kinds[_iree_kind(k)] += v
        _print(
            f"turbine {args.precision} ({what}, {args.threads} thread(s))", rows, kinds, args.top
        )
        result["turbine" if args.precision == "fp32" else "turbine-bf16"] = rows
        onnx_path, _ = _peers.export_onnx(module, margs, mkwargs, td)
        f32 = args.precision == "fp32"
        if f32:
            rows, kinds = ort_node_times(onnx_path, margs, mkwargs, args.threads, args.calls, td)
            _print("ONNX Runtime", rows, kinds, args.top)
            result["ort"] = rows
        rows, kinds = openvino_layer_times(
            module, margs, mkwargs, onnx_path, args.threads, args.calls, f32=f32
        )
        _print("OpenVINO f32" if f32 else "OpenVINO default", rows, kinds, args.top)
        result["openvino-f32" if f32 else "openvino"] = rows
    if args.json:
        _harness.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
