"""The AVX-512 direct-convolution kernel (an implicit-im2col variant of :mod:`.avx512`'s matmul
kernel), fp32 and bf16; :mod:`.direct_convs` rewrites the compile copy's convolutions onto it.

A convolution is the matmul ``out[m, f] = sum_k cols[m, k] * w[k, f]`` over ``m = (n, oh, ow)``
and ``k = (ky, kx, c)``; the im2col copy ``cols`` is ``KH * KW`` times the input. This kernel
never writes it: it reads the zero-padded **channels-last** input ``xp[n, hp, wp, c]`` in place,
where row ``m``'s entry ``k`` is ``xp[n, oh*sh + ky*dh, ow*sw + kx*dw, c]``: an offset per row
(its window's origin) plus an offset per kernel row ``ky`` plus ``kx * C + c``, contiguous over
``(kx, c)`` when the width is not dilated (a *segment* of ``KW * C`` elements; dilated widths:
one segment of ``C`` per tap). So the register block, panels and workgroups are the matmul
kernel's (``mr x nr`` = 4 x 64 of C in 16 zmm accumulators, each step one broadcast of the
input per row and ``nr / 16`` loads of the weight panel), with the reduction walked as segments:

- the weight ``w[f, c, ky, kx]`` is packed once (a weight: by IREE's constant hoisting) as
  ``[K, F]`` with ``k = (ky, kx, c)``, in :mod:`.avx512`'s ``nr``-column panels;
- a reduction block is as many whole segments as fit in ``kc`` elements, or ``kc`` elements of
  one segment: the panel block is read by each of the workgroup's rows, and each register
  block's accumulators pass through C once per reduction block. :func:`conv_kernel_for`
  chooses per CPU vendor: on AMD ``kc`` 256 (a 64 KiB block, in L2) over 128-row workgroups of
  4 x 64 blocks; on Intel ``kc`` 128 (32 KiB, in L1) over 96-row workgroups of 6 x 64 blocks,
  with the next block's panel prefetched into L2 as the row blocks go;
- C is ``[N * OH * OW, Np]`` (channels-last); rows left over at the end use the smaller
  register blocks (1 to ``mr - 1`` rows).

The kernel's epilogue (:mod:`.epilogues`: per-channel scale and shift, a residual, ReLU) is
applied in the last reduction block's store; with ``out_pad`` it writes C zero-padded as the
next convolution reads it.

The bf16 form (``precision="bf16"``, :mod:`.bf16`) reads a *pair* of reduction elements (``c``,
``c + 1`` of one tap: adjacent in the channels-last input) as one 32-bit word, multiplied into
the f32 accumulators by ``vdpbf16ps`` (AVX512-BF16), as :mod:`.avx512`'s bf16 matmul form does;
its input channels must be even (:mod:`.direct_convs` pads an odd count with a zero channel).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from .activations import ACTIVATIONS, store_activation
from .avx512 import avx2_row_block, emit_accumulator_init, emit_epilogue, fma
from .convs import Conv
from .host import cpu_vendor
from .isa import kernel_isa
from .kernel_text import close_executable, open_static_executable, row_blocks

__all__ = ["CONV_BLOCKING_ENV", "CONV_KC", "Avx512Conv", "conv_kernel_for", "panel_width"]

#: Environment variable replacing the kernel's blocking for every convolution, for measurements:
#: ``fixed`` (the matmul kernel's 4 x 64 registers, reduction blocks of 128, 128 x 64
#: workgroups: the blocking before reduction blocks of :data:`CONV_KC`) or ``key=value`` pairs
#: over it (``mr``, ``nr``, ``kc``, ``rows``, ``cols``, e.g. ``rows=32,kc=64``); unset or
#: empty: the choice of :func:`conv_kernel_for`.
CONV_BLOCKING_ENV = "TURBINE_CPU_CONV_BLOCKING"
#: The reduction block of :func:`conv_kernel_for`'s default (elements of the input's segments).
CONV_KC = 256
_BLOCKING_KEYS = {
    "mr": "mr",
    "nr": "nr",
    "kc": "kc",
    "rows": "rows_per_workgroup",
    "cols": "cols_per_workgroup",
    "pf": "prefetch",
    "pfl": "prefetch_locality",
}


@dataclass(frozen=True)
class Avx512Conv:
    """One direct-convolution executable for a static geometry.

    Attributes:
        g: the convolution (NCHW sizes, stride, padding, dilation).
        mr, nr, kc: the register block (rows, columns) and the reduction block (elements).
        rows_per_workgroup, cols_per_workgroup: the workgroup's block of C.
        prefetch: cache lines of the next reduction block's panel prefetched per step (0:
            none), at the step's position in that block; the register blocks take turns over
            the step's ``nr / 16`` lines, so a workgroup's row blocks together fetch the whole
            next block (docs/performance.md, section 10).
        prefetch_locality: ``memref.prefetch``'s locality: 3 (L1, ``prefetcht0``), 2 (L2).
        scale, shift, residual, relu, hardswish, silu, sigmoid, hardsigmoid: the epilogue of
            the last reduction block's store (:mod:`.epilogues`): ``* scale[f]``, ``+
            shift[f]`` (each an ``Np``-float operand), ``+ residual[m, f]`` (an ``M x Np``
            operand), then ``max(., 0)``, torch's hardswish, SiLU, sigmoid or hardsigmoid (one
            at most; the last two: a squeeze-excitation's gate).
        out_pad: C written zero-padded by ``(rows, columns)`` on each side, as the next
            convolution reads it (``[N, OH + 2 * ph, OW + 2 * pw, Np]``: the border zeros, the
            interior the output); ``(0, 0)``: C is ``[M, Np]``.
    """

    g: Conv
    mr: int = 4
    nr: int = 64
    kc: int = 128
    rows_per_workgroup: int = 128
    cols_per_workgroup: int = 64
    prefetch: int = 0
    prefetch_locality: int = 3
    scale: bool = False
    shift: bool = False
    residual: bool = False
    relu: bool = False
    hardswish: bool = False
    silu: bool = False
    sigmoid: bool = False
    hardsigmoid: bool = False
    out_pad: tuple[int, int] = (0, 0)
    bf16: bool = False

    @property
    def operand_dtype(self) -> str:
        """The operand element type the kernel reads (the input and the packed weight)."""
        return "bf16" if self.bf16 else "f32"

    @property
    def unit(self) -> int:
        """Elements per step of the reduction: 2 (a pair of bf16 values) or 1 (f32)."""
        return 2 if self.bf16 else 1

    def __post_init__(self) -> None:
        if self.bf16 and (self.g.c % 2 or self.kc % 2):
            raise ValueError(f"AVX-512 bf16 convolution kernel: odd channels or block: {self}")
        if self.g.n is None:
            raise ValueError("AVX-512 convolution kernel: the batch must be static")
        if self.nr % 16 or self.cols_per_workgroup % self.nr or self.np_ % self.cols_per_workgroup:
            raise ValueError(f"AVX-512 convolution kernel: bad column blocking: {self}")
        if self.mr < 1 or self.mr * self.nr // 16 > 24 or self.kc < 1:
            raise ValueError(f"AVX-512 convolution kernel: bad register block: {self}")

    @property
    def np_(self) -> int:
        """The output channels padded to whole panels."""
        return -(-self.g.f // self.nr) * self.nr

    @property
    def m(self) -> int:
        """The output pixels (rows of C)."""
        assert self.g.n is not None
        return self.g.n * self.g.oh * self.g.ow

    @property
    def k(self) -> int:
        return self.g.kh * self.g.kw * self.g.c

    @property
    def c_rows(self) -> int:
        """Rows of C: the output pixels, with the border of :attr:`out_pad`."""
        assert self.g.n is not None
        qh, qw = self.out_pad
        return self.g.n * (self.g.oh + 2 * qh) * (self.g.ow + 2 * qw)

    @property
    def input_size(self) -> int:
        """Elements of the padded channels-last input the kernel reads."""
        assert self.g.n is not None
        return self.g.n * self.g.hp * self.g.wp * self.g.c

    @property
    def segments(self) -> int:
        """The reduction's contiguous runs in the input: one per kernel row (``KW * C``
        elements) when the width is not dilated, else one per tap (``C`` elements)."""
        return self.g.kh if self.g.dilation[1] == 1 else self.g.kh * self.g.kw

    @property
    def segment_length(self) -> int:
        return self.k // self.segments

    @property
    def segments_per_block(self) -> int:
        """Segments per reduction block (each whole) when one fits in ``kc``, else 1."""
        n, length = self.segments, self.segment_length
        return max(1, min(n, self.kc // length)) if length <= self.kc else 1

    @property
    def block_length(self) -> int:
        """Elements of a segment per reduction block."""
        return min(self.segment_length, self.kc)

    @property
    def name(self) -> str:
        g = self.g
        return (
            f"__turbine_avx512_{self.operand_dtype}_conv_n{g.n}_c{g.c}_h{g.h}_w{g.w}_f{self.np_}_k{g.kh}x{g.kw}"
            f"_s{g.stride[0]}x{g.stride[1]}_p{g.padding[0]}x{g.padding[1]}"
            f"_d{g.dilation[0]}x{g.dilation[1]}_{self.mr}x{self.nr}x{self.kc}"
            f"_{self.rows_per_workgroup}x{self.cols_per_workgroup}_pf{self.prefetch}"
            + (f"l{self.prefetch_locality}" if self.prefetch else "")
            + "".join(f"_{e}" for e in self.epilogue)
            + (f"_opad{self.out_pad[0]}x{self.out_pad[1]}" if any(self.out_pad) else "")
        )

    @property
    def activation(self) -> str | None:
        """The activation of the store other than ReLU, if any."""
        return store_activation(self)

    @property
    def epilogue(self) -> tuple[str, ...]:
        """The epilogue's steps, in order (empty: the kernel stores its sums)."""
        steps = ("scale", "shift", "residual", *ACTIVATIONS)
        return tuple(s for s in steps if getattr(self, s))

    def dispatch(self, a: str, b: str, *extra: str) -> str:
        """The ``flow.dispatch`` of this kernel: ``a`` the padded NHWC input (1-D), ``b`` the
        packed weight (1-D), both of :attr:`operand_dtype`, ``extra`` the epilogue's operands
        (scale, shift: ``Np`` floats; residual: ``M x Np``); the result is
        ``tensor<M x Np x f32>``."""
        types = {
            "scale": f"tensor<{self.np_}xf32>",
            "shift": f"tensor<{self.np_}xf32>",
            "residual": f"tensor<{self.m}x{self.np_}xf32>",
        }
        extra_t = [types[s] for s in self.epilogue if s in types]
        if len(extra) != len(extra_t):
            raise ValueError(f"AVX-512 convolution kernel: operands {extra} for {self.name}")
        dt = self.operand_dtype
        operands = ", ".join([a, b, *extra])
        operand_t = ", ".join(
            [f"tensor<{self.input_size}x{dt}>", f"tensor<{self.k * self.np_}x{dt}>", *extra_t]
        )
        return (
            f"flow.dispatch @{self.name}::@{self.name}({operands}) : ({operand_t}) -> "
            f"tensor<{self.c_rows}x{self.np_}xf32>"
        )

    def executable(self) -> str:
        """The ``stream.executable`` (MLIR text) for a module's top level. Offsets along the
        reduction count steps (:attr:`unit` elements: bf16 reads i32 words, each a pair)."""
        mr, nr, u = self.mr, self.nr, self.unit
        mb, nb = self.rows_per_workgroup, self.cols_per_workgroup
        taps, c = self.segments, self.segment_length // u
        tb, cb = self.segments_per_block, self.block_length // u
        word = "i32" if self.bf16 else "f32"
        a_t = f"memref<{self.input_size // u}x{word}>"
        b_t = f"memref<{self.k * self.np_ // u}x{word}>"
        c_t = f"memref<{self.c_rows}x{self.np_}xf32>"
        r_t = f"memref<{self.m}x{self.np_}xf32>"  # the residual
        out: list[str] = []
        e = out.append
        name = self.name
        binds = ["%a", "%b", *(f"%{s}" for s in self.epilogue if s not in ACTIVATIONS), "%c"]
        open_static_executable(e, name, (self.np_ // nb, -(-self.m // mb)), binds)
        consts = (
            {0, 1, mr, nr, taps, c, tb, cb} | set(range(mr)) | {16 * j for j in range(nr // 16)}
        )
        for v in sorted(consts):
            e(f"      %c{v} = arith.constant {v} : index")
        e(f"      %ma = stream.binding.subspan %a[%c0] : !stream.binding -> {a_t}")
        e(f"      %mb = stream.binding.subspan %b[%c0] : !stream.binding -> {b_t}")
        e(f"      %mc = stream.binding.subspan %c[%c0] : !stream.binding -> {c_t}")
        v_t = f"memref<{self.np_}xf32>"
        for binding, memref, t in (("scale", "mscale", v_t), ("shift", "mbias", v_t)):
            if getattr(self, binding):
                e(
                    f"      %{memref} = stream.binding.subspan %{binding}[%c0] : !stream.binding -> {t}"
                )
        if self.residual:
            e(f"      %mres = stream.binding.subspan %residual[%c0] : !stream.binding -> {r_t}")
        e("      %zero = arith.constant dense<0.0> : vector<16xf32>")
        e("      %wgx = stream.dispatch.workgroup.id[0] : index")
        e("      %wgy = stream.dispatch.workgroup.id[1] : index")
        e(f"      %n0 = affine.apply affine_map<()[s0] -> (s0 * {nb})>()[%wgx]")
        e(f"      %m0 = affine.apply affine_map<()[s0] -> (s0 * {mb})>()[%wgy]")
        e(f"      %mend = affine.min affine_map<()[s0] -> (s0 + {mb}, {self.m})>()[%m0]")
        e(f"      %nbc = arith.constant {nb} : index")
        if any(self.out_pad):
            self._zero_border(e)
        e(f"      scf.for %t0 = %c0 to %c{taps} step %c{tb} {{")
        e(f"        %tend = affine.min affine_map<()[s0] -> (s0 + {tb}, {taps})>()[%t0]")
        e(f"        scf.for %k0 = %c0 to %c{c} step %c{cb} {{")
        e("          %t0z = arith.cmpi eq, %t0, %c0 : index")
        e("          %k0z = arith.cmpi eq, %k0, %c0 : index")
        e("          %first = arith.andi %t0z, %k0z : i1")
        e(f"          %kend = affine.min affine_map<()[s0] -> (s0 + {cb}, {c})>()[%k0]")
        if self.epilogue:
            e(f"          %tlast = arith.cmpi eq, %tend, %c{taps} : index")
            e(f"          %klast = arith.cmpi eq, %kend, %c{c} : index")
            e("          %last = arith.andi %tlast, %klast : i1")
        e(f"          scf.for %nn = %c0 to %nbc step %c{nr} {{")
        e("            %ncol = arith.addi %n0, %nn : index")
        # B element offset of (panel, k = 0)
        e(
            f"            %pbase = affine.apply affine_map<()[s0] -> ((s0 floordiv {nr}) * "
            f"{self.k * nr // u})>()[%ncol]"
        )
        e(f"            scf.for %mi = %m0 to %mend step %c{mr} {{")
        e(
            f"              %left = affine.min affine_map<()[s0, s1] -> ({mr}, s1 - s0)>()"
            "[%mi, %mend]"
        )
        row_blocks(e, "              ", mr, lambda r, p: self._micro(e, r, a_t, b_t, c_t, r_t, p))
        e("            }")
        e("          }")
        e("        }")
        e("      }")
        close_executable(e)
        return "\n".join(out)

    def _zero_border(self, e: Any) -> None:
        """The workgroups of the first row block zero their columns of C's border pixels."""
        g = self.g
        assert g.n is not None
        qh, qw = self.out_pad
        ohp, owp = g.oh + 2 * qh, g.ow + 2 * qw
        vt = "vector<16xf32>"
        c_t = f"memref<{self.c_rows}x{self.np_}xf32>"
        e("      %zb_first = arith.cmpi eq, %wgy, %c0 : index")
        e("      scf.if %zb_first {")
        e(f"        %zb_n = arith.constant {self.c_rows} : index")
        e("        scf.for %zp = %c0 to %zb_n step %c1 {")
        e(
            f"          %zh = affine.apply affine_map<()[s0] -> ((s0 mod {ohp * owp}) floordiv {owp})>()[%zp]"
        )
        e(f"          %zw = affine.apply affine_map<()[s0] -> (s0 mod {owp})>()[%zp]")
        e(f"          %zh_lo = arith.constant {qh} : index")
        e(f"          %zh_hi = arith.constant {qh + g.oh} : index")
        e(f"          %zw_lo = arith.constant {qw} : index")
        e(f"          %zw_hi = arith.constant {qw + g.ow} : index")
        e("          %zb1 = arith.cmpi ult, %zh, %zh_lo : index")
        e("          %zb2 = arith.cmpi uge, %zh, %zh_hi : index")
        e("          %zb3 = arith.cmpi ult, %zw, %zw_lo : index")
        e("          %zb4 = arith.cmpi uge, %zw, %zw_hi : index")
        e("          %zb12 = arith.ori %zb1, %zb2 : i1")
        e("          %zb34 = arith.ori %zb3, %zb4 : i1")
        e("          %zb = arith.ori %zb12, %zb34 : i1")
        e("          scf.if %zb {")
        for j in range(self.cols_per_workgroup // 16):
            e(f"            %zc{j} = affine.apply affine_map<()[s0] -> (s0 + {16 * j})>()[%n0]")
            e(f"            vector.store %zero, %mc[%zp, %zc{j}] : {c_t}, {vt}")
        e("          }")
        e("        }")
        e("      }")

    def _micro(self, e: Any, rows: int, a_t: str, b_t: str, c_t: str, r_t: str, p: str) -> None:
        """``rows`` x ``nr`` of C over one reduction block: load (or zero), FMAs, store."""
        g, nr, u = self.g, self.nr, self.unit
        nv = nr // 16
        vt = "vector<16xf32>"
        word = "i32" if self.bf16 else "f32"
        bt = f"vector<16x{word}>"
        ohw, ow, c = g.oh * g.ow, g.ow, g.c // u
        (sh, sw), (dh, dw) = g.stride, g.dilation
        hp, wp = self.g.hp, self.g.wp
        accs = [f"%acc{r}_{j}" for r in range(rows) for j in range(nv)]
        types = ", ".join([vt] * len(accs))
        # the element offset of row m's window origin: ((n * Hp + oh * sh) * Wp + ow * sw) * C
        origin = (
            f"affine_map<()[s0] -> ((((s0 floordiv {ohw}) * {hp} + ((s0 mod {ohw}) floordiv {ow})"
            f" * {sh}) * {wp} + (s0 mod {ow}) * {sw}) * {c})>"
        )
        qh, qw = self.out_pad
        # C's row of output pixel m (its place inside the zero border of out_pad)
        c_row = (
            f"affine_map<()[s0] -> ((s0 floordiv {ohw}) * {(g.oh + 2 * qh) * (ow + 2 * qw)} + "
            f"((s0 mod {ohw}) floordiv {ow} + {qh}) * {ow + 2 * qw} + (s0 mod {ow}) + {qw})>"
        )
        for r in range(rows):
            e(f"{p}%row{r} = arith.addi %mi, %c{r} : index")
            e(f"{p}%org{r} = affine.apply {origin}()[%row{r}]")
            if any(self.out_pad):
                e(f"{p}%crow{r} = affine.apply {c_row}()[%row{r}]")
            else:
                e(f"{p}%crow{r} = arith.addi %row{r}, %c0 : index")
            for j in range(nv):
                e(f"{p}%col{r}_{j} = arith.addi %ncol, %c{16 * j} : index")
        emit_accumulator_init(e, p, rows, nv, c_t, row="%crow")
        iters = ", ".join(f"{a} = %init#{i}" for i, a in enumerate(accs))
        e(
            f"{p}%res:{len(accs)} = scf.for %t = %t0 to %tend step %c1 iter_args({iters}) "
            f"-> ({types}) {{"
        )
        q = p + "  "
        # the tap's offset in the input and its first row of the packed weight
        if self.segments == g.kh:  # segment t: kernel row t, KW * C contiguous elements
            toff = f"s0 * {dh * wp * c}"
        else:  # segment t: tap (t / KW, t % KW), C contiguous elements
            toff = f"(s0 floordiv {g.kw}) * {dh * wp * c} + (s0 mod {g.kw}) * {dw * c}"
        e(f"{q}%toff = affine.apply affine_map<()[s0] -> ({toff})>()[%t]")
        seg = self.segment_length // u
        e(f"{q}%tb = affine.apply affine_map<()[s0, s1] -> (s0 + s1 * {seg * nr})>()[%pbase, %t]")
        for r in range(rows):
            e(f"{q}%torg{r} = arith.addi %org{r}, %toff : index")
        taccs = [f"%tacc{r}_{j}" for r in range(rows) for j in range(nv)]
        titers = ", ".join(f"{t} = {a}" for t, a in zip(taccs, accs))
        e(
            f"{q}%tres:{len(accs)} = scf.for %k = %k0 to %kend step %c1 iter_args({titers}) "
            f"-> ({types}) {{"
        )
        w = q + "  "
        e(f"{w}%boff = affine.apply affine_map<()[s0, s1] -> (s0 + s1 * {nr})>()[%tb, %k]")
        if self.prefetch:
            # the same step of the next reduction block (the panel is contiguous); each register
            # block prefetches other lines of the step's nr / 16 (rotating with its index), so
            # the workgroup's row blocks together cover the whole next block
            last = self.k * self.np_ // u - 1
            dist = self.segments_per_block * self.block_length * nr // u
            lines = nr // 16
            for j in range(self.prefetch):
                e(
                    f"{w}%pf{j} = affine.min affine_map<()[s0, s1, s2] -> (s0 + {dist} + "
                    f"((((s1 - s2) floordiv {self.mr}) * {self.prefetch} + {j}) mod {lines}) * 16,"
                    f" {last})>()[%boff, %mi, %m0]"
                )
                e(
                    f"{w}memref.prefetch %mb[%pf{j}], read, locality<{self.prefetch_locality}>,"
                    f" data : {b_t}"
                )
        for j in range(nv):
            e(f"{w}%bo{j} = arith.addi %boff, %c{16 * j} : index")
            e(f"{w}%bv{j} = vector.load %mb[%bo{j}] : {b_t}, {bt}")
        outs = []
        for r in range(rows):
            e(f"{w}%ai{r} = arith.addi %torg{r}, %k : index")
            e(f"{w}%as{r} = memref.load %ma[%ai{r}] : {a_t}")
            e(f"{w}%ab{r} = vector.broadcast %as{r} : {word} to {bt}")
            for j in range(nv):
                e(f"{w}%f{r}_{j} = " + fma(f"%ab{r}", f"%bv{j}", f"%tacc{r}_{j}", self.bf16))
                outs.append(f"%f{r}_{j}")
        e(f"{w}scf.yield " + ", ".join(outs) + f" : {types}")
        e(f"{q}}}")
        e(f"{q}scf.yield " + ", ".join(f"%tres#{i}" for i in range(len(accs))) + f" : {types}")
        e(f"{p}}}")
        results = [f"%res#{i}" for i in range(len(accs))]

        def store(v: str, r: int, j: int, prefix: str) -> None:
            e(f"{prefix}vector.store {v}, %mc[%crow{r}, %col{r}_{j}] : {c_t}, {vt}")

        if self.epilogue:
            v_t = f"memref<{self.np_}xf32>"
            emit_epilogue(
                e,
                p,
                rows,
                nv,
                results,
                store,
                scale=v_t if self.scale else None,
                bias=v_t if self.shift else None,
                residual=r_t if self.residual else None,
                relu=self.relu,
                activation=self.activation,
            )
        else:
            for r in range(rows):
                for j in range(nv):
                    store(results[r * nv + j], r, j, p)


def _env_blocking(spec: str) -> dict[str, int]:
    """The fields ``spec`` (``fixed`` or ``key=value,...``) sets."""
    if spec == "fixed":
        return {}
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = part.partition("=")
        if key.strip() not in _BLOCKING_KEYS or not value.strip().isdigit():
            raise ValueError(
                f"{CONV_BLOCKING_ENV}={spec!r}: expected 'fixed' or key=value pairs over "
                f"{', '.join(_BLOCKING_KEYS)}"
            )
        out[_BLOCKING_KEYS[key.strip()]] = int(value)
    return out


def conv_kernel_for(g: Conv, bf16: bool = False) -> Avx512Conv:
    """The kernel (and its blocking) for the convolution ``g``: ``$TURBINE_CPU_CONV_BLOCKING``
    when set, else the measured per-shape choice (docs/performance.md, section 10). ``bf16``:
    the bf16 form where the input channels are even (the rewrite pads odd ones; else f32)."""
    bf16 = bf16 and g.c % 2 == 0
    spec = os.environ.get(CONV_BLOCKING_ENV, "").strip().lower()
    if spec:
        fields: dict[str, Any] = _env_blocking(spec)
        return replace(Avx512Conv(g, bf16=bf16), **fields)
    if kernel_isa() == "avx2" and not bf16:
        # 16 ymm registers: 6 x 16 accumulators (12 ymm), docs/performance.md section 19
        np_ = -(-g.f // 16) * 16
        cols = next(c for c in (32, 16) if np_ % c == 0)
        kernel = Avx512Conv(g, mr=6, nr=16, kc=CONV_KC, cols_per_workgroup=cols)
        # few pixels (a 3 x 3 map: 9 rows as 5 + 4, not 6 + 3; section 23)
        return replace(kernel, mr=avx2_row_block(kernel.m, kernel.mr, kernel.rows_per_workgroup))
    # Measured per CPU vendor (docs/performance.md, section 10; the values are the same
    # whatever the blocking: each element's sum runs in the same order).
    kernel = _vendor_blocking(g, bf16)
    nr = panel_width(g.f) if not bf16 else kernel.nr
    if nr != kernel.nr:  # few output channels: narrower panels, more rows (section 17)
        kernel = replace(kernel, nr=nr, mr=_NARROW_MR, cols_per_workgroup=nr)
    return kernel


#: The register block's rows for panels narrower than 64 (12 x 32 or 12 x 16 accumulators).
_NARROW_MR = 12
#: The relative FMA rate of the kernel's register blocks by panel width, measured on the
#: Intel Xeon (docs/performance.md, section 17): a 64-wide panel loads 4 weight vectors for 6
#: broadcasts, a 16-wide one 1 for 12, so its FMAs wait on loads.
_PANEL_RATE = {64: 1.0, 32: 0.85, 16: 0.5}


def panel_width(f: int) -> int:
    """The panel width (``nr``) for ``f`` output channels: the one whose useful share of the
    padded columns, times its rate, is highest (64 on a tie): 16 channels 16 (64 would
    compute 4x the outputs), 24 or 80 channels 32, 40, 112 or 120 channels 64."""

    def value(nr: int) -> tuple[float, int]:
        return (f / (-(-f // nr) * nr) * _PANEL_RATE[nr], nr)

    return max(_PANEL_RATE, key=value)


def _vendor_blocking(g: Conv, bf16: bool) -> Avx512Conv:
    if cpu_vendor() == "GenuineIntel":
        # Xeon (Sapphire Rapids class): 6 x 64 register blocks in workgroups of 96 rows,
        # reduction blocks of 128 (a 32 KiB panel block stays in the 48 KiB L1), and the next
        # block's panel prefetched into L2 one line a step: ResNet-18 / -50 7-8 % faster at
        # one thread, the 7 x 7 and 14 x 14 layers (whose weights stream from L3) 16-20 %
        return Avx512Conv(
            g, mr=6, rows_per_workgroup=96, prefetch=1, prefetch_locality=2, bf16=bf16
        )
    # AMD EPYC (Zen 4) and others: reduction blocks of 256, not the matmul kernel's 128: half
    # the passes of each register block over its accumulators in C, 4-19 % faster per ResNet
    # layer on Zen 4 (192-512 alike there)
    return Avx512Conv(g, kc=CONV_KC, bf16=bf16)
