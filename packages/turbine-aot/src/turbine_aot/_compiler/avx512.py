"""The AVX-512 fp32 matmul kernel: a hand-written IREE executable (MLIR ``vector`` ops), the
weight layout it reads, and the host check.

IREE 3.13's fp32 ``mmt4d`` ukernel reaches 90-127 GFLOP/s on one core of this AVX-512 CPU for
the GPT-2-small matmul shapes, oneDNN 150-165, this kernel 140-158 (docs/performance.md,
sections 6 and 9; at M = 1-8 it is 2-2.5x IREE's code). This kernel is
written as a ``stream.executable`` over ``vector<16xf32>`` FMAs that IREE compiles like any
dispatch; :mod:`.matmuls` writes the calls. It computes
``C[z, m, n] (f32) = sum_k A[z, m, k] * B[z, k, n]`` (f32):

- ``A`` is ``[batch * M, K]`` row-major (the activations as they are: no copy).
- ``B`` is packed once (weights: by IREE's constant hoisting) in panels of ``nr`` columns:
  ``Bp[z][p][k][j] = B[z][k][nr*p + j]`` (``Np`` = ``N`` padded to ``nr``, zeros), flattened,
  so that the kernel reads ``nr`` contiguous floats per ``k``. ``batch_b=False``: one ``B``
  for every batch entry.
- ``C`` is ``[batch * M, Np]``.

Register blocking: ``mr`` rows by ``nr`` columns of ``C`` in ``mr * nr / 16`` zmm accumulators
(4 x 64: 16 accumulators), each step of ``K`` one broadcast of ``A`` per row and ``nr / 16``
loads of ``B``. ``K`` is walked in blocks of ``kc`` (128: a block of a panel, 32 KiB, stays in
L1 while the workgroup's rows go over it), ``C`` accumulating across blocks. A workgroup
computes ``rows_per_workgroup`` rows by ``cols_per_workgroup`` columns of one batch entry; rows
left over at the end of ``M`` (any ``M``, dynamic too) use a kernel of fewer rows. Products of
few static rows also prefetch the next K block's panel into L2 (:meth:`Avx512Gemm.for_rows`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .activations import emit_activation, emit_activation_constants, relu_line
from .host import cpu_flags, cpu_vendor
from .isa import AVX512_FEATURES, kernel_isa
from .kernel_text import close_executable, open_executable, row_blocks, workgroup_block
from .workgroups import balanced_grid

__all__ = [
    "AVX512_BF16_FEATURES",
    "AVX512_FEATURES",
    "MANY_ROWS",
    "MATMUL_PREFETCH_ENV",
    "MATMUL_ROWS_ENV",
    "Avx512Gemm",
    "emit_accumulator_init",
    "emit_epilogue",
    "fma",
    "host_avx512_bf16_missing",
    "host_avx512_missing",
]

#: ``off``: no products prefetch their weight's next block (:meth:`Avx512Gemm.for_rows`), for
#: measurements; unset or anything else: the default.
MATMUL_PREFETCH_ENV = "TURBINE_CPU_MATMUL_PREFETCH"
#: ``fixed``: AVX2 products and convolutions of few static rows keep the 6-row register block
#: whatever their row count (:func:`avx2_row_block`), the A/B baseline; unset or anything
#: else: the default.
MATMUL_ROWS_ENV = "TURBINE_CPU_MATMUL_ROWS"
#: The static rows from which fp32 products on Intel CPUs take 6 x 64 register blocks
#: (:meth:`Avx512Gemm.many_rows`).
MANY_ROWS = 48
#: FMA latency in cycles of the AVX2 CPUs the row model of :func:`avx2_row_block` assumes
#: (AMD Zen 2-4, Intel Skylake to Golden Cove: 4, two FMAs issued a cycle).
_FMA_LATENCY = 4
#: The flags its bf16 form needs (``vdpbf16ps``).
AVX512_BF16_FEATURES = (*AVX512_FEATURES, "avx512_bf16")


def host_avx512_missing() -> list[str]:
    """What this machine lacks to run the kernel well (empty: nothing)."""
    flags = cpu_flags()
    return [f for f in AVX512_FEATURES if f not in flags]


def host_avx512_bf16_missing() -> list[str]:
    """What this machine lacks to run the kernels' bf16 forms (empty: nothing)."""
    flags = cpu_flags()
    return [f for f in AVX512_BF16_FEATURES if f not in flags]


def emit_accumulator_init(
    e: Any, p: str, rows: int, nv: int, c_t: str, row: str = "%row", masks: Sequence[str] = ()
) -> None:
    """Emits ``%init``: the ``rows`` x ``nv`` vector<16xf32> accumulators' starting values,
    zeros on the first reduction block (``%first``), else C's values there (``%mc[<row><r>,
    %col<r>_<j>]``, ``row`` the prefix of C's row indices; ``masks``: one ``vector<16xi1>``
    per ``j``, the columns of C that exist, the others read as zeros); shared by the matmul and
    the direct-convolution kernels."""
    vt = "vector<16xf32>"
    n = rows * nv
    types = ", ".join([vt] * n)
    e(f"{p}%init:{n} = scf.if %first -> ({types}) {{")
    e(f"{p}  scf.yield " + ", ".join(["%zero"] * n) + f" : {types}")
    e(f"{p}}} else {{")
    loads = []
    for r in range(rows):
        for j in range(nv):
            if masks:
                e(
                    f"{p}  %ld{r}_{j} = vector.maskedload %mc[{row}{r}, %col{r}_{j}], {masks[j]}, "
                    f"%zero : {c_t}, vector<16xi1>, {vt} into {vt}"
                )
            else:
                e(f"{p}  %ld{r}_{j} = vector.load %mc[{row}{r}, %col{r}_{j}] : {c_t}, {vt}")
            loads.append(f"%ld{r}_{j}")
    e(f"{p}  scf.yield " + ", ".join(loads) + f" : {types}")
    e(f"{p}}}")


def emit_epilogue(
    e: Any,
    p: str,
    rows: int,
    nv: int,
    values: list[str],
    store: Callable[[str, int, int, str], None],
    *,
    scale: str | None = None,
    bias: str | None = None,
    residual: str | None = None,
    relu: bool = False,
    activation: str | None = None,
) -> None:
    """Emits the stores of the ``rows`` x ``nv`` accumulators ``values``: on the last reduction
    block (``%last``) times ``%mscale[%col0_<j>]`` (``scale``: its memref type), plus
    ``%mbias[%col0_<j>]`` (``bias``), plus ``%mres[%row<r>, %col<r>_<j>]`` (``residual``),
    then at least zero (``relu``: :func:`.activations.relu_line`, as torch's ReLU: NaN stays
    NaN, -0.0 stays -0.0) or ``activation`` (:func:`emit_activation`); on the others as they
    are. ``store(value, r, j, prefix)`` emits the store of row ``r``'s vector ``j``. Shared by
    the matmul and the direct-convolution kernels (:mod:`.epilogues`).

    Each value is stored in its branch right where it is computed: were the branches to yield
    their values to stores after them, all ``rows * nv`` would be live at once, which on AVX2
    (16 registers) spills and made SiLU's ``exp`` cost 2.3x IREE's own elementwise code
    (docs/performance.md, section 21)."""
    vt = "vector<16xf32>"
    e(f"{p}scf.if %last {{")
    if activation:
        emit_activation_constants(e, p + "  ")
    for j in range(nv):
        if scale:
            e(f"{p}  %sv_e{j} = vector.load %mscale[%col0_{j}] : {scale}, {vt}")
        if bias:
            e(f"{p}  %bv_e{j} = vector.load %mbias[%col0_{j}] : {bias}, {vt}")
    for r in range(rows):
        for j in range(nv):
            v = values[r * nv + j]
            if scale:
                e(f"{p}  %es{r}_{j} = arith.mulf {v}, %sv_e{j} : {vt}")
                v = f"%es{r}_{j}"
            if bias:
                e(f"{p}  %eb{r}_{j} = arith.addf {v}, %bv_e{j} : {vt}")
                v = f"%eb{r}_{j}"
            if residual:
                e(f"{p}  %rv{r}_{j} = vector.load %mres[%row{r}, %col{r}_{j}] : {residual}, {vt}")
                e(f"{p}  %ea{r}_{j} = arith.addf {v}, %rv{r}_{j} : {vt}")
                v = f"%ea{r}_{j}"
            if relu:
                e(relu_line(f"{p}  ", f"%er{r}_{j}", v, "%zero"))
                v = f"%er{r}_{j}"
            if activation:
                v = emit_activation(e, p + "  ", v, f"{r}_{j}", activation)
            store(v, r, j, p + "  ")
    e(f"{p}}} else {{")
    for r in range(rows):
        for j in range(nv):
            store(values[r * nv + j], r, j, p + "  ")
    e(f"{p}}}")


def fma(a: str, b: str, acc: str, bf16: bool) -> str:
    """The right-hand side of one multiply-accumulate step into ``acc`` (``vector<16xf32>``):
    f32, ``acc + a * b`` (``vector<16xf32>`` operands); bf16, ``vdpbf16ps`` (AVX512-BF16) over
    ``vector<16xi32>`` operands whose words are bf16 pairs: ``acc[i] += a[2i] * b[2i] +
    a[2i + 1] * b[2i + 1]`` in f32. Shared by the matmul and the direct-convolution kernels."""
    vt = "vector<16xf32>"
    if not bf16:
        return f"vector.fma {a}, {b}, {acc} : {vt}"
    wt = "vector<16xi32>"
    return (
        f'llvm.inline_asm "vdpbf16ps $2, $1, $0", "=v,v,v,0" {a}, {b}, {acc} : '
        f"({wt}, {wt}, {vt}) -> {vt}"
    )


def avx2_row_block(m: int, mr: int = 6, rows_per_workgroup: int | None = None) -> int:
    """The register block's rows (at most ``mr``) for an AVX2 product of ``m`` static rows, 16
    columns a block (two ymm accumulators a row). A block of ``r`` rows issues ``2 r`` FMAs a
    step of ``K``, each on its own dependency chain, so it takes at least ``max(latency, r)``
    cycles at two FMAs a cycle; ``mr``'s blocks leave a short last one whose chains wait (8 rows
    as 6 + 2: 10 cycles a step). The rows are spread evenly over the same number of blocks where
    that takes fewer cycles (8 rows as 4 + 4: 8 cycles, measured 6-12 % faster on the AMD Zen
    3; 9 as 5 + 4; 13 as 5 + 5 + 3), never over more blocks (each pass reads the panel of ``B``
    again: 32 rows in blocks of 4 measured 5-10 % slower than 6). ``mr`` itself where ``m`` is
    larger than a workgroup's rows (``rows_per_workgroup``) or ``TURBINE_CPU_MATMUL_ROWS`` is
    ``fixed`` (docs/performance.md section 23)."""
    if os.environ.get(MATMUL_ROWS_ENV, "").strip().lower() == "fixed":
        return mr
    if m <= mr or (rows_per_workgroup is not None and m > rows_per_workgroup):
        return mr

    def cycles(block: int) -> int:
        full, last = divmod(m, block)
        return full * max(_FMA_LATENCY, block) + (max(_FMA_LATENCY, last) if last else 0)

    even = -(-m // -(-m // mr))
    return even if cycles(even) < cycles(mr) else mr


@dataclass(frozen=True)
class Avx512Gemm:
    """One AVX-512 fp32 matmul executable for a static ``k`` and padded width ``np_`` (a
    multiple of ``nr``); ``M`` and the batch are given per call.

    Attributes:
        k: the reduction (any size).
        np_: the padded output width.
        batch_b: ``B`` has one packed matrix per batch entry (else one shared by all).
        mr, nr: the register block (rows, columns; ``nr`` a multiple of 16).
        kc: the reduction block.
        rows_per_workgroup, cols_per_workgroup: the workgroup's block of ``C``
            (``cols_per_workgroup`` a multiple of ``nr`` dividing ``np_``).
        bias, relu: the epilogue of the last reduction block's store
            (:mod:`.epilogues`): ``+ bias[n]`` (a third operand, ``Np`` floats), then
            ``max(., 0)``.
        prefetch: lines of the next K block's panel each step prefetches into L2 (0: none;
            :meth:`for_rows`, and the Winograd matmuls on Intel), the register blocks taking
            turns over a step's ``nr / 16``.
        n_out: the columns of ``C`` the kernel writes, ``C`` being ``[rows, n_out]`` (0: all
            ``np_``): the last panel's columns past it are computed and not stored (masked
            stores), so that no copy of the first ``n_out`` columns follows the kernel
            (docs/performance.md, section 31).
    """

    k: int
    np_: int
    batch_b: bool = False
    mr: int = 4
    nr: int = 64
    kc: int = 128
    rows_per_workgroup: int = 128
    cols_per_workgroup: int = 64
    bias: bool = False
    relu: bool = False
    bf16: bool = False
    prefetch: int = 0
    n_out: int = 0

    @staticmethod
    def for_shape(k: int, n: int, *, batch_b: bool = False, bf16: bool = False) -> Avx512Gemm:
        """The kernel for ``k`` x ``n`` with the measured blocking (4 x 64 registers, K blocks
        of 128 steps, 128 x 64 workgroups; at most 32 columns: one panel of 16 or 32, 12 x 16 or
        8 x 32 registers; blocked for AVX2 (:func:`.isa.kernel_isa`): 6 x 16 registers in
        96-row workgroups, docs/performance.md section 19); ``bf16``: the AVX512-BF16 form."""
        if kernel_isa() == "avx2" and not bf16:
            # one 16-column panel a workgroup (a sequential read of it), reduction blocks of
            # 512 (a 32 KiB panel block): 8-10 % over 64 columns and blocks of 128
            np_ = -(-n // 16) * 16
            return Avx512Gemm(
                k, np_, batch_b, mr=6, nr=16, kc=512, rows_per_workgroup=96, cols_per_workgroup=16
            )
        if n <= 32 and not bf16:
            # one panel of 16 (12 x 16 registers) or 32 (8 x 32) columns instead of 64 mostly
            # zeros: attention's p @ v over heads of 16-32 values (docs/performance.md, section 30)
            if n <= 16:
                return Avx512Gemm(
                    k, 16, batch_b, mr=12, nr=16, rows_per_workgroup=96, cols_per_workgroup=16
                )
            return Avx512Gemm(k, 32, batch_b, mr=8, nr=32, cols_per_workgroup=32)
        nr = 64
        np_ = -(-n // nr) * nr
        return Avx512Gemm(k, np_, batch_b, bf16=bf16)

    def for_rows(self, m: int | None) -> Avx512Gemm:
        """This kernel for products of a static ``m`` rows (``None``: unknown): with many rows
        on Intel CPUs, 6 x 64 register blocks (:meth:`many_rows`); where a
        workgroup has at most 8 register blocks of rows (``m <= 8 mr``), its register blocks
        prefetch the next K block's panel into L2 as they go, together all of it once
        (:attr:`prefetch` lines a step each); with more rows, or ``B`` per batch entry, none.
        A panel block is read from memory (or L3) by the first register block and from L1 by
        the rest: with few rows that first read is most of the time. Measured on the Xeon,
        interleaved, one thread: 8 x ``Linear(2048)`` at one row 0.88x, eight rows 0.83x, the
        MLP benchmark (3 x ``Linear(1024)``, batch 8) 0.85x; at 128 rows (the GPT shape)
        1.03x, hence none there (docs/performance.md, section 9)."""
        if self.many_rows(m):
            # many rows on the Intel Xeon: 6 x 64 register blocks (24 accumulators), the
            # GPT-2 shape 2-4 % faster at one and two threads (docs/performance.md, section 36)
            return replace(self, mr=6)
        off = os.environ.get(MATMUL_PREFETCH_ENV, "").strip().lower() == "off"
        if off or m is None or m <= 0 or self.batch_b or m > 8 * self.mr:
            return self
        if m == 1 and kernel_isa() == "avx2":
            # one row streaming its weights from memory (a decode step): the hardware
            # prefetchers do better alone on the AMD Zen 3 (110M Llama decode, one thread,
            # interleaved: 50.3 -> 57.0 tokens/s without; docs/performance.md section 19)
            return self
        kernel = self
        if kernel_isa() == "avx2" and not self.bf16 and self.nr == 16:
            kernel = replace(self, mr=avx2_row_block(m, self.mr, self.rows_per_workgroup))
        blocks = -(-min(m, kernel.rows_per_workgroup) // kernel.mr)
        return replace(kernel, prefetch=-(-(kernel.nr // 16) // blocks))

    def many_rows(self, m: int | None) -> bool:
        """Whether :meth:`for_rows` gives ``m`` static rows 6 x 64 register blocks: at least
        :data:`MANY_ROWS` of them, on an Intel CPU's AVX-512 fp32 form with 4 x 64 blocks
        (measured there; a few rows keep 4-row blocks: 8 rows are two of them, where 6 + 2
        would leave the second mostly empty)."""
        return (
            m is not None
            and m >= MANY_ROWS
            and (self.mr, self.nr, self.bf16) == (4, 64, False)
            and kernel_isa() == "avx512"
            and cpu_vendor() == "GenuineIntel"
        )

    def balanced(self, m: int | None, batch: int = 1, workers: int | None = None) -> Avx512Gemm:
        """This kernel with the workgroup columns (``cols_per_workgroup``: one to four panels)
        that leave the busiest of IREE's workers the least work for ``m`` static rows of
        ``batch`` entries (:func:`.workgroups.best_grid`; ``None``: unknown rows, unchanged).
        IREE hands out 8 workgroups at a time from 8 a worker on: GPT-2's ``Linear(512,
        1536)`` at 128 rows is 24 workgroups of 64 columns, 16 of them on one of two workers;
        in 12 of 128 columns each worker runs 6 (docs/performance.md, section 28)."""
        return balanced_grid(self, m, batch, self.nr, workers)

    @property
    def operand_dtype(self) -> str:
        """The operand element type the kernel reads (``A`` and the packed ``B``)."""
        return "bf16" if self.bf16 else "f32"

    @property
    def steps(self) -> int:
        """Steps of the reduction loop: ``K`` (f32), or ``Kp / 2`` pairs (bf16)."""
        return self.kp // 2 if self.bf16 else self.k

    def __post_init__(self) -> None:
        if self.k <= 0 or self.np_ <= 0 or self.np_ % self.nr or self.nr % 16:
            raise ValueError(f"AVX-512 kernel: np_ must be a positive multiple of nr: {self}")
        if self.cols_per_workgroup % self.nr or self.np_ % self.cols_per_workgroup:
            raise ValueError(f"AVX-512 kernel: bad workgroup columns: {self}")
        if self.mr < 1 or self.mr * self.nr // 16 > 24 or self.kc < 1:
            raise ValueError(f"AVX-512 kernel: bad register block: {self}")
        if self.n_out and not self.np_ - self.nr < self.n_out < self.np_:
            raise ValueError(f"AVX-512 kernel: n_out must fall in the last panel: {self}")

    @property
    def c_cols(self) -> int:
        """The columns of ``C`` as the kernel writes it (:attr:`n_out`, else ``np_``)."""
        return self.n_out or self.np_

    @property
    def kp(self) -> int:
        """The reduction as the kernel reads it: any ``K`` (f32); bf16 reads pairs, so ``K``
        rounded up to even (the rewrite pads ``A`` and ``B`` with zeros)."""
        return self.k + self.k % 2 if self.bf16 else self.k

    @property
    def name(self) -> str:
        b = "_bb" if self.batch_b else ""
        epilogue = ("_bias" if self.bias else "") + ("_relu" if self.relu else "")
        return (
            f"__turbine_avx512_{self.operand_dtype}_gemm_{self.k}x{self.np_}{b}"
            f"_{self.mr}x{self.nr}x{self.kc}"
            f"_{self.rows_per_workgroup}x{self.cols_per_workgroup}{epilogue}"
            + (f"_pf{self.prefetch}" if self.prefetch else "")
            + (f"_n{self.n_out}" if self.n_out else "")
        )

    @property
    def packed_b_size(self) -> int:
        """Elements (of :attr:`operand_dtype`) of one packed ``B`` matrix."""
        return self.np_ * self.kp

    def pack_layout(self, kind: str, batch: int) -> tuple[list[int], str, list[int]]:
        """How :mod:`.matmuls` packs ``B`` (already padded to ``Np``): the expanded sizes, the
        reassociation of the expand, and the permutation into the packed order. ``kind``:
        ``"kn"`` (``[K, Np]``), ``"nk"`` (``[Np, K]``, a linear's weight), ``"bkn"``
        (``[batch, K, Np]``). bf16: each ``k`` is a pair ``(2i, 2i + 1)`` adjacent per column."""
        p, k, nr = self.np_ // self.nr, self.kp, self.nr
        if self.bf16:
            k2 = k // 2
            if kind == "kn":
                return [k2, 2, p, nr], "[[0, 1], [2, 3]]", [2, 0, 3, 1]
            if kind == "nk":
                return [p, nr, k2, 2], "[[0, 1], [2, 3]]", [0, 2, 1, 3]
            return [batch, k2, 2, p, nr], "[[0], [1, 2], [3, 4]]", [0, 3, 1, 4, 2]
        if kind == "kn":
            return [k, p, nr], "[[0], [1, 2]]", [1, 0, 2]
        if kind == "nk":
            return [p, nr, k], "[[0, 1], [2]]", [0, 2, 1]
        return [batch, k, p, nr], "[[0], [1], [2, 3]]", [0, 2, 1, 3]

    def dispatch(
        self, a: str, b: str, m: str, batch: str, rows: str, b_elems: int, bias: str | None = None
    ) -> str:
        """The ``flow.dispatch`` of this kernel (result ``tensor<?xNpxf32>``); ``bias``: the
        ``tensor<Npxf32>`` operand of a kernel with :attr:`bias`."""
        if (bias is None) == self.bias:
            raise ValueError(f"AVX-512 kernel: bias operand {bias!r} for {self.name}")
        dt = self.operand_dtype
        a_t = f"tensor<?x{self.kp}x{dt}>{{{rows}}}"
        extra, extra_t = (f", {bias}", f", tensor<{self.np_}xf32>") if bias else ("", "")
        return (
            f"flow.dispatch @{self.name}::@{self.name}[{m}, {batch}]({a}, {b}{extra}, {m}, "
            f"{batch}) : ({a_t}, tensor<{b_elems}x{dt}>{extra_t}, index, index) -> "
            f"tensor<?x{self.c_cols}xf32>{{{rows}}}"
        )

    def executable(self) -> str:
        """The ``stream.executable`` (MLIR text) for a module's top level."""
        # bf16: A and B are read as i32 words, each a pair of bf16 values along K.
        k, np_, nr, mr, kc = self.steps, self.np_, self.nr, self.mr, self.kc
        mb, nb = self.rows_per_workgroup, self.cols_per_workgroup
        panels = np_ // nr
        word = "i32" if self.bf16 else "f32"
        b_words = self.packed_b_size // 2 if self.bf16 else self.packed_b_size
        b_elems = "?" if self.batch_b else str(b_words)
        a_t, c_t = f"memref<?x{k}x{word}>", f"memref<?x{self.c_cols}xf32>"
        b_t = f"memref<{b_elems}x{word}>"
        out: list[str] = []
        e = out.append
        name = self.name
        open_executable(
            e,
            name,
            column_blocks=np_ // nb,
            rows_per_workgroup=mb,
            bindings=["%a", "%b", *(["%bias"] if self.bias else []), "%c"],
            batch=True,
            constants={0, 1, 16, mr, nr, kc, k}
            | set(range(mr))
            | {16 * j for j in range(nr // 16)},
        )
        e("      %rows = arith.muli %m, %batch : index")
        b_dims = ""
        if self.batch_b:
            e(f"      %bmat = arith.constant {b_words} : index")
            e("      %bsize = arith.muli %batch, %bmat : index")
            b_dims = "{%bsize}"
        e(f"      %ma = stream.binding.subspan %a[%c0] : !stream.binding -> {a_t}{{%rows}}")
        e(f"      %mb = stream.binding.subspan %b[%c0] : !stream.binding -> {b_t}{b_dims}")
        e(f"      %mc = stream.binding.subspan %c[%c0] : !stream.binding -> {c_t}{{%rows}}")
        if self.bias:
            e(
                "      %mbias = stream.binding.subspan %bias[%c0] : !stream.binding -> "
                f"memref<{np_}xf32>"
            )
        e("      %zero = arith.constant dense<0.0> : vector<16xf32>")
        workgroup_block(
            e, cols_per_workgroup=nb, rows_per_workgroup=mb, column_base="%n0", batch=True
        )
        e("      %zrow = arith.muli %wgz, %m : index")  # batch entry z: rows z*M ...
        if self.batch_b:
            e("      %bz = arith.muli %wgz, %bmat : index")
        else:
            e("      %bz = arith.addi %c0, %c0 : index")
        e(f"      %nbc = arith.constant {nb} : index")
        e(f"      scf.for %k0 = %c0 to %c{k} step %c{kc} {{")
        e("        %first = arith.cmpi eq, %k0, %c0 : index")
        e(f"        %kend = affine.min affine_map<()[s0] -> (s0 + {kc}, {k})>()[%k0]")
        if self.bias or self.relu:
            e(f"        %last = arith.cmpi eq, %kend, %c{k} : index")
        e(f"        scf.for %nn = %c0 to %nbc step %c{nr} {{")
        e("          %ncol = arith.addi %n0, %nn : index")
        e(f"          %panel = arith.divui %ncol, %c{nr} : index")
        # B element offset of (panel, k=0): bz + panel * K * nr
        e(
            f"          %pbase = affine.apply affine_map<()[s0, s1] -> (s0 + s1 * {k * nr})>()"
            "[%bz, %panel]"
        )
        e(f"          scf.for %mi = %m0 to %mend step %c{mr} {{")
        e(f"            %left = affine.min affine_map<()[s0, s1] -> ({mr}, s1 - s0)>()[%mi, %mend]")
        e("            %grow = arith.addi %zrow, %mi : index")
        row_blocks(e, "            ", mr, lambda r, p: self._micro(e, r, panels, b_t, a_t, c_t, p))
        e("          }")
        e("        }")
        e("      }")
        close_executable(e)
        return "\n".join(out)

    def _micro(self, e, rows: int, panels: int, b_t: str, a_t: str, c_t: str, p: str) -> None:
        """``rows`` x ``nr`` of C over one K block: load (or zero), FMAs, store."""
        nv = self.nr // 16
        vt = "vector<16xf32>"
        word = "i32" if self.bf16 else "f32"
        bt = f"vector<16x{word}>"
        accs = [f"%acc{r}_{j}" for r in range(rows) for j in range(nv)]
        types = ", ".join([vt] * len(accs))
        for r in range(rows):
            e(f"{p}%row{r} = arith.addi %grow, %c{r} : index")
            for j in range(nv):
                e(f"{p}%col{r}_{j} = arith.addi %ncol, %c{16 * j} : index")
        masks: list[str] = []
        if self.n_out:  # the columns of C that exist, per vector of the register block
            for j in range(nv):
                e(
                    f"{p}%cl{j} = affine.apply affine_map<()[s0] -> ({self.n_out} - s0)>()"
                    f"[%col0_{j}]"
                )
                e(f"{p}%cm{j} = vector.create_mask %cl{j} : vector<16xi1>")
                masks.append(f"%cm{j}")
        emit_accumulator_init(e, p, rows, nv, c_t, masks=masks)
        iters = ", ".join(f"{a} = %init#{i}" for i, a in enumerate(accs))
        e(
            f"{p}%res:{len(accs)} = scf.for %k = %k0 to %kend step %c1 iter_args({iters}) -> ({types}) {{"
        )
        e(
            f"{p}  %boff = affine.apply affine_map<()[s0, s1] -> (s0 + s1 * {self.nr})>()[%pbase, %k]"
        )
        if self.prefetch:
            # the same step of the next K block (a panel is contiguous along K), into L2; the
            # register blocks take turns over the step's nr / 16 lines
            last = self.packed_b_size // (2 if self.bf16 else 1) - 1
            dist, lines = self.kc * self.nr, self.nr // 16
            for j in range(self.prefetch):
                # clamped to the end of this batch entry's B (one B: of the only one)
                e(
                    f"{p}  %pf{j} = affine.min affine_map<()[s0, s1, s2, s3] -> (s0 + {dist} + "
                    f"((((s1 - s2) floordiv {self.mr}) * {self.prefetch} + {j}) mod {lines}) * 16,"
                    f" s3 + {last})>()[%boff, %mi, %m0, %bz]"
                )
                e(f"{p}  memref.prefetch %mb[%pf{j}], read, locality<2>, data : {b_t}")
        for j in range(nv):
            e(f"{p}  %bo{j} = arith.addi %boff, %c{16 * j} : index")
            e(f"{p}  %bv{j} = vector.load %mb[%bo{j}] : {b_t}, {bt}")
        outs = []
        for r in range(rows):
            e(f"{p}  %as{r} = memref.load %ma[%row{r}, %k] : {a_t}")
            e(f"{p}  %ab{r} = vector.broadcast %as{r} : {word} to {bt}")
            for j in range(nv):
                e(f"{p}  %f{r}_{j} = " + fma(f"%ab{r}", f"%bv{j}", f"%acc{r}_{j}", self.bf16))
                outs.append(f"%f{r}_{j}")
        e(f"{p}  scf.yield " + ", ".join(outs) + f" : {types}")
        e(f"{p}}}")
        results = [f"%res#{i}" for i in range(len(accs))]

        def store(v: str, r: int, j: int, prefix: str) -> None:
            if masks:
                e(
                    f"{prefix}vector.maskedstore %mc[%row{r}, %col{r}_{j}], {masks[j]}, {v} : "
                    f"{c_t}, vector<16xi1>, {vt}"
                )
            else:
                e(f"{prefix}vector.store {v}, %mc[%row{r}, %col{r}_{j}] : {c_t}, {vt}")

        if self.bias or self.relu:
            bias_t = f"memref<{self.np_}xf32>" if self.bias else None
            emit_epilogue(e, p, rows, nv, results, store, bias=bias_t, relu=self.relu)
        else:
            for r in range(rows):
                for j in range(nv):
                    store(results[r * nv + j], r, j, p)
