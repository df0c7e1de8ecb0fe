"""Where the AMX weight-only int4 kernel's time goes: the kernel with one part at a time taken
out, timed interleaved against the whole kernel on ``layers`` x (``width`` x ``width``) int4
weights (groups of 128, zero points), one row.

The variants leave parts of the work out and so **compute wrong results by design**: only the
whole kernel is checked against numpy's float64 product; the others are timings, nothing more.
What each leaves out (``turbine_aot._compiler.amx_quant``; docs/quantization.md, "Where the AMX
int4 kernel's time goes"):

* ``no-nibble-split``: the A tiles are not built (the stack buffers keep whatever they hold): no
  vector load of a weight byte, no split, no store;
* ``no-group-sums``: the C tiles are neither stored nor combined per group;
* ``no-tile-products``: no tile load, tile product or tile store (the split, the prefetch and
  the per-group combination stay);
* ``tile-products-alone``: only the tile loads and products, the prefetch of the weight lines
  and the C tiles' stores; ``...-no-prefetch``: without the prefetch too;
* ``contiguous-reads``: the weight lines a step needs read as one contiguous 2 KiB (as a
  block-interleaved layout would hold them), not 64 bytes from each of 32 rows 1 KiB apart;
  no software prefetch.

A profile, not a test: nothing asserts on time. ``--threads N`` above 1 runs on ``local-task``.

Usage::

    python benchmarks/amx_quant_ablation.py                    # 8 x 2048 x 2048, one thread
    python benchmarks/amx_quant_ablation.py --width 1024 --json out.json
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _harness  # noqa: E402
import numpy as np  # noqa: E402
import quant_kernel_ab  # noqa: E402


def _variants():
    """name -> ``AmxQuantGemm`` (``kernel``) or a subclass of it with one part left out."""
    from turbine_aot._compiler.amx_quant import AmxQuantGemm

    def filtered(base, drop):
        class Filtered(base):
            def _group_tiles(self, e, p, g, tag):
                lines: list[str] = []
                super()._group_tiles(lines.append, p, g, tag)
                for line in lines:
                    if not any(d in line for d in drop):
                        e(line)

        return Filtered

    class NoSplit(AmxQuantGemm):
        def _abuild(self, e, p, step, tag):
            return

    class NoSums(AmxQuantGemm):
        def _extract(self, e, p, g, accs, tag):
            return accs

        def _store_sums(self, e, p, g, tag):
            return

    class TilesAlone(NoSums, NoSplit):
        pass

    class NoTiles(AmxQuantGemm):
        def _group_tiles(self, e, p, g, tag):
            lines: list[str] = []
            super()._group_tiles(lines.append, p, g, tag)
            for line in lines:
                if not any(t in line for t in ("tileloadd", "tdpbusd", "tilezero")):
                    e(line)

        def _store_sums(self, e, p, g, tag):
            return

    class Contiguous(AmxQuantGemm):
        """Step ``s`` of a 32-channel block reads the 2 KiB at ``block + 2048 s``; no software
        prefetch (the hardware's follows a contiguous stream)."""

        def _prefetch(self, e, p, step, tag):
            return

        def _prefetch_head(self, e, p):
            return

        def _abuild(self, e, p, step, tag):
            lines: list[str] = []
            super()._abuild(lines.append, p, step, tag)
            kb = self.k // 2
            for line in lines:
                if "vector.load %mq[%nj" not in line:
                    e(line)
                    continue
                value = line.split("=")[0].strip()
                j = int(value.rsplit("_", 1)[1])
                e(
                    f"{p}%cj{tag}_{j} = affine.apply affine_map<()[s0, s1] -> "
                    f"(s0 + s1 * {2048 // kb} + {j * 64 // kb})>()[%n0, {step}]"
                )
                e(f"{p}%cc{tag}_{j} = arith.constant {j * 64 % kb} : index")
                e(
                    f"{p}{value} = vector.load %mq[%cj{tag}_{j}, %cc{tag}_{j}] : "
                    f"memref<{self.n}x{kb}xi8>, vector<64xi8>"
                )

    return {
        "kernel": AmxQuantGemm,
        "no-nibble-split": NoSplit,
        "no-group-sums": NoSums,
        "no-tile-products": NoTiles,
        "tile-products-alone": TilesAlone,
        "tile-products-alone-no-prefetch": filtered(TilesAlone, ("prefetch",)),
        "contiguous-reads": Contiguous,
    }


def main(argv: list[str] | None = None) -> int:
    p = _harness.argument_parser(__doc__)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=2048, help="K = N: 256 ... 4096, a power of 2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--budget-s", type=float, default=60.0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from turbine_aot._compiler.amx_quant import AmxQuantGemm, host_amx_int8_missing

    missing = host_amx_int8_missing()
    if missing:
        print(f"skipped: this CPU lacks {', '.join(missing)} (the kernel needs AMX-INT8)")
        return 0
    w = args.width
    if w % 128 or 2048 % (w // 2):
        raise SystemExit("--width: 256, 512, 1024, 2048 or 4096 (contiguous-reads' 2 KiB steps)")
    host, check_kernel = quant_kernel_ab.operands(1, w, args.layers, 4, 128)
    base = AmxQuantGemm.for_shape(w, w, 4, 128, True)
    fields = dataclasses.asdict(base)
    variants = []
    for name, cls in _variants().items():
        kernel = cls(**fields)
        mlir = quant_kernel_ab._module(kernel, args.layers)
        variants.append(_harness.KernelVariant(name, mlir))

    def check(name: str, got: np.ndarray) -> None:
        if name == "kernel":  # the ablations compute wrong results by design (module doc)
            check_kernel(name, got)

    _harness.kernel_ab(
        variants,
        host,
        check,
        weight_bytes=sum(a.nbytes for a in host[1:]),
        calls=args.calls,
        budget_s=args.budget_s,
        json_path=args.json,
        threads=args.threads,
        meta={"benchmark": "amx-quant-ablation", "layers": args.layers, "width": w},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
