"""The AMX bf16 matmul kernel: a hand-written IREE executable, the weight layout it reads, and
what it needs from the host (AMX-BF16, and Linux's permission to use the tile registers).

IREE 3.13 has no AMX code path (its bf16 ``mmt4d`` ukernel uses AVX512-BF16 and is no faster
than its fp32 one), but its LLVM backend assembles AMX instructions. This module writes the
kernel as a ``stream.executable`` whose function is plain MLIR (``scf`` loops, ``memref``
address arithmetic) around ``llvm.inline_asm`` AMX instructions; IREE compiles it like any
dispatch (no C compiler, no plugin) and the program calls it with ``flow.dispatch``
(:mod:`.matmuls` writes those calls for ``precision="bf16"``, :mod:`.bf16`).

The kernel computes ``C[z, m, n] (f32) = sum_k A[z, m, k] (bf16) * B[z, k, n] (bf16)``:

- ``A`` is ``[batch * M, Kp]`` bf16, row-major (the activations, cast per call), ``Kp`` the
  reduction padded to a multiple of 32 (:func:`padded`) with zeros.
- ``B`` is packed once (weights: by IREE's constant hoisting) in the layout AMX's
  ``tdpbf16ps`` reads, tile by tile: ``Bp[z][nt][kt][kk][n][j] = B[z][32*kt + 2*kk + j][16*nt + n]``
  for ``nt < Np/16``, ``kt < Kp/32``, ``kk, n < 16``, ``j < 2`` (``Np`` = ``N`` padded to
  32), flattened; each 16x32 tile is one contiguous KiB. ``batch_b=False``: one ``B`` for
  every batch entry (a weight).
- ``C`` is ``[batch * M, Np]`` f32.

Register blocking: the 8 tile registers hold a 32x32 block of ``C`` (tmm0-3), two 16-row
strips of ``A`` (tmm4-5) and two 16-column panels of ``B`` (tmm6-7): each 32-deep step of
``K`` is four tile loads and four ``tdpbf16ps`` (16x16x32 each). A workgroup computes
``rows_per_workgroup`` (128) rows by ``cols_per_workgroup`` (64, or 32) columns of one batch
entry, 32 rows at a time; the last strip of ``M`` (any ``M``, dynamic too) loads a tile
configuration with fewer rows, so ``A`` and ``C`` need no padding in ``M``. The workgroup grid
is ``(Np / cols, ceil(M / rows), batch)``, which IREE's task system spreads over its workers.

Measured (docs/performance.md, section 9): 690-970 GFLOP/s on one core for the GPT-2-small
matmul shapes, against oneDNN's AMX 550-660 and IREE's own fp32 code 90-110.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .host import cpu_flags, is_x86_64_linux
from .kernel_text import close_executable, open_executable, workgroup_block
from .workgroups import balanced_grid

__all__ = [
    "AMX_FEATURES",
    "CPU_REQUIRES_KEY",
    "AmxGemm",
    "AmxUnavailableError",
    "cpu_flags",
    "emit_permission_request",
    "emit_tile_config",
    "host_amx_missing",
    "module_requires_amx",
    "padded",
    "request_amx_permission",
    "tile_asm",
]

#: The ``/proc/cpuinfo`` flags the kernel needs: the tile registers and the bf16 tile product.
AMX_FEATURES = ("amx_tile", "amx_bf16")
#: The ``iree.reflection`` key of a public function naming the CPU features its module's code
#: needs (comma separated); :mod:`.matmuls` sets it (:data:`AMX_FEATURES` for the AMX kernel).
CPU_REQUIRES_KEY = "turbine.cpu_requires"

#: ``arch_prctl`` codes (``asm/prctl.h``) and the tile-data state component (``XFEATURE_XTILEDATA``).
_SYS_ARCH_PRCTL = 158  # x86-64 syscall number
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18

_TILE_ROWS = 16  # rows of every tile
_K_STEP = 32  # bf16 elements in a 64-byte tile row: the reduction depth of one tdpbf16ps
_N_STEP = 32  # columns of C per register block (two 16-column tiles)


class AmxUnavailableError(RuntimeError):
    """This process cannot run AMX code: the CPU, the kernel or the OS lacks what it needs."""


def padded(size: int, multiple: int = _K_STEP) -> int:
    """``size`` rounded up to a multiple of ``multiple`` (32: the kernel's K and N units)."""
    return -(-size // multiple) * multiple


def host_amx_missing() -> list[str]:
    """What this machine lacks to run the AMX kernel (empty: nothing): the missing CPU
    features of :data:`AMX_FEATURES` (read from ``/proc/cpuinfo``), or ``"Linux on x86-64"``
    where the check itself cannot be made."""
    if not is_x86_64_linux():
        return ["Linux on x86-64"]
    flags = cpu_flags()
    return [f for f in AMX_FEATURES if f not in flags]


@functools.lru_cache(maxsize=1)
def _request_permission() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
    if rc != 0:
        err = ctypes.get_errno()
        raise AmxUnavailableError(
            f"Linux refused this process the AMX tile registers (arch_prctl(ARCH_REQ_XCOMP_PERM, "
            f"XFEATURE_XTILEDATA) failed: {os.strerror(err)}; Linux 5.16 or newer is needed, "
            "and a thread's sigaltstack must be large enough for the tile state)"
        )


def request_amx_permission() -> None:
    """Asks Linux for the AMX tile state for this process (once; later calls return at once).

    Linux makes a process request the tile-data state before its first AMX instruction
    (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, Linux 5.16+); without it the
    first tile instruction raises SIGILL. The permission is process-wide and covers threads
    started before and after, so IREE's workers are covered. turbine's runtime calls this when
    it loads a module compiled with ``precision="bf16"`` (a clear error instead of a crash where
    AMX cannot run); the kernel also makes the request itself (:class:`AmxGemm`'s
    ``request_permission``), so such modules run under IREE's own tools too.

    Raises:
        AmxUnavailableError: the CPU has no AMX-BF16, or Linux refused the request.
    """
    missing = host_amx_missing()
    if missing:
        raise AmxUnavailableError(
            f"this machine cannot run AMX code: it lacks {', '.join(missing)}"
        )
    _request_permission()


def module_requires_amx(reflections: Iterable[Mapping[str, str]]) -> bool:
    """Whether a module holds AMX code: one of its public functions' reflections (as read by
    ``_signatures.reflection.module_functions``, which turns an unreadable one into a damaged-
    module error) names the AMX features under :data:`CPU_REQUIRES_KEY`."""
    for reflection in reflections:
        requires = str(reflection.get(CPU_REQUIRES_KEY, ""))
        if any(f in requires.split(",") for f in AMX_FEATURES):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# the executable
# ---------------------------------------------------------------------------------------------
# tile registers: 0-3 the C block (C00, C01, C10, C11), 4-5 A strips, 6-7 B panels
_FULL_ROWS = 0x1010101010101010  # rows byte of tiles 0..7 = 16 (word 6 of the tile config)
_COLSB = 0x0040004000400040  # colsb (u16) of four tiles = 64 bytes (words 2 and 3)


def _byte_mask(*tiles: int) -> int:
    mask = 0
    for t in tiles:
        mask |= 0xFF << (8 * t)
    return mask


@dataclass(frozen=True)
class AmxGemm:
    """One AMX bf16 matmul executable, for a static reduction ``kp`` and width ``np_`` (both
    multiples of 32); ``M`` and the batch are given per call.

    Attributes:
        kp, np_: the padded reduction and output width (see the module doc).
        batch_b: ``B`` has one packed matrix per batch entry (else one shared by all).
        rows_per_workgroup, cols_per_workgroup: the workgroup's block of ``C`` (multiples of
            32; ``cols_per_workgroup`` divides ``np_``).
        request_permission: each workgroup first asks Linux for the tile state itself (the
            ``arch_prctl`` system call, see :func:`request_amx_permission`), so that the module
            runs in any process (``iree-run-module``, ``iree-benchmark-module``, IREE's C API),
            not only under turbine's runtime. Once granted the call returns at once: no cost
            measured (within noise, 1.5-330 us dispatches). ``False`` only to show why.
    """

    kp: int
    np_: int
    batch_b: bool = False
    rows_per_workgroup: int = 128
    cols_per_workgroup: int = 64
    request_permission: bool = True

    #: The operand element type the kernel reads.
    operand_dtype = "bf16"

    @staticmethod
    def for_shape(k: int, n: int, *, batch_b: bool = False) -> AmxGemm:
        """The kernel for a ``k`` x ``n`` product (padded to multiples of 32) with the measured
        blocking (128 x 64, or 128 x 32 where 64 does not divide the padded ``n``)."""
        kp, np_ = padded(k), padded(n)
        cols = 64 if np_ % 64 == 0 else 32
        return AmxGemm(kp, np_, batch_b, 128, cols)

    def balanced(self, m: int | None, batch: int = 1, workers: int | None = None) -> AmxGemm:
        """This kernel with the workgroup columns (one to four times its usual ones) that leave
        the busiest of IREE's workers the least work for ``m`` static rows of ``batch``
        entries, as :meth:`.avx512.Avx512Gemm.balanced` (``None``: unknown rows, unchanged;
        docs/performance.md, section 28)."""
        return balanced_grid(self, m, batch, self.cols_per_workgroup, workers)

    def pack_layout(self, kind: str, batch: int) -> tuple[list[int], str, list[int]]:
        """How :mod:`.matmuls` packs ``B`` (already padded to ``kp`` x ``np_``): the expanded
        sizes, the reassociation of the expand, and the permutation into the tile order of the
        module doc. ``kind``: ``"kn"`` (``[Kp, Np]``), ``"nk"`` (``[Np, Kp]``, a linear's
        weight), ``"bkn"`` (``[batch, Kp, Np]``)."""
        kt, nt = self.kp // _K_STEP, self.np_ // _TILE_ROWS
        if kind == "kn":
            return [kt, 16, 2, nt, 16], "[[0, 1, 2], [3, 4]]", [3, 0, 1, 4, 2]
        if kind == "nk":
            return [nt, 16, kt, 16, 2], "[[0, 1], [2, 3, 4]]", [0, 2, 3, 1, 4]
        return [batch, kt, 16, 2, nt, 16], "[[0], [1, 2, 3], [4, 5]]", [0, 4, 1, 2, 5, 3]

    def __post_init__(self) -> None:
        if self.kp % _K_STEP or self.np_ % _N_STEP or self.kp <= 0 or self.np_ <= 0:
            raise ValueError(f"AMX kernel sizes must be positive multiples of 32: {self}")
        if self.rows_per_workgroup % 32 or self.cols_per_workgroup % _N_STEP:
            raise ValueError(f"AMX workgroup blocks must be multiples of 32: {self}")
        if self.np_ % self.cols_per_workgroup:
            raise ValueError(f"cols_per_workgroup must divide np_: {self}")

    @property
    def name(self) -> str:
        """The executable's (and its export's) symbol."""
        b = ("_bb" if self.batch_b else "") + ("" if self.request_permission else "_noperm")
        return (
            f"__turbine_amx_bf16_gemm_{self.kp}x{self.np_}{b}"
            f"_{self.rows_per_workgroup}x{self.cols_per_workgroup}"
        )

    @property
    def packed_b_size(self) -> int:
        """Elements of one packed ``B`` matrix (``np_ * kp``)."""
        return self.np_ * self.kp

    def dispatch(
        self, a: str, b: str, m: str, batch: str, rows: str, b_elems: int, bias: str | None = None
    ) -> str:
        """The ``flow.dispatch`` of this kernel (one line of MLIR, result ``tensor<?xNpxf32>``).

        Args:
            a: the ``tensor<?x{kp}xbf16>`` operand (``rows`` rows = batch * M).
            b: the packed ``tensor<{b_elems}xbf16>`` operand.
            m, batch, rows: ``index`` values: M, the batch count, and their product.
            bias: must be None (this kernel has no epilogue).
        """
        if bias is not None:
            raise ValueError(f"AMX kernel: no bias epilogue ({self.name})")
        a_t = f"tensor<?x{self.kp}xbf16>{{{rows}}}"
        return (
            f"flow.dispatch @{self.name}::@{self.name}[{m}, {batch}]({a}, {b}, {m}, {batch}) : "
            f"({a_t}, tensor<{b_elems}xbf16>, index, index) -> "
            f"tensor<?x{self.np_}xf32>{{{rows}}}"
        )

    def executable(self) -> str:
        """The ``stream.executable`` (MLIR text) for a module's top level."""
        kp, np_ = self.kp, self.np_
        mb, nb = self.rows_per_workgroup, self.cols_per_workgroup
        kt = kp // _K_STEP
        panel = kt * 1024  # bytes of one 16-column panel of packed B (kt tiles of 1 KiB)
        b_elems = "?" if self.batch_b else str(self.packed_b_size)
        a_t, a_dims, a_rank = self._a_memref()
        c_t = f"memref<?x{np_}xf32>"
        b_t = f"memref<{b_elems}xbf16>"
        out: list[str] = []
        e = out.append
        name = self.name
        open_executable(
            e,
            name,
            column_blocks=np_ // nb,
            rows_per_workgroup=mb,
            bindings=self._bindings(),
            batch=True,
            constants=(0, 1, 16, 32),
        )
        e("      %rows = arith.muli %m, %batch : index")
        b_dims = "{%bsize}" if self.batch_b else ""
        if self.batch_b:
            e(f"      %bmat = arith.constant {self.packed_b_size} : index")
            e("      %bsize = arith.muli %batch, %bmat : index")
        e(f"      %ma = stream.binding.subspan %a[%c0] : !stream.binding -> {a_t}{a_dims}")
        e(f"      %mb = stream.binding.subspan %b[%c0] : !stream.binding -> {b_t}{b_dims}")
        e(f"      %mc = stream.binding.subspan %c[%c0] : !stream.binding -> {c_t}{{%rows}}")
        self._emit_extra_subspans(e)
        # Base addresses (i64): the aligned pointer plus the memref's element offset (IREE may
        # fold a binding offset into the subspan).
        for v, mem, t, elem, size, rank in (
            ("a", "%ma", a_t, "bf16", 2, a_rank),
            ("b", "%mb", b_t, "bf16", 2, 1),
            ("c", "%mc", c_t, "f32", 4, 2),
        ):
            idx = ", ".join(["index"] * rank)
            sizes = ", ".join(f"%{v}size{i}" for i in range(rank))
            strides = ", ".join(f"%{v}stride{i}" for i in range(rank))
            e(
                f"      %{v}base, %{v}offset, {sizes}, {strides} = memref.extract_strided_metadata "
                f"{mem} : {t} -> memref<{elem}>, index, {idx}, {idx}"
            )
            e(f"      %{v}ptr = memref.extract_aligned_pointer_as_index {mem} : {t} -> index")
            e(
                f"      %{v}addr = affine.apply affine_map<()[s0, s1] -> (s0 + s1 * {size})>()"
                f"[%{v}ptr, %{v}offset]"
            )
        consts = {
            "sa": self._a_row_bytes(),  # A row stride, bytes
            "sc": np_ * 4,  # C row stride, bytes
            "s64": 64,
            "arows16": 16 * self._a_row_bytes(),  # 16 rows of A
            "crows16": 16 * np_ * 4,  # 16 rows of C
            "k1024": 1024,
            "panel": panel,
            "four": 4,
            "r16": 16,
            "sh8": 8,
            "sh16": 16,
            "sh24": 24,
            "sh32": 32,
            "sh40": 40,
            "rows235": _FULL_ROWS & ~_byte_mask(2, 3, 5),
            "rows014": _FULL_ROWS & ~_byte_mask(0, 1, 4),
        }
        for name, value in consts.items():
            e(f"      %{name} = arith.constant {value} : i64")
        # The tile configuration (64 bytes, palette 1): words 0-5 and 7 are fixed, word 6
        # (the rows of tiles 0-7) is written per 32-row strip.
        emit_tile_config(e, [1, 0, _COLSB, _COLSB, 0, 0, None, 0])
        if self.request_permission:
            emit_permission_request(e)
        workgroup_block(
            e, cols_per_workgroup=nb, rows_per_workgroup=mb, column_base="%n0", batch=True
        )
        self._emit_workgroup_prologue(e)
        # batch entry z: A and C rows start at z * M; B at z * (one packed matrix) if batched
        e("      %zrow = arith.muli %wgz, %m : index")
        if self.batch_b:
            e(
                f"      %bz = affine.apply affine_map<()[s0, s1] -> (s0 + s1 * "
                f"{self.packed_b_size * 2})>()[%baddr, %wgz]"
            )
        else:
            e("      %bz = arith.addi %baddr, %c0 : index")
        e("      %bz64 = arith.index_cast %bz : index to i64")
        e("      %nbl = arith.constant " + str(nb) + " : index")
        e("      scf.for %ms = %m0 to %mend step %c32 {")
        e("        %left = affine.min affine_map<()[s0, s1] -> (32, s1 - s0)>()[%ms, %mend]")
        e("        %left64 = arith.index_cast %left : index to i64")
        e("        %two = arith.cmpi sgt, %left, %c16 : index")
        # rows of the strip's tiles: > 16 rows: C10, C11, A1 get left - 16; else C00, C01, A0
        # get left (and the second half is not used)
        e("        %r2 = arith.subi %left64, %r16 : i64")
        e("        %x16 = arith.shli %r2, %sh16 : i64")
        e("        %x24 = arith.shli %r2, %sh24 : i64")
        e("        %x40 = arith.shli %r2, %sh40 : i64")
        e("        %t0 = arith.ori %rows235, %x16 : i64")
        e("        %t1 = arith.ori %t0, %x24 : i64")
        e("        %wtwo = arith.ori %t1, %x40 : i64")
        e("        %y8 = arith.shli %left64, %sh8 : i64")
        e("        %y32 = arith.shli %left64, %sh32 : i64")
        e("        %u0 = arith.ori %rows014, %left64 : i64")
        e("        %u1 = arith.ori %u0, %y8 : i64")
        e("        %wone = arith.ori %u1, %y32 : i64")
        e("        %w6 = arith.select %two, %wtwo, %wone : i64")
        e("        memref.store %w6, %cfg[%cfgi6] : memref<8xi64>")
        e("        " + tile_asm("ldtilecfg ($0)", "r,~{memory}", ["%cfgp64"]))
        e("        %grow = arith.addi %zrow, %ms : index")
        self._emit_a_strip_base(e)
        e("        %arow0 = arith.index_cast %arow0i : index to i64")
        e("        %arow1 = arith.addi %arow0, %arows16 : i64")
        e(
            f"        %crow0i = affine.apply affine_map<()[s0, s1] -> (s0 + s1 * {np_ * 4})>()"
            "[%caddr, %grow]"
        )
        e("        %crow0 = arith.index_cast %crow0i : index to i64")
        e("        scf.if %two {")
        self._strip(e, two=True)
        e("        } else {")
        self._strip(e, two=False)
        e("        }")
        e("      }")
        e("      " + tile_asm("tilerelease", "", []))
        close_executable(e)
        return "\n".join(out)

    # -- how A is read: a row-major [rows, kp] matrix here; :class:`.amx_conv.AmxConv` reads a
    # -- convolution's padded input in place instead (the same strips, tiles and B panels)

    def _a_memref(self) -> tuple[str, str, int]:
        """A's binding: its memref type, the dynamic sizes suffix of the subspan, its rank."""
        return f"memref<?x{self.kp}xbf16>", "{%rows}", 2

    def _a_row_bytes(self) -> int:
        """Bytes between two consecutive rows of A (the tiles' load stride)."""
        return self.kp * 2

    def _emit_a_strip_base(self, e) -> None:
        """Emits ``%arow0i`` (index): the address of the strip's first A row (the strip's
        first row is ``%ms``, ``%grow`` counting the batch entries before it)."""
        e(
            f"        %arow0i = affine.apply affine_map<()[s0, s1] -> (s0 + s1 * {self.kp * 2})>()"
            "[%aaddr, %grow]"
        )

    def _emit_k_loop(self, e, p: str) -> tuple[str, list[str]]:
        """Opens the reduction loop(s) at indent ``p``: defines ``%ka`` and ``%kb`` (i64), the
        byte offsets of the step's A tile columns (from the strip's rows) and B tile (from
        the panel). Returns the loop body's indent and the lines that close the loop(s)."""
        e(f"{p}%kt = arith.constant {self.kp // _K_STEP} : index")
        e(f"{p}scf.for %k = %c0 to %kt step %c1 {{")
        e(f"{p}  %k64 = arith.index_cast %k : index to i64")
        e(f"{p}  %ka = arith.muli %k64, %s64 : i64")
        e(f"{p}  %kb = arith.muli %k64, %k1024 : i64")
        return p + "  ", [f"{p}}}"]

    def _bindings(self) -> list[str]:
        """The executable's bindings, in the dispatch's order (operands, then the result)."""
        return ["%a", "%b", "%c"]

    def _emit_extra_subspans(self, e) -> None:
        """Emits the subspans of the bindings besides A, B and C (none here)."""

    def _emit_workgroup_prologue(self, e) -> None:
        """Emits what a workgroup does before its strips (its block: ``%n0``, ``%m0``,
        ``%wgy``, ``%wgz``): nothing here."""

    def _emit_after_store(self, e, p: str) -> None:
        """Emits, at indent ``p``, what follows the store of a register block of C (the block's
        first column ``%ncol``, its rows ``%grow`` to ``%grow + %left``): nothing here."""

    def _strip(self, e, *, two: bool) -> None:
        """The columns of one 32-row strip (``two``) or of a strip of at most 16 rows."""
        p = "          "
        e(f"{p}scf.for %ns = %c0 to %nbl step %c32 {{")
        e(f"{p}  %ncol = arith.addi %n0, %ns : index")
        e(f"{p}  %ntile = arith.divui %ncol, %c16 : index")
        e(f"{p}  %ntile64 = arith.index_cast %ntile : index to i64")
        e(f"{p}  %bpo = arith.muli %ntile64, %panel : i64")
        e(f"{p}  %bcol0 = arith.addi %bz64, %bpo : i64")
        e(f"{p}  %bcol1 = arith.addi %bcol0, %panel : i64")
        e(f"{p}  %ncol64 = arith.index_cast %ncol : index to i64")
        e(f"{p}  %cn = arith.muli %ncol64, %four : i64")
        e(f"{p}  %cp00 = arith.addi %crow0, %cn : i64")
        tiles = (0, 1, 2, 3) if two else (0, 1)
        for t in tiles:
            e(f"{p}  " + tile_asm(f"tilezero %tmm{t}", "", []))
        q, closes = self._emit_k_loop(e, p + "  ")
        e(f"{q}%pa0 = arith.addi %arow0, %ka : i64")
        e(f"{q}%pb0 = arith.addi %bcol0, %kb : i64")
        e(f"{q}%pb1 = arith.addi %bcol1, %kb : i64")

        def load(ptr: str, stride: str, tile: int) -> None:
            e(f"{q}" + tile_asm(f"tileloadd ($0,$1,1), %tmm{tile}", "r,r,~{memory}", [ptr, stride]))

        def dot(c: int, a: int, b: int) -> None:
            e(f"{q}" + tile_asm(f"tdpbf16ps %tmm{b}, %tmm{a}, %tmm{c}", "", []))

        self._emit_b_prefetch(e, q)
        load("%pa0", "%sa", 4)
        load("%pb0", "%s64", 6)
        dot(0, 4, 6)
        load("%pb1", "%s64", 7)
        dot(1, 4, 7)
        if two:
            e(f"{q}%pa1 = arith.addi %arow1, %ka : i64")
            load("%pa1", "%sa", 5)
            dot(2, 5, 6)
            dot(3, 5, 7)
        for line in closes:
            e(line)

        c00, stride, rows16 = self._c_block(e, p + "  ")

        def store(ptr: str, tile: int) -> None:
            e(
                f"{p}  "
                + tile_asm(f"tilestored %tmm{tile}, ($0,$1,1)", "r,r,~{memory}", [ptr, stride])
            )

        e(f"{p}  %cq01 = arith.addi {c00}, %s64 : i64")
        store(c00, 0)
        store("%cq01", 1)
        if two:
            e(f"{p}  %cq10 = arith.addi {c00}, {rows16} : i64")
            e(f"{p}  %cq11 = arith.addi %cq10, %s64 : i64")
            store("%cq10", 2)
            store("%cq11", 3)
        self._emit_after_store(e, p + "  ")
        e(f"{p}}}")

    @property
    def prefetch_steps(self) -> int:
        """Reduction steps ahead at which each step prefetches the two ``B`` tiles it will
        load then (0: none, here; :class:`.amx_conv.AmxConv` sets it)."""
        return 0

    def _emit_b_prefetch(self, e, q: str) -> None:
        """Emits, at indent ``q`` in the reduction loop, ``prefetcht0`` of the 16 lines of
        each ``B`` tile :attr:`prefetch_steps` steps on (``%pb0`` / ``%pb1`` are this step's;
        a prefetch past the end of ``B`` reads nothing and cannot fault)."""
        if not self.prefetch_steps:
            return
        for j, base in enumerate(("%pb0", "%pb1")):
            for i in range(_TILE_ROWS):
                off = self.prefetch_steps * 1024 + 64 * i
                e(f"{q}%pfo{j}_{i} = arith.constant {off} : i64")
                e(f"{q}%pfa{j}_{i} = arith.addi {base}, %pfo{j}_{i} : i64")
                e(f"{q}" + tile_asm("prefetcht0 ($0)", "r", [f"%pfa{j}_{i}"]))

    def _c_block(self, e, p: str) -> tuple[str, str, str]:
        """Emits, at indent ``p``, where the register block's tiles are stored: returns the
        address of its first tile (i64), the stride of its rows and the offset of its second
        16 rows (i64 values): here ``C`` itself."""
        return "%cp00", "%sc", "%crows16"


def emit_tile_config(e: Callable[[str], object], words: Sequence[int | None]) -> None:
    """Emits ``%cfg`` (a ``memref<8xi64>`` on the stack: the 64-byte tile configuration that
    ``ldtilecfg`` reads) with its fixed words stored (``None``: a word the kernel writes
    later, at index ``%cfgi<i>``, also emitted), and ``%cfgp64``, its address as an i64.

    The words: 0 the palette (1), 2-3 the bytes per row of tiles 0-3 and 4-7 (u16 each), 6 the
    rows of tiles 0-7 (a byte each); the others 0."""
    e("      %cfg = memref.alloca() : memref<8xi64>")
    for i, w in enumerate(words):
        if w is None:
            continue
        e(f"      %cfgw{i} = arith.constant {w} : i64")
        e(f"      %cfgi{i} = arith.constant {i} : index")
        e(f"      memref.store %cfgw{i}, %cfg[%cfgi{i}] : memref<8xi64>")
    for i, w in enumerate(words):
        if w is None:
            e(f"      %cfgi{i} = arith.constant {i} : index")
    e("      %cfgp = memref.extract_aligned_pointer_as_index %cfg : memref<8xi64> -> index")
    e("      %cfgp64 = arith.index_cast %cfgp : index to i64")


def emit_permission_request(e: Callable[[str], object]) -> None:
    """Emits ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`` as a raw system call (the
    executable has no libc; see :func:`request_amx_permission`). Its result is not needed:
    without the permission the first tile instruction raises SIGILL whatever the kernel does."""
    e(f"      %sysnr = arith.constant {_SYS_ARCH_PRCTL} : i64")
    e(f"      %sysop = arith.constant {_ARCH_REQ_XCOMP_PERM} : i64")
    e(f"      %sysxf = arith.constant {_XFEATURE_XTILEDATA} : i64")
    e(
        '      %sysrc = llvm.inline_asm has_side_effects "syscall", '
        '"={ax},{ax},{di},{si},~{rcx},~{r11},~{memory}" %sysnr, %sysop, %sysxf : '
        "(i64, i64, i64) -> i64"
    )


def tile_asm(text: str, constraints: str, operands: list[str]) -> str:
    """An ``llvm.inline_asm`` with side effects over i64 operands (AT&T syntax): how the AMX
    kernels write tile instructions, which IREE's LLVM backend assembles."""
    types = ", ".join("i64" for _ in operands)
    return (
        f'llvm.inline_asm has_side_effects "{text}", "{constraints}" '
        f"{', '.join(operands)} : ({types}) -> ()"
    )
