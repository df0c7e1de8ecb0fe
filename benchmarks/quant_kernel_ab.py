"""A weight-only quantized kernel alone, A/B of its blocking: ``layers`` x (``width`` x
``width``) products of ``rows`` f32 rows with int4 (grouped, zero points) or int8 weights,
each variant of ``Avx512QuantGemm`` (or, ``--kernel amx``, of ``AmxQuantGemm``) timed
interleaved.

The kernel (``turbine_aot._compiler.avx512_quant`` / ``.amx_quant``) is compiled in a module of its own, its
results checked against numpy's float64 product of the dequantized weights, and every variant
timed round-robin in one process; reported: median ms per call, the weights' read rate, and
calls/s against the first variant (the default). It is a benchmark: nothing asserts on time.

Usage::

    python benchmarks/quant_kernel_ab.py                                 # int4 g128, default vs a few
    python benchmarks/quant_kernel_ab.py --bits 4 --group 32 --variants '{}' '{"nr": 1}'
    # AVX2, one row: the nibble-masks form against the general AVX2 form it replaced
    python benchmarks/quant_kernel_ab.py --variants '{}' \
        '{"nibble_masks": false, "cols_per_workgroup": 32, "zero_points_per_block": true}'
    # AMX (one row, int4 groups of 128s), two workers: two workgroups a product against eight
    python benchmarks/quant_kernel_ab.py --kernel amx --threads 2 \
        --variants '{}' '{"cols_per_workgroup": 256}'
    # is the AVX2 int4 kernel waiting on memory? each variant again with its weights in L1
    python benchmarks/quant_kernel_ab.py --weights-in-l1

The default variant is the kernel turbine builds for the shape and ``--rows`` on this CPU.
``--threads N`` above 1 runs them on ``local-task`` with ``N`` workers.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _harness  # noqa: E402
import numpy as np  # noqa: E402

DEFAULT_VARIANTS = ("{}", '{"nr": 1}', '{"nr": 2}')


def _module(kernel, layers: int) -> str:
    """``main(x, q0, s0, z0, ...)``: the kernel on each weight, every result returned."""
    k, n = kernel.k, kernel.n
    rt = f"tensor<?x{n}xf32>"
    weights = []
    for i in range(layers):
        names = [f"%q{i}", f"%s{i}", f"%z{i}"][: len(kernel.operand_types())]
        weights.append(names)
    params = ", ".join(
        f"{name}: {t}" for names in weights for name, t in zip(names, kernel.operand_types())
    )
    lines = [kernel.executable()]
    prepared = getattr(kernel, "prepared_row", False)
    if prepared:  # the row put in the kernel's order by its own dispatch, once per call
        lines.append(kernel.row_executable())
    lines.append(
        f"func.func @main(%x: tensor<?x{k}xf32>, {params}) -> ({', '.join([rt] * layers)}) {{"
    )
    lines.append("  %c0 = arith.constant 0 : index")
    lines.append(f"  %m = tensor.dim %x, %c0 : tensor<?x{k}xf32>")
    a = "%x"
    if prepared:
        lines.append("  %rows = " + kernel.row_dispatch("%x", "%m"))
        a = "%rows"
    for i, names in enumerate(weights):
        lines.append(f"  %r{i} = " + kernel.dispatch(a, names, "%m"))
    lines.append(
        f"  return {', '.join(f'%r{i}' for i in range(layers))} : {', '.join([rt] * layers)}"
    )
    lines.append("}")
    return "module {\n" + "\n".join(lines) + "\n}\n"


def weights_in_l1(kernel, mlir: str) -> str:
    """A timing experiment on ``mlir``, the module of ``kernel`` (a nibble-masks kernel: AVX2
    int4, one row): channel ``j`` of every block reads weight row ``j`` instead of its own, so
    the weights the kernel reads (a few KiB) stay in L1 while it does all its work (scales and
    zero points stay each channel's own); its values are wrong. Each channel must read a row of
    its own: where all read the same row, LLVM merges their identical unpacking and the "L1"
    time measures a fraction of the loop (the mistake of earlier measurements,
    docs/quantization.md, "The int4 kernel's loop, measured again")."""
    if not getattr(kernel, "nibble_masks", False):
        raise SystemExit(
            f"--weights-in-l1: {kernel.name} is not a nibble-masks kernel (AVX2 int4, one row)"
        )
    out, n = re.subn(r"(vector\.load %mq\[)%n(\d+), ", r"\1%i\2, ", mlir)
    if not n:
        raise SystemExit(f"--weights-in-l1: no weight loads found in {kernel.name}")
    return out


def _weights(rng, bits: int, group: int | None, w: int):
    """(host operands, the dequantized f64 weight [N, K])."""
    if bits == 8 and group is None:
        q = rng.integers(-128, 128, size=(w, w), dtype=np.int8)
        return [q], q.astype(np.float64)
    g = w // group
    q = rng.integers(-8 if bits == 4 else -128, 8 if bits == 4 else 128, size=(w, w)).astype(
        np.int8
    )
    s = rng.uniform(0.01, 0.05, size=(w, g)).astype(np.float32)
    z = rng.integers(-2, 3, size=(w, g)).astype(np.int8)
    deq = (q.astype(np.float64) - np.repeat(z, group, 1)) * np.repeat(s, group, 1)
    if bits == 4:
        u = (q & 0xF).astype(np.uint8)
        q = (u[:, 0::2] | (u[:, 1::2] << 4)).view(np.int8)
    return [q, s, z], deq


def operands(
    rows: int, width: int, layers: int, bits: int, group: int | None
) -> tuple[list[np.ndarray], Callable[[str, np.ndarray], None]]:
    """The benchmark's host operands (``rows`` f32 rows, then each layer's weight operands, from
    a fixed seed) and the check of a variant's first result against numpy's float64 product of
    the first layer (raises SystemExit naming the variant on a wrong one)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, width)).astype(np.float32)
    host, deqs = [x], []
    for _ in range(layers):
        ops, deq = _weights(rng, bits, group, width)
        host += ops
        deqs.append(deq)
    want = x.astype(np.float64) @ deqs[0].T

    def check(name: str, got: np.ndarray) -> None:
        if not np.allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max()):
            raise SystemExit(f"{name}: wrong results (max error {np.abs(got - want).max():.3g})")

    return host, check


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--bits", type=int, choices=(4, 8), default=4)
    p.add_argument("--group", type=int, default=128, help="0: int8 per channel")
    p.add_argument(
        "--kernel",
        choices=("avx512", "amx"),
        default="avx512",
        help="amx: AmxQuantGemm (one row, AMX-INT8 hosts); variants name its fields",
    )
    p.add_argument("--threads", type=int, default=1, help="above 1: local-task workers")
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--budget-s", type=float, default=60.0)
    p.add_argument(
        "--variants",
        nargs="*",
        default=list(DEFAULT_VARIANTS),
        help="JSON objects of Avx512QuantGemm fields to replace ({}: the default kernel)",
    )
    p.add_argument(
        "--weights-in-l1",
        action="store_true",
        help="each variant also timed with its weights in L1 (AVX2 int4, one row; wrong values)",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from turbine_aot._compiler.amx_quant import AmxQuantGemm, host_amx_int8_missing
    from turbine_aot._compiler.avx512_quant import Avx512QuantGemm

    if args.kernel == "amx":
        if args.rows != 1:
            raise SystemExit("--kernel amx: the AMX kernel computes one row (--rows 1)")
        missing = host_amx_int8_missing()
        if missing:
            print(f"skipped: this CPU lacks {', '.join(missing)} (--kernel amx needs AMX-INT8)")
            return 0
    group = args.group or None
    w = args.width
    host, check = operands(args.rows, w, args.layers, args.bits, group)

    variants = []
    for v in args.variants:
        if args.kernel == "amx":
            base = AmxQuantGemm.for_shape(w, w, args.bits, group, group is not None)
        else:
            base = Avx512QuantGemm.for_shape(
                w, w, args.bits, group, group is not None, rows=args.rows
            )
        kernel = dataclasses.replace(base, **json.loads(v))
        mlir = _module(kernel, args.layers)
        variants.append(_harness.KernelVariant(kernel.name, mlir))
        if args.weights_in_l1:
            l1 = weights_in_l1(kernel, mlir)
            variants.append(_harness.KernelVariant(f"{kernel.name} (weights in L1)", l1))

    def check_streaming(name: str, got: np.ndarray) -> None:
        if not name.endswith("(weights in L1)"):
            check(name, got)

    _harness.kernel_ab(
        variants,
        host,
        check_streaming,
        weight_bytes=sum(a.nbytes for a in host[1:]),
        calls=args.calls,
        budget_s=args.budget_s,
        json_path=args.json,
        threads=args.threads,
        meta={
            "benchmark": "quant-kernel-ab",
            "kernel": args.kernel,
            "rows": args.rows,
            "bits": args.bits,
            "group": group,
            "layers": args.layers,
            "width": w,
            "weights_in_l1": args.weights_in_l1,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
