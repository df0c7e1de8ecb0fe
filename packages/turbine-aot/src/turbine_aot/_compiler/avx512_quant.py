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
output channels. For ``nr`` (4) output channels by ``mr`` rows the kernel keeps ``nr * mr``
``vector<16xf32>`` accumulators of partial dot products along ``K``: per step it loads 16
weight bytes per channel (16 int8 or 32 int4 values), widens them to f32 (``vpmovsxbd`` /
``vpmovzxbd`` + ``vcvtdq2ps``; int4: nibbles split with ``xor 0x88``, ``and``, ``shr``, giving
``q + 8`` unsigned), subtracts the group's zero point, and FMAs them with ``A``'s 16 (int4:
32, de-interleaved into even / odd ``k``) values; at the end of a group the group's sum is
scaled into the total; at the end of ``K`` each accumulator is summed across its lanes. Rows
left over at the end of ``M`` use a kernel of fewer rows.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Avx512QuantGemm"]


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
        arith: int4 with groups of a multiple of 128: unpack the nibbles with shifts and masks
            into f32 (no lookup: no shuffle per weight), the activations reordered to match
            once per block of rows (see :meth:`_executable_arith`).
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
    arith: bool = False
    lut: bool = False
    prefetch: bool = False
    prefetch_blocks: int = 1

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
    def for_shape(
        k: int, n: int, bits: int, group: int | None, zero_point: bool, variant: str = ""
    ) -> Avx512QuantGemm:
        """The kernel turbine uses for the shape.

        ``variant`` (``TURBINE_CPU_QUANT_KERNEL``, for A/B measurements): ``"v1"`` the first
        version (the int4 tables' zero points loaded, converted and broadcast per group and
        channel; no software prefetch), ``"nozb"`` the same, ``"nopf"`` today's without the
        software prefetch, ``"pf2"`` prefetching two blocks ahead instead of one, ``"nr8"`` int4 blocks of 8 channels instead of 4, ``"arith"`` /
        ``"lut"`` the shuffle-free unpacking / its layout with table lookups (no prefetch).
        """
        cols = next(c for c in (32, 16, 8, 4) if n % c == 0)
        mr = 4 if group is None else 2
        v1 = variant == "v1"
        lut = bits == 4 and group is not None and group % 128 == 0
        lut = lut and Avx512QuantGemm.arith_supports(k, bits, group)
        # 8 channels per block (the activations' even / odd split shared by 8) measured 0.80x
        # of 4 on the int4 stack (1 thread, AMD EPYC Zen 4): kept as a variant ("nr8").
        nr = 8 if bits == 4 and n % 8 == 0 and variant == "nr8" else 4
        return Avx512QuantGemm(
            k,
            n,
            bits,
            group,
            zero_point,
            mr=mr,
            nr=nr,
            cols_per_workgroup=max(cols, nr),
            zero_points_per_block=not v1 and variant != "nozb",
            arith=(variant == "arith" and Avx512QuantGemm.arith_supports(k, bits, group))
            or (variant == "lut" and lut),
            lut=variant == "lut" and lut,
            prefetch=variant not in ("v1", "nozb", "nopf", "arith", "lut"),
            prefetch_blocks=2 if variant == "pf2" else 1,
        )

    def __post_init__(self) -> None:
        if not self.supports(self.k, self.n, self.bits, self.group):
            raise ValueError(f"quantized AVX-512 kernel: unsupported shape {self}")
        if self.n % self.cols_per_workgroup or self.cols_per_workgroup % self.nr:
            raise ValueError(f"quantized AVX-512 kernel: bad workgroup columns: {self}")
        if self.arith and not self.arith_supports(self.k, self.bits, self.group):
            raise ValueError(f"quantized AVX-512 kernel: no arithmetic int4 for {self}")

    @staticmethod
    def arith_supports(k: int, bits: int, group: int | None) -> bool:
        """Whether the shuffle-free int4 form applies: groups of whole 128-value chunks, and
        the reordered activations (``mr`` rows of ``k`` f32) small enough for the stack."""
        if bits == 8:  # per channel only (no groups)
            return group is None and k % 64 == 0 and k <= 2048  # 4 rows: 32 KiB of stack
        if bits != 4 or group is None or k % 128 or k > 4096:
            return False
        return group % 128 == 0 or group in (32, 64)

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
        zb = (
            "_lu" if self.lut else "_ar" if self.arith else "_zb" if self._zero_point_buffer else ""
        )
        pf = "_pf" if self.prefetch else ""
        pf += f"{self.prefetch_blocks}" if self.prefetch and self.prefetch_blocks > 1 else ""
        return (
            f"__turbine_avx512_i{self.bits}_gemm_{self.k}x{self.n}{g}_{self.mr}x{self.nr}"
            f"_{self.rows_per_workgroup}x{self.cols_per_workgroup}{zb}{pf}"
        )

    @property
    def _zero_point_buffer(self) -> bool:
        return self.zero_points_per_block and self.bits == 4 and self.zero_point

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
        a_t = f"tensor<?x{self.k}xf32>{{{m}}}"
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
        a_t, c_t = f"memref<?x{k}xf32>", f"memref<?x{n}xf32>"
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
        e(f"stream.executable private @{name} {{")
        e(
            f"  stream.executable.export public @{name} workgroups(%m: index) "
            "-> (index, index, index) {"
        )
        e(f"    %x = arith.constant {n // nb} : index")
        e(f"    %y = affine.apply affine_map<()[s0] -> (s0 ceildiv {mb})>()[%m]")
        e("    %one = arith.constant 1 : index")
        e("    stream.return %x, %y, %one : index, index, index")
        e("  }")
        e("  builtin.module {")
        args = ", ".join(f"{b}: !stream.binding" for b in bindings)
        e(f"    func.func @{name}({args}, %m: index) {{")
        zw = next(w for w in (16, 8, 4, 2, 1) if self.groups % w == 0) if self.groups else 1
        consts = {0, 1, mr, nr, nb, k, self.groups, zw} | set(range(max(mr, nr)))
        for v in sorted(consts):
            e(f"      %c{v} = arith.constant {v} : index")
        e(f"      %ma = stream.binding.subspan %a[%c0] : !stream.binding -> {a_t}{{%m}}")
        e(f"      %mq = stream.binding.subspan %q[%c0] : !stream.binding -> {q_t}")
        if self.group:
            e(f"      %ms = stream.binding.subspan %s[%c0] : !stream.binding -> {s_t}")
            if self.zero_point:
                e(f"      %mz = stream.binding.subspan %z[%c0] : !stream.binding -> {z_t}")
        e(f"      %mc = stream.binding.subspan %c[%c0] : !stream.binding -> {c_t}{{%m}}")
        e("      %zero = arith.constant dense<0.0> : vector<16xf32>")
        zbuf_t = f"memref<{nr}x{self.groups}xf32>"
        if self._zero_point_buffer:
            e(f"      %zbuf = memref.alloca() : {zbuf_t}")
        e("      %wgx = stream.dispatch.workgroup.id[0] : index")
        e("      %wgy = stream.dispatch.workgroup.id[1] : index")
        e(f"      %nbase = affine.apply affine_map<()[s0] -> (s0 * {nb})>()[%wgx]")
        e(f"      %m0 = affine.apply affine_map<()[s0] -> (s0 * {mb})>()[%wgy]")
        e(f"      %mend = affine.min affine_map<()[s0, s1] -> (s0 + {mb}, s1)>()[%m0, %m]")
        if self.arith:
            self._executable_arith(e, (a_t, q_t, s_t, z_t, c_t))
            return "\n".join(out)
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
        if mr > 1:
            e("          scf.index_switch %left")
            for r in range(1, mr):
                e(f"          case {r} {{")
                micro(e, r, types, "            ")
                e("            scf.yield")
                e("          }")
            e("          default {")
            micro(e, mr, types, "            ")
            e("          }")
        else:
            micro(e, 1, types, "          ")
        e("        }")
        e("      }")
        e("      return")
        e("    }")
        e("  }")
        e("}")
        return "\n".join(out)

    def _indices(self, e, rows: int, p: str) -> None:
        for r in range(rows):
            e(f"{p}%row{r} = arith.addi %mi, %c{r} : index")
        for j in range(self.nr):
            e(f"{p}%n{j} = arith.addi %ncol, %c{j} : index")

    def _prefetch_rows(self, e, p: str) -> None:
        """``%pn{j}``: the row ``nr`` channels on (the next block's), clamped to ``N``."""
        for j in range(self.nr):
            e(
                f"{p}%pn{j} = affine.min affine_map<()[s0] -> "
                f"(s0 + {self.nr * self.prefetch_blocks}, {self.n - 1})>()"
                f"[%n{j}]"
            )

    def _prefetch(self, e, q_t: str, byte: str, p: str) -> None:
        """Software prefetch of the next block's weight line at ``byte`` (its rows are 1-2 KiB
        runs, too short for the hardware prefetchers to ramp up)."""
        for j in range(self.nr):
            e(f"{p}memref.prefetch %mq[%pn{j}, {byte}], read, locality<3>, data : {q_t}")

    def _store(self, e, rows: int, res: str, c_t: str, p: str) -> None:
        """Sums each accumulator across its lanes and stores it."""
        for r in range(rows):
            for j in range(self.nr):
                i = r * self.nr + j
                e(
                    f"{p}%sum{i} = vector.reduction <add>, {res}#{i} fastmath<reassoc> : "
                    "vector<16xf32> into f32"
                )
                e(f"{p}memref.store %sum{i}, %mc[%row{r}, %n{j}] : {c_t}")

    def _micro_plain(self, e, rows: int, types: tuple[str, ...], p: str) -> None:
        """``rows`` x ``nr`` of ``C = A Q^T`` (int8, no scales)."""
        a_t, q_t, _, _, c_t = types
        nr, vt = self.nr, "vector<16xf32>"
        unroll = 4 if self.k % 64 == 0 else 1
        self._indices(e, rows, p)
        if self.prefetch:
            self._prefetch_rows(e, p)
        accs = [f"%acc{r}_{j}" for r in range(rows) for j in range(nr)]
        tys = ", ".join([vt] * len(accs))
        iters = ", ".join(f"{a} = %zero" for a in accs)
        e(f"{p}%cstep = arith.constant {16 * unroll} : index")
        e(
            f"{p}%res:{len(accs)} = scf.for %k = %c0 to %c{self.k} step %cstep iter_args({iters}) -> ({tys}) {{"
        )
        cur = {(r, j): f"%acc{r}_{j}" for r in range(rows) for j in range(nr)}
        if self.prefetch:
            self._prefetch(e, q_t, "%k", p + "  ")
        for u in range(unroll):
            e(f"{p}  %k{u} = affine.apply affine_map<()[s0] -> (s0 + {16 * u})>()[%k]")
            for j in range(nr):
                e(f"{p}  %qv{u}_{j} = vector.load %mq[%n{j}, %k{u}] : {q_t}, vector<16xi8>")
                e(f"{p}  %w{u}_{j} = arith.sitofp %qv{u}_{j} : vector<16xi8> to {vt}")
            for r in range(rows):
                e(f"{p}  %x{u}_{r} = vector.load %ma[%row{r}, %k{u}] : {a_t}, {vt}")
                for j in range(nr):
                    e(f"{p}  %f{u}_{r}_{j} = vector.fma %x{u}_{r}, %w{u}_{j}, {cur[r, j]} : {vt}")
                    cur[r, j] = f"%f{u}_{r}_{j}"
        e(
            f"{p}  scf.yield "
            + ", ".join(cur[r, j] for r in range(rows) for j in range(nr))
            + f" : {tys}"
        )
        e(f"{p}}}")
        self._store(e, rows, "%res", c_t, p)

    def _micro_grouped(self, e, rows: int, types: tuple[str, ...], p: str) -> None:
        """``rows`` x ``nr`` of ``C = A W^T`` with ``W`` dequantized per group in registers."""
        a_t, q_t, s_t, z_t, c_t = types
        nr, vt, group = self.nr, "vector<16xf32>", self.group
        assert group is not None
        per_load = 16 if self.bits == 8 else 32  # values per 16-byte load
        steps = group // per_load
        self._indices(e, rows, p)
        if self.prefetch:
            self._prefetch_rows(e, p)
        tots = [f"%tot{r}_{j}" for r in range(rows) for j in range(nr)]
        tys = ", ".join([vt] * len(tots))
        iters = ", ".join(f"{a} = %zero" for a in tots)
        if self.bits == 4:
            values = ", ".join(f"{v:.1f}" for v in [*range(8), *range(-8, 0)])
            e(f"{p}%qvals = arith.constant dense<[{values}]> : {vt}")  # nibble -> value
            e(f"{p}%c4v = arith.constant dense<4> : vector<16xi32>")
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
            if self.bits == 4:  # the group's 16 dequantized values, (q - z) * s as eager's
                qz = "%qvals"
                if self.zero_point:
                    e(f"{q}%qz{j} = arith.subf %qvals, %zb{j} : {vt}")
                    qz = f"%qz{j}"
                e(f"{q}%tab{j} = arith.mulf {qz}, %sb{j} : {vt}")
        cur: dict[tuple[int, int], str | None] = {
            (r, j): f"%tot{r}_{j}" if self.bits == 4 else None
            for r in range(rows)
            for j in range(nr)
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
            self._prefetch(e, q_t, f"%pb{line}", q)
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
                    for j in range(nr):
                        fma(f"%xe{st}_{r}", f"%low{st}_{j}", r, j, f"{st}e")
                        fma(f"%xo{st}_{r}", f"%hiw{st}_{j}", r, j, f"{st}o")
        outs = []
        for r in range(rows):
            for j in range(nr):
                if self.bits == 4:  # the weights were scaled in the table
                    outs.append(str(cur[r, j]))
                    continue
                e(f"{q}%nt{r}_{j} = vector.fma %sb{j}, {cur[r, j]}, %tot{r}_{j} : {vt}")
                outs.append(f"%nt{r}_{j}")
        e(f"{q}scf.yield " + ", ".join(outs) + f" : {tys}")
        e(f"{p}}}")
        self._store(e, rows, "%res", c_t, p)

    def _executable_arith(self, e, types: tuple[str, ...]) -> None:
        """The loops of the shuffle-free int4 form (after the function's prologue).

        64 weight bytes of a channel are 16 dwords; nibble ``j`` of dword ``i`` is the value
        at ``k0 + 8 i + j``. After ``xor 0x88888888`` (nibble ``q + 8``), ``(d >> 4 j) & 15 |
        0x4B000000`` read as f32 is ``2^23 + q + 8``; minus ``2^23 + 8 + z`` (the block's
        zero points, converted once) it is exactly ``q - z``, times the group's scale the
        same rounding as eager's dequantized weight. Eight such vectors FMA with activations
        reordered once per block of rows (``xp[r, k0 + 16 j + i] = A[r, k0 + 8 i + j]``).
        """
        a_t, _, _, z_t, _ = types
        k, nr, mr, nb = self.k, self.nr, self.mr, self.cols_per_workgroup
        xp_t, zb_t = f"memref<{mr}x{k}xf32>", f"memref<{nr}x{max(self.groups, 1)}xf32>"
        zw = next(w for w in (16, 8, 4, 2, 1) if self.groups % w == 0) if self.groups else 1
        per = 32 // self.bits  # values per dword: 8 (int4) or 4 (int8)
        chunk = 16 * per
        e(f"      %xp = memref.alloca() : {xp_t}")
        if self.group and not self._zero_point_buffer:  # (else the prologue made it)
            e(f"      %zbuf = memref.alloca() : {zb_t}")
        e(f"      %cchunk = arith.constant {chunk} : index")
        e(f"      scf.for %mi = %m0 to %mend step %c{mr} {{")
        e(f"        %left = affine.min affine_map<()[s0, s1] -> ({mr}, s1 - s0)>()[%mi, %mend]")
        e("        scf.for %r = %c0 to %left step %c1 {")
        e("          %xrow = arith.addi %mi, %r : index")
        cv, c2, c3 = f"vector<{chunk}xf32>", f"vector<16x{per}xf32>", f"vector<{per}x16xf32>"
        e(f"          scf.for %kc = %c0 to %c{k} step %cchunk {{")
        e(f"            %xl = vector.load %ma[%xrow, %kc] : {a_t}, {cv}")
        e(f"            %x2 = vector.shape_cast %xl : {cv} to {c2}")
        e(f"            %xt = vector.transpose %x2, [1, 0] : {c2} to {c3}")
        e(f"            %x1 = vector.shape_cast %xt : {c3} to {cv}")
        e(f"            vector.store %x1, %xp[%r, %kc] : {xp_t}, {cv}")
        e("          }")
        e("        }")
        e(f"        scf.for %nq = %c0 to %c{nb} step %c{nr} {{")
        e("          %ncol = arith.addi %nbase, %nq : index")
        zv, zf = f"vector<{zw}xi8>", f"vector<{zw}xf32>"
        if self.group:
            zoff = 0.0 if self.lut else 8388616.0  # lut: the zero point; arith: + 2^23 + 8
            e(f"          %zoff = arith.constant dense<{zoff}> : {zf}")
            e(f"          scf.for %gz = %c0 to %c{self.groups} step %c{zw} {{")
        for j in range(nr if self.group else 0):
            if self.zero_point:
                e(f"            %zn{j} = arith.addi %ncol, %c{j} : index")
                e(f"            %zl{j} = vector.load %mz[%zn{j}, %gz] : {z_t}, {zv}")
                e(f"            %zc{j} = arith.sitofp %zl{j} : {zv} to {zf}")
                e(f"            %zd{j} = arith.addf %zc{j}, %zoff : {zf}")
            zval = f"%zd{j}" if self.zero_point else "%zoff"
            if self.group:
                e(f"            vector.store {zval}, %zbuf[%c{j}, %gz] : {zb_t}, {zf}")
        if self.group:
            e("          }")
        micro = self._micro_arith if self.group else self._micro_arith8
        if mr > 1:
            e("          scf.index_switch %left")
            for r in range(1, mr):
                e(f"          case {r} {{")
                micro(e, r, types, "            ")
                e("            scf.yield")
                e("          }")
            e("          default {")
            micro(e, mr, types, "            ")
            e("          }")
        else:
            micro(e, 1, types, "          ")
        e("        }")
        e("      }")
        e("      return")
        e("    }")
        e("  }")
        e("}")

    def _micro_arith(self, e, rows: int, types: tuple[str, ...], p: str) -> None:
        """``rows`` x ``nr`` of ``C = A W^T``, int4 unpacked arithmetically (``arith``)."""
        _, q_t, s_t, _, c_t = types
        nr, vt, group, mr = self.nr, "vector<16xf32>", self.group, self.mr
        assert group is not None
        xp_t, zb_t = f"memref<{mr}x{self.k}xf32>", f"memref<{nr}x{self.groups}xf32>"
        vi = "vector<16xi32>"
        self._indices(e, rows, p)
        e(f"{p}%xor = arith.constant dense<-2004318072> : {vi}")  # 0x88888888
        e(f"{p}%m15 = arith.constant dense<15> : {vi}")
        e(f"{p}%magic = arith.constant dense<1258291200> : {vi}")  # 0x4B000000: 2^23
        for j in range(1, 8):
            e(f"{p}%sh{j} = arith.constant dense<{4 * j}> : {vi}")
        tots = [f"%tot{r}_{j}" for r in range(rows) for j in range(nr)]
        tys = ", ".join([vt] * len(tots))
        iters = ", ".join(f"{a} = %zero" for a in tots)
        blk = max(group, 128)  # one group of whole chunks, or one chunk of 128 / G groups
        e(f"{p}%nblk = arith.constant {self.k // blk} : index")
        e(
            f"{p}%res:{len(tots)} = scf.for %g = %c0 to %nblk step %c1 "
            f"iter_args({iters}) -> ({tys}) {{"
        )
        q = p + "  "
        if group >= 128:
            for j in range(nr):
                e(f"{q}%sv{j} = memref.load %ms[%n{j}, %g] : {s_t}")
                e(f"{q}%sb{j} = vector.broadcast %sv{j} : f32 to {vt}")
                e(f"{q}%cv{j} = memref.load %zbuf[%c{j}, %g] : {zb_t}")
                e(f"{q}%cb{j} = vector.broadcast %cv{j} : f32 to {vt}")
        else:  # lane i holds k0 + 8 i .. k0 + 8 i + 7: group 8 i / G of the chunk's
            gpc = 128 // group
            gv = f"vector<{gpc}xf32>"
            lanes = ", ".join(str(8 * i // group) for i in range(16))
            e(f"{q}%g0 = affine.apply affine_map<()[s0] -> (s0 * {gpc})>()[%g]")
            for j in range(nr):
                e(f"{q}%sv{j} = vector.load %ms[%n{j}, %g0] : {s_t}, {gv}")
                e(f"{q}%sb{j} = vector.shuffle %sv{j}, %sv{j} [{lanes}] : {gv}, {gv}")
                e(f"{q}%cv{j} = vector.load %zbuf[%c{j}, %g0] : {zb_t}, {gv}")
                e(f"{q}%cb{j} = vector.shuffle %cv{j}, %cv{j} [{lanes}] : {gv}, {gv}")
        if self.lut:  # the group's 16 dequantized values per channel, indexed by the nibble
            values = ", ".join(f"{v:.1f}" for v in [*range(8), *range(-8, 0)])
            e(f"{q}%qvals = arith.constant dense<[{values}]> : {vt}")
            for j in range(nr):
                e(f"{q}%qz{j} = arith.subf %qvals, %cb{j} : {vt}")
                e(f"{q}%tab{j} = arith.mulf %qz{j}, %sb{j} : {vt}")
        cur = {(r, j): f"%tot{r}_{j}" for r in range(rows) for j in range(nr)}
        for c in range(blk // 128):
            e(f"{q}%ko{c} = affine.apply affine_map<()[s0] -> (s0 * {blk} + {c * 128})>()[%g]")
            e(f"{q}%bo{c} = affine.apply affine_map<()[s0] -> (s0 * {blk // 2} + {c * 64})>()[%g]")
            for pj in range(8):
                e(f"{q}%kx{c}_{pj} = affine.apply affine_map<()[s0] -> (s0 + {16 * pj})>()[%ko{c}]")
                for r in range(rows):
                    e(f"{q}%x{c}_{pj}_{r} = vector.load %xp[%c{r}, %kx{c}_{pj}] : {xp_t}, {vt}")
            for j in range(nr):
                t = f"{c}_{j}"
                e(f"{q}%qb{t} = vector.load %mq[%n{j}, %bo{c}] : {q_t}, vector<64xi8>")
                e(f"{q}%qd{t} = vector.bitcast %qb{t} : vector<64xi8> to {vi}")
                if self.lut:  # vpermps reads the low 4 bits of each lane: no mask
                    for pj in range(8):
                        u = f"{t}_{pj}"
                        src = f"%qd{t}"
                        if pj:
                            e(f"{q}%qs{u} = arith.shrui %qd{t}, %sh{pj} : {vi}")
                            src = f"%qs{u}"
                        e(
                            f'{q}%qw{u} = llvm.call_intrinsic "llvm.x86.avx512.permvar.sf.512"'
                            f"(%tab{j}, {src}) : ({vt}, {vi}) -> {vt}"
                        )
                        for r in range(rows):
                            fma = f"vector.fma %x{c}_{pj}_{r}, %qw{u}, {cur[r, j]} : {vt}"
                            e(f"{q}%a{u}_{r} = {fma}")
                            cur[r, j] = f"%a{u}_{r}"
                    continue
                e(f"{q}%qx{t} = arith.xori %qd{t}, %xor : {vi}")
                for pj in range(8):
                    u = f"{t}_{pj}"
                    src = f"%qx{t}"
                    if pj:
                        e(f"{q}%qs{u} = arith.shrui %qx{t}, %sh{pj} : {vi}")
                        src = f"%qs{u}"
                    e(f"{q}%qm{u} = arith.andi {src}, %m15 : {vi}")
                    e(f"{q}%qo{u} = arith.ori %qm{u}, %magic : {vi}")
                    e(f"{q}%qf{u} = arith.bitcast %qo{u} : {vi} to {vt}")
                    e(f"{q}%qz{u} = arith.subf %qf{u}, %cb{j} : {vt}")
                    e(f"{q}%qw{u} = arith.mulf %qz{u}, %sb{j} : {vt}")
                    for r in range(rows):
                        e(f"{q}%a{u}_{r} = vector.fma %x{c}_{pj}_{r}, %qw{u}, {cur[r, j]} : {vt}")
                        cur[r, j] = f"%a{u}_{r}"
        e(
            f"{q}scf.yield "
            + ", ".join(cur[r, j] for r in range(rows) for j in range(nr))
            + f" : {tys}"
        )
        e(f"{p}}}")
        self._store(e, rows, "%res", c_t, p)

    def _micro_arith8(self, e, rows: int, types: tuple[str, ...], p: str) -> None:
        """``rows`` x ``nr`` of ``C = A Q^T``, int8 per channel unpacked arithmetically: byte
        ``j`` of dword ``i`` is the value at ``k0 + 4 i + j``; after ``xor 0x80808080``,
        ``(d >> 8 j) & 255 | 0x4B000000`` read as f32 minus ``2^23 + 128`` is exactly ``q``."""
        _, q_t, _, _, c_t = types
        nr, vt, mr = self.nr, "vector<16xf32>", self.mr
        xp_t, vi = f"memref<{mr}x{self.k}xf32>", "vector<16xi32>"
        self._indices(e, rows, p)
        e(f"{p}%xor = arith.constant dense<-2139062144> : {vi}")  # 0x80808080
        e(f"{p}%m255 = arith.constant dense<255> : {vi}")
        e(f"{p}%magic = arith.constant dense<1258291200> : {vi}")  # 0x4B000000: 2^23
        e(f"{p}%off = arith.constant dense<8388736.0> : {vt}")  # 2^23 + 128
        for j in range(1, 4):
            e(f"{p}%sh{j} = arith.constant dense<{8 * j}> : {vi}")
        accs = [f"%acc{r}_{j}" for r in range(rows) for j in range(nr)]
        tys = ", ".join([vt] * len(accs))
        iters = ", ".join(f"{a} = %zero" for a in accs)
        e(f"{p}%c64s = arith.constant 64 : index")
        e(
            f"{p}%res:{len(accs)} = scf.for %k = %c0 to %c{self.k} step %c64s "
            f"iter_args({iters}) -> ({tys}) {{"
        )
        q = p + "  "
        cur = {(r, j): f"%acc{r}_{j}" for r in range(rows) for j in range(nr)}
        for pj in range(4):
            e(f"{q}%kx{pj} = affine.apply affine_map<()[s0] -> (s0 + {16 * pj})>()[%k]")
            for r in range(rows):
                e(f"{q}%x{pj}_{r} = vector.load %xp[%c{r}, %kx{pj}] : {xp_t}, {vt}")
        for j in range(nr):
            e(f"{q}%qb{j} = vector.load %mq[%n{j}, %k] : {q_t}, vector<64xi8>")
            e(f"{q}%qd{j} = vector.bitcast %qb{j} : vector<64xi8> to {vi}")
            e(f"{q}%qx{j} = arith.xori %qd{j}, %xor : {vi}")
            for pj in range(4):
                u = f"{j}_{pj}"
                src = f"%qx{j}"
                if pj:
                    e(f"{q}%qs{u} = arith.shrui %qx{j}, %sh{pj} : {vi}")
                    src = f"%qs{u}"
                if pj < 3:
                    e(f"{q}%qm{u} = arith.andi {src}, %m255 : {vi}")
                    src = f"%qm{u}"
                e(f"{q}%qo{u} = arith.ori {src}, %magic : {vi}")
                e(f"{q}%qf{u} = arith.bitcast %qo{u} : {vi} to {vt}")
                e(f"{q}%qw{u} = arith.subf %qf{u}, %off : {vt}")
                for r in range(rows):
                    e(f"{q}%a{u}_{r} = vector.fma %x{pj}_{r}, %qw{u}, {cur[r, j]} : {vt}")
                    cur[r, j] = f"%a{u}_{r}"
        e(
            f"{q}scf.yield "
            + ", ".join(cur[r, j] for r in range(rows) for j in range(nr))
            + f" : {tys}"
        )
        e(f"{p}}}")
        self._store(e, rows, "%res", c_t, p)
