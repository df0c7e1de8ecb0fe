"""The fp32 kernel for products of two activations whose sizes are known only when the program
runs: attention's ``q @ k^T`` and ``p @ v`` over a dynamic sequence (docs/performance.md,
section 20).

IREE 3.13's own code for a batch matmul whose output sizes are both dynamic runs at well under
1 GFLOP/s on a Zen 3 core and has cliffs by size (BERT's ``q @ k^T`` at sequence 32: 1.76 ms
for 0.5 M multiply-adds), and its data tiling fails to compile ``p @ v`` there. The
:mod:`.avx512` kernel needs a static ``K`` and ``N`` (it packs ``B`` in panels of a static
width); this one reads ``B`` as it is, row-major, so both may be dynamic. It computes, per batch
entry ``z``, ``C[z] = A[z] @ B[z]`` (f32):

- ``A`` is ``[batch * M, K]`` row-major, ``B`` is ``[batch * K, N]`` row-major and ``C`` is
  ``[batch * M, N]``, all as the program has them (no padded copies); ``M``, ``K``, ``N`` and
  the batch are operands of the dispatch.
- A workgroup computes one 16-column panel of ``C`` for :attr:`rows_per_workgroup` rows of one
  batch entry: workgroups ``(ceil(N / 16), ceil(M / rows), batch)``. Where ``N`` may leave a
  partial last panel (:attr:`masked`), that panel's loads of ``B`` and ``C`` and its stores are
  masked to the columns inside ``N`` (one ``vmaskmovps`` a row and step on AVX2); the others
  are whole.
- Register blocking: :attr:`mr` rows by 16 columns (one ``vector<16xf32>`` a row: a zmm
  register, or two ymm on AVX2), each step of ``K`` one load of ``B``'s 16 floats and one
  broadcast of ``A`` per row; ``K`` walked in blocks of :attr:`kc`, ``C`` accumulating across
  blocks; the rows left at the end of ``M`` take a kernel of fewer rows.

The same MLIR computes the same values on every x86 CPU with AVX2 and FMA; only the blocking
follows :func:`.isa.kernel_isa`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .isa import kernel_isa
from .kernel_text import close_executable, open_executable, row_blocks, workgroup_block

__all__ = ["PANEL", "Avx512DynamicGemm"]

#: Columns of a panel: ``Np`` is ``N`` rounded up to it.
PANEL = 16


@dataclass(frozen=True)
class Avx512DynamicGemm:
    """One executable for products ``[M, K] @ [K, N]`` per batch entry, ``M``, ``N`` and the
    batch dynamic, ``K`` static (``k``) or dynamic (``None``).

    Attributes:
        k: the reduction when it is static.
        masked: ``N`` may leave a partial last panel (dynamic, or not a multiple of 16): its
            loads and stores are masked (``vector.maskedload`` / ``maskedstore``); else every
            panel is whole.
        mr: rows of the register block (``mr`` vector accumulators).
        kc: the reduction block.
        rows_per_workgroup: rows of ``C`` a workgroup computes (a multiple of ``mr``).
    """

    k: int | None
    masked: bool = True
    mr: int = 6
    kc: int = 512
    rows_per_workgroup: int = 96

    @staticmethod
    def for_product(k: int | None, n: int | None) -> Avx512DynamicGemm:
        """The kernel for a reduction ``k`` and a width ``n`` (``None``: dynamic), blocked for
        :func:`.isa.kernel_isa`: 6 rows on AVX2 (12 ymm accumulators, a ``B`` vector's two
        halves and a broadcast), 12 on AVX-512 (12 of 32 zmm registers)."""
        masked = n is None or n % PANEL != 0
        mr = 6 if kernel_isa() == "avx2" else 12
        return Avx512DynamicGemm(k, masked, mr=mr, rows_per_workgroup=96)

    def __post_init__(self) -> None:
        if self.k is not None and self.k <= 0:
            raise ValueError(f"dynamic-size kernel: bad reduction: {self}")
        if self.mr < 1 or self.kc < 1 or self.rows_per_workgroup % self.mr:
            raise ValueError(f"dynamic-size kernel: bad blocking: {self}")

    @property
    def name(self) -> str:
        k = "D" if self.k is None else str(self.k)
        return (
            f"__turbine_f32_dyn_gemm_k{k}_{self.mr}x{PANEL}x{self.kc}_{self.rows_per_workgroup}"
            + ("_m" if self.masked else "")
        )

    def a_type(self) -> str:
        """``A``'s builtin tensor type as the dispatch takes it (sizes given as ``{rows[, k]}``)."""
        return "tensor<?x?xf32>" if self.k is None else f"tensor<?x{self.k}xf32>"

    def dispatch(
        self, a: str, b: str, m: str, batch: str, k: str, n: str, rows: str, b_rows: str
    ) -> str:
        """The ``flow.dispatch`` of this kernel: ``a`` (:meth:`a_type`, ``rows`` = ``m *
        batch`` rows), ``b`` (``tensor<?x?xf32>``, ``b_rows`` = ``k * batch`` rows of ``n``);
        the result ``tensor<?x?xf32>`` of ``rows`` x ``n``. ``k`` is the reduction's index
        value (the constant where it is static)."""
        a_dims = f"{{{rows}}}" if self.k is not None else f"{{{rows}, {k}}}"
        name = self.name
        return (
            f"flow.dispatch @{name}::@{name}[{m}, {batch}, {k}, {n}]({a}, {b}, {m}, {batch}, "
            f"{k}, {n}) : ({self.a_type()}{a_dims}, tensor<?x?xf32>{{{b_rows}, {n}}}, index, "
            f"index, index, index) -> tensor<?x?xf32>{{{rows}, {n}}}"
        )

    def executable(self) -> str:
        """The ``stream.executable`` (MLIR text) for a module's top level."""
        mr, kc, mb = self.mr, self.kc, self.rows_per_workgroup
        a_t = "memref<?x?xf32>" if self.k is None else f"memref<?x{self.k}xf32>"
        a_dims = "{%rows, %k}" if self.k is None else "{%rows}"
        b_t = c_t = "memref<?x?xf32>"
        out: list[str] = []
        e = out.append
        name = self.name
        open_executable(
            e,
            name,
            column_blocks=("%n", PANEL),
            rows_per_workgroup=mb,
            bindings=["%a", "%b", "%c"],
            batch=True,
            constants={0, 1, kc, mr, PANEL, *range(mr)},
            sizes=["%k", "%n"],
        )
        e("      %rows = arith.muli %m, %batch : index")
        e("      %brows = arith.muli %k, %batch : index")
        e(f"      %ma = stream.binding.subspan %a[%c0] : !stream.binding -> {a_t}{a_dims}")
        e(f"      %mb = stream.binding.subspan %b[%c0] : !stream.binding -> {b_t}{{%brows, %n}}")
        e(f"      %mc = stream.binding.subspan %c[%c0] : !stream.binding -> {c_t}{{%rows, %n}}")
        e("      %zero = arith.constant dense<0.0> : vector<16xf32>")
        workgroup_block(
            e, cols_per_workgroup=PANEL, rows_per_workgroup=mb, column_base="%ncol", batch=True
        )
        if self.masked:  # the columns of this panel inside N (all 16 but in the last one)
            e("      %rem = arith.subi %n, %ncol : index")
            e("      %mask = vector.create_mask %rem : vector<16xi1>")
            e(f"      %whole = arith.cmpi sge, %rem, %c{PANEL} : index")
        e("      %zrow = arith.muli %wgz, %m : index")  # batch entry z: rows z*M of A and C
        e("      %zk = arith.muli %wgz, %k : index")  # ... and rows z*K of B
        # at least one block: a reduction of size 0 stores zeros
        e("      %kblocks = affine.max affine_map<()[s0] -> (s0, 1)>()[%k]")
        e(f"      scf.for %k0 = %c0 to %kblocks step %c{kc} {{")
        e("        %first = arith.cmpi eq, %k0, %c0 : index")
        e(f"        %kend = affine.min affine_map<()[s0, s1] -> (s0 + {kc}, s1)>()[%k0, %k]")
        e(f"        scf.for %mi = %m0 to %mend step %c{mr} {{")
        e(f"          %left = affine.min affine_map<()[s0, s1] -> ({mr}, s1 - s0)>()[%mi, %mend]")
        e("          %grow = arith.addi %zrow, %mi : index")
        if self.masked:
            e("          scf.if %whole {")
            row_blocks(e, "            ", mr, lambda r, p: self._micro(e, r, a_t, False, p))
            e("          } else {")
            row_blocks(e, "            ", mr, lambda r, p: self._micro(e, r, a_t, True, p))
            e("          }")
        else:
            row_blocks(e, "          ", mr, lambda r, p: self._micro(e, r, a_t, False, p))
        e("        }")
        e("      }")
        close_executable(e)
        return "\n".join(out)

    def _micro(self, e: Any, rows: int, a_t: str, masked: bool, p: str) -> None:
        """``rows`` x 16 of C over one K block: load (or zero), FMAs, store; ``masked``: the
        panel's columns past N neither read nor written."""
        vt, mt = "vector<16xf32>", "memref<?x?xf32>"

        def load(ref: str, row: str) -> str:
            if masked:
                return (
                    f"vector.maskedload {ref}[{row}, %ncol], %mask, %zero : {mt}, "
                    f"vector<16xi1>, {vt} into {vt}"
                )
            return f"vector.load {ref}[{row}, %ncol] : {mt}, {vt}"

        accs = [f"%acc{r}" for r in range(rows)]
        types = ", ".join([vt] * rows)
        for r in range(rows):
            e(f"{p}%row{r} = arith.addi %grow, %c{r} : index")
        e(f"{p}%init:{rows} = scf.if %first -> ({types}) {{")
        e(f"{p}  scf.yield " + ", ".join(["%zero"] * rows) + f" : {types}")
        e(f"{p}}} else {{")
        for r in range(rows):
            e(f"{p}  %ld{r} = " + load("%mc", f"%row{r}"))
        e(f"{p}  scf.yield " + ", ".join(f"%ld{r}" for r in range(rows)) + f" : {types}")
        e(f"{p}}}")
        iters = ", ".join(f"{a} = %init#{i}" for i, a in enumerate(accs))
        e(
            f"{p}%res:{rows} = scf.for %kk = %k0 to %kend step %c1 iter_args({iters}) -> ({types}) {{"
        )
        e(f"{p}  %brow = arith.addi %zk, %kk : index")
        e(f"{p}  %bv = " + load("%mb", "%brow"))
        outs = []
        for r in range(rows):
            e(f"{p}  %as{r} = memref.load %ma[%row{r}, %kk] : {a_t}")
            e(f"{p}  %ab{r} = vector.broadcast %as{r} : f32 to {vt}")
            e(f"{p}  %f{r} = vector.fma %ab{r}, %bv, %acc{r} : {vt}")
            outs.append(f"%f{r}")
        e(f"{p}  scf.yield " + ", ".join(outs) + f" : {types}")
        e(f"{p}}}")
        for r in range(rows):
            if masked:
                e(
                    f"{p}vector.maskedstore %mc[%row{r}, %ncol], %mask, %res#{r} : {mt}, vector<16xi1>, {vt}"
                )
            else:
                e(f"{p}vector.store %res#{r}, %mc[%row{r}, %ncol] : {mt}, {vt}")
