"""The AVX-512 weight-only quantized matmul kernel: a hand-written IREE executable that reads
int8 / packed int4 weights as they are stored and dequantizes them in registers.

``C[m, n] (f32) = sum_k A[m, k] * W[n, k]`` where ``W`` is the torchao weight-only weight:

- ``group=None`` (``Int8WeightOnlyConfig``, per output channel): ``W = Q`` (``i8``), the
  per-channel scale is applied after the call by the program's own multiply (as in torchao's
  math: ``(x @ q.float().T) * scale``).
- grouped (``IntxWeightOnlyConfig``, ``PerGroup(G)``): ``W[n, k] = (Q[n, k] - Z[n, g]) *
  S[n, g]`` with ``g = k // G``, ``S`` f32 and ``Z`` i8 (optional) of shape ``[N, K / G]``.
  ``bits=8``: ``Q`` one value per byte; ``bits=4``: two values per byte, element ``2i`` in the
  low nibble of byte ``i`` (IREE's ``i4`` layout, what turbine's archives hold).

Every operand is read where it is: ``A`` (``[M, K]`` f32, row-major), ``Q`` (``[N, K]`` bytes or
``[N, K / 2]`` for int4), ``S`` and ``Z``. No packed copy of the weight is made (nothing for
IREE to hoist: the bytes read per call are the integer bytes plus the scales).

Blocking: each workgroup computes ``rows_per_workgroup`` rows of ``M`` by ``cols_per_workgroup``
output channels. For ``nr`` output channels (4; int8 per channel: 1, so that a workgroup reads
its weight rows as one sequential run; int4 where ``M`` is 1: 2) by ``mr`` rows the kernel keeps ``nr * mr``
``vector<16xf32>`` accumulators of partial dot products along ``K``: per step it loads 16
weight bytes per channel (16 int8 or 32 int4 values) and FMAs them, as f32, with ``A``'s 16
(int4: 32, de-interleaved into even / odd ``k``) values. int8: the bytes are widened to f32
(``vpmovsxbd`` + ``vcvtdq2ps``), the group's zero point subtracted, and at the end of a group
the group's sum is scaled into the total. int4: each byte is zero-extended (``vpmovzxbd``);
the byte and the byte shifted right by 4 index (``vpermps`` reads the low 4 bits) a table of
the group's 16 dequantized values ``(q - z) * s`` per channel, built once per group (one row
and groups of 128s: the loaded bytes themselves, shifted, index it: ``nibble_shifts``). At the
end of ``K`` each accumulator is summed across its lanes. Rows left over at the end of ``M``
use a kernel of fewer rows. The current version software-prefetches the next block's weight
rows while it reads this block's.

On an AVX2 CPU (:func:`.isa.kernel_isa`) the same kernel is built without the table (there is
no 16-entry ``vpermps`` on 8-float registers): the nibbles are sign-extended and converted, and
each group's sum is scaled at its end as int8's is (``lookup``; docs/quantization.md, "AVX2
CPUs"), in register blocks for 16 ymm registers. int4 of one row there (a decode step) has a
form of its own, ``nibble_masks`` (:mod:`.avx2_quant`): one ``and`` and one conversion per
eight weights.

Three versions are built (``TURBINE_CPU_QUANT_KERNEL``, :data:`VARIANTS`): the current one,
``v1``, the first (the A/B baseline of ``benchmarks/quant_bench.py --ab``; for int8 per channel
it also has blocks of 4 channels, the current one a channel at a time), and
``rows-per-workgroup`` (AVX2 nibble masks without the prepared row: the A/B baseline of that).
The variants that were measured and lost (``arith``, ``lut``, ``nr8``, ``pf2``, ``nozb``,
``nopf``) were removed: their figures are in docs/quantization.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from .avx2_quant import emit_masks_body, masks_support, row_executable, row_name, row_width
from .isa import kernel_isa, target_avx512
from .kernel_text import (
    close_executable,
    open_executable,
    row_blocks,
    tree_sum,
    workgroup_block,
)
from .workgroups import balanced_columns

__all__ = ["VARIANTS", "Avx512QuantGemm"]

#: The kernel versions :meth:`Avx512QuantGemm.for_shape` builds: ``""`` the current one,
#: ``"v1"`` the first (A/B baseline), ``"rows-per-workgroup"`` the current one but for AVX2's
#: one-row int4 products reordering their row in each workgroup (A/B baseline of the prepared
#: row).
VARIANTS = ("", "v1", "rows-per-workgroup")


@dataclass(frozen=True)
class Avx512QuantGemm:
    """One quantized matmul executable for static ``k`` and ``n`` (``M`` given per call).

    Attributes:
        k, n: the reduction and the output channels.
        bits: 8 or 4 (the weight's storage).
        group: the group size of the scales (``None``: no scales in the kernel).
        zero_point: the grouped weight has zero points.
        mr, nr: the register block (rows of ``M``, output channels).
        rows_per_workgroup, cols_per_workgroup: a workgroup's block of ``C``.
        prefetch: software-prefetch the next block's weight rows (``memref.prefetch``, one
            line per group or per 64 bytes) while computing this block's: each row is a 1-2 KiB
            run, too short for the hardware prefetchers to ramp up; the loop otherwise waits
            on memory (1.15-1.4x measured).
        zero_points_per_block: int4 with zero points: convert the block's ``nr`` rows of zero
            points to f32 once, 16 groups per instruction, into a stack buffer that each group's
            table reads as a broadcast operand (instead of a scalar load, convert and broadcast
            per group and channel).
        nibble_shifts: int4, groups of a multiple of 128, one row per register block: the
            table lookups index with the 64 loaded weight bytes themselves, read as 16 dwords
            and shifted right by 0, 4, ..., 28 (``vpermps`` reads an index's low 4 bits), so
            no byte is widened first; lane ``i`` of shift ``t`` is ``k = 8 i + t`` of the 128,
            and each row's activations are put in that order once per workgroup, into a stack
            buffer (``4 K`` bytes: ``K`` up to 4096).
        lookup: int4 weights dequantized by the 16-entry table lookup (``vpermps`` over a zmm
            register: AVX-512); without it (AVX2, :func:`.isa.kernel_isa`) each nibble is
            sign-extended and converted (``q - z`` exact in f32) and the group's sum is scaled
            at its end, as int8's is (docs/quantization.md, "AVX2 CPUs").
        nibble_masks: AVX2, int4, one row: each nibble taken out of its dword in place by one
            ``and`` and converted, the factor ``16^t`` undone on the reordered activations
            (:mod:`.avx2_quant`; docs/quantization.md, "Weight-only int4 on AVX2").
        chains: ``nibble_masks``' accumulators per channel (independent FMA chains).
        prefetch_ahead: the rows ahead whose lines ``prefetch`` fetches (0: ``nr``, the next
            block's; for A/B measurements: farther measured within 4 % on Zen 3).
        plain_chains: int8 without scales: accumulators per output (the unrolled steps of ``K``
            take turns, at most four accumulators in all). With one, a one-row product is one
            FMA chain per channel, bound by the FMA's latency (16 weights per 4 cycles); four
            measured 1.49x at ``K`` = 2048 and 1.24x at 768 on Zen 3 (docs/quantization.md,
            "Weight-only int8 on AVX2: four FMA chains").
        prepared_row: ``nibble_masks`` with ``A`` given as prepared rows
            (:func:`.avx2_quant.row_executable`'s, dispatched before the kernel by
            :meth:`row_dispatch`): the activations put in nibble order once per call instead of
            once per workgroup.
    """

    k: int
    n: int
    bits: int = 8
    group: int | None = None
    zero_point: bool = False
    mr: int = 2
    nr: int = 4
    rows_per_workgroup: int = 16
    cols_per_workgroup: int = 32
    zero_points_per_block: bool = False
    prefetch: bool = False
    nibble_shifts: bool = False
    lookup: bool = True
    nibble_masks: bool = False
    chains: int = 2
    prepared_row: bool = False
    prefetch_ahead: int = 0
    plain_chains: int = 1

    @staticmethod
    def supports(k: int, n: int, bits: int, group: int | None) -> bool:
        """Whether the kernel handles the shape (else the matmul stays IREE's)."""
        if bits not in (4, 8) or n % 4 or k <= 0:
            return False
        if group is None:
            return bits == 8 and k % 16 == 0
        step = 16 if bits == 8 else 32
        return group > 0 and k % group == 0 and group % step == 0 and group // step <= 8

    @staticmethod
    def shifts_support(k: int, bits: int, group: int | None, mr: int = 1) -> bool:
        """Whether ``nibble_shifts`` applies (int4, groups of 128s, one row, ``K`` <= 4096)."""
        return (
            bits == 4
            and group is not None
            and group > 0
            and group % 128 == 0
            and mr == 1
            and k <= 4096
        )

    @staticmethod
    def for_shape(
        k: int,
        n: int,
        bits: int,
        group: int | None,
        zero_point: bool,
        variant: str = "",
        rows: int | None = None,
        workers: int | None = None,
    ) -> Avx512QuantGemm:
        """The kernel turbine uses for the shape (``rows``: ``M`` where it is static), its
        workgroup columns cut so that IREE's ``workers`` (default: those it starts here) share
        the dispatch evenly where ``rows`` is known (:func:`.workgroups.balanced_columns`:
        multiples of ``nr``, the usual count kept unless another saves 5 %; ``v1`` keeps its
        grid, the A/B baseline)."""
        kernel = Avx512QuantGemm._blocking(k, n, bits, group, zero_point, variant, rows)
        if variant == "v1":
            return kernel
        return balanced_columns(kernel, rows, n, kernel.nr, workers)

    @staticmethod
    def _blocking(
        k: int,
        n: int,
        bits: int,
        group: int | None,
        zero_point: bool,
        variant: str,
        rows: int | None,
    ) -> Avx512QuantGemm:
        """The kernel's blocking for the shape, before its grid is cut for the workers.

        ``variant`` (``TURBINE_CPU_QUANT_KERNEL``, one of :data:`VARIANTS`): ``""`` the current
        kernel, ``"v1"`` the first version (for A/B measurements: the int4 tables' zero points
        loaded, converted and broadcast per group and channel; no software prefetch). Blocked
        for AVX2 (:func:`.isa.kernel_isa`) there is no lookup: int4 of one row takes the
        ``nibble_masks`` form where it applies (:mod:`.avx2_quant`; ``v1``: not, the A/B
        baseline), with its row prepared once per call (``"rows-per-workgroup"``: reordered
        by each workgroup, the A/B baseline of that), everything else the general form.
        """
        if variant not in VARIANTS:
            raise ValueError(
                f"quantized AVX-512 kernel: unknown variant {variant!r} (known: "
                + ", ".join(repr(v) for v in VARIANTS)
                + ")"
            )
        cols = next(c for c in (32, 16, 8, 4) if n % c == 0)
        current = variant in ("", "rows-per-workgroup")
        # a target without AVX-512 has no 16-entry vpermps: the AVX2 forms (isa.py)
        if kernel_isa() == "avx2" or not target_avx512():
            if rows == 1 and current and masks_support(k, bits, group):
                # The widest workgroups that leave 16 of them for the workers to share (128
                # columns measured 1.06-1.08x the 32 at N = 2048 and 768, one thread, when each
                # workgroup reordered the row itself; with the row prepared once per call,
                # prepared_row, not measured again).
                wide = [c for c in (128, 64) if n % c == 0 and n // c >= 16]
                # Groups of 64s: 4 channels a block in one FMA chain each, 1.11-1.12x the
                # 2 channels in two chains (K = 768 and 2048, one thread; 1.08x at two): the
                # loop has fewer instructions a weight, more of its iterations in flight.
                # Groups of 32 (lanes of two groups a vector) keep 2 and two (1 x 4: 0.96x).
                # docs/quantization.md, "Four channels a block".
                four = group != 32 and variant == ""
                return Avx512QuantGemm(
                    k,
                    n,
                    bits,
                    group,
                    zero_point,
                    mr=1,
                    nr=4 if four else 2,
                    cols_per_workgroup=wide[0] if wide else cols,
                    prefetch=True,
                    lookup=False,
                    nibble_masks=True,
                    chains=1 if four else 2,
                    prepared_row=variant == "",
                )
            # 16 ymm registers: a vector<16xf32> is two. Per channel (int8): 4 rows x 1
            # channel (8 accumulator registers); grouped: 1 row x 2 channels, each with its
            # group's partial sum and its total (8); no table lookups (no 16-entry vpermps).
            grouped = group is not None
            return Avx512QuantGemm(
                k,
                n,
                bits,
                group,
                zero_point,
                mr=1 if grouped else 4,
                nr=2 if grouped else 1,
                cols_per_workgroup=cols,
                zero_points_per_block=True,
                prefetch=True,
                lookup=False,
                plain_chains=4 if current else 1,
            )
        mr = 4 if group is None else 2
        # 4 channels per block: 8 (int4) measured 0.80x (docs/quantization.md). int8 per
        # channel: one channel at a time (a workgroup's weight rows read as one sequential run),
        # 2.58x the 4-channel blocks at one row (docs/quantization.md, the VNNI kernel's figures).
        # int4 at one row (decode): 2 channels, 1.02-1.16x the 4 (1 channel: 0.77-0.86x, its
        # activations' even / odd split shared by none); at 4-16 rows 4 stay (2: 0.89-0.99x).
        nr = 1 if group is None and current else 4
        shifts = False
        if current and bits == 4 and rows == 1:
            nr = 2
            shifts = Avx512QuantGemm.shifts_support(k, bits, group)
            mr = 1 if shifts else mr
        return Avx512QuantGemm(
            k,
            n,
            bits,
            group,
            zero_point,
            mr=mr,
            nr=nr,
            cols_per_workgroup=cols,
            zero_points_per_block=current and not shifts,
            prefetch=current,
            nibble_shifts=shifts,
            plain_chains=4 if current else 1,
        )

    def __post_init__(self) -> None:
        if not self.supports(self.k, self.n, self.bits, self.group):
            raise ValueError(f"quantized AVX-512 kernel: unsupported shape {self}")
        if self.nibble_shifts and not self.shifts_support(self.k, self.bits, self.group, self.mr):
            raise ValueError(f"quantized AVX-512 kernel: no nibble shifts for {self}")
        if self.nibble_shifts and not self.lookup:
            raise ValueError(f"quantized AVX-512 kernel: nibble shifts are lookups: {self}")
        if self.nibble_masks and (
            self.lookup or not masks_support(self.k, self.bits, self.group, self.mr)
        ):
            raise ValueError(f"quantized AVX-512 kernel: no nibble masks for {self}")
        if self.prepared_row and not self.nibble_masks:
            raise ValueError(f"quantized AVX-512 kernel: prepared rows need nibble masks: {self}")
        if self.n % self.cols_per_workgroup or self.cols_per_workgroup % self.nr:
            raise ValueError(f"quantized AVX-512 kernel: bad workgroup columns: {self}")

    @property
    def k_bytes(self) -> int:
        """The bytes of one output channel's weights."""
        return self.k if self.bits == 8 else self.k // 2

    @property
    def groups(self) -> int:
        return self.k // self.group if self.group else 0

    @property
    def name(self) -> str:
        g = f"_g{self.group}{'z' if self.zero_point else ''}" if self.group else ""
        zb = "_zb" if self._zero_point_buffer else ""
        pf = "_pf" if self.prefetch else ""
        ns = "_ns" if self.nibble_shifts else ""
        nl = "" if self.lookup or self.bits == 8 else "_cvt"
        nm = f"_nm{self.chains}" if self.nibble_masks else ""
        pr = "_pr" if self.prepared_row else ""
        pr += f"_pa{self.prefetch_ahead}" if self.prefetch_ahead else ""
        pr += f"_ch{self.plain_chains}" if self.plain_chains > 1 and self.group is None else ""
        return (
            f"__turbine_avx512_i{self.bits}_gemm_{self.k}x{self.n}{g}_{self.mr}x{self.nr}"
            f"_{self.rows_per_workgroup}x{self.cols_per_workgroup}{zb}{pf}{ns}{nl}{nm}{pr}"
        )

    @property
    def a_width(self) -> int:
        """The columns of ``A`` as the kernel reads it: ``K``, or a prepared row's width."""
        if self.prepared_row:
            assert self.group is not None
            return row_width(self.k, self.group)
        return self.k

    @property
    def row_name(self) -> str | None:
        """The executable preparing ``A``'s rows (:meth:`row_executable`), if any."""
        return row_name(self.k, self.group) if self.prepared_row and self.group else None

    def row_executable(self) -> str:
        """The ``stream.executable`` preparing ``A``'s rows (``prepared_row``)."""
        assert self.prepared_row and self.group is not None
        return row_executable(self.k, self.group)

    def row_dispatch(self, a: str, m: str) -> str:
        """The ``flow.dispatch`` preparing the rows of ``a`` (``tensor<?xKxf32>``, ``m`` rows)
        for this kernel's :meth:`dispatch` (``prepared_row``)."""
        name = self.row_name
        assert name is not None
        return (
            f"flow.dispatch @{name}::@{name}[{m}]({a}, {m}) : (tensor<?x{self.k}xf32>{{{m}}}, "
            f"index) -> tensor<?x{self.a_width}xf32>{{{m}}}"
        )

    @property
    def _zero_point_buffer(self) -> bool:
        return (
            self.zero_points_per_block
            and self.bits == 4
            and self.zero_point
            and not self.nibble_shifts
            and not self.nibble_masks
        )

    def operand_types(self) -> list[str]:
        """The builtin tensor types of the weight operands (after ``A``)."""
        types = [f"tensor<{self.n}x{self.k_bytes}xi8>"]
        if self.group:
            types.append(f"tensor<{self.n}x{self.groups}xf32>")
            if self.zero_point:
                types.append(f"tensor<{self.n}x{self.groups}xi8>")
        return types

    def dispatch(self, a: str, weights: list[str], m: str) -> str:
        """The ``flow.dispatch`` of this kernel (result ``tensor<?xNxf32>``)."""
        a_t = f"tensor<?x{self.a_width}xf32>{{{m}}}"
        operands = ", ".join([a, *weights, m])
        types = ", ".join([a_t, *self.operand_types(), "index"])
        return (
            f"flow.dispatch @{self.name}::@{self.name}[{m}]({operands}) : ({types}) -> "
            f"tensor<?x{self.n}xf32>{{{m}}}"
        )

    def executable(self) -> str:
        """The ``stream.executable`` (MLIR text) for a module's top level."""
        k, n, nr, mr = self.k, self.n, self.nr, self.mr
        mb, nb = self.rows_per_workgroup, self.cols_per_workgroup
        a_t, c_t = f"memref<?x{self.a_width}xf32>", f"memref<?x{n}xf32>"
        q_t = f"memref<{n}x{self.k_bytes}xi8>"
        s_t, z_t = f"memref<{n}x{self.groups}xf32>", f"memref<{n}x{self.groups}xi8>"
        out: list[str] = []
        e = out.append
        name = self.name
        bindings = ["%a", "%q"]
        if self.group:
            bindings.append("%s")
            if self.zero_point:
                bindings.append("%z")
        bindings.append("%c")
        zw = next(w for w in (16, 8, 4, 2, 1) if self.groups % w == 0) if self.groups else 1
        open_executable(
            e,
            name,
            column_blocks=n // nb,
            rows_per_workgroup=mb,
            bindings=bindings,
            constants={0, 1, mr, nr, nb, k, self.groups, zw} | set(range(max(mr, nr))),
        )
        e(f"      %ma = stream.binding.subspan %a[%c0] : !stream.binding -> {a_t}{{%m}}")
        e(f"      %mq = stream.binding.subspan %q[%c0] : !stream.binding -> {q_t}")
        if self.group:
            e(f"      %ms = stream.binding.subspan %s[%c0] : !stream.binding -> {s_t}")
            if self.zero_point:
                e(f"      %mz = stream.binding.subspan %z[%c0] : !stream.binding -> {z_t}")
        e(f"      %mc = stream.binding.subspan %c[%c0] : !stream.binding -> {c_t}{{%m}}")
        e("      %zero = arith.constant dense<0.0> : vector<16xf32>")
        workgroup_block(e, cols_per_workgroup=nb, rows_per_workgroup=mb, column_base="%nbase")
        if self.nibble_shifts or self.nibble_masks:
            body = self._body_shifts if self.nibble_shifts else partial(emit_masks_body, self)
            body(e, (a_t, q_t, s_t, z_t, c_t))
            close_executable(e)
            return "\n".join(out)
        zbuf_t = f"memref<{nr}x{self.groups}xf32>"
        if self._zero_point_buffer:
            e(f"      %zbuf = memref.alloca() : {zbuf_t}")
        e(f"      scf.for %nq = %c0 to %c{nb} step %c{nr} {{")
        e("        %ncol = arith.addi %nbase, %nq : index")
        if self._zero_point_buffer:  # the block's zero points as f32, zw groups at a time
            zv, zf = f"vector<{zw}xi8>", f"vector<{zw}xf32>"
            e(f"        scf.for %gz = %c0 to %c{self.groups} step %c{zw} {{")
            for j in range(nr):
                e(f"          %zn{j} = arith.addi %ncol, %c{j} : index")
                e(f"          %zl{j} = vector.load %mz[%zn{j}, %gz] : {z_t}, {zv}")
                e(f"          %zc{j} = arith.sitofp %zl{j} : {zv} to {zf}")
                e(f"          vector.store %zc{j}, %zbuf[%c{j}, %gz] : {zbuf_t}, {zf}")
            e("        }")
        e(f"        scf.for %mi = %m0 to %mend step %c{mr} {{")
        e(f"          %left = affine.min affine_map<()[s0, s1] -> ({mr}, s1 - s0)>()[%mi, %mend]")
        micro = self._micro_grouped if self.group else self._micro_plain
        types = (a_t, q_t, s_t, z_t, c_t)
        row_blocks(e, "          ", mr, lambda r, p: micro(e, r, types, p))
        e("        }")
        e("      }")
        close_executable(e)
        return "\n".join(out)

    def _indices(self, e, rows: int, p: str) -> None:
        for r in range(rows):
            e(f"{p}%row{r} = arith.addi %mi, %c{r} : index")
        for j in range(self.nr):
            e(f"{p}%n{j} = arith.addi %ncol, %c{j} : index")

    def emit_prefetch_rows(self, e, p: str) -> None:
        """``%pn{j}``: the row ``nr`` channels on (the next block's), clamped to ``N``."""
        for j in range(self.nr):
            e(
                f"{p}%pn{j} = affine.min affine_map<()[s0] -> (s0 + {self.prefetch_ahead or self.nr}, {self.n - 1})>()"
                f"[%n{j}]"
            )

    def emit_prefetch(self, e, q_t: str, byte: str, p: str) -> None:
        """Software prefetch of the next block's weight line at ``byte`` (its rows are 1-2 KiB
        runs, too short for the hardware prefetchers to ramp up)."""
        for j in range(self.nr):
            e(f"{p}memref.prefetch %mq[%pn{j}, {byte}], read, locality<3>, data : {q_t}")

    def _store(self, e, rows: int, res: str | list[str], c_t: str, p: str) -> None:
        """Sums each accumulator (``res#i``, or the names ``res``) across its lanes and stores
        it."""
        for r in range(rows):
            for j in range(self.nr):
                i = r * self.nr + j
                acc = res[i] if isinstance(res, list) else f"{res}#{i}"
                e(
                    f"{p}%sum{i} = vector.reduction <add>, {acc} fastmath<reassoc> : "
                    "vector<16xf32> into f32"
                )
                e(f"{p}memref.store %sum{i}, %mc[%row{r}, %n{j}] : {c_t}")

    def _micro_plain(self, e, rows: int, types: tuple[str, ...], p: str) -> None:
        """``rows`` x ``nr`` of ``C = A Q^T`` (int8, no scales)."""
        a_t, q_t, _, _, c_t = types
        nr, vt = self.nr, "vector<16xf32>"
        unroll = 4 if self.k % 64 == 0 else 1
        # independent FMA chains per accumulator: the unrolled steps take turns
        # (at most four accumulators in all: eight ymm registers where vectors of 16 are two)
        chains = max(1, min(self.plain_chains, unroll, 4 // (rows * nr)))
        self._indices(e, rows, p)
        if self.prefetch:
            self.emit_prefetch_rows(e, p)
        keys = [(r, j, c) for r in range(rows) for j in range(nr) for c in range(chains)]
        tys = ", ".join([vt] * len(keys))
        iters = ", ".join(f"%acc{r}_{j}_{c} = %zero" for r, j, c in keys)
        e(f"{p}%cstep = arith.constant {16 * unroll} : index")
        e(
            f"{p}%res:{len(keys)} = scf.for %k = %c0 to %c{self.k} step %cstep iter_args({iters}) -> ({tys}) {{"
        )
        cur = {key: "%acc{}_{}_{}".format(*key) for key in keys}
        if self.prefetch:
            self.emit_prefetch(e, q_t, "%k", p + "  ")
        for u in range(unroll):
            c = u % chains
            e(f"{p}  %k{u} = affine.apply affine_map<()[s0] -> (s0 + {16 * u})>()[%k]")
            for j in range(nr):
                e(f"{p}  %qv{u}_{j} = vector.load %mq[%n{j}, %k{u}] : {q_t}, vector<16xi8>")
                e(f"{p}  %w{u}_{j} = arith.sitofp %qv{u}_{j} : vector<16xi8> to {vt}")
            for r in range(rows):
                e(f"{p}  %x{u}_{r} = vector.load %ma[%row{r}, %k{u}] : {a_t}, {vt}")
                for j in range(nr):
                    e(
                        f"{p}  %f{u}_{r}_{j} = vector.fma %x{u}_{r}, %w{u}_{j}, {cur[r, j, c]} : {vt}"
                    )
                    cur[r, j, c] = f"%f{u}_{r}_{j}"
        e(f"{p}  scf.yield " + ", ".join(cur[key] for key in keys) + f" : {tys}")
        e(f"{p}}}")
        sums = []
        for r in range(rows):
            for j in range(nr):
                parts = [f"%res#{keys.index((r, j, c))}" for c in range(chains)]
                sums.append(tree_sum(e, p, parts, f"%cs{r}_{j}", vt))
        self._store(e, rows, sums, c_t, p)

    def _micro_grouped(self, e, rows: int, types: tuple[str, ...], p: str) -> None:
        """``rows`` x ``nr`` of ``C = A W^T`` with ``W`` dequantized per group in registers."""
        a_t, q_t, s_t, z_t, c_t = types
        nr, vt, group = self.nr, "vector<16xf32>", self.group
        assert group is not None
        per_load = 16 if self.bits == 8 else 32  # values per 16-byte load
        steps = group // per_load
        self._indices(e, rows, p)
        if self.prefetch:
            self.emit_prefetch_rows(e, p)
        tots = [f"%tot{r}_{j}" for r in range(rows) for j in range(nr)]
        tys = ", ".join([vt] * len(tots))
        iters = ", ".join(f"{a} = %zero" for a in tots)
        table = self.bits == 4 and self.lookup
        if table:
            values = ", ".join(f"{v:.1f}" for v in [*range(8), *range(-8, 0)])
            e(f"{p}%qvals = arith.constant dense<[{values}]> : {vt}")  # nibble -> value
            e(f"{p}%c4v = arith.constant dense<4> : vector<16xi32>")
        elif self.bits == 4:  # a nibble's sign extension: << 28 (low) or 24 (high), >> 28
            for c in (24, 28):
                e(f"{p}%c{c}v = arith.constant dense<{c}> : vector<16xi32>")
        e(
            f"{p}%res:{len(tots)} = scf.for %g = %c0 to %c{self.groups} step %c1 "
            f"iter_args({iters}) -> ({tys}) {{"
        )
        q = p + "  "
        for j in range(nr):
            e(f"{q}%sv{j} = memref.load %ms[%n{j}, %g] : {s_t}")
            e(f"{q}%sb{j} = vector.broadcast %sv{j} : f32 to {vt}")
            if self.zero_point and self._zero_point_buffer:
                zbuf_t = f"memref<{nr}x{self.groups}xf32>"
                e(f"{q}%zf{j} = memref.load %zbuf[%c{j}, %g] : {zbuf_t}")
                e(f"{q}%zb{j} = vector.broadcast %zf{j} : f32 to {vt}")
            elif self.zero_point:
                e(f"{q}%zv{j} = memref.load %mz[%n{j}, %g] : {z_t}")
                e(f"{q}%zf{j} = arith.sitofp %zv{j} : i8 to f32")
                e(f"{q}%zb{j} = vector.broadcast %zf{j} : f32 to {vt}")
            if table:  # the group's 16 dequantized values, (q - z) * s as eager's
                qz = "%qvals"
                if self.zero_point:
                    e(f"{q}%qz{j} = arith.subf %qvals, %zb{j} : {vt}")
                    qz = f"%qz{j}"
                e(f"{q}%tab{j} = arith.mulf {qz}, %sb{j} : {vt}")
        cur: dict[tuple[int, int], str | None] = {
            (r, j): f"%tot{r}_{j}" if table else None for r in range(rows) for j in range(nr)
        }

        def fma(x: str, w: str, r: int, j: int, tag: str) -> None:
            prev = cur[r, j]
            if prev is None:
                e(f"{q}%p{tag}_{r}_{j} = arith.mulf {x}, {w} : {vt}")
            else:
                e(f"{q}%p{tag}_{r}_{j} = vector.fma {x}, {w}, {prev} : {vt}")
            cur[r, j] = f"%p{tag}_{r}_{j}"

        kb = group * self.bits // 8
        for line in range(0, kb, 64) if self.prefetch else ():
            e(f"{q}%pb{line} = affine.apply affine_map<()[s0] -> (s0 * {kb} + {line})>()[%g]")
            self.emit_prefetch(e, q_t, f"%pb{line}", q)
        for st in range(steps):
            kbytes = group * self.bits // 8
            e(
                f"{q}%ko{st} = affine.apply affine_map<()[s0] -> (s0 * {group} + {st * per_load})>()[%g]"
            )
            e(f"{q}%bo{st} = affine.apply affine_map<()[s0] -> (s0 * {kbytes} + {st * 16})>()[%g]")
            if self.bits == 8:
                for j in range(nr):
                    e(f"{q}%qv{st}_{j} = vector.load %mq[%n{j}, %bo{st}] : {q_t}, vector<16xi8>")
                    w = f"%wf{st}_{j}"
                    e(f"{q}{w} = arith.sitofp %qv{st}_{j} : vector<16xi8> to {vt}")
                    if self.zero_point:
                        e(f"{q}%wz{st}_{j} = arith.subf {w}, %zb{j} : {vt}")
                        w = f"%wz{st}_{j}"
                for r in range(rows):
                    e(f"{q}%xv{st}_{r} = vector.load %ma[%row{r}, %ko{st}] : {a_t}, {vt}")
                    for j in range(nr):
                        w = f"%wz{st}_{j}" if self.zero_point else f"%wf{st}_{j}"
                        fma(f"%xv{st}_{r}", w, r, j, f"{st}")
            else:
                for j in range(nr):
                    b = f"%qv{st}_{j}"
                    e(f"{q}{b} = vector.load %mq[%n{j}, %bo{st}] : {q_t}, vector<16xi8>")
                    if not table:  # each nibble sign-extended, converted, minus the zero point
                        it = "vector<16xi32>"
                        e(f"{q}%by{st}_{j} = arith.extui {b} : vector<16xi8> to {it}")
                        for h, up in (("lo", 28), ("hi", 24)):
                            e(f"{q}%{h}u{st}_{j} = arith.shli %by{st}_{j}, %c{up}v : {it}")
                            e(f"{q}%{h}s{st}_{j} = arith.shrsi %{h}u{st}_{j}, %c28v : {it}")
                            w = f"%{h}w{st}_{j}"
                            e(f"{q}{w} = arith.sitofp %{h}s{st}_{j} : {it} to {vt}")
                            if self.zero_point:
                                e(f"{q}%{h}z{st}_{j} = arith.subf {w}, %zb{j} : {vt}")
                        continue
                    e(f"{q}%lo{st}_{j} = arith.extui {b} : vector<16xi8> to vector<16xi32>")
                    e(f"{q}%hi{st}_{j} = arith.shrui %lo{st}_{j}, %c4v : vector<16xi32>")
                    for h in ("lo", "hi"):  # vpermps: lane i = table[index_i & 15]
                        e(
                            f'{q}%{h}w{st}_{j} = llvm.call_intrinsic "llvm.x86.avx512.permvar.sf.512"'
                            f"(%tab{j}, %{h}{st}_{j}) : ({vt}, vector<16xi32>) -> {vt}"
                        )
                for r in range(rows):
                    e(f"{q}%ko{st}_{r}b = affine.apply affine_map<()[s0] -> (s0 + 16)>()[%ko{st}]")
                    e(f"{q}%xa{st}_{r} = vector.load %ma[%row{r}, %ko{st}] : {a_t}, {vt}")
                    e(f"{q}%xb{st}_{r} = vector.load %ma[%row{r}, %ko{st}_{r}b] : {a_t}, {vt}")
                    even = ", ".join(str(2 * i) for i in range(16))
                    odd = ", ".join(str(2 * i + 1) for i in range(16))
                    e(
                        f"{q}%xe{st}_{r} = vector.shuffle %xa{st}_{r}, %xb{st}_{r} [{even}] : {vt}, {vt}"
                    )
                    e(
                        f"{q}%xo{st}_{r} = vector.shuffle %xa{st}_{r}, %xb{st}_{r} [{odd}] : {vt}, {vt}"
                    )
                    wl = "z" if self.zero_point and not table else "w"
                    for j in range(nr):
                        fma(f"%xe{st}_{r}", f"%lo{wl}{st}_{j}", r, j, f"{st}e")
                        fma(f"%xo{st}_{r}", f"%hi{wl}{st}_{j}", r, j, f"{st}o")
        outs = []
        for r in range(rows):
            for j in range(nr):
                if table:  # the weights were scaled in the table
                    outs.append(str(cur[r, j]))
                    continue
                e(f"{q}%nt{r}_{j} = vector.fma %sb{j}, {cur[r, j]}, %tot{r}_{j} : {vt}")
                outs.append(f"%nt{r}_{j}")
        e(f"{q}scf.yield " + ", ".join(outs) + f" : {tys}")
        e(f"{p}}}")
        self._store(e, rows, "%res", c_t, p)

    def _body_shifts(self, e, types: tuple[str, ...]) -> None:
        """The function body of the ``nibble_shifts`` form (see the attribute), after the
        workgroup's ``%nbase`` / ``%m0`` / ``%mend``: per row of ``M``, the activations
        reordered into ``%xp`` once, then the workgroup's channels ``nr`` at a time, two
        accumulators per channel (even / odd shifts: two FMA chains)."""
        a_t, q_t, s_t, z_t, c_t = types
        k, nr, nb, group = self.k, self.nr, self.cols_per_workgroup, self.group
        assert group is not None
        vt, it = "vector<16xf32>", "vector<16xi32>"
        xp_t = f"memref<{k}xf32>"
        p = "      "
        e(f"{p}%xp = memref.alloca() : {xp_t}")
        values = ", ".join(f"{v:.1f}" for v in [*range(8), *range(-8, 0)])
        e(f"{p}%qvals = arith.constant dense<[{values}]> : {vt}")  # nibble -> value
        for t in range(1, 8):
            e(f"{p}%sh{t} = arith.constant dense<{4 * t}> : {it}")
        for c in (128, 64):
            e(f"{p}%c{c}i = arith.constant {c} : index")
        e(f"{p}scf.for %mi = %m0 to %mend step %c1 {{")
        q = p + "  "
        # the row's activations in lookup order: xp[128 b + 16 t + i] = a[128 b + 8 i + t]
        e(f"{q}scf.for %kb = %c0 to %c{k} step %c128i {{")
        e(f"{q}  %xv = vector.load %ma[%mi, %kb] : {a_t}, vector<128xf32>")
        for t in range(8):
            mask = ", ".join(str(8 * i + t) for i in range(16))
            e(f"{q}  %xt{t} = vector.shuffle %xv, %xv [{mask}] : vector<128xf32>, vector<128xf32>")
            e(f"{q}  %xo{t} = affine.apply affine_map<()[s0] -> (s0 + {16 * t})>()[%kb]")
            e(f"{q}  vector.store %xt{t}, %xp[%xo{t}] : {xp_t}, {vt}")
        e(f"{q}}}")
        e(f"{q}scf.for %nq = %c0 to %c{nb} step %c{nr} {{")
        r = q + "  "
        e(f"{r}%ncol = arith.addi %nbase, %nq : index")
        for j in range(nr):
            e(f"{r}%n{j} = arith.addi %ncol, %c{j} : index")
        if self.prefetch:
            self.emit_prefetch_rows(e, r)
        accs = [f"%acc{j}_{h}" for j in range(nr) for h in range(2)]
        tys = ", ".join([vt] * len(accs))
        iters = ", ".join(f"{a} = %zero" for a in accs)
        e(
            f"{r}%res:{len(accs)} = scf.for %g = %c0 to %c{self.groups} step %c1 "
            f"iter_args({iters}) -> ({tys}) {{"
        )
        g = r + "  "
        for j in range(nr):  # the group's 16 dequantized values (q - z) * s, as eager's
            e(f"{g}%sv{j} = memref.load %ms[%n{j}, %g] : {s_t}")
            e(f"{g}%sb{j} = vector.broadcast %sv{j} : f32 to {vt}")
            qz = "%qvals"
            if self.zero_point:
                e(f"{g}%zv{j} = memref.load %mz[%n{j}, %g] : {z_t}")
                e(f"{g}%zf{j} = arith.sitofp %zv{j} : i8 to f32")
                e(f"{g}%zb{j} = vector.broadcast %zf{j} : f32 to {vt}")
                e(f"{g}%qz{j} = arith.subf %qvals, %zb{j} : {vt}")
                qz = f"%qz{j}"
            e(f"{g}%tab{j} = arith.mulf {qz}, %sb{j} : {vt}")
        cur = {(j, h): f"%acc{j}_{h}" for j in range(nr) for h in range(2)}
        kb = group // 2  # a group's bytes
        for blk in range(group // 128):
            e(f"{g}%k{blk} = affine.apply affine_map<()[s0] -> (s0 * {group} + {128 * blk})>()[%g]")
            e(f"{g}%b{blk} = affine.apply affine_map<()[s0] -> (s0 * {kb} + {64 * blk})>()[%g]")
            if self.prefetch:
                self.emit_prefetch(e, q_t, f"%b{blk}", g)
            for t in range(8):
                e(
                    f"{g}%x{blk}_{t}o = affine.apply affine_map<()[s0] -> (s0 + {16 * t})>()[%k{blk}]"
                )
                e(f"{g}%x{blk}_{t} = vector.load %xp[%x{blk}_{t}o] : {xp_t}, {vt}")
            for j in range(nr):
                e(f"{g}%qb{blk}_{j} = vector.load %mq[%n{j}, %b{blk}] : {q_t}, vector<64xi8>")
                e(f"{g}%qd{blk}_{j} = vector.bitcast %qb{blk}_{j} : vector<64xi8> to {it}")
                for t in range(8):
                    idx = f"%qd{blk}_{j}"
                    if t:
                        idx = f"%qs{blk}_{j}_{t}"
                        e(f"{g}{idx} = arith.shrui %qd{blk}_{j}, %sh{t} : {it}")
                    w = f"%w{blk}_{j}_{t}"  # vpermps: lane i = table[index_i & 15]
                    e(
                        f'{g}{w} = llvm.call_intrinsic "llvm.x86.avx512.permvar.sf.512"'
                        f"(%tab{j}, {idx}) : ({vt}, {it}) -> {vt}"
                    )
                    h = t % 2
                    out = f"%f{blk}_{j}_{t}"
                    e(f"{g}{out} = vector.fma %x{blk}_{t}, {w}, {cur[j, h]} : {vt}")
                    cur[j, h] = out
        e(
            f"{g}scf.yield "
            + ", ".join(cur[j, h] for j in range(nr) for h in range(2))
            + f" : {tys}"
        )
        e(f"{r}}}")
        for j in range(nr):
            e(f"{r}%both{j} = arith.addf %res#{2 * j}, %res#{2 * j + 1} : {vt}")
            e(f"{r}%sum{j} = vector.reduction <add>, %both{j} fastmath<reassoc> : {vt} into f32")
            e(f"{r}memref.store %sum{j}, %mc[%mi, %n{j}] : {c_t}")
        e(f"{q}}}")
        e(f"{p}}}")
