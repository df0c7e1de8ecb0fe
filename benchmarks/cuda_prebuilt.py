"""CUDA figures on a machine that has a GPU but no IREE compiler (the runtime alone).

Two steps:

* ``python benchmarks/cuda_prebuilt.py prepare DIR`` (here, with the compiler): exports each model
  with turbine (parameters externalized, so modules stay small) and compiles it with turbine's
  default flags for ``cuda`` (``--iree-cuda-target`` from ``--arch``, default ``sm_80``: IREE
  3.13 rejects ``sm_90``).
* ``python benchmarks/cuda_prebuilt.py run DIR --json out.json`` (on the GPU machine, with
  torch, numpy and iree-base-runtime): rebuilds each model from the same seed, writes its
  parameters to an ``.irpa`` with ``turbine_params`` (numpy only), loads the module on the
  ``cuda`` driver and times it interleaved with eager CUDA PyTorch (``torch.cuda.synchronize``
  after each eager call; IREE's exported function returns when its results are ready; neither
  is read back). For reduced-precision models it also reports both eager's and IREE's max abs
  error against an fp32 CPU reference with the same weights.

Model names: ``mlp``, ``resnet18``, ``gpt``, ``gpt-dyn``, with optional ``-bN`` (batch) and
``-f16`` / ``-bf16`` suffixes (see :func:`_case`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import _harness

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "packages/turbine-params/src"))

MODELS = ("mlp", "resnet18", "gpt", "gpt-dyn", "resnet18-f16", "gpt-f16")


def _case(name: str):
    """The benchmark model ``name``: a ``-bN`` suffix sets the batch (``mlp-b4096``, ``gpt-b8``),
    ``-f16`` casts weights and float inputs to fp16 (``gpt-b8-f16``), ``-bf16`` runs the model in
    bf16 behind an fp32 interface (inputs cast in, outputs cast out: NumPy has no bf16)."""
    import _models
    import torch

    dtype = None
    base = name
    for suffix, dt in (("-bf16", torch.bfloat16), ("-f16", torch.float16)):
        if base.endswith(suffix):
            base, dtype = base.removesuffix(suffix), dt
            break
    kw = {}
    if "-b" in base:
        base, _, batch = base.rpartition("-b")
        kw["batch"] = int(batch)
    case = {
        "mlp": _models.mlp,
        "resnet18": _models.resnet18,
        "gpt": _models.gpt,
        "gpt-dyn": lambda **kw: _models.gpt(dynamic=True, **kw),
    }[base](**kw)
    if dtype is torch.float16:
        case.module = case.module.half()
        case.args = tuple(a.half() if a.is_floating_point() else a for a in case.args)
    elif dtype is torch.bfloat16:
        case.module = _in_out_fp32(case.module.to(torch.bfloat16)).eval()
    if dtype is not None:
        case.name = name
        case.atol = 5e-2
    return case


def _in_out_fp32(inner):
    """``inner`` (a reduced-precision module) called with fp32 inputs, returning fp32."""
    import torch

    class InOutFp32(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            dtype = next(self.inner.parameters()).dtype  # follows .float() for the reference
            args = [a.to(dtype) if a.is_floating_point() else a for a in args]
            return self.inner(*args).float()

    return InOutFp32()


def prepare(out: Path, arch: str, models: list[str], cpu: str | None) -> None:
    import torch

    import turbine_aot
    from turbine_aot._compiler.flags import default_compile_flags

    out.mkdir(parents=True, exist_ok=True)
    flags = {
        "cuda": default_compile_flags(
            "cuda", overrides=[f"--iree-cuda-target={arch}"], use_env=False
        )
    }
    if cpu:
        # The GPU machine's CPU: turbine's llvm-cpu defaults with a named CPU instead of `host`.
        flags["local-task"] = default_compile_flags(
            "llvm-cpu", overrides=[f"--iree-llvmcpu-target-cpu={cpu}"], use_env=False
        )
    for name in models:
        aten = torch.ops.aten
        variants = {"turbine": ()}
        if name.startswith("gpt"):
            # IREE's attention op and N-d linear: what the default decompositions replace.
            variants["attention-op"] = (aten.scaled_dot_product_attention, aten.linear)
        for variant, kept_ops in variants.items():
            case = _case(name)
            turbine_aot.externalize_module_parameters(case.module)
            with turbine_aot.extend_aot_decompositions(remove_ops=list(kept_ops)):
                eo = turbine_aot.export(
                    case.module, args=case.args, dynamic_shapes=case.dynamic_shapes
                )
            for driver, dflags in flags.items():
                t0 = time.perf_counter()
                path = out / f"{name}.{variant}.{driver}.vmfb"
                target = "cuda" if driver == "cuda" else "llvm-cpu"
                eo.compile(save_to=path, target_device=target, extra_args=dflags)
                size = path.stat().st_size / 2**20
                print(f"{path.name}: {size:.1f} MiB in {time.perf_counter() - t0:.1f}s")
    (out / "flags.json").write_text(json.dumps(flags))


def run(
    src: Path, models: list[str], calls: int, json_out: str | None, driver: str, budget_s: float
) -> int:
    import _harness
    import iree.runtime as rt
    import numpy as np
    import torch

    from turbine_params import save_module_parameters

    on_cuda = driver == "cuda"
    if on_cuda:
        assert torch.cuda.is_available(), "no CUDA device visible to torch"
    dev = torch.device("cuda" if on_cuda else "cpu")
    results = []
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"turbine-cuda-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    config = rt.Config(driver)
    for name in models:
        case = _case(name)
        irpa = tmp / f"{name}.irpa"
        save_module_parameters(irpa, case.module)
        index = rt.ParameterIndex()
        index.load(str(irpa))
        ref32 = None
        if next(case.module.parameters()).dtype != torch.float32:
            # Reduced precision: also compare both eager and IREE with an fp32 CPU reference
            # (same weights and inputs, upcast), which tells whose numerics drift.
            import copy

            with torch.no_grad():
                m32 = copy.deepcopy(case.module).float()
                a32 = [a.float() if a.is_floating_point() else a for a in case.args]
                ref32 = m32(*a32).double().numpy()
        model = case.module.to(dev).eval()
        x_cpu = case.args[0]
        x = x_cpu.to(dev)
        with torch.no_grad():
            ref = model(x).float().cpu()
        if ref32 is not None:
            res_eager32 = float(np.abs(ref.double().numpy() - ref32).max())
        res: dict = {
            "model": case.name,
            "dtype": str(next(case.module.parameters()).dtype).removeprefix("torch."),
            "driver": driver,
            "device": torch.cuda.get_device_name(0) if on_cuda else f"cpu x{os.cpu_count()}",
            "torch_threads": torch.get_num_threads(),
            "variants": {},
        }
        if ref32 is not None:
            res["eager_max_abs_err_vs_fp32"] = res_eager32
            res["max_abs_output"] = float(np.abs(ref32).max())
        fns = {}
        for vmfb in sorted(src.glob(f"{name}.*.{driver}.vmfb")):
            variant = vmfb.name.split(".")[1]
            row: dict = {"module_bytes": vmfb.stat().st_size}
            try:
                params = rt.create_io_parameters_module(
                    config.vm_instance, index.create_provider(scope="model")
                )
                vm = rt.VmModule.mmap(config.vm_instance, str(vmfb))
                ctx = rt.SystemContext(vm_modules=[params, vm], config=config)
                fn = ctx.modules.module["main"]
                x_np = x_cpu.numpy()
                out = np.asarray(fn(x_np).to_host())
                row["max_abs_err"] = float(np.abs(out.astype(np.float32) - ref.numpy()).max())
                if ref32 is not None:
                    row["max_abs_err_vs_fp32"] = float(np.abs(out.astype(np.float64) - ref32).max())
                # Input already on the device. The exported function is synchronous (IREE's
                # default async-internal model waits on its fence before returning), so a
                # call is timed like eager's call + torch.cuda.synchronize(); no read-back.
                x_dev = rt.asdevicearray(config.device, x_np)
                fns[variant] = lambda fn=fn, x_dev=x_dev: fn(x_dev)
            except Exception as e:  # the row records why
                row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            res["variants"][variant] = row

        def eager(model=model, x=x) -> None:
            with torch.no_grad():
                model(x)
            if on_cuda:
                torch.cuda.synchronize()

        fns["eager"] = eager
        t = _harness.time_interleaved(fns, calls=calls, warmup=3, budget_s=budget_s)
        for k, v in t.items():
            if k == "eager":
                res["eager_ms"] = v["wall"] * 1e3
            else:
                res["variants"][k]["ms"] = v["wall"] * 1e3
        results.append(res)
        line = [f"{driver} {name:9s} eager {res['eager_ms']:7.2f} ms"]
        if ref32 is not None:
            line[0] += f" (err vs fp32 {res_eager32:.1e}, |out| <= {res['max_abs_output']:.2g})"
        for v, row in res["variants"].items():
            if "ms" in row:
                line.append(
                    f"{v} {row['ms']:7.2f} ms ({row['ms'] / res['eager_ms']:.2f}× eager, "
                    f"err {row['max_abs_err']:.1e}"
                    + (f", vs fp32 {row['max_abs_err_vs_fp32']:.1e})" if ref32 is not None else ")")
                )
            else:
                line.append(f"{v} failed: {row.get('error', '')[:200]}")
        print(" | ".join(line), flush=True)
        if json_out:  # after each model, so a run cut short keeps what it measured
            doc = {"benchmark": f"models-{driver}", "results": results}
            _harness.write_json(json_out, doc)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("dir")
    a.add_argument("--arch", default="sm_80")
    a.add_argument("--models", default=",".join(MODELS))
    a.add_argument("--cpu", default=None, help="also build for this LLVM CPU (e.g. x86-64-v4)")
    b = sub.add_parser("run")
    b.add_argument("dir")
    b.add_argument("--models", default=",".join(MODELS))
    b.add_argument("--calls", type=int, default=50)
    b.add_argument("--json", default=None)
    b.add_argument("--driver", default="cuda", choices=("cuda", "local-task"))
    b.add_argument("--budget", type=float, default=20.0, help="seconds of timing per model")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if args.cmd == "prepare":
        prepare(Path(args.dir), args.arch, models, args.cpu)
        return 0
    return run(Path(args.dir), models, args.calls, args.json, args.driver, args.budget)


if __name__ == "__main__":
    sys.exit(main())
