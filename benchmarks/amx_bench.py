"""One matmul per shape, fp32 in and out: turbine's own CPU kernels — ``precision="bf16"`` (AMX)
and ``--turbine-cpu-matmul=avx512`` (fp32) — against IREE's fp32 and bf16 code and PyTorch
eager in fp32 and bf16 (oneDNN, AMX).

Each shape is ``M x N x K`` (``y[M, N] = x[M, K] @ w[K, N]``, ``w`` a parameter: the GPT-2-small
shapes of docs/performance.md section 6, and decode shapes with M = 1 and 8). Candidates:

* ``eager-fp32`` / ``eager-bf16`` — ``torch.mm`` on fp32 / bf16 operands (bf16: oneDNN's AMX
  kernel, the operands already bf16: no cast counted);
* ``turbine`` — ``export`` + ``compile()`` with IREE's fp32 matmul code (data-tiled ``mmt4d``
  ukernel; below 16 rows IREE's codegen without data tiling);
* ``turbine-avx512`` — the same with turbine's AVX-512 fp32 kernel
  (``extra_args=["--turbine-cpu-matmul=avx512"]``);
* ``turbine-bf16`` — ``compile(precision="bf16")``: the activation cast per call, the weight
  packed once, the AMX kernel;
* ``iree-bf16`` — the model itself in bf16 (bf16 weight, ``x.bfloat16() @ w``, result back to
  fp32) with turbine's defaults: IREE 3.13's bf16 ``mmt4d`` ukernel.

One thread (torch one thread, IREE ``local-sync``) unless ``--threads``; interleaved rounds,
median wall time per call, reported as GFLOP/s (2*M*N*K / time). The IREE modules are called
through ``iree.runtime`` with the input already in a device buffer, as eager gets its tensors:
the module's own time. (turbine's ``load_module`` call path converts torch tensors in and out,
which adds the same absolute time to every IREE candidate.) On a CPU without AMX-BF16 the
``turbine-bf16`` column says why it is missing. It is a benchmark: nothing asserts on time.

Usage::

    python benchmarks/amx_bench.py
    python benchmarks/amx_bench.py --shapes 128x512x2048,1x2048x512 --threads 2 --json out.json
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _harness  # noqa: E402

GPT_SHAPES = "128x512x2048,128x2048x512,128x1536x512,128x8192x512,128x512x512"
DECODE_SHAPES = "1x512x2048,1x2048x512,1x1536x512,1x8192x512,8x512x2048,8x2048x512,8x8192x512"
#: MLP batch 8 (3x1024), a classifier head, odd sizes, ResNet's fc
OTHER_SHAPES = "8x1024x1024,128x10x512,100x70x100,1x1000x512"
CANDIDATES = ("eager-fp32", "turbine", "turbine-avx512", "eager-bf16", "turbine-bf16", "iree-bf16")


def _modules(k: int, n: int):
    import torch

    class MatMul(torch.nn.Module):
        def __init__(self, w: torch.Tensor):
            super().__init__()
            self.w = torch.nn.Parameter(w, requires_grad=False)

        def forward(self, x):
            return x @ self.w

    class MatMulBf16(MatMul):
        def forward(self, x):
            return (x.bfloat16() @ self.w).float()

    w = torch.randn(k, n) / k**0.5
    return MatMul(w).eval(), MatMulBf16(w.bfloat16()).eval()


def measure(shape: str, threads: int, calls: int, budget_s: float) -> dict:
    import iree.runtime as rt
    import torch

    import turbine_aot

    m, n, k = (int(v) for v in shape.split("x"))
    torch.manual_seed(0)
    fp32, bf16 = _modules(k, n)
    x = torch.randn(m, k)
    xb, wb = x.bfloat16(), fp32.w.detach().bfloat16()
    driver = "local-sync" if threads == 1 else "local-task"
    fns, errors, max_err = {}, {}, {}
    ref = x.double() @ fp32.w.detach().double()
    fns["eager-fp32"] = lambda: torch.mm(x, fp32.w)
    fns["eager-bf16"] = lambda: torch.mm(xb, wb)
    with torch.no_grad():
        max_err["eager-fp32"] = float((torch.mm(x, fp32.w).double() - ref).abs().max())
        max_err["eager-bf16"] = float((torch.mm(xb, wb).double() - ref).abs().max())
    iree_kernel = {"extra_args": ["--turbine-cpu-matmul=iree"]}
    for name, model, kw in (
        ("turbine", fp32, iree_kernel),
        ("turbine-avx512", fp32, {"extra_args": ["--turbine-cpu-matmul=avx512"]}),
        ("turbine-bf16", fp32, {"precision": "bf16"}),
        ("iree-bf16", bf16, iree_kernel),
    ):
        try:
            eo = turbine_aot.export(model, args=(x,))
            vmfb = bytes(eo.compile(save_to=None, **kw).map_memory())
            ctx = rt.SystemContext(config=rt.Config(driver))
            ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
            xd = rt.asdevicearray(ctx.config.device, x.numpy())
            fns[name] = lambda f=ctx.modules.module.main, xd=xd: f(xd)
            got = torch.from_numpy(fns[name]().to_host().copy())
            max_err[name] = float((got.double() - ref).abs().max())
        except Exception as e:  # a candidate that cannot be built is a result
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    with torch.no_grad():
        t = _harness.time_interleaved(fns, calls=calls, budget_s=budget_s)
    flop = 2 * m * n * k
    return {
        "shape": shape,
        "threads": threads,
        "gflops": {c: flop / t[c]["wall"] / 1e9 for c in t},
        "us": {c: t[c]["wall"] * 1e6 for c in t},
        "max_abs_err_vs_fp64": max_err,
        "errors": errors,
        "loadavg_1m": os.getloadavg()[0],
    }


def table(rows: list[dict]) -> str:
    head = ["shape (MxNxK)", "threads", *CANDIDATES]
    head += ["turbine-avx512 / eager-fp32", "turbine-bf16 / eager-bf16"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        g = r["gflops"]
        cells = [r["shape"], str(r["threads"])]
        cells += [f"{g[c]:.0f}" if c in g else "–" for c in CANDIDATES]
        for ours, theirs in (("turbine-avx512", "eager-fp32"), ("turbine-bf16", "eager-bf16")):
            t, o = g.get(ours), g.get(theirs)
            cells.append(f"**{t / o:.2f}x**" if t and o else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument(
        "--shapes", default=f"{GPT_SHAPES},{DECODE_SHAPES},{OTHER_SHAPES}", help="comma list MxNxK"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--budget-s", type=float, default=10.0, help="timing budget per shape")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    if args.threads > 1:
        _harness.set_runtime_flags([f"--task_topology_max_group_count={args.threads}"])
    rows = []
    for shape in [s for s in args.shapes.split(",") if s]:
        t0 = time.perf_counter()
        r = measure(shape, args.threads, args.calls, args.budget_s)
        rows.append(r)
        errs = "; ".join(f"{c}: {e}" for c, e in r["errors"].items())
        print(
            f"[amx] {shape}: "
            + ", ".join(f"{c} {v:.0f}" for c, v in r["gflops"].items())
            + f" GFLOP/s ({time.perf_counter() - t0:.0f}s, load {r['loadavg_1m']:.1f})"
            + (f"; failed: {errs}" if errs else ""),
            flush=True,
        )
    print()
    print(table(rows))
    if args.json:
        meta = {"benchmark": "amx", "date": time.strftime("%Y-%m-%d")}
        _harness.write_json(args.json, {**meta, "results": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
