"""The AVX-512 VNNI int8 x int8 matmul kernel: a hand-written IREE executable whose integer dot
products are ``vpdpbusd`` (64 int8 multiply-adds per instruction), for torchao's
dynamic-activation configs (``Int8DynamicActivationInt8WeightConfig``: the activations
quantized to int8 per row in the program, int8 weights per output channel).

``C[m, n] (i32) = sum_k X[m, k] * Q[n, k]`` exactly, with ``X`` ``[M, K]`` and ``Q`` ``[N, K]``
both ``i8`` (signed) as torchao computes them (``torch._int_mm``); the rescale
(``float(C) * x_scale * w_scale``) stays the program's, so the results are torchao's to the
bit: the integer sums are exact, the float ops the same.

``vpdpbusd`` multiplies *unsigned* bytes by signed ones (``acc[i] += sum_{j<4} u[4i+j] *
s[4i+j]``, no saturation). The kernel feeds it ``U = X + 128`` (``X`` xor ``0x80``: the same
byte read unsigned), so each sum is ``sum_k X Q + 128 * sum_k Q[n, k]``; the second term, per
output channel, comes in as ``corr`` (``[N]`` i32), which the calling function computes from
the weight (a constant expression of a global: IREE hoists it into an initializer that runs once
at load) and the kernel subtracts at the end. ``|U Q|`` sums stay below ``2^31`` for ``K`` up
to 65536 (``255 * 128 * K``).

Every operand is read where it is: ``X`` (``[M, K]`` bytes, row-major: 1/4 of the f32
activations), ``Q`` (``[N, K]``, the archive's bytes), ``corr``; nothing is packed or copied.

Blocking: a workgroup computes ``rows_per_workgroup`` rows of ``M`` by ``cols_per_workgroup``
output channels; for ``nr`` channels by ``mr`` (up to 4) rows the kernel keeps ``mr * nr``
``vector<16xi32>`` accumulators; per step of 64 ``k`` it loads 64 weight bytes per channel and
64 activation bytes per row (xor ``0x80``) and issues one ``vpdpbusd`` per row and channel. At
the end of ``K`` each accumulator is summed across its lanes, ``corr`` subtracted, and stored.
**One channel at a time** (``nr = 1``): a workgroup then reads its weight rows as one
sequential run (32 rows of ``K`` bytes, contiguous), which the hardware prefetchers follow;
blocks of 4 channels (``nr = 4``, the weight-only kernel's blocking) read 4 rows ``K`` bytes
apart side by side and ran 1.69x slower at one row (12.5 against 21.2 GB/s of weights,
``benchmarks/vnni_kernel_ab.py``, docs/quantization.md). No software prefetch by default: with
the weights in DRAM (not the last-level cache) prefetching the next channel's row a line per
step ran 0.81-0.89x of none (``prefetch=True`` keeps it for A/B), and a 110M Llama's w8a8
decode step 0.85x (docs/quantization.md). Rows left over at the end of ``M`` use a kernel of
fewer rows; any ``M`` works (dynamic too).

``vpdpbusd`` is reached with ``llvm.call_intrinsic "llvm.x86.avx512.vpdpbusd.512"`` over a
``vector<16xi32>`` accumulator and two ``vector<64xi8>`` operands (IREE 3.13's LLVM declares the
intrinsic on bytes; ``<16 x i32>`` operands, the older declaration, are refused: "expects <64 x
i8>"), which it lowers to the one instruction (``tests/test_quant_int8_matmul_vnni.py`` checks the assembly).
"""

from __future__ import annotations

from dataclasses import dataclass

from .host import cpu_flags
from .kernel_text import close_executable, open_executable, row_blocks, workgroup_block
from .workgroups import balanced_columns

__all__ = ["VNNI_FEATURES", "Avx512VnniGemm", "host_vnni_missing"]

#: The ``/proc/cpuinfo`` flags the kernel needs (``vpdpbusd`` on zmm registers).
VNNI_FEATURES = ("avx512f", "avx512_vnni")

_K_STEP = 64  # int8 values per vpdpbusd


def host_vnni_missing() -> list[str]:
    """What this machine lacks to run the kernel (empty: nothing)."""
    flags = cpu_flags()
    return [f for f in VNNI_FEATURES if f not in flags]


@dataclass(frozen=True)
class Avx512VnniGemm:
    """One int8 x int8 -> int32 matmul executable for static ``k`` and ``n`` (``M`` per call).

    Attributes:
        k, n: the reduction and the output channels.
        mr, nr: the register block (rows of ``M``, output channels).
        unroll: steps of 64 ``k`` per loop iteration.
        rows_per_workgroup, cols_per_workgroup: a workgroup's block of ``C``.
        prefetch: software-prefetch the next block's weight rows (off: slower from DRAM).
    """

    k: int
    n: int
    mr: int = 4
    nr: int = 1
    unroll: int = 2
    rows_per_workgroup: int = 16
    cols_per_workgroup: int = 32
    prefetch: bool = False

    @staticmethod
    def supports(k: int, n: int) -> bool:
        """Whether the kernel handles the shape (else the matmul stays IREE's)."""
        return n > 0 and n % 4 == 0 and k > 0 and k % _K_STEP == 0 and k <= 65536

    @staticmethod
    def for_shape(
        k: int, n: int, rows: int | None = None, workers: int | None = None
    ) -> Avx512VnniGemm:
        """The kernel turbine uses for the shape, its workgroup columns cut so that IREE's
        ``workers`` (default: those it starts here) share the dispatch evenly where ``rows``
        (``M``) is static (:func:`.workgroups.balanced_columns`)."""
        cols = next(c for c in (32, 16, 8, 4) if n % c == 0)
        unroll = 2 if k % (2 * _K_STEP) == 0 else 1
        kernel = Avx512VnniGemm(k, n, unroll=unroll, cols_per_workgroup=cols)
        return balanced_columns(kernel, rows, n, kernel.nr, workers)

    def __post_init__(self) -> None:
        if not self.supports(self.k, self.n) or self.k % (_K_STEP * self.unroll):
            raise ValueError(f"VNNI int8 kernel: unsupported shape {self}")
        if self.n % self.cols_per_workgroup or self.cols_per_workgroup % self.nr:
            raise ValueError(f"VNNI int8 kernel: bad workgroup columns: {self}")

    @property
    def name(self) -> str:
        pf = "_pf" if self.prefetch else ""
        return (
            f"__turbine_avx512_vnni_i8i8_gemm_{self.k}x{self.n}_{self.mr}x{self.nr}"
            f"_u{self.unroll}_{self.rows_per_workgroup}x{self.cols_per_workgroup}{pf}"
        )

    def dispatch(self, x: str, q: str, corr: str, m: str) -> str:
        """The ``flow.dispatch`` of this kernel (result ``tensor<?xNxi32>``)."""
        x_t = f"tensor<?x{self.k}xi8>{{{m}}}"
        types = f"{x_t}, tensor<{self.n}x{self.k}xi8>, tensor<{self.n}xi32>, index"
        return (
            f"flow.dispatch @{self.name}::@{self.name}[{m}]({x}, {q}, {corr}, {m}) : ({types}) "
            f"-> tensor<?x{self.n}xi32>{{{m}}}"
        )

    def executable(self) -> str:
        """The ``stream.executable`` (MLIR text) for a module's top level."""
        k, n, nr, mr = self.k, self.n, self.nr, self.mr
        mb, nb = self.rows_per_workgroup, self.cols_per_workgroup
        x_t, q_t = f"memref<?x{k}xi8>", f"memref<{n}x{k}xi8>"
        k_t, c_t = f"memref<{n}xi32>", f"memref<?x{n}xi32>"
        out: list[str] = []
        e = out.append
        name = self.name
        open_executable(
            e,
            name,
            column_blocks=n // nb,
            rows_per_workgroup=mb,
            bindings=["%a", "%q", "%corr", "%c"],
            constants={0, 1, mr, nr, nb, k} | set(range(max(mr, nr))),
        )
        e(f"      %ma = stream.binding.subspan %a[%c0] : !stream.binding -> {x_t}{{%m}}")
        e(f"      %mq = stream.binding.subspan %q[%c0] : !stream.binding -> {q_t}")
        e(f"      %mk = stream.binding.subspan %corr[%c0] : !stream.binding -> {k_t}")
        e(f"      %mc = stream.binding.subspan %c[%c0] : !stream.binding -> {c_t}{{%m}}")
        e("      %zero = arith.constant dense<0> : vector<16xi32>")
        e("      %sign = arith.constant dense<-128> : vector<64xi8>")
        workgroup_block(e, cols_per_workgroup=nb, rows_per_workgroup=mb, column_base="%nbase")
        e(f"      scf.for %nq = %c0 to %c{nb} step %c{nr} {{")
        e("        %ncol = arith.addi %nbase, %nq : index")
        e(f"        scf.for %mi = %m0 to %mend step %c{mr} {{")
        e(f"          %left = affine.min affine_map<()[s0, s1] -> ({mr}, s1 - s0)>()[%mi, %mend]")
        types = (x_t, q_t, k_t, c_t)
        row_blocks(e, "          ", mr, lambda r, p: self._micro(e, r, types, p))
        e("        }")
        e("      }")
        close_executable(e)
        return "\n".join(out)

    def _micro(self, e, rows: int, types: tuple[str, ...], p: str) -> None:
        """``rows`` x ``nr`` of ``C = X Q^T - corr`` (int32)."""
        x_t, q_t, k_t, c_t = types
        nr, vt, bt = self.nr, "vector<16xi32>", "vector<64xi8>"
        for r in range(rows):
            e(f"{p}%row{r} = arith.addi %mi, %c{r} : index")
        for j in range(nr):
            e(f"{p}%n{j} = arith.addi %ncol, %c{j} : index")
            if self.prefetch:  # the next block's row, clamped to N
                e(
                    f"{p}%pn{j} = affine.min affine_map<()[s0] -> (s0 + {nr}, {self.n - 1})>()"
                    f"[%n{j}]"
                )
        accs = [f"%acc{r}_{j}" for r in range(rows) for j in range(nr)]
        tys = ", ".join([vt] * len(accs))
        iters = ", ".join(f"{a} = %zero" for a in accs)
        e(f"{p}%kstep = arith.constant {_K_STEP * self.unroll} : index")
        e(
            f"{p}%res:{len(accs)} = scf.for %k = %c0 to %c{self.k} step %kstep "
            f"iter_args({iters}) -> ({tys}) {{"
        )
        q = p + "  "
        cur = {(r, j): f"%acc{r}_{j}" for r in range(rows) for j in range(nr)}
        for u in range(self.unroll):
            e(f"{q}%k{u} = affine.apply affine_map<()[s0] -> (s0 + {_K_STEP * u})>()[%k]")
            if self.prefetch:
                for j in range(nr):
                    e(f"{q}memref.prefetch %mq[%pn{j}, %k{u}], read, locality<3>, data : {q_t}")
            for j in range(nr):
                e(f"{q}%qb{u}_{j} = vector.load %mq[%n{j}, %k{u}] : {q_t}, {bt}")
            for r in range(rows):
                e(f"{q}%xb{u}_{r} = vector.load %ma[%row{r}, %k{u}] : {x_t}, {bt}")
                e(f"{q}%ub{u}_{r} = arith.xori %xb{u}_{r}, %sign : {bt}")  # X + 128 as u8
                for j in range(nr):
                    out = f"%d{u}_{r}_{j}"
                    e(
                        f'{q}{out} = llvm.call_intrinsic "llvm.x86.avx512.vpdpbusd.512"'
                        f"({cur[r, j]}, %ub{u}_{r}, %qb{u}_{j}) : ({vt}, {bt}, {bt}) -> {vt}"
                    )
                    cur[r, j] = out
        e(
            f"{q}scf.yield "
            + ", ".join(cur[r, j] for r in range(rows) for j in range(nr))
            + f" : {tys}"
        )
        e(f"{p}}}")
        for j in range(nr):
            e(f"{p}%corr{j} = memref.load %mk[%n{j}] : {k_t}")
        for r in range(rows):
            for j in range(nr):
                i = r * nr + j
                e(f"{p}%sum{i} = vector.reduction <add>, %res#{i} : {vt} into i32")
                e(f"{p}%out{i} = arith.subi %sum{i}, %corr{j} : i32")
                e(f"{p}memref.store %out{i}, %mc[%row{r}, %n{j}] : {c_t}")
