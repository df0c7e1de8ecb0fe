"""The AVX-512 fp32 direct-convolution kernel (an implicit-im2col variant of :mod:`.avx512`'s
matmul kernel) and the rewrite that calls it for the 2-D convolutions of the compile copy.

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
  one segment (``kc`` 256 by default, :func:`conv_kernel_for`; 128 in the matmul kernel): the
  panel block (64 KiB, in L2) is read by each of the workgroup's 128 rows, and each register
  block's accumulators pass through C once per reduction block;
- C is ``[N * OH * OW, Np]`` (channels-last); rows left over at the end use the 1-3 row kernels.

The rewrite (:func:`rewrite_convs_avx512`, applied by ``rewrites.module_for_compile`` where the
fp32 matmul kernel is the choice) turns each accepted ``torch.aten.convolution`` / ``conv2d``
into a call of a private function over builtin tensors (IREE inlines it)::

    xp  = pad(transpose(x, NCHW -> NHWC))                   (one copy, the input's size)
    c   = flow.dispatch @kernel(xp, pack(w))
    out = transpose(c[:, :F] + b, NHWC -> NCHW)

With the epilogues (:mod:`.epilogues`, unless ``TURBINE_CPU_EPILOGUES=keep``) the bias, an
eval-mode batch norm after the convolution (as a per-channel scale and shift), a residual add
and a ReLU are done by the kernel in its last reduction block's store: the call replaces the
last of those ops; when that result is read only by another direct convolution with padding,
the kernel writes it zero-padded as that one reads it (``out_pad``) and IREE copies nothing in
between. Without them (or for what is not absorbed) the element-wise ops sit between a
transpose to NCHW and one back; IREE's element-wise fusion folds them into the one dispatch
that writes the next padded input, so the relayouts cost one pass over each activation
(docs/performance.md, sections 10 and 11). No ``util.optimization_barrier`` is needed: the
kernel's operands are read by a ``flow.dispatch`` IREE does not fuse into, and the producers
it sees read their inputs through permutations (the IREE 3.13 miscompile in :mod:`.convs` needs
a windowed ``linalg.generic``); ``tests/test_cpu_conv_avx512.py`` checks the shared-producer
case. Accepted: 2-D, fp32, groups 1, not transposed, static shapes (the batch too), any kernel
size, channels, stride, padding and dilation; the rest stays on :mod:`.convs`' path.

``precision="bf16"`` (:mod:`.bf16`) gives the kernel's bf16 form: the padded input is converted
to bf16 in the dispatch that writes it, the weight once, and each step reads a *pair* of
reduction elements (``c``, ``c + 1`` of one tap: adjacent in the channels-last input) as one
32-bit word, multiplied into the f32 accumulators by ``vdpbf16ps`` (AVX512-BF16), as
:mod:`.avx512`'s bf16 matmul form does. An odd channel count (an RGB stem) gets one zero channel
on the input (in the same padding) and on the weight, so pairs never straddle two taps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from .avx512 import (
    AVX512_BF16_FEATURES,
    AVX512_FEATURES,
    emit_accumulator_init,
    emit_epilogue,
    fma,
)
from .convs import Conv, conv_geometry
from .epilogues import (
    BatchNorm,
    channel_affine,
    eval_batch_norm,
    fusion_enabled,
    only_user,
    padded_outputs_enabled,
    same_shape_add,
)
from .matmuls import mark_cpu_requires
from .torch_ir import TensorType, TopLevel, walk

__all__ = [
    "CONV_BLOCKING_ENV",
    "Avx512Conv",
    "conv_kernel_for",
    "direct_convs",
    "rewrite_convs_avx512",
]

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
}

_CONV_OPS = ("torch.aten.conv2d", "torch.aten.convolution")
_FUNC_PREFIX = "__turbine_avx512_conv"


@dataclass(frozen=True)
class Avx512Conv:
    """One direct-convolution executable for a static geometry.

    Attributes:
        g: the convolution (NCHW sizes, stride, padding, dilation).
        mr, nr, kc: the register block (rows, columns) and the reduction block (elements).
        rows_per_workgroup, cols_per_workgroup: the workgroup's block of C.
        prefetch: cache lines of the next reduction block prefetched per step (0: none; 1-4
            measured slower, docs/performance.md, section 10).
        scale, shift, residual, relu: the epilogue of the last reduction block's store
            (:mod:`.epilogues`): ``* scale[f]``, ``+ shift[f]`` (each an ``Np``-float operand),
            ``+ residual[m, f]`` (an ``M x Np`` operand), then ``max(., 0)``.
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
    scale: bool = False
    shift: bool = False
    residual: bool = False
    relu: bool = False
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
    def hp(self) -> int:
        return self.g.h + 2 * self.g.padding[0]

    @property
    def wp(self) -> int:
        return self.g.w + 2 * self.g.padding[1]

    @property
    def input_size(self) -> int:
        """Elements of the padded channels-last input the kernel reads."""
        assert self.g.n is not None
        return self.g.n * self.hp * self.wp * self.g.c

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
            + "".join(f"_{e}" for e in self.epilogue)
            + (f"_opad{self.out_pad[0]}x{self.out_pad[1]}" if any(self.out_pad) else "")
        )

    @property
    def epilogue(self) -> tuple[str, ...]:
        """The epilogue's steps, in order (empty: the kernel stores its sums)."""
        steps = ("scale", "shift", "residual", "relu")
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
        e(f"stream.executable private @{name} {{")
        e(f"  stream.executable.export public @{name} workgroups() -> (index, index, index) {{")
        e(f"    %x = arith.constant {self.np_ // nb} : index")
        e(f"    %y = arith.constant {-(-self.m // mb)} : index")
        e("    %z = arith.constant 1 : index")
        e("    stream.return %x, %y, %z : index, index, index")
        e("  }")
        e("  builtin.module {")
        bindings = "".join(f"%{s}: !stream.binding, " for s in self.epilogue if s != "relu")
        e(
            f"    func.func @{name}(%a: !stream.binding, %b: !stream.binding, {bindings}"
            "%c: !stream.binding) {"
        )
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
        p = "              "
        if mr > 1:
            e(f"{p}scf.index_switch %left")
            for r in range(1, mr):
                e(f"{p}case {r} {{")
                self._micro(e, r, a_t, b_t, c_t, r_t, p + "  ")
                e(f"{p}  scf.yield")
                e(f"{p}}}")
            e(f"{p}default {{")
            self._micro(e, mr, a_t, b_t, c_t, r_t, p + "  ")
            e(f"{p}}}")
        else:
            self._micro(e, 1, a_t, b_t, c_t, r_t, p)
        e("            }")
        e("          }")
        e("        }")
        e("      }")
        e("      return")
        e("    }")
        e("  }")
        e("}")
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
        hp, wp = self.hp, self.wp
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
        if self.prefetch:  # the same position of the next reduction block (the panel is contiguous)
            last = self.k * self.np_ // u - 1
            dist = self.segments_per_block * self.block_length * nr // u
            for j in range(self.prefetch):
                e(
                    f"{w}%pf{j} = affine.min affine_map<()[s0] -> (s0 + {dist + 16 * j}, {last})>()"
                    "[%boff]"
                )
                e(f"{w}memref.prefetch %mb[%pf{j}], read, locality<3>, data : {b_t}")
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
        if self.epilogue:
            v_t = f"memref<{self.np_}xf32>"
            results = emit_epilogue(
                e,
                p,
                rows,
                nv,
                results,
                scale=v_t if self.scale else None,
                bias=v_t if self.shift else None,
                residual=r_t if self.residual else None,
                relu=self.relu,
            )
        for r in range(rows):
            for j in range(nv):
                e(
                    f"{p}vector.store {results[r * nv + j]}, %mc[%crow{r}, %col{r}_{j}] : {c_t}, {vt}"
                )


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
    # reduction blocks of 256, not the matmul kernel's 128: half the passes of each register
    # block over its accumulators in C, 4-19 % faster per ResNet layer on the AMD EPYC (Zen 4)
    # of docs/performance.md, section 10 (192-512 alike there; the values are the same: each
    # element's sum runs in the same order whatever the blocking)
    return Avx512Conv(g, kc=CONV_KC, bf16=bf16)


def _spec(op: Any) -> Conv | None:
    g = conv_geometry(op)
    if g is None or g.n is None:
        return None
    return g


def direct_convs(module_op: Any) -> list[Any]:
    """The convolutions of ``module_op`` that :func:`rewrite_convs_avx512` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name in _CONV_OPS and _spec(o) is not None]


def _tensor(*dims: int) -> str:
    return "tensor<" + "x".join(str(d) for d in dims) + "xf32>"


def _truncf_1d(result: str, src: str, size: int) -> str:
    """``result = bf16(src)`` over a 1-D f32 tensor of ``size`` elements."""
    bf_t = f"tensor<{size}xbf16>"
    return (
        f"  {result}_init = tensor.empty() : {bf_t}\n"
        f"  {result} = linalg.generic {{indexing_maps = [affine_map<(i) -> (i)>, "
        f'affine_map<(i) -> (i)>], iterator_types = ["parallel"]}} ins({src} : {_tensor(size)}) '
        f"outs({result}_init : {bf_t}) {{\n"
        "  ^bb0(%tv: f32, %to: bf16):\n"
        "    %tt = arith.truncf %tv : f32 to bf16\n"
        "    linalg.yield %tt : bf16\n"
        f"  }} -> {bf_t}"
    )


def _function(
    name: str,
    kernel: Avx512Conv,
    bn_eps: float | None = None,
    padded_input: bool = False,
    channels: int | None = None,
    affine: list[tuple[str, list[Any]]] | None = None,
) -> str:
    """The private function computing the convolution through ``kernel`` (builtin tensors).

    Its arguments: ``%x`` (NCHW; ``padded_input``: the previous kernel's zero-padded NHWC
    output as this kernel reads it, flat), ``%w``, the bias ``%b`` if the convolution has one,
    then for the kernel's epilogue (:mod:`.epilogues`) a batch norm's ``%gamma``, ``%beta``,
    ``%mean``, ``%var`` (``bn_eps`` given: folded into the kernel's scale and shift) or the
    per-channel parameters ``%p<i>`` of ``affine`` (``(kind, sizes)`` steps: ``sub``, ``mul``,
    ``add``, folded the same way), and the residual ``%res`` (NCHW, the output's shape). It
    returns the NCHW output and, for a kernel with :attr:`Avx512Conv.out_pad`, C as the next
    convolution reads it (flat). ``channels``: the convolution's input channels where the kernel's are more (zero channels
    padded onto the input and the weight: an odd count made even for the bf16 form)."""
    g = kernel.g
    assert g.n is not None
    n, c, h, w, f = g.n, g.c, g.h, g.w, g.f
    c0 = c if channels is None else channels
    x_t, w0_t, out_t = _tensor(n, c0, h, w), _tensor(f, c0, g.kh, g.kw), _tensor(n, f, g.oh, g.ow)
    f_t = _tensor(f)
    if padded_input:
        x_t = _tensor(kernel.input_size)
    w_arg = "%w0" if c != c0 else "%w"
    args = f"%x: {x_t}, {w_arg}: {w0_t}" + (f", %b: {f_t}" if g.bias else "")
    if bn_eps is not None:
        args += "".join(f", %{v}: {f_t}" for v in ("gamma", "beta", "mean", "var"))
    affine = affine or []
    args += "".join(f", %p{i}: {_tensor(*sizes)}" for i, (_, sizes) in enumerate(affine))
    if kernel.residual:
        args += f", %res: {out_t}"
    padded_out = any(kernel.out_pad)
    results_t = f"({out_t}, {_tensor(kernel.c_rows * f)})" if padded_out else out_t
    lines = [f"func.func private @{name}({args}) -> {results_t} {{"]
    e = lines.append
    e("  %zero = arith.constant 0.0 : f32")
    if c != c0:  # the weight's zero channels
        e(f"  %w = tensor.pad %w0 low[0, 0, 0, 0] high[0, {c - c0}, 0, 0] {{")
        e("  ^bb0(%q0: index, %q1: index, %q2: index, %q3: index):")
        e("    tensor.yield %zero : f32")
        e(f"  }} : {w0_t} to {_tensor(f, c, g.kh, g.kw)}")
    extra = _epilogue_operands(e, kernel, bn_eps, affine)
    if padded_input:
        a_name = "%a32" if kernel.bf16 else "%a"
        e(f"  {a_name} = tensor.cast %x : {x_t} to {x_t}")
        if kernel.bf16:
            e(_truncf_1d("%a", "%a32", kernel.input_size))
    else:
        _input(e, kernel, x_t, c0)
    _rest(e, kernel, out_t, extra)
    return "\n".join(lines)


def _input(e: Any, kernel: Avx512Conv, x_t: str, c0: int) -> None:
    """Emits ``%a``: the NCHW ``%x`` (``c0`` channels) as the kernel reads it (NHWC,
    zero-padded, flat; in bf16 for the bf16 form)."""
    g = kernel.g
    assert g.n is not None
    n, c, h, w = g.n, g.c, g.h, g.w
    (ph, pw) = g.padding
    nhwc_t, xp_t = _tensor(n, h, w, c0), _tensor(n, kernel.hp, kernel.wp, c)
    e(f"  %xt_init = tensor.empty() : {nhwc_t}")
    e(
        f"  %xt = linalg.transpose ins(%x : {x_t}) outs(%xt_init : {nhwc_t}) permutation = [0, 2, 3, 1]"
    )
    src, src_t = "%xt", nhwc_t
    if ph or pw or c != c0:
        e(f"  %xp = tensor.pad %xt low[0, {ph}, {pw}, 0] high[0, {ph}, {pw}, {c - c0}] {{")
        e("  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):")
        e("    tensor.yield %zero : f32")
        e(f"  }} : {nhwc_t} to {xp_t}")
        src, src_t = "%xp", xp_t
    dims = "[[" + ", ".join("0123") + "]]"
    a_name = "%a32" if kernel.bf16 else "%a"
    e(
        f"  {a_name} = tensor.collapse_shape {src} {dims} : {src_t} into {_tensor(kernel.input_size)}"
    )
    if kernel.bf16:  # converted in the dispatch that writes the padded input
        e(_truncf_1d("%a", "%a32", kernel.input_size))


def _rest(e: Any, kernel: Avx512Conv, out_t: str, extra: list[str]) -> None:
    """Emits the weight's packing, the dispatch and the function's results."""
    g = kernel.g
    assert g.n is not None
    n, c, f = g.n, g.c, g.f
    np_, k, nr = kernel.np_, kernel.k, kernel.nr
    w_t = _tensor(f, c, g.kh, g.kw)
    wt_t, kf_t = _tensor(g.kh, g.kw, c, f), _tensor(k, f)
    # the weight: [F, C, KH, KW] -> [KH, KW, C, F] -> [K, F] -> pad F -> panels [P, K, nr]
    e(f"  %wt_init = tensor.empty() : {wt_t}")
    e(
        f"  %wt = linalg.transpose ins(%w : {w_t}) outs(%wt_init : {wt_t}) permutation = [2, 3, 1, 0]"
    )
    e(f"  %wk = tensor.collapse_shape %wt [[0, 1, 2], [3]] : {wt_t} into {kf_t}")
    wk, wk_t = "%wk", kf_t
    if np_ != f:
        e(f"  %wpad = tensor.pad %wk low[0, 0] high[0, {np_ - f}] {{")
        e("  ^bb0(%j0: index, %j1: index):")
        e("    tensor.yield %zero : f32")
        e(f"  }} : {kf_t} to {_tensor(k, np_)}")
        wk, wk_t = "%wpad", _tensor(k, np_)
    p = np_ // nr
    if kernel.bf16:  # panels of pairs: [K/2, 2, P, nr] -> [P, K/2, nr, 2]
        ex_sizes, reassoc, perm = [k // 2, 2, p, nr], "[[0, 1], [2, 3]]", [2, 0, 3, 1]
    else:  # panels: [K, P, nr] -> [P, K, nr]
        ex_sizes, reassoc, perm = [k, p, nr], "[[0], [1, 2]]", [1, 0, 2]
    ex_t, pan_t = _tensor(*ex_sizes), _tensor(*(ex_sizes[i] for i in perm))
    e(
        f"  %wex = tensor.expand_shape {wk} {reassoc} output_shape "
        f"[{', '.join(map(str, ex_sizes))}] : {wk_t} into {ex_t}"
    )
    e(f"  %wpan_init = tensor.empty() : {pan_t}")
    e(
        f"  %wpan = linalg.transpose ins(%wex : {ex_t}) outs(%wpan_init : {pan_t}) "
        f"permutation = [{', '.join(map(str, perm))}]"
    )
    all_dims = ", ".join(str(i) for i in range(len(perm)))
    bp_name = "%bp32" if kernel.bf16 else "%bp"
    e(f"  {bp_name} = tensor.collapse_shape %wpan [[{all_dims}]] : {pan_t} into {_tensor(k * np_)}")
    if kernel.bf16:  # a weight: converted once, with the packing (constant hoisting)
        e(_truncf_1d("%bp", "%bp32", k * np_))
    e("  %cm = " + kernel.dispatch("%a", "%bp", *extra))
    m = kernel.m
    cm, cm_t = "%cm", _tensor(m, np_)
    padded_out = any(kernel.out_pad)
    if padded_out:  # np_ == f: C flat for the next kernel, and its interior as the output
        qh, qw = kernel.out_pad
        ohp, owp = g.oh + 2 * qh, g.ow + 2 * qw
        e(
            f"  %cflat = tensor.collapse_shape %cm [[0, 1]] : {_tensor(kernel.c_rows, f)} into {_tensor(kernel.c_rows * f)}"
        )
        p4_t = _tensor(n, ohp, owp, f)
        e(
            f"  %c4 = tensor.expand_shape %cm [[0, 1, 2], [3]] output_shape [{n}, {ohp}, {owp}, {f}] : {_tensor(kernel.c_rows, f)} into {p4_t}"
        )
        e(
            f"  %ci = tensor.extract_slice %c4[0, {qh}, {qw}, 0] [{n}, {g.oh}, {g.ow}, {f}] [1, 1, 1, 1] : {p4_t} to {_tensor(n, g.oh, g.ow, f)}"
        )
        e(
            f"  %cm2 = tensor.collapse_shape %ci [[0, 1, 2], [3]] : {_tensor(n, g.oh, g.ow, f)} into {cm_t}"
        )
        cm = "%cm2"
    if np_ != f:
        e(f"  %cs = tensor.extract_slice %cm[0, 0] [{m}, {f}] [1, 1] : {cm_t} to {_tensor(m, f)}")
        cm, cm_t = "%cs", _tensor(m, f)
    o_t = _tensor(n, g.oh, g.ow, f)
    e(
        f"  %o = tensor.expand_shape {cm} [[0, 1, 2], [3]] output_shape [{n}, {g.oh}, {g.ow}, {f}] : {cm_t} into {o_t}"
    )
    e(f"  %out_init = tensor.empty() : {out_t}")
    if g.bias and not kernel.shift:  # the bias add and the transpose back to NCHW: one op
        e(
            "  %out = linalg.generic {indexing_maps = ["
            "affine_map<(n, f, h, w) -> (n, h, w, f)>, affine_map<(n, f, h, w) -> (f)>, "
            "affine_map<(n, f, h, w) -> (n, f, h, w)>], iterator_types = "
            '["parallel", "parallel", "parallel", "parallel"]} '
            f"ins(%o, %b : {o_t}, {_tensor(f)}) outs(%out_init : {out_t}) {{"
        )
        e("  ^bb0(%v: f32, %bv: f32, %u: f32):")
        e("    %s = arith.addf %v, %bv : f32")
        e("    linalg.yield %s : f32")
        e(f"  }} -> {out_t}")
    else:
        e(
            f"  %out = linalg.transpose ins(%o : {o_t}) outs(%out_init : {out_t}) permutation = [0, 3, 1, 2]"
        )
    if padded_out:
        e(f"  return %out, %cflat : {out_t}, {_tensor(kernel.c_rows * f)}")
    else:
        e(f"  return %out : {out_t}")
    e("}")


def _vector_op(e: Any, result: str, ins: list[str], body: list[str], f: int) -> None:
    """``result = linalg.generic`` over ``[f]`` vectors ``ins`` (block arguments ``%i0``...;
    ``body`` ends by defining ``%r``)."""
    f_t = _tensor(f)
    maps = ", ".join(["affine_map<(d0) -> (d0)>"] * (len(ins) + 1))
    e(f"  {result}_init = tensor.empty() : {f_t}")
    e(
        f"  {result} = linalg.generic {{indexing_maps = [{maps}], iterator_types = "
        f'["parallel"]}} ins({", ".join(ins)} : {", ".join([f_t] * len(ins))}) '
        f"outs({result}_init : {f_t}) {{"
    )
    e("  ^bb0(" + ", ".join(f"%i{i}: f32" for i in range(len(ins))) + ", %o: f32):")
    for line in body:
        e(f"    {line}")
    e("    linalg.yield %r : f32")
    e(f"  }} -> {f_t}")


def _epilogue_operands(
    e: Any, kernel: Avx512Conv, bn_eps: float | None, affine: list[tuple[str, list[Any]]]
) -> list[str]:
    """Emits the kernel's epilogue operands (scale, shift: padded to ``Np``; the residual as
    ``M x Np``) from the function's arguments; returns their names, in the kernel's order."""
    g = kernel.g
    assert g.n is not None
    f, np_ = g.f, kernel.np_
    vectors: list[str] = []
    if bn_eps is not None:  # y = (conv + b - mean) / sqrt(var + eps) * gamma + beta
        e(f"  %eps = arith.constant {bn_eps:.9e} : f32")
        _vector_op(
            e,
            "%scale",
            ["%gamma", "%var"],
            [
                "%ve = arith.addf %i1, %eps : f32",
                "%sd = math.sqrt %ve : f32",
                "%r = arith.divf %i0, %sd : f32",
            ],
            f,
        )
        if g.bias:  # shift = beta + (b - mean) * scale
            ins = ["%beta", "%mean", "%scale", "%b"]
            body = ["%bm = arith.subf %i3, %i1 : f32", "%ms = arith.mulf %bm, %i2 : f32"]
            body.append("%r = arith.addf %i0, %ms : f32")
        else:  # shift = beta - mean * scale
            ins = ["%beta", "%mean", "%scale"]
            body = ["%ms = arith.mulf %i1, %i2 : f32", "%r = arith.subf %i0, %ms : f32"]
        _vector_op(e, "%shift", ins, body, f)
        vectors = ["%scale", "%shift"]
    elif affine:
        vectors = _affine_vectors(e, affine, f, "%b" if g.bias else None)
    elif kernel.shift:
        vectors = ["%b"]
    out: list[str] = []
    for v in vectors:
        if np_ != f:
            e(f"  {v}_np = tensor.pad {v} low[0] high[{np_ - f}] {{")
            e("  ^bb0(%pi: index):")
            e("    tensor.yield %zero : f32")
            e(f"  }} : {_tensor(f)} to {_tensor(np_)}")
            v = f"{v}_np"
        out.append(v)
    if kernel.residual:
        assert np_ == f, "a residual needs whole panels"
        nhwc = _tensor(g.n, g.oh, g.ow, f)
        e(f"  %rt_init = tensor.empty() : {nhwc}")
        e(
            f"  %rt = linalg.transpose ins(%res : {_tensor(g.n, f, g.oh, g.ow)}) "
            f"outs(%rt_init : {nhwc}) permutation = [0, 2, 3, 1]"
        )
        e(
            f"  %rm = tensor.collapse_shape %rt [[0, 1, 2], [3]] : {nhwc} into {_tensor(kernel.m, f)}"
        )
        out.append("%rm")
    return out


def _affine_vectors(
    e: Any, affine: list[tuple[str, list[Any]]], f: int, bias: str | None
) -> list[str]:
    """Emits the kernel's ``[f]`` scale and shift (those it has, in that order) folding the
    steps ``affine`` applied to ``conv + bias``: ``- p`` and ``+ p`` move the shift, ``* p``
    scales both."""
    scale, shift = None, bias
    ops = {"sub": "arith.subf", "add": "arith.addf", "mul": "arith.mulf"}
    for i, (kind, sizes) in enumerate(affine):
        dims = ", ".join(str(d) for d in range(len(sizes)))
        e(
            f"  %pv{i} = tensor.collapse_shape %p{i} [[{dims}]] : {_tensor(*sizes)} into {_tensor(f)}"
        )
        p = f"%pv{i}"
        if kind == "mul":
            if scale is not None:
                _vector_op(e, f"%sc{i}", [scale, p], ["%r = arith.mulf %i0, %i1 : f32"], f)
            scale = f"%sc{i}" if scale is not None else p
        if shift is not None:
            _vector_op(e, f"%sh{i}", [shift, p], [f"%r = {ops[kind]} %i0, %i1 : f32"], f)
            shift = f"%sh{i}"
        elif kind == "add":
            shift = p
        elif kind == "sub":
            _vector_op(e, f"%sh{i}", [p], ["%r = arith.negf %i0 : f32"], f)
            shift = f"%sh{i}"
    return [v for v in (scale, shift) if v is not None]


def _absorbed(
    conv: Any, g: Conv, np_: int
) -> tuple[BatchNorm | None, list[tuple[Any, str, Any]], Any, list[Any]]:
    """What the kernel absorbs after ``conv`` (:mod:`.epilogues`): ``(batch norm, per-channel
    steps, residual, ops)``, ``ops`` the absorbed ops in order (the last one's result is the
    call's)."""
    ops: list[Any] = []
    value = conv.results[0]
    bn = eval_batch_norm(value, g.f)
    affine: list[tuple[Any, str, Any]] = []
    if bn is not None:
        ops.append(bn.op)
        value = bn.op.results[0]
    else:  # a batch norm as torch.export decomposes it, or any per-channel scale and shift
        affine = channel_affine(value, g.f)
        ops += [step[0] for step in affine]
        if affine:
            value = affine[-1][0].results[0]
    residual = None
    add = same_shape_add(value) if np_ == g.f else None
    if add is not None:
        ops.append(add[0])
        residual, value = add[1], add[0].results[0]
    relu = only_user(value, "torch.aten.relu")
    if relu is not None:
        ops.append(relu)
    return bn, affine, residual, ops


def _padded_consumer(
    value: Any, found: list[tuple[Any, Conv | None]], start: int
) -> tuple[int, Conv] | None:
    """``(index, geometry)`` of the convolution of ``found[start:]`` reading ``value`` as its input,
    ``value``'s one use, with padding: the kernel producing ``value`` then writes it zero-padded
    as that convolution reads it (:attr:`Avx512Conv.out_pad`), and IREE copies nothing in
    between."""
    uses = list(value.uses)
    if len(uses) != 1 or uses[0].operand_number != 0:
        return None
    user = uses[0].owner
    for i in range(start, len(found)):
        o, g = found[i]
        if o.operation == user.operation and g is not None and any(g.padding):
            return i, g
    return None


def rewrite_convs_avx512(module_op: Any, bf16: bool = False) -> int:
    """Rewrites, in place, each convolution :func:`direct_convs` finds as a call of the AVX-512
    direct-convolution kernel (see the module doc); ``bf16``: its bf16 form
    (``precision="bf16"``), the module then marked as needing AVX512-BF16.

    Returns:
        How many convolutions were rewritten.
    """
    from turbine_ir.ir import FlatSymbolRefAttr, InsertionPoint, Operation, Type

    op = getattr(module_op, "operation", module_op)
    top = TopLevel(op)
    found = [(o, _spec(o)) for o in direct_convs(op)]
    fuse = fusion_enabled()
    # convolutions (their index in found) whose input is an earlier kernel's padded output
    padded_inputs: dict[int, Any] = {}
    any_bf16 = False
    for index, (conv, g) in enumerate(found):
        assert g is not None and g.n is not None
        # bf16 reads channel pairs: an odd channel count gets one zero channel (the stems)
        pad_c = bf16 and g.c % 2 == 1
        kernel = conv_kernel_for(replace(g, c=g.c + 1) if pad_c else g, bf16)
        any_bf16 = any_bf16 or kernel.bf16
        f_t, out_t = _tensor(g.f), _tensor(g.n, g.f, g.oh, g.ow)
        types = [_tensor(g.n, g.c, g.h, g.w), _tensor(g.f, g.c, g.kh, g.kw), f_t]
        operands = list(conv.operands)[: 3 if g.bias else 2]
        types = types[: len(operands)]
        bn, affine, residual, absorbed = (
            _absorbed(conv, g, kernel.np_) if fuse else (None, [], None, [])
        )
        kinds = [kind for _, kind, _ in affine]
        consumer = None
        if fuse:
            final = absorbed[-1].results[0] if absorbed else conv.results[0]
            # not in bf16: the next kernel reads bf16, so a conversion pass stays anyway
            if padded_outputs_enabled() and kernel.np_ == g.f and not bf16:
                consumer = _padded_consumer(final, found, index + 1)
            kernel = replace(
                kernel,
                scale=bn is not None or "mul" in kinds,
                shift=bn is not None or g.bias or any(k != "mul" for k in kinds),
                residual=residual is not None,
                relu=bool(absorbed) and absorbed[-1].name == "torch.aten.relu",
                out_pad=consumer[1].padding if consumer is not None else (0, 0),
            )
        if bn is not None:
            operands += [bn.weight, bn.bias, bn.mean, bn.var]
            types += [f_t] * 4
        for _, _, param in affine:
            operands.append(param)
            sizes = TensorType.of(param).sizes  # type: ignore[union-attr]
            types.append(_tensor(*sizes))  # type: ignore[arg-type]
        if residual is not None:
            operands.append(residual)
            types.append(out_t)
        padded = padded_inputs.pop(index, None)
        if kernel.name not in top:
            top.append(kernel.executable())
        name = top.unique(f"{_FUNC_PREFIX}_{index}")
        eps = bn.eps if bn is not None else None
        steps = [(kind, TensorType.of(p).sizes) for _, kind, p in affine]  # type: ignore[union-attr]
        top.append(
            _function(
                name,
                kernel,
                eps,
                padded_input=padded is not None,
                channels=g.c if pad_c else None,
                affine=steps,
            )
        )
        anchor = absorbed[-1] if absorbed else conv  # operands of absorbed ops may come later
        with conv.location, InsertionPoint(anchor):
            builtin = [
                Operation.create(
                    "torch_c.to_builtin_tensor",
                    results=[Type.parse(t, conv.context)],
                    operands=[v],
                ).result
                for v, t in zip(operands, types)
            ]
            if padded is not None:  # the previous kernel's C, as this kernel reads it
                builtin[0] = padded
            results = [Type.parse(out_t, conv.context)]
            if consumer is not None:
                results.append(Type.parse(_tensor(kernel.c_rows * g.f), conv.context))
            call = Operation.create(
                "func.call",
                results=results,
                operands=builtin,
                attributes={"callee": FlatSymbolRefAttr.get(name)},
            )
            back = Operation.create(
                "torch_c.from_builtin_tensor",
                results=[conv.results[0].type],
                operands=[call.results[0]],
            ).result
        if consumer is not None:
            padded_inputs[consumer[0]] = call.results[1]
        if absorbed:
            absorbed[-1].results[0].replace_all_uses_with(back)
        for fused in reversed(absorbed):
            fused.erase()
        conv.results[0].replace_all_uses_with(back)
        conv.erase()
    if found:
        mark_cpu_requires(op, AVX512_BF16_FEATURES if any_bf16 else AVX512_FEATURES)
    return len(found)
