"""Weight-only quantized matvec stack: fp32 / torchao int8 / int4 calls/s on llvm-cpu, turbine's
AVX-512 quantized kernel against IREE's own dequantize + matmul, against the read-bandwidth limit.

The model is issue 26's bandwidth-bound stack: ``layers`` x ``Linear(width, width)`` (no bias),
batch ``rows`` (1: one decode step). Variants, weights from an ``.irpa`` (externalized, as
deployed):

* ``fp32`` — the plain model (turbine's default: the AVX-512 fp32 kernel);
* ``int8`` — ``Int8WeightOnlyConfig()`` (per channel);
* ``int4-g32`` / ``int4-g128`` — ``IntxWeightOnlyConfig(weight_dtype=torch.int4,
  granularity=PerGroup(G))`` (packed ``i4`` in the archive);
* ``w8a8`` — ``Int8DynamicActivationInt8WeightConfig()`` (int8 weights per channel, the
  activations quantized to int8 per row in the program; the integer products on turbine's
  AVX-512 VNNI kernel where the CPU has it);
* ``w4a8-g32`` / ``w4a8-g128`` — ``Int8DynamicActivationIntxWeightConfig(weight_dtype=
  torch.int4, weight_granularity=PerGroup(G))`` (packed ``i4`` weights, the activations
  quantized to int8 per row: turbine's VNNI w4a8 kernel where the CPU has it; its
  ``kernel-int4`` build, ``TURBINE_CPU_INT8_MATMUL=iree``, runs the same weights on the
  weight-only int4 kernel with the dequantized f32 activations, what turbine did before);

each compiled twice: turbine's defaults (``kernel``: the quantized matmuls on the AVX-512
int8 / int4 kernel, ``w8a8``'s on the VNNI kernel) and ``--turbine-cpu-matmul=iree`` (``iree``:
IREE 3.13's dequantize + matmul, for ``w8a8`` its integer matmul: what turbine did before). All
are timed interleaved in one process (the machine is shared: the ratios are the result), median
wall time per call, the input already in a device buffer, in blocks of ``--block`` calls (the
first of each block untimed), as a user calls one model repeatedly: with one call per round
each call finds the caches holding the previous variant's weights (on a 2-core Xeon whose L3
holds the fp32 stack, int4's calls took 1.71-1.75 ms that way, 1.11-1.12 in blocks of three;
docs/quantization.md). ``eager`` (torchao's own CPU path) beside. Also reported: the bytes of
weights (+ scales, zero points) each call must read, the parallel read bandwidth of this
machine (numpy sum of a buffer far larger than the caches, 1 and ``threads`` threads) and the
time limit it sets, the error against torchao eager, and each variant's resident memory after
loading and after calls (a child process per variant: RSS growth over the process before
loading, against the archive).
It is a benchmark: nothing asserts on time.

Usage::

    python benchmarks/quant_bench.py                # 2 threads (local-task)
    python benchmarks/quant_bench.py --threads 1 --json out.json
    python benchmarks/quant_bench.py --ab --no-iree --no-eager   # this kernel vs its first version
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _harness  # noqa: E402
import numpy as np  # noqa: E402

VARIANTS = ("fp32", "int8", "int4-g32", "int4-g128", "w8a8", "w4a8-g32", "w4a8-g128")
#: turbine_aot._compiler.quant_matmuls.QUANT_KERNEL_ENV (not imported: the benchmark reads no
#: private module).
QUANT_KERNEL_ENV = "TURBINE_CPU_QUANT_KERNEL"
KINDS = ("kernel", "kernel-v1", "kernel-int4", "iree", "eager")
#: turbine_aot._compiler.quant_int8_matmuls.CPU_INT8_MATMUL_ENV: ``iree`` keeps w4a8's products
#: on the weight-only int4 kernel (the ``kernel-int4`` build).
INT8_MATMUL_ENV = "TURBINE_CPU_INT8_MATMUL"


def _model(variant: str, layers: int, width: int):
    import torch

    torch.manual_seed(0)
    layers_ = [torch.nn.Linear(width, width, bias=False) for _ in range(layers)]
    m = torch.nn.Sequential(*layers_).eval()
    if variant == "fp32":
        return m
    from torchao.quantization import (
        Int8DynamicActivationInt8WeightConfig,
        Int8DynamicActivationIntxWeightConfig,
        Int8WeightOnlyConfig,
        IntxWeightOnlyConfig,
        quantize_,
    )
    from torchao.quantization.granularity import PerGroup

    if variant == "int8":
        config = Int8WeightOnlyConfig()
    elif variant == "w8a8":
        config = Int8DynamicActivationInt8WeightConfig()
    elif variant.startswith("w4a8"):
        config = Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4, weight_granularity=PerGroup(int(variant.split("-g")[1]))
        )
    else:
        group = int(variant.split("-g")[1])
        config = IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group))
    quantize_(m, config)
    return m


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _load(irpa: str, vmfb: bytes, driver: str):
    import iree.runtime as rt

    config = rt.Config(driver)
    index = rt.ParameterIndex()
    index.load(irpa)
    params = rt.create_io_parameters_module(
        config.vm_instance, index.create_provider(scope="model")
    )
    vm = rt.VmModule.copy_buffer(config.vm_instance, vmfb)
    ctx = rt.SystemContext(vm_modules=[params, vm], config=config)
    return config, ctx.modules.module["main"]


def _build(variant: str, args, tmp: Path) -> dict:
    """Exports ``variant``, writes its archive, compiles both ways: paths and figures."""
    import torch

    import turbine_aot
    from turbine_params import externalize_module_parameters, save_module_parameters

    m = _model(variant, args.layers, args.width)
    x = torch.randn(args.rows, args.width)
    with torch.no_grad():
        ref = m(x)
    externalize_module_parameters(m)
    irpa = tmp / f"{variant}.irpa"
    save_module_parameters(irpa, m)
    eo = turbine_aot.export(m, args=(x,))
    out = {"irpa": str(irpa), "archive_mib": irpa.stat().st_size / 2**20, "vmfb": {}}
    kinds: list[tuple[str, list[str], dict[str, str]]] = [("kernel", [], {})]
    if args.iree:
        kinds.append(("iree", ["--turbine-cpu-matmul=iree"], {}))
    if args.ab:
        kinds.append(("kernel-v1", [], {QUANT_KERNEL_ENV: args.ab}))
    if variant.startswith("w4a8"):
        kinds.append(("kernel-int4", [], {INT8_MATMUL_ENV: "iree"}))
    for kind, extra, env in kinds:
        if variant == "fp32" and kind != "kernel":
            continue
        vmfb = tmp / f"{variant}.{kind}.vmfb"
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            vmfb.write_bytes(bytes(eo.compile(save_to=None, extra_args=extra).map_memory()))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        out["vmfb"][kind] = str(vmfb)
    torch.save({"x": x, "ref": ref}, tmp / f"{variant}.io.pt")
    return out


def _weight_bytes(variant: str, layers: int, width: int) -> int:
    """Bytes of weights, scales and zero points one call reads."""
    n = k = width
    if variant == "fp32":
        per = n * k * 4
    elif variant in ("int8", "w8a8"):
        per = n * k + n * 4
    else:
        group = int(variant.split("-g")[1])
        per = n * k // 2 + n * (k // group) * (4 + 1)
    return layers * per


def memory_child(argv: list[str]) -> int:
    """``--memory-child VMFB IRPA DRIVER OUT``: resident MiB growth after loading and after
    calls (a fresh process)."""
    vmfb, irpa, driver, out = argv
    import torch

    io = torch.load(Path(vmfb).parent / (Path(vmfb).name.split(".")[0] + ".io.pt"))
    x = io["x"].numpy()
    data = Path(vmfb).read_bytes()
    base = _rss_mib()
    _, fn = _load(irpa, data, driver)
    loaded = _rss_mib()
    for _ in range(5):
        fn(x).to_host()
    called = _rss_mib()
    _harness.write_json(out, {"after_load": loaded - base, "after_calls": called - base})
    return 0


def measure(args) -> dict:
    import iree.runtime as rt
    import torch

    driver = "local-sync" if args.threads == 1 else "local-task"
    tmp = Path(tempfile.mkdtemp(prefix="turbine-quant-bench-"))
    variants = [v for v in args.variants.split(",") if v]
    if "fp32" not in variants:
        variants.insert(0, "fp32")  # the baseline of every ratio
    built = {v: _build(v, args, tmp) for v in variants}
    fns, errors, results = {}, {}, {}
    for v, b in built.items():
        io = torch.load(tmp / f"{v}.io.pt")
        x, ref = io["x"], io["ref"]
        for kind, path in b["vmfb"].items():
            name = f"{v}/{kind}"
            config, fn = _load(b["irpa"], Path(path).read_bytes(), driver)
            got = np.asarray(fn(x.numpy()).to_host())
            errors[name] = float(np.abs(got - ref.numpy()).max())
            xd = rt.asdevicearray(config.device, x.numpy())
            fns[name] = lambda fn=fn, xd=xd: fn(xd)
        if v != "fp32" and args.eager:
            m = _model(v, args.layers, args.width)
            fns[f"{v}/eager"] = lambda m=m, x=x: m(x)
    with torch.no_grad():
        t = _harness.time_interleaved(
            fns, calls=args.calls, budget_s=args.budget_s, block=args.block
        )
    memory = {}
    for v, b in built.items() if args.memory else ():
        path = b["vmfb"]["kernel"]
        out = tmp / f"{v}.mem.json"
        child = _harness.run_json_child(
            [sys.executable, __file__, "--memory-child", path, b["irpa"], driver, str(out)],
            out,
            timeout=300,
        )
        memory[v] = child.result
        if "iree" in b["vmfb"] and args.memory_iree:
            out = tmp / f"{v}.iree.mem.json"
            child = _harness.run_json_child(
                [
                    sys.executable,
                    __file__,
                    "--memory-child",
                    b["vmfb"]["iree"],
                    b["irpa"],
                    driver,
                    str(out),
                ],
                out,
                timeout=300,
            )
            memory[f"{v}/iree"] = child.result
    bw = {t: _harness.read_bandwidth_gbs(t) for t in (1, args.threads)}
    for v, b in built.items():
        wb = _weight_bytes(v, args.layers, args.width)
        results[v] = {
            "archive_mib": b["archive_mib"],
            "weight_bytes_per_call": wb,
            "limit_ms": wb / (bw[args.threads] * 1e9) * 1e3,
            "cpu_ms": {kind: t[f"{v}/{kind}"]["cpu"] * 1e3 for kind in KINDS if f"{v}/{kind}" in t},
            "ms": {kind: t[f"{v}/{kind}"]["wall"] * 1e3 for kind in KINDS if f"{v}/{kind}" in t},
            "max_abs_err_vs_eager": {
                kind: errors[f"{v}/{kind}"]
                for kind in ("kernel", "kernel-v1", "kernel-int4", "iree")
                if f"{v}/{kind}" in errors
            },
            "resident_mib": memory.get(v),
            "resident_mib_iree": memory.get(f"{v}/iree"),
        }
    return {
        "layers": args.layers,
        "width": args.width,
        "rows": args.rows,
        "threads": args.threads,
        "block": args.block,
        "read_bw_gbs": {str(k): v for k, v in bw.items()},
        "variants": results,
        "loadavg": os.getloadavg(),
    }


def table(r: dict) -> str:
    fp32 = r["variants"]["fp32"]["ms"]["kernel"]
    fp32_cpu = r["variants"]["fp32"]["cpu_ms"]["kernel"]
    head = [
        "weights",
        "bytes read / call (MiB)",
        "archive (MiB)",
        "turbine (kernel) ms",
        "calls/s",
        "× fp32 calls/s",
        "CPU ms (× fp32)",
        "first kernel (v1) ms (× fp32; new / v1 calls/s)",
        "w4a8: weight-only int4 kernel ms (w4a8 / it calls/s)",
        "IREE dequant + matmul ms",
        "× fp32 (IREE)",
        "eager ms",
        "limit ms",
        "limit / turbine",
        "max err vs eager",
        "resident after load / calls (MiB)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v, x in r["variants"].items():
        ms = x["ms"]
        res = x["resident_mib"] or {}
        cells = [
            v,
            f"{x['weight_bytes_per_call'] / 2**20:.1f}",
            f"{x['archive_mib']:.1f}",
            f"{ms['kernel']:.2f}",
            f"{1e3 / ms['kernel']:.0f}",
            f"**{fp32 / ms['kernel']:.2f}×**",
            f"{x['cpu_ms']['kernel']:.2f} ({fp32_cpu / x['cpu_ms']['kernel']:.2f}×)",
            (
                f"{ms['kernel-v1']:.2f} ({fp32 / ms['kernel-v1']:.2f}×; "
                f"{ms['kernel-v1'] / ms['kernel']:.2f}×)"
                if "kernel-v1" in ms
                else "–"
            ),
            (
                f"{ms['kernel-int4']:.2f} ({ms['kernel-int4'] / ms['kernel']:.2f}×)"
                if "kernel-int4" in ms
                else "–"
            ),
            f"{ms['iree']:.2f}" if "iree" in ms else "–",
            f"{fp32 / ms['iree']:.2f}×" if "iree" in ms else "–",
            f"{ms['eager']:.2f}" if "eager" in ms else "–",
            f"{x['limit_ms']:.2f}",
            f"{x['limit_ms'] / ms['kernel']:.2f}",
            f"{x['max_abs_err_vs_eager']['kernel']:.1e}",
            f"{res.get('after_load', float('nan')):.1f} / {res.get('after_calls', float('nan')):.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    bw = ", ".join(f"{k} thread(s) {v:.1f} GB/s" for k, v in r["read_bw_gbs"].items())
    load = ", ".join(f"{v:.1f}" for v in r["loadavg"])
    lines.append("")
    lines.append(f"read bandwidth: {bw}; load average at the end: {load}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--memory-child"]:
        return memory_child(argv[1:])
    p = _harness.argument_parser(__doc__)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--budget-s", type=float, default=60.0)
    p.add_argument(
        "--block",
        type=int,
        default=3,
        help="calls of a variant in a row per round, the first untimed (1: strict round-robin)",
    )
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma list of " + ", ".join(VARIANTS)
    )
    p.add_argument(
        "--no-memory", dest="memory", action="store_false", help="skip the resident-memory children"
    )
    p.add_argument(
        "--no-iree", dest="iree", action="store_false", help="skip IREE's dequantize + matmul"
    )
    p.add_argument(
        "--no-eager", dest="eager", action="store_false", help="skip torchao eager's timing"
    )
    p.add_argument(
        "--ab",
        nargs="?",
        const="v1",
        default=None,
        help=f"also the kernel built with {QUANT_KERNEL_ENV}=AB, timed interleaved (v1, the "
        "default: its first version, the only other one built; the variants that lost were "
        "removed, docs/quantization.md)",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    args.memory_iree = args.iree
    import torch

    torch.set_num_threads(args.threads)
    if args.threads > 1:
        _harness.set_runtime_flags([f"--task_topology_max_group_count={args.threads}"])
    t0 = time.perf_counter()
    r = measure(args)
    print(json.dumps(r, indent=1, default=str), flush=True)
    print()
    print(table(r))
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.json:
        _harness.write_json(
            args.json, {"benchmark": "quant", "date": time.strftime("%Y-%m-%d"), **r}
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
