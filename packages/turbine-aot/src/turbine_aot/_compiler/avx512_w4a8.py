"""The int4 x int8 matmul kernel, in an AVX-512 VNNI form and an AVX2 form: a hand-written IREE
executable for torchao's
``Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(G))``
(int4 weights per group, the activations quantized to int8 per row with a zero point: llama.cpp
Q4_0's integer math, docs/quantization.md).

``C[m, n] (f32) = sx[m] * sum_g s[n, g] * sum_{k in g} (Q[n, k] - zw[n, g]) (X[m, k] - zx[m])``
with ``X`` the int8 activations (``[M, K]``, asymmetric: per-row scale ``sx`` and zero point
``zx``), ``Q`` the int4 weights as stored (``[N, K / 2]`` bytes, element ``2i`` in the low
nibble of byte ``i``: IREE's ``i4`` layout), ``s`` / ``zw`` the weight's per-group scales and
zero points (``[N, K / G]``; ``zw`` optional).

Per block of up to 4 rows a workgroup first prepares the rows on its stack: ``X``
**de-interleaved** per 128 ``k`` (the 64 even values, then the 64 odd: the nibbles' order),
``-8 * sum X`` per 8 ``k`` (two ``vpdpbusd`` on a vector of ones) and, with zero points,
``a[m, g] = sum_{k in g} (X - zx)``; its 32 channels then read them from there (three
dispatches per call fewer than preparing them in the program, docs/quantization.md).

Per 64 weight bytes (128 ``k``), channel and row the kernel issues two ``vpdpbusd`` (unsigned x
signed bytes, ``acc[i] += sum_{j<4} u[4i+j] * s[4i+j]``): the unsigned operand is the nibbles
plus 8 (``U = Q + 8`` in 0..15: the bytes xor ``0x88``, then the low nibbles masked and the
high ones shifted down), the signed one the de-interleaved activations. Lane ``i`` of the
accumulator then holds ``sum U X`` over ``k`` in ``[8i, 8i + 8)`` of the step; it starts at
``-8 * sum X`` over the same 8 ``k``, so each lane ends as the exact ``sum Q X`` of its 8 ``k``.
It is converted to f32 and multiplied, lane by lane, by its group's scale (groups of 32: each
scale spread over 4 lanes) into an f32 accumulator. The rest of the sum is per row and channel,
after the loop:

``sum_g s_g sum (Q - zw)(X - zx) = sum_g s_g sum Q X - zx * t[n] - sum_g s_g zw_g a[m, g]``

with ``t[n] = sum_g s_g sum_{k in g} Q`` (``[N]`` f32, a constant expression of the weight's
globals: IREE hoists it into an initializer that runs once at load). The result is multiplied
by ``sx[m]``. The integer sums are exact; only the f32 summation order differs from torchao
eager's fake-quantized ``mm``.

Every operand is read where it is: the int8 activations as the program quantized them, the
packed weight bytes, the scales and zero points; nothing is repacked or dequantized, and ``t``
is one float per channel. Blocking as the int8 VNNI kernel's (:mod:`.avx512_vnni`): one output
channel at a time (a workgroup's weight rows read as one sequential run), no software prefetch
(as that kernel: a 110M Llama's w4a8 decode step ran 0.96x with it). A row block's prepared data (1.5 ``K`` bytes a row,
plus the group sums) stays within IREE's 32 KiB of stack: 4 rows up to ``K`` = 4096, 2 to 8192,
1 to 16384.

**The AVX2 form** (``isa="avx2"``: the kernels built for AVX2, ``_compiler.isa``; AMD Zen 1-3,
Intel client cores) has no ``vpdpbusd``. Each 64-byte operand is split into its two 32-byte
halves, and per half the two ``vpdpbusd`` become two ``vpmaddubsw`` (unsigned x signed bytes,
adjacent pairs summed as i16: at most ``2 * 15 * 128``, never saturating), one ``vpaddw`` of the
even and odd products (at most 7680) and one ``vpmaddwd`` by a vector of ones (adjacent i16
pairs as i32), so lane ``i`` of the joined ``vector<16xi32>`` holds the same 8-``k`` sum as the
VNNI form's, and one ``vpaddd`` adds the ``-8 * sum X`` start. Everything else (the prepared
rows, the scales, the per-row terms) is the same text; LLVM keeps the 16-lane vectors as pairs
of ymm registers. The rows' ``-8 * sum X`` use the same sequence on a vector of ones. A 110M
Llama decodes at 252 tokens/s at one thread on a Zen 3 (1.17x llama.cpp's Q4_0) against 96 on
the weight-only int4 kernel (docs/quantization.md, "The w4a8 kernel on AVX2").
"""

from __future__ import annotations

from dataclasses import dataclass

from .kernel_text import close_executable, open_executable, row_blocks, workgroup_block
from .workgroups import balanced_columns

__all__ = ["Avx512W4A8Gemm"]

_K_STEP = 128  # k values per 64 weight bytes (two vpdpbusd)
#: A row's prepared data is 1.5 K bytes (+ the group sums) on the stack: IREE's CPU stack
#: allocation limit is 32 KiB, so 4 rows per block up to K = 4096, 2 to 8192, 1 to 16384.
_MAX_K = 16384
#: The forms, by instruction set, and their names' stems.
_ISAS = {"avx512": "avx512_vnni", "avx2": "avx2"}


@dataclass(frozen=True)
class Avx512W4A8Gemm:
    """One int4 x int8 matmul executable for static ``k``, ``n`` and ``group`` (``M`` per call).

    Attributes:
        k, n, group: the reduction, the output channels, the weight's group size.
        zero_point: the weight has zero points (a ``zw`` operand and the ``a`` term).
        mr: rows of ``M`` per register block (one channel at a time).
        unroll: steps of 128 ``k`` per loop iteration.
        rows_per_workgroup, cols_per_workgroup: a workgroup's block of ``C``.
        prefetch: software-prefetch the next channel's weight row (off by default).
        isa: ``"avx512"``: the dot products are AVX-512 VNNI's ``vpdpbusd``; ``"avx2"``:
            ``vpmaddubsw`` + ``vpmaddwd`` (the AVX2 form, module doc).
    """

    k: int
    n: int
    group: int
    zero_point: bool = True
    mr: int = 4
    unroll: int = 2
    rows_per_workgroup: int = 16
    cols_per_workgroup: int = 32
    prefetch: bool = False
    isa: str = "avx512"

    @staticmethod
    def supports(k: int, n: int, group: int) -> bool:
        """Whether the kernel handles the shape (else the product stays on the current path).

        ``K`` a multiple of 128 (one step); a group either inside a step (32, 64, 128) or a
        multiple of it; ``N`` a multiple of 4; ``|sum Q X|`` per lane far below ``2^31``."""
        if n <= 0 or n % 4 or k <= 0 or k % _K_STEP or k > _MAX_K or group <= 0:
            return False
        if k % group:
            return False
        return group in (32, 64, 128) or group % _K_STEP == 0

    @staticmethod
    def for_shape(
        k: int,
        n: int,
        group: int,
        zero_point: bool,
        isa: str = "avx512",
        rows: int | None = None,
        workers: int | None = None,
    ) -> Avx512W4A8Gemm:
        """The kernel turbine uses for the shape on ``isa`` (``avx512``: VNNI; ``avx2``), its
        workgroup columns cut so that IREE's ``workers`` (default: those it starts here) share
        the dispatch evenly where ``rows`` (``M``) is static
        (:func:`.workgroups.balanced_columns`)."""
        cols = next(c for c in (32, 16, 8, 4) if n % c == 0)
        unroll = 2 if k % (2 * _K_STEP) == 0 else 1
        mr = 4 if k <= 4096 else 2 if k <= 8192 else 1
        kernel = Avx512W4A8Gemm(
            k, n, group, zero_point, mr=mr, unroll=unroll, cols_per_workgroup=cols, isa=isa
        )
        return balanced_columns(kernel, rows, n, 4, workers)

    def __post_init__(self) -> None:
        if not self.supports(self.k, self.n, self.group) or self.k % (_K_STEP * self.unroll):
            raise ValueError(f"w4a8 kernel: unsupported shape {self}")
        if self.mr * self.k * 3 // 2 + self.mr * self.groups * 4 > 30 * 1024:
            raise ValueError(f"w4a8 kernel: a row block's data exceeds the stack: {self}")
        if self.n % self.cols_per_workgroup:
            raise ValueError(f"w4a8 kernel: bad workgroup columns: {self}")
        if self.isa not in _ISAS:
            raise ValueError(f"w4a8 kernel: no form for {self.isa!r}; known: {', '.join(_ISAS)}")

    @property
    def stem(self) -> str:
        """The form's part of the names (``avx512_vnni`` / ``avx2``)."""
        return _ISAS[self.isa]

    @property
    def groups(self) -> int:
        return self.k // self.group

    @property
    def name(self) -> str:
        z = "z" if self.zero_point else ""
        pf = "_pf" if self.prefetch else ""
        return (
            f"__turbine_{self.stem}_i4i8_gemm_{self.k}x{self.n}_g{self.group}{z}_{self.mr}x1"
            f"_u{self.unroll}_{self.rows_per_workgroup}x{self.cols_per_workgroup}{pf}"
        )

    def _types(self) -> dict[str, str]:
        """The operands' shapes (``?``: rows), in binding order."""
        k, n, g = self.k, self.n, self.groups
        types = {"x": f"?x{k}xi8", "zx": "?xi8", "sx": "?xf32"}
        types.update({"q": f"{n}x{k // 2}xi8", "s": f"{n}x{g}xf32"})
        if self.zero_point:
            types["z"] = f"{n}x{g}xi8"
        types["t"] = f"{n}xf32"
        return types

    def _buffers(self) -> dict[str, str]:
        """A row block's prepared data, on the stack (:meth:`_prepare`)."""
        mr, k, g = self.mr, self.k, self.groups
        bufs = {"xd": f"memref<{mr}x{k}xi8>", "nx": f"memref<{mr}x{k // 8}xi32>"}
        if self.zero_point:
            bufs["a"] = f"memref<{mr}x{g}xf32>"
        return bufs

    def dispatch(self, operands: dict[str, str], m: str) -> str:
        """The ``flow.dispatch`` of this kernel on ``operands`` (named as :meth:`_types`;
        result ``tensor<?xNxf32>``)."""
        types = self._types()
        values = ", ".join(operands[name] for name in types)
        tys = ", ".join(
            f"tensor<{t}>{{{m}}}" if t.startswith("?") else f"tensor<{t}>" for t in types.values()
        )
        return (
            f"flow.dispatch @{self.name}::@{self.name}[{m}]({values}, {m}) : ({tys}, index) "
            f"-> tensor<?x{self.n}xf32>{{{m}}}"
        )

    def executable(self) -> str:
        """The ``stream.executable`` (MLIR text) for a module's top level."""
        n, mr = self.n, self.mr
        mb, nb = self.rows_per_workgroup, self.cols_per_workgroup
        types = self._types()
        out: list[str] = []
        e = out.append
        name = self.name
        open_executable(
            e,
            name,
            column_blocks=n // nb,
            rows_per_workgroup=mb,
            bindings=[f"%b{b}" for b in [*types, "c"]],
            constants={0, 1, mr, nb, self.k, self.groups} | set(range(mr + 1)),
        )
        for b, t in [*types.items(), ("c", f"?x{n}xf32")]:
            dyn = "{%m}" if t.startswith("?") else ""
            e(
                f"      %m{b} = stream.binding.subspan %b{b}[%c0] : !stream.binding -> memref<{t}>{dyn}"
            )
        e("      %zero = arith.constant dense<0.0> : vector<16xf32>")
        e("      %x88 = arith.constant dense<-120> : vector<64xi8>")  # 0x88
        e("      %x0f = arith.constant dense<15> : vector<64xi8>")
        e("      %four = arith.constant dense<4> : vector<64xi8>")
        if self.isa == "avx2":
            e("      %ones16 = arith.constant dense<1> : vector<16xi16>")
        workgroup_block(e, cols_per_workgroup=nb, rows_per_workgroup=mb, column_base="%nbase")
        for b, t in self._buffers().items():
            e(f"      %{b}buf = memref.alloca() : {t}")
        e(f"      scf.for %mi = %m0 to %mend step %c{mr} {{")
        e(f"        %left = affine.min affine_map<()[s0, s1] -> ({mr}, s1 - s0)>()[%mi, %mend]")

        def block(rows: int, p: str) -> None:
            self._prepare(e, rows, p)
            e(f"{p}scf.for %nq = %c0 to %c{nb} step %c1 {{")
            e(f"{p}  %ncol = arith.addi %nbase, %nq : index")
            self._micro(e, rows, p + "  ")
            e(f"{p}}}")

        row_blocks(e, "        ", mr, block)
        e("      }")
        close_executable(e)
        return "\n".join(out)

    def _dot(
        self, e, p: str, out: str, acc: str, even: tuple[str, str], odd: tuple[str, str]
    ) -> None:
        """``out = acc + lanes``, lane ``i`` of ``vector<16xi32>`` the sum of ``u * x`` over
        bytes ``4i .. 4i + 3`` of both ``(u, x)`` pairs (``vector<64xi8>``: ``u`` unsigned
        0..15 or 1, ``x`` signed): on AVX-512 two ``vpdpbusd``; on AVX2 per 32-byte half two
        ``vpmaddubsw`` (pairs, as i16: at most 2 * 15 * 128, no saturation), their sum (at
        most 7680) and one ``vpmaddwd`` by ones (pairs of those, as i32), the halves joined."""
        it, bt = "vector<16xi32>", "vector<64xi8>"
        name = out.lstrip("%")
        if self.isa == "avx512":
            vnni = '"llvm.x86.avx512.vpdpbusd.512"'
            e(
                f"{p}%{name}_v = llvm.call_intrinsic {vnni}({acc}, {even[0]}, {even[1]}) : ({it}, {bt}, {bt}) -> {it}"
            )
            e(
                f"{p}{out} = llvm.call_intrinsic {vnni}(%{name}_v, {odd[0]}, {odd[1]}) : ({it}, {bt}, {bt}) -> {it}"
            )
            return
        ht, wt, qt = "vector<32xi8>", "vector<16xi16>", "vector<8xi32>"
        halves = []
        for h in (0, 1):
            parts = []
            for j, (u, x) in enumerate((even, odd)):
                for v, tag in ((u, "u"), (x, "x")):
                    e(
                        f"{p}%{name}_{tag}{j}{h} = vector.extract_strided_slice {v} "
                        f"offsets = [{32 * h}], sizes = [32], strides = [1] : {bt} to {ht}"
                    )
                e(
                    f'{p}%{name}_m{j}{h} = llvm.call_intrinsic "llvm.x86.avx2.pmadd.ub.sw"'
                    f"(%{name}_u{j}{h}, %{name}_x{j}{h}) : ({ht}, {ht}) -> {wt}"
                )
                parts.append(f"%{name}_m{j}{h}")
            e(f"{p}%{name}_s{h} = arith.addi {parts[0]}, {parts[1]} : {wt}")
            e(
                f'{p}%{name}_w{h} = llvm.call_intrinsic "llvm.x86.avx2.pmadd.wd"'
                f"(%{name}_s{h}, %ones16) : ({wt}, {wt}) -> {qt}"
            )
            halves.append(f"%{name}_w{h}")
        lanes = ", ".join(str(i) for i in range(16))
        e(f"{p}%{name}_j = vector.shuffle {halves[0]}, {halves[1]} [{lanes}] : {qt}, {qt}")
        e(f"{p}{out} = arith.addi {acc}, %{name}_j : {it}")

    def _prepare(self, e, rows: int, p: str) -> None:
        """The row block's data, into the stack buffers: ``X`` de-interleaved per 128 ``k``
        (the 64 even values, then the 64 odd: the nibbles' order), ``-8 * sum X`` per 8 ``k``
        (where the accumulators start) and, with zero points, ``sum (X - zx)`` per group."""
        t = self._types()
        bufs = self._buffers()
        x_t = f"memref<{t['x']}>"
        bt, it = "vector<64xi8>", "vector<16xi32>"
        even = ", ".join(str(2 * i) for i in range(64))
        odd = ", ".join(str(2 * i + 1) for i in range(64))
        e(f"{p}%ones = arith.constant dense<1> : {bt}")
        e(f"{p}%zi16 = arith.constant dense<0> : {it}")
        e(f"{p}%three = arith.constant dense<3> : {it}")
        for r in range(rows):
            e(f"{p}%prow{r} = arith.addi %mi, %c{r} : index")
        e(f"{p}%pstep = arith.constant {_K_STEP} : index")
        e(f"{p}scf.for %pk = %c0 to %c{self.k} step %pstep {{")
        q = p + "  "
        e(f"{q}%pk2 = affine.apply affine_map<()[s0] -> (s0 + 64)>()[%pk]")
        e(f"{q}%pl = affine.apply affine_map<()[s0] -> (s0 floordiv 8)>()[%pk]")
        for r in range(rows):
            e(f"{q}%pa{r} = vector.load %mx[%prow{r}, %pk] : {x_t}, {bt}")
            e(f"{q}%pb{r} = vector.load %mx[%prow{r}, %pk2] : {x_t}, {bt}")
            e(f"{q}%pe{r} = vector.shuffle %pa{r}, %pb{r} [{even}] : {bt}, {bt}")
            e(f"{q}%po{r} = vector.shuffle %pa{r}, %pb{r} [{odd}] : {bt}, {bt}")
            e(f"{q}vector.store %pe{r}, %xdbuf[%c{r}, %pk] : {bufs['xd']}, {bt}")
            e(f"{q}vector.store %po{r}, %xdbuf[%c{r}, %pk2] : {bufs['xd']}, {bt}")
            # sum X per 8 k (lane i: k 8i..8i+7 of the step), times -8
            self._dot(e, q, f"%pt{r}", "%zi16", ("%ones", f"%pe{r}"), ("%ones", f"%po{r}"))
            e(f"{q}%p8{r} = arith.shli %pt{r}, %three : {it}")
            e(f"{q}%pn{r} = arith.subi %zi16, %p8{r} : {it}")
            e(f"{q}vector.store %pn{r}, %nxbuf[%c{r}, %pl] : {bufs['nx']}, {it}")
        e(f"{p}}}")
        if not self.zero_point:
            return
        # sum (X - zx) per group = -(sum of the group's lanes of nx) / 8 - G * zx
        lanes = self.group // 8
        vt = f"vector<{lanes}xi32>"
        e(f"{p}%cg = arith.constant {self.group} : i32")
        e(f"{p}%c8i = arith.constant 8 : i32")
        e(f"{p}%c0i = arith.constant 0 : i32")
        for r in range(rows):
            e(f"{p}%pz{r} = memref.load %mzx[%prow{r}] : memref<{t['zx']}>")
            e(f"{p}%pzi{r} = arith.extsi %pz{r} : i8 to i32")
            e(f"{p}%pgz{r} = arith.muli %pzi{r}, %cg : i32")
        e(f"{p}scf.for %pg = %c0 to %c{self.groups} step %c1 {{")
        e(f"{q}%pgl = affine.apply affine_map<()[s0] -> (s0 * {lanes})>()[%pg]")
        for r in range(rows):
            e(f"{q}%pv{r} = vector.load %nxbuf[%c{r}, %pgl] : {bufs['nx']}, {vt}")
            e(f"{q}%pr{r} = vector.reduction <add>, %pv{r} : {vt} into i32")
            e(f"{q}%pd{r} = arith.divsi %pr{r}, %c8i : i32")
            e(f"{q}%pm{r} = arith.subi %c0i, %pd{r} : i32")
            e(f"{q}%pq{r} = arith.subi %pm{r}, %pgz{r} : i32")
            e(f"{q}%pf{r} = arith.sitofp %pq{r} : i32 to f32")
            e(f"{q}memref.store %pf{r}, %abuf[%c{r}, %pg] : {bufs['a']}")
        e(f"{p}}}")

    def _micro(self, e, rows: int, p: str) -> None:
        """``rows`` rows of one channel's ``C``."""
        t = {b: f"memref<{ty}>" for b, ty in self._types().items()}
        b = self._buffers()
        c_t = f"memref<?x{self.n}xf32>"
        vt, it, bt = "vector<16xf32>", "vector<16xi32>", "vector<64xi8>"
        group = self.group
        for r in range(rows):
            e(f"{p}%row{r} = arith.addi %mi, %c{r} : index")
        e(f"{p}%n0 = arith.addi %ncol, %c0 : index")
        if self.prefetch:  # the next channel's row, clamped to N
            e(f"{p}%pn = affine.min affine_map<()[s0] -> (s0 + 1, {self.n - 1})>()[%n0]")
        accs = [f"%acc{r}" for r in range(rows)]
        tys = ", ".join([vt] * rows)
        e(f"{p}%kstep = arith.constant {_K_STEP * self.unroll} : index")
        e(
            f"{p}%res:{rows} = scf.for %k = %c0 to %c{self.k} step %kstep "
            f"iter_args({', '.join(f'{a} = %zero' for a in accs)}) -> ({tys}) {{"
        )
        q = p + "  "
        cur = list(accs)
        for u in range(self.unroll):
            # k offset, weight byte offset, lane (of 8 k) offset of this 128-k step
            e(f"{q}%k{u} = affine.apply affine_map<()[s0] -> (s0 + {_K_STEP * u})>()[%k]")
            e(
                f"{q}%kb{u} = affine.apply affine_map<()[s0] -> ((s0 + {_K_STEP * u}) floordiv 2)>()[%k]"
            )
            e(f"{q}%ko{u} = affine.apply affine_map<()[s0] -> (s0 + {_K_STEP * u + 64})>()[%k]")
            e(
                f"{q}%kl{u} = affine.apply affine_map<()[s0] -> ((s0 + {_K_STEP * u}) floordiv 8)>()[%k]"
            )
            if self.prefetch:
                e(f"{q}memref.prefetch %mq[%pn, %kb{u}], read, locality<3>, data : {t['q']}")
            e(f"{q}%qb{u} = vector.load %mq[%n0, %kb{u}] : {t['q']}, {bt}")
            e(f"{q}%ub{u} = arith.xori %qb{u}, %x88 : {bt}")  # nibbles + 8
            e(f"{q}%lo{u} = arith.andi %ub{u}, %x0f : {bt}")
            e(f"{q}%hi{u} = arith.shrui %ub{u}, %four : {bt}")
            # the scales of the groups in this step, one per lane (a lane: 8 k)
            if group < _K_STEP:
                per = _K_STEP // group  # groups in the step
                e(
                    f"{q}%g{u} = affine.apply affine_map<()[s0] -> ((s0 + {_K_STEP * u}) floordiv "
                    f"{group})>()[%k]"
                )
                e(f"{q}%sl{u} = vector.load %ms[%n0, %g{u}] : {t['s']}, vector<{per}xf32>")
                spread = ", ".join(str(i * per // 16) for i in range(16))
                e(
                    f"{q}%sv{u} = vector.shuffle %sl{u}, %sl{u} [{spread}] : "
                    f"vector<{per}xf32>, vector<{per}xf32>"
                )
            else:
                e(
                    f"{q}%g{u} = affine.apply affine_map<()[s0] -> ((s0 + {_K_STEP * u}) floordiv "
                    f"{group})>()[%k]"
                )
                e(f"{q}%ss{u} = memref.load %ms[%n0, %g{u}] : {t['s']}")
                e(f"{q}%sv{u} = vector.broadcast %ss{u} : f32 to {vt}")
            for r in range(rows):
                e(f"{q}%nx{u}_{r} = vector.load %nxbuf[%c{r}, %kl{u}] : {b['nx']}, {it}")
                e(f"{q}%xe{u}_{r} = vector.load %xdbuf[%c{r}, %k{u}] : {b['xd']}, {bt}")
                e(f"{q}%xo{u}_{r} = vector.load %xdbuf[%c{r}, %ko{u}] : {b['xd']}, {bt}")
                self._dot(
                    e,
                    q,
                    f"%do{u}_{r}",
                    f"%nx{u}_{r}",
                    (f"%lo{u}", f"%xe{u}_{r}"),
                    (f"%hi{u}", f"%xo{u}_{r}"),
                )
                e(f"{q}%df{u}_{r} = arith.sitofp %do{u}_{r} : {it} to {vt}")
                e(f"{q}%f{u}_{r} = vector.fma %df{u}_{r}, %sv{u}, {cur[r]} : {vt}")
                cur[r] = f"%f{u}_{r}"
        e(f"{q}scf.yield {', '.join(cur)} : {tys}")
        e(f"{p}}}")
        e(f"{p}%t0 = memref.load %mt[%n0] : {t['t']}")
        if self.zero_point:  # sum_g s_g zw_g a[m, g], w groups at a time
            w = next(v for v in (16, 8, 4, 2, 1) if self.groups % v == 0)
            wt = f"vector<{w}xf32>"
            e(f"{p}%wz = arith.constant dense<0.0> : {wt}")
            e(f"{p}%cw = arith.constant {w} : index")
            e(
                f"{p}%zres:{rows} = scf.for %g = %c0 to %c{self.groups} step %cw "
                f"iter_args({', '.join(f'%za{r} = %wz' for r in range(rows))}) -> "
                f"({', '.join([wt] * rows)}) {{"
            )
            e(f"{q}%gs = vector.load %ms[%n0, %g] : {t['s']}, {wt}")
            e(f"{q}%gz = vector.load %mz[%n0, %g] : {t['z']}, vector<{w}xi8>")
            e(f"{q}%gzf = arith.sitofp %gz : vector<{w}xi8> to {wt}")
            e(f"{q}%gsz = arith.mulf %gs, %gzf : {wt}")
            for r in range(rows):
                e(f"{q}%ga{r} = vector.load %abuf[%c{r}, %g] : {b['a']}, {wt}")
                e(f"{q}%zn{r} = vector.fma %gsz, %ga{r}, %za{r} : {wt}")
            e(
                f"{q}scf.yield {', '.join(f'%zn{r}' for r in range(rows))} : {', '.join([wt] * rows)}"
            )
            e(f"{p}}}")
        for r in range(rows):
            e(f"{p}%sum{r} = vector.reduction <add>, %res#{r} fastmath<reassoc> : {vt} into f32")
            e(f"{p}%zi{r} = memref.load %mzx[%row{r}] : {t['zx']}")
            e(f"{p}%zx{r} = arith.sitofp %zi{r} : i8 to f32")
            e(f"{p}%sx{r} = memref.load %msx[%row{r}] : {t['sx']}")
            e(f"{p}%zt{r} = arith.mulf %zx{r}, %t0 : f32")
            e(f"{p}%y{r} = arith.subf %sum{r}, %zt{r} : f32")
            y = f"%y{r}"
            if self.zero_point:
                e(
                    f"{p}%zs{r} = vector.reduction <add>, %zres#{r} fastmath<reassoc> : "
                    f"vector<{w}xf32> into f32"
                )
                e(f"{p}%yz{r} = arith.subf {y}, %zs{r} : f32")
                y = f"%yz{r}"
            e(f"{p}%out{r} = arith.mulf {y}, %sx{r} : f32")
            e(f"{p}memref.store %out{r}, %mc[%row{r}, %n0] : {c_t}")
