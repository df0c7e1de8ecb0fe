"""Products sharing an input as separate calls or as one: is merging them (an attention layer's
q / k / v, an MLP's gate / up) worth a kernel of its own?

Two modules of ``--layers`` layers, each layer ``x = (q(x) + k(x) + v(x)) * 1.75`` (the
factor keeps the values near 1 through the layers) over three ``Linear(W, W)`` without bias:
``separate`` as written (three products, three of turbine's kernel dispatches), ``fused`` with
the three weights concatenated into one ``Linear(W, 3W)`` whose output is sliced (one product,
one dispatch, the same bytes read). Both are quantized the same way (``--weights``: fp32,
torchao int8 weight-only, int4 weight-only in groups of 128), exported, compiled with turbine's
defaults and called in turn in one process, one row; the medians, their ratio (separate /
fused) and each module's largest difference from eager (relative to eager's largest value) are
printed, and written with ``--json``.

Usage::

    python benchmarks/sibling_products_ab.py --threads 2 --weights int4

A measurement, not a test: nothing here asserts on time.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _harness  # noqa: E402


def _modules(layers: int, width: int):
    import torch

    class Separate(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = (
                torch.nn.ModuleList(
                    torch.nn.Linear(width, width, bias=False) for _ in range(layers)
                )
                for _ in range(3)
            )

        def forward(self, x):
            for q, k, v in zip(self.q, self.k, self.v):
                x = (q(x) + k(x) + v(x)) * 1.75
            return x

    class Fused(torch.nn.Module):
        def __init__(self, separate: Separate) -> None:
            super().__init__()
            self.qkv = torch.nn.ModuleList()
            for q, k, v in zip(separate.q, separate.k, separate.v):
                linear = torch.nn.Linear(width, 3 * width, bias=False)
                linear.weight.data = torch.cat([q.weight.data, k.weight.data, v.weight.data])
                self.qkv.append(linear)

        def forward(self, x):
            for linear in self.qkv:
                y = linear(x)
                x = (y[:, :width] + y[:, width : 2 * width] + y[:, 2 * width :]) * 1.75
            return x

    torch.manual_seed(0)
    separate = Separate().eval()
    return {"separate": separate, "fused": Fused(separate).eval()}


def _quantize(module, weights: str):
    if weights == "fp32":
        return module
    import torch
    from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    config = (
        Int8WeightOnlyConfig()
        if weights == "int8"
        else IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(128))
    )
    quantize_(module, config)
    return module


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--weights", choices=("fp32", "int8", "int4"), default="int4")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--budget-s", type=float, default=60.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    if args.threads > 1:
        _harness.set_runtime_flags([f"--task_topology_max_group_count={args.threads}"])
    import turbine_aot
    from turbine_aot import runtime
    from turbine_params import externalize_module_parameters, save_module_parameters

    driver = "local-sync" if args.threads == 1 else "local-task"
    x = torch.randn(1, args.width)
    calls, errors = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, module in _modules(args.layers, args.width).items():
            module = _quantize(module, args.weights)
            with torch.no_grad():
                ref = module(x)
            externalize_module_parameters(module)
            irpa = Path(tmp) / f"{name}.irpa"
            save_module_parameters(irpa, module)
            vmfb = turbine_aot.export(module, args=(x,)).compile(save_to=None)
            loaded = runtime.load_module(vmfb, device=driver, parameters=irpa)
            errors[name] = float((loaded.main(x) - ref).abs().max() / ref.abs().max())
            calls[name] = lambda loaded=loaded: loaded.main(x)
        timed = _harness.time_interleaved(calls, calls=args.calls, budget_s=args.budget_s)
    ms = {k: v["wall"] * 1e3 for k, v in timed.items()}
    ratio = ms["separate"] / ms["fused"]
    print(
        f"{args.weights}, {args.threads} thread(s), {args.layers} layers of 3 x "
        f"Linear({args.width}, {args.width}): separate {ms['separate']:.3f} ms, fused "
        f"{ms['fused']:.3f} ms, separate / fused {ratio:.3f}; max |diff| from eager / max |eager| "
        f"{errors['separate']:.2e} / {errors['fused']:.2e}"
    )
    if args.json:
        _harness.write_json(
            args.json,
            {"args": vars(args), "ms": ms, "ratio": ratio, "max_rel_diff": errors},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
