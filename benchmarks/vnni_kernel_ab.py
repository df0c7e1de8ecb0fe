"""The AVX-512 VNNI int8 kernel alone, A/B of its blocking: ``layers`` x (``width`` x ``width``)
int8 x int8 products of ``rows`` rows, each variant of ``Avx512VnniGemm`` timed interleaved.

The kernel (``turbine_aot._compiler.avx512_vnni``) is compiled in a module of its own (no
activation quantization, no rescale: what ``quant_bench.py``'s ``w8a8`` row adds around it),
its results checked against numpy's exact integer product, and every variant timed round-robin
in one process; reported: median ms per call, the weights' read rate, and calls/s against the
first variant (the default). It is a benchmark: nothing asserts on time.

Usage::

    python benchmarks/vnni_kernel_ab.py                                  # default vs a few
    python benchmarks/vnni_kernel_ab.py --variants '{}' '{"nr": 8}' '{"prefetch": true}'
    python benchmarks/vnni_kernel_ab.py --width 768 --layers 150    # 88 MB: weights from DRAM
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _harness  # noqa: E402
import numpy as np  # noqa: E402

DEFAULT_VARIANTS = ("{}", '{"nr": 4}', '{"nr": 2}', '{"prefetch": true}', '{"unroll": 4}')


def _module(kernel, layers: int, width: int) -> str:
    """``main(x, q0, corr0, ...)``: the kernel on each weight, every result returned."""
    rt = f"tensor<?x{width}xi32>"
    params = ", ".join(
        f"%q{i}: tensor<{width}x{width}xi8>, %k{i}: tensor<{width}xi32>" for i in range(layers)
    )
    lines = [kernel.executable()]
    lines.append(
        f"func.func @main(%x: tensor<?x{width}xi8>, {params}) -> ({', '.join([rt] * layers)}) {{"
    )
    lines.append("  %c0 = arith.constant 0 : index")
    lines.append(f"  %m = tensor.dim %x, %c0 : tensor<?x{width}xi8>")
    for i in range(layers):
        lines.append(f"  %r{i} = " + kernel.dispatch("%x", f"%q{i}", f"%k{i}", "%m"))
    results = ", ".join(f"%r{i}" for i in range(layers))
    lines.append(f"  return {results} : {', '.join([rt] * layers)}")
    lines.append("}")
    return "module {\n" + "\n".join(lines) + "\n}\n"


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--budget-s", type=float, default=60.0)
    p.add_argument(
        "--variants",
        nargs="*",
        default=list(DEFAULT_VARIANTS),
        help="JSON objects of Avx512VnniGemm fields to replace ({}: the default kernel)",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from turbine_aot._compiler.avx512_vnni import Avx512VnniGemm

    rng = np.random.default_rng(0)
    w = args.width
    x = rng.integers(-128, 128, size=(args.rows, w), dtype=np.int8)
    host = [x]
    for _ in range(args.layers):
        q = rng.integers(-128, 128, size=(w, w), dtype=np.int8)
        host += [q, (128 * q.astype(np.int32).sum(1)).astype(np.int32)]
    want = x.astype(np.int64) @ host[1].astype(np.int64).T

    def check(name: str, got: np.ndarray) -> None:
        if not np.array_equal(got, want):
            raise SystemExit(f"{name}: wrong results")

    variants = []
    for v in args.variants:
        kernel = dataclasses.replace(Avx512VnniGemm.for_shape(w, w), **json.loads(v))
        variants.append(_harness.KernelVariant(kernel.name, _module(kernel, args.layers, w)))
    _harness.kernel_ab(
        variants,
        host,
        check,
        weight_bytes=args.layers * w * w,
        calls=args.calls,
        budget_s=args.budget_s,
        json_path=args.json,
        meta={"benchmark": "vnni-kernel-ab", "rows": args.rows, "layers": args.layers, "width": w},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
