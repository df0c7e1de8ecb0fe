"""The AMX bf16 convolution kernel: :mod:`.amx`'s matmul kernel reading a stride-1 convolution's
zero-padded channels-last input in place (an implicit im2col), for ``precision="bf16"`` on CPUs
with AMX-BF16. :mod:`.direct_convs` calls it for every convolution that is not dilated
(:func:`amx_conv_supports`; strided ones and channel counts that are not a multiple of 32 through
:class:`AmxConvPlan`), dilated ones keep the AVX-512 direct kernel's bf16 form.

A convolution of stride 1 and dilation 1 over the padded input ``xp[n, hp, wp, c]`` is, per
image, the matmul ``C[r, f] = sum_{ky, kx, c} xp_flat[r + ky * wp + kx, c] * w[f, c, ky, kx]``
over the rows ``r = oh * wp + x`` of an output grid as wide as the *padded* input: row ``r``'s
entries of one tap ``(ky, kx)`` are ``C`` channels at ``xp_flat[(r + ky * wp + kx) * C]``, so the
16 rows of an AMX tile are 16 input pixels ``C * 2`` bytes apart, whatever output row they fall
in. ``tileloadd`` reads such a tile directly (its stride operand), 32 channels (64 bytes) of one
tap per reduction step; the reduction walks the taps and the channels in blocks of 32 (``C`` must
be a multiple of 32). The grid's ``wp - ow`` extra columns per output row are computed and
dropped (``ow`` of the ``wp`` columns are kept: 56 of 58 in a ResNet's first stage, 7 of 9 in its
last), which buys a kernel that never copies the input nine times; the reads of the last rows'
extra columns run up to ``kw - 1`` pixels past the image, so the input gets one more zero row
at the bottom (:mod:`.direct_convs` pads it in the dispatch that writes the input anyway).

Everything else is :class:`.amx.AmxGemm`'s: 32 x 32 register blocks of ``C`` in four tiles, the
weight packed once (by IREE's constant hoisting) in the tile order of ``B`` with ``k = (ky, kx,
c)``, workgroups of 128 rows x 64 (or 32) columns, one batch entry each, the tile permission
asked for by the kernel itself. ``C`` is ``[n * oh * wp, Np]`` f32; the caller slices the
``ow`` real columns out, fused with the transpose back to NCHW. The epilogue
(:attr:`AmxConv.scale_shift`, :attr:`AmxConv.relu`: the bias, a batch norm or per-channel steps
folded into a scale and shift, and a ReLU) runs over each 32-column block of ``C`` right after
its tiles are stored, while it is in the cache. With whole panels it also adds a residual
(:attr:`AmxConv.residual`, read channels-last) before the ReLU, and, where the next
convolution is an AMX one over the result (at stride 1, or strided through its space-to-depth
form: :attr:`AmxConv.out_next_s2d`), writes that convolution's input itself: bf16,
zero-padded, in the layout its kernel reads (:attr:`AmxConv.out_next`), so that IREE runs
no copy, padding or conversion pass between the two; where nothing else reads the result the
f32 ``C`` is then not written at all (:attr:`AmxConv.f32_out`). Where a strided 1x1
convolution reads the result (a ResNet's shortcut at a stage transition), the kernel also
writes that convolution's input, every ``sh``-th pixel of every ``sw``-th row in bf16
(:attr:`AmxConv.out_strided`), instead of an f32 result the shortcut would subsample and
round in a pass of its own.

Measured: docs/performance.md, section 8 ("Convolutions on AMX") and section 18.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .activations import relu_line
from .amx import AmxGemm, padded
from .convs import Conv
from .host import cpu_flags
from .workgroups import balanced_rows

__all__ = [
    "AMX_CONV_ENV",
    "AmxConv",
    "AmxConvPlan",
    "amx_conv_enabled",
    "amx_conv_plan",
    "amx_conv_supports",
]

#: Environment variable: ``off`` keeps every ``precision="bf16"`` convolution on the AVX-512
#: direct kernel's bf16 form (for A/B measurements; part of the compile cache's key).
AMX_CONV_ENV = "TURBINE_CPU_AMX_CONV"

#: Input channels per reduction step (one 64-byte tile row of bf16).
_C_STEP = 32
#: Input channels of a convolution whose tile rows hold two taps of 16 channels each.
_HALF_STEP = 16
#: The stack's scratch block of a per-pixel epilogue: 32 rows of C's 32 columns, each row
#: padded to 48 floats (192 bytes, not a power of two: its rows spread over the L1 sets).
_SCRATCH_COLS = 48
_SCRATCH_T = f"memref<32x{_SCRATCH_COLS}xf32>"
#: Reductions of at least this many ``k`` prefetch their weight tiles (:attr:`AmxConv.prefetch_steps`).
_PREFETCH_MIN_K = 1024
#: How many reduction steps ahead.
_PREFETCH_STEPS = 4


def _to_bf16(e, q: str, result: str, v: str, native: bool) -> None:
    """``result`` = ``v`` (``vector<16xf32>``) rounded to ``vector<16xbf16>``: ``native``, one
    ``vcvtneps2bf16`` (AVX512-BF16: round to nearest even, NaN kept, f32 subnormals flushed as
    IREE's CPU runtime does anyway); else ``arith.truncf``, which IREE expands into seven
    integer instructions (docs/performance.md, section 29)."""
    if not native:
        e(f"{q}{result} = arith.truncf {v} : vector<16xf32> to vector<16xbf16>")
        return
    e(
        f'{q}{result}i = llvm.inline_asm "vcvtneps2bf16 $1, $0", "=v,v" {v} : '
        "(vector<16xf32>) -> vector<16xi16>"
    )
    e(f"{q}{result} = vector.bitcast {result}i : vector<16xi16> to vector<16xbf16>")


def _emit_pixel_index(e, q: str, name: str, expr: str) -> None:
    """``name`` = ``expr`` (an affine expression of the batch entry ``s0``, the output row
    ``s1``, the output column ``s2`` and the block's first channel ``s3``: where the epilogue's
    pixel goes in one of its results) and ``name``1 = 16 channels on (the block's second
    vector)."""
    e(
        f"{q}{name} = affine.apply affine_map<()[s0, s1, s2, s3] -> {expr}>()"
        "[%wgz, %eoy, %eox, %ncol]"
    )
    e(f"{q}{name}1 = arith.addi {name}, %c16 : index")


def amx_conv_enabled() -> bool:
    """Whether the bf16 rewrite may use this kernel (unless ``TURBINE_CPU_AMX_CONV=off``)."""
    return os.environ.get(AMX_CONV_ENV, "").strip().lower() != "off"


def amx_conv_supports(g: Conv) -> bool:
    """Whether :class:`AmxConv` computes ``g`` (through :func:`amx_conv_plan`): static and not
    dilated (dilated convolutions keep the AVX-512 kernel)."""
    return g.n is not None and g.dilation == (1, 1) and g.c > 0


@dataclass(frozen=True)
class AmxConvPlan:
    """How a convolution becomes the stride-1 convolution :class:`AmxConv` computes.

    A stride ``(sh, sw)`` convolution is a stride-1 one over the input's *space-to-depth*
    form: ``xs[n, i, j, (py, px, c)] = xp[n, sh * i + py, sw * j + px, c]`` (``sh * sw`` times
    the channels, ``1 / (sh * sw)`` the pixels), with the kernel ``ceil(kh / sh) x ceil(kw /
    sw)`` over ``w2[f, (py, px, c), a, b] = w[f, c, sh * a + py, sw * b + px]`` (zero past the
    kernel's edge): tap ``ky = sh * a + py`` of output row ``oh`` reads row ``sh * (oh + a) +
    py``. The kernel leaves out the 32-channel blocks of a tap whose phases are all past the
    kernel's edge (:attr:`AmxConv.s2d`): a 3x3 stride-2 convolution over whole blocks of
    channels computes 9 taps' products, not 16 (docs/performance.md, section 18: ResNet-50's
    three 0.81 / 0.43 / 0.31 ms → 0.48 / 0.28 / 0.22). Where a block mixes phases (fewer than
    32 channels a phase) it runs if any of them is inside; a ResNet stem's 7x7 stride-2 over 3
    channels (16 taps of 16 channels, two taps a tile row) runs all of them (512 products an
    output for 147). A strided 1x1 convolution instead reads every ``sh``-th
    row and ``sw``-th column (``th``, ``tw``) and is a stride-1 1x1 one: its space-to-depth
    weight would be three quarters zeros, and IREE does not hoist a packed weight that much
    larger than the original (it would pack it at every call). The input channels are padded
    with zeros to ``c_pad`` so that ``sh * sw * c_pad`` is a multiple of 32 (the kernel's tile
    rows).

    Attributes:
        sh, sw: the space-to-depth factors (the stride, or 1).
        th, tw: the steps at which the padded input is read (the stride of a 1x1, or 1).
        c_pad: input channels after zero padding.
        kh2, kw2: the stride-1 kernel's size.
        rows, cols: the padded input's size in the space-to-depth form (``rows`` includes the
            kernel's extra zero row; ``cols`` is the kernel's output-grid width).
    """

    sh: int
    sw: int
    th: int
    tw: int
    c_pad: int
    kh2: int
    kw2: int
    rows: int
    cols: int

    @property
    def height(self) -> int:
        """Rows taken from the zero-padded input (every ``th``-th), before space-to-depth."""
        return self.sh * self.rows

    @property
    def width(self) -> int:
        """Columns taken from the zero-padded input (every ``tw``-th), before space-to-depth."""
        return self.sw * self.cols

    @property
    def extent(self) -> tuple[int, int]:
        """Rows and columns of the zero-padded input those are taken from."""
        return self.th * (self.height - 1) + 1, self.tw * (self.width - 1) + 1


def amx_conv_plan(g: Conv) -> tuple[AmxConvPlan, AmxConv]:
    """The plan and the kernel for a convolution :func:`amx_conv_supports` accepts."""
    assert amx_conv_supports(g) and g.n is not None, g
    sh, sw = g.stride
    th = tw = 1
    if g.kh == g.kw == 1:  # a 1x1 reads a strided subset of the input instead
        sh, sw, th, tw = 1, 1, sh, sw
    kh2, kw2 = -(-g.kh // sh), -(-g.kw // sw)
    c_pad = g.c
    # 16 channels where a whole tile row can hold two taps (an even kernel width): the RGB
    # stems' space-to-depth form (3 -> 4 channels x 2 x 2), half the products of 32
    step = _HALF_STEP if sh * sw * c_pad <= _HALF_STEP and kw2 % 2 == 0 else _C_STEP
    while (sh * sw * c_pad) % step:
        c_pad += 1
    plan = AmxConvPlan(sh, sw, th, tw, c_pad, kh2, kw2, g.oh + kh2, g.ow + kw2 - 1)
    c2 = sh * sw * c_pad
    np_ = padded(g.f)
    kernel = AmxConv(
        kh2 * kw2 * c2,
        np_,
        False,
        128,
        64 if np_ % 64 == 0 else 32,
        c=c2,
        kh=kh2,
        kw=kw2,
        oh=g.oh,
        wp=plan.cols,
        n=g.n,
        s2d=(sh, sw, g.kh, g.kw) if sh * sw > 1 else None,
    )
    # rows per workgroup that IREE's workers share evenly (docs/performance.md, section 35)
    kernel = balanced_rows(kernel, kernel.m, g.n)
    return plan, kernel


@dataclass(frozen=True)
class AmxConv(AmxGemm):
    """One AMX bf16 convolution executable, for a static geometry (see the module doc).

    Attributes (besides :class:`.amx.AmxGemm`'s, with ``kp = kh * kw * c``):
        c: input channels (a multiple of 32).
        kh, kw: the kernel's size.
        oh: output rows.
        wp: the padded input's width (the output grid's width: ``ow + kw - 1``).
        n: images.
        scale_shift: the epilogue ``C * scale + shift`` per output channel (two ``[np_]`` f32
            operands after B: a batch norm, a bias), applied to each stored 32-column block
            while it is in the cache.
        relu: then ``max(C, 0)``.
        residual: then ``+ res`` (an operand after the scale and shift: ``[n * oh * ow, np_]``
            f32, the output's pixels channels-last), before the ReLU.
        residual_layout: ``(rows, cols, ph, pw)``: the residual is bf16 instead, laid out as
            an earlier AMX kernel's :attr:`out_next` result (``[n, rows, cols, np_]`` flat, the
            pixels at ``(ph, pw)``): that kernel's result read in place.
        out_next: ``(rows, cols, ph, pw)``: the kernel also writes its result in bf16 as the
            next convolution's kernel reads its input (a second result, ``[n, rows, cols,
            np_]`` flat: the ``oh x ow`` pixels at ``(ph, pw)``, zeros around them), so that
            no copy or conversion pass runs in between (docs/performance.md, section 18).
        out_next_f32: the :attr:`out_next` result in f32, for a max pooling rather than a
            convolution (:func:`.pools.max_pool_function` with ``padded_input``).
        out_next_s2d: ``(sh, sw)``: the :attr:`out_next` result in the space-to-depth form a
            strided convolution's kernel reads (:class:`AmxConvPlan`): ``rows x cols`` are
            then the form's pixels, each ``sh * sw`` of the padded input's (``[n, rows, cols,
            sh, sw, np_]`` flat); the output's pixels at ``(ph, pw)`` of the padded input
            (``sh rows x sw cols``), zeros around them.
        out_strided: ``(rows, cols, sh, sw)``: the kernel also writes, in bf16, the input of
            a strided 1x1 convolution over its output (stride ``(sh, sw)``, no padding) as
            that convolution's kernel reads it (a further result, ``[n, rows, cols, np_]``
            flat: output pixel ``(sh i, sw j)`` at ``(i, j)``; the rows past the last such
            pixel, the kernel's extra zero row, zero). Whole panels only (``np_`` is the
            reader's channel count).
        f32_out: with :attr:`out_next` or :attr:`out_strided`, whether the f32 result is
            written too (``False`` where nothing else reads it: the kernel's first result is
            then left unwritten).
        s2d: ``(sh, sw, kh, kw)`` where the input is a strided convolution's space-to-depth
            form (:class:`AmxConvPlan`): its stride and its own kernel's size. The reduction
            then leaves out the 32-channel blocks whose weights are zero for a tap, the
            phases past the kernel's edge (:meth:`k_runs`: a 3x3 stride-2 convolution
            computes 9 taps' products, not 16).

    With :attr:`residual` or :attr:`out_next` the register block's tiles are stored to a
    scratch block on the workgroup's stack (32 rows of 48 floats) rather than to ``C``, and the
    epilogue reads them there: rows of ``C`` are ``4 np_`` bytes apart, a power of two for
    most layers, so a block's 32 rows, the residual's and the bf16 result's fall into the same
    few sets of the L1 cache and evict each other (docs/performance.md, section 18).
    """

    c: int = field(default=_C_STEP, kw_only=True)
    kh: int = field(default=1, kw_only=True)
    kw: int = field(default=1, kw_only=True)
    oh: int = field(default=1, kw_only=True)
    wp: int = field(default=1, kw_only=True)
    n: int = field(default=1, kw_only=True)
    scale_shift: bool = field(default=False, kw_only=True)
    relu: bool = field(default=False, kw_only=True)
    residual: bool = field(default=False, kw_only=True)
    residual_layout: tuple[int, int, int, int] | None = field(default=None, kw_only=True)
    out_next: tuple[int, int, int, int] | None = field(default=None, kw_only=True)
    out_next_f32: bool = field(default=False, kw_only=True)
    out_next_s2d: tuple[int, int] = field(default=(1, 1), kw_only=True)
    out_strided: tuple[int, int, int, int] | None = field(default=None, kw_only=True)
    f32_out: bool = field(default=True, kw_only=True)
    s2d: tuple[int, int, int, int] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        half = self.c == _HALF_STEP and self.kw % 2 == 0
        if (self.c % _C_STEP and not half) or self.kp != self.kh * self.kw * self.c:
            raise ValueError(
                f"AMX convolution: channels must be a multiple of 32 (or 16, with an even "
                f"kernel width): {self}"
            )
        if self.batch_b:
            raise ValueError(f"AMX convolution: one weight for every image: {self}")
        if self.out_next is not None:
            rows, cols, ph, pw = self._out_next_padded
            if ph < 0 or pw < 0 or ph + self.oh > rows or pw + self.ow > cols:
                raise ValueError(f"AMX convolution: the output does not fit {self.out_next}")
        if self.out_strided is not None:
            rows, cols, sh, sw = self.out_strided
            if rows < -(-self.oh // sh) or cols != -(-self.ow // sw):
                raise ValueError(
                    f"AMX convolution: the strided result does not fit {self.out_strided}"
                )
        if self.out_next is None and self.out_strided is None and not self.f32_out:
            raise ValueError(f"AMX convolution: no result to write: {self}")

    @property
    def prefetch_steps(self) -> int:
        """Weight tiles prefetched :data:`_PREFETCH_STEPS` steps ahead where the reduction is
        at least :data:`_PREFETCH_MIN_K` long: a workgroup's weight panel is then larger than
        L1 and its first strip reads it from L3 or memory (ResNet-50's stages 3 and 4;
        docs/performance.md, section 29)."""
        return _PREFETCH_STEPS if self.kp >= _PREFETCH_MIN_K else 0

    @property
    def _out_next_padded(self) -> tuple[int, int, int, int]:
        """:attr:`out_next` as the padded input's rows and columns (``sh rows``, ``sw
        cols``) and where the output's pixels start in it."""
        assert self.out_next is not None
        rows, cols, ph, pw = self.out_next
        sh, sw = self.out_next_s2d
        return sh * rows, sw * cols, ph, pw

    def _out_next_map(self, row: str, col: str) -> str:
        """The affine map (symbols: the batch entry, ``row`` / ``col`` expressions of the
        padded input's row and column in ``s1`` / ``s2``, the channel) to the element of
        :attr:`out_next`'s result."""
        rows, cols, _, _ = self.out_next  # type: ignore[misc]
        sh, sw = self.out_next_s2d
        if (sh, sw) == (1, 1):
            return f"(((s0 * {rows} + {row}) * {cols} + {col}) * {self.np_} + s3)"
        return (
            f"(((s0 * {rows} + ({row}) floordiv {sh}) * {cols} + ({col}) floordiv {sw}) * "
            f"{sh * sw * self.np_} + (({row}) mod {sh} * {sw} + ({col}) mod {sw}) * {self.np_} "
            "+ s3)"
        )

    @property
    def _residual_shape(self) -> str:
        """The residual operand's shape and element type (:attr:`residual`,
        :attr:`residual_layout`), as a tensor or memref type spells them."""
        if self.residual_layout is None:
            return f"{self.n * self.oh * self.ow}x{self.np_}xf32"
        rows, cols, _, _ = self.residual_layout
        return f"{self.n * rows * cols * self.np_}xbf16"

    @property
    def residual_type(self) -> str:
        """The residual operand's tensor type."""
        return f"tensor<{self._residual_shape}>"

    @property
    def out_next_type(self) -> str:
        """The tensor type of the :attr:`out_next` result."""
        return f"tensor<{self.out_next_size}x{self.out_next_dtype}>"

    @property
    def out_strided_size(self) -> int:
        """Elements of the :attr:`out_strided` result (bf16)."""
        assert self.out_strided is not None
        rows, cols, _, _ = self.out_strided
        return self.n * rows * cols * self.np_

    @property
    def out_strided_type(self) -> str:
        """The tensor type of the :attr:`out_strided` result."""
        return f"tensor<{self.out_strided_size}xbf16>"

    @property
    def out_next_dtype(self) -> str:
        """The element type of the :attr:`out_next` result."""
        return "f32" if self.out_next_f32 else "bf16"

    @property
    def _per_pixel(self) -> bool:
        """Whether the epilogue works pixel by pixel (a residual, a bf16 result) from the
        stack's scratch block."""
        return self.residual or self.out_next is not None or self.out_strided is not None

    @property
    def ow(self) -> int:
        """Output columns (the grid's first ``ow`` of its ``wp``)."""
        return self.wp - self.kw + 1

    @property
    def out_next_size(self) -> int:
        """Elements of the :attr:`out_next` result (:attr:`out_next_dtype`)."""
        assert self.out_next is not None
        rows, cols, _, _ = self.out_next
        sh, sw = self.out_next_s2d
        return self.n * rows * cols * sh * sw * self.np_

    @property
    def image_rows(self) -> int:
        """Rows of one image of the input as the kernel reads it: the padded rows
        (``oh + kh - 1``) and one zero row for the extra columns' reads."""
        return self.oh + self.kh

    @property
    def input_size(self) -> int:
        """Elements of the input operand (``[n, image_rows, wp, c]``, flat, bf16)."""
        return self.n * self.image_rows * self.wp * self.c

    @property
    def m(self) -> int:
        """Rows of ``C`` per image: the output grid ``oh x wp``."""
        return self.oh * self.wp

    @property
    def name(self) -> str:
        perm = "" if self.request_permission else "_noperm"
        epilogue = (
            ("_ss" if self.scale_shift else "")
            + ("_res" if self.residual else "")
            + ("b{}x{}p{}x{}".format(*self.residual_layout) if self.residual_layout else "")
            + ("_relu" if self.relu else "")
        )
        if self.out_next is not None:
            epilogue += "_to{}x{}p{}x{}".format(*self.out_next)
            epilogue += "f32" if self.out_next_f32 else ""
            if self.out_next_s2d != (1, 1):
                epilogue += "s{}x{}".format(*self.out_next_s2d)
        if self.out_strided is not None:
            epilogue += "_sub{}x{}s{}x{}".format(*self.out_strided)
        if not self.f32_out:
            epilogue += "_nof32"
        if self.s2d is not None and self._skips_blocks:
            epilogue += "_s{}x{}of{}x{}".format(*self.s2d)
        return (
            f"__turbine_amx_bf16_conv_{self.n}x{self.image_rows}x{self.wp}x{self.c}"
            f"_k{self.kh}x{self.kw}_f{self.np_}{epilogue}{perm}"
            f"_{self.rows_per_workgroup}x{self.cols_per_workgroup}"
        )

    def conv_dispatch(
        self,
        a: str,
        b: str,
        scale_shift: tuple[str, str] | None = None,
        residual: str | None = None,
    ) -> list[str]:
        """Lines computing ``%cm`` (``tensor<{n * m}x{np_}xf32>``) from ``a`` (the input,
        ``tensor<{input_size}xbf16>``), ``b`` (the packed weight), with :attr:`scale_shift`
        the ``tensor<{np_}xf32>`` scale and shift, with :attr:`residual` the residual
        (``tensor<{n * oh * ow}x{np_}xf32>``); with :attr:`out_next` also ``%cnext``
        (``tensor<{out_next_size}x{out_next_dtype}>``), with :attr:`out_strided` ``%cstr``
        (:attr:`out_strided_type`)."""
        if bool(scale_shift) != self.scale_shift:
            raise ValueError(f"{self.name}: scale and shift operands {scale_shift!r}")
        if bool(residual) != self.residual:
            raise ValueError(f"{self.name}: residual operand {residual!r}")
        rows = self.n * self.m
        b_elems = self.packed_b_size
        vec_t = f"tensor<{self.np_}xf32>"
        extra = "".join(f", {v}" for v in scale_shift or ())
        extra_t = f", {vec_t}, {vec_t}" if scale_shift else ""
        if residual:
            extra += f", {residual}"
            extra_t += f", {self.residual_type}"
        c_t = f"tensor<?x{self.np_}xf32>{{%amx_rows}}"
        lines = [
            f"  %amx_m = arith.constant {self.m} : index",
            f"  %amx_n = arith.constant {self.n} : index",
            f"  %amx_rows = arith.constant {rows} : index",
        ]
        call = (
            f"flow.dispatch @{self.name}::@{self.name}[%amx_m, %amx_n]({a}, {b}{extra}, "
            f"%amx_m, %amx_n) : (tensor<{self.input_size}xbf16>, tensor<{b_elems}xbf16>{extra_t}, "
            "index, index) -> "
        )
        cast = f" : tensor<?x{self.np_}xf32> to tensor<{rows}x{self.np_}xf32>"
        more = [("%cnext", self.out_next_type)] if self.out_next is not None else []
        more += [("%cstr", self.out_strided_type)] if self.out_strided is not None else []
        if not more:
            lines.append(f"  %cmd = {call}{c_t}")
            lines.append(f"  %cm = tensor.cast %cmd{cast}")
            return lines
        types = ", ".join([c_t] + [t for _, t in more])
        lines.append(f"  %cmd:{1 + len(more)} = {call}({types})")
        lines.append(f"  %cm = tensor.cast %cmd#0{cast}")
        for i, (value, t) in enumerate(more, 1):
            lines.append(f"  {value} = tensor.cast %cmd#{i} : {t} to {t}")
        return lines

    # -- the epilogue: scale, shift and ReLU over each stored block of C ------------------------

    def _bindings(self) -> list[str]:
        operands = ["%a", "%b"] + (["%esc", "%esh"] if self.scale_shift else [])
        operands += ["%resid"] if self.residual else []
        operands += ["%c"] + (["%onext"] if self.out_next is not None else [])
        return operands + (["%ostr"] if self.out_strided is not None else [])

    def _emit_extra_subspans(self, e) -> None:
        if self.scale_shift:
            v_t = f"memref<{self.np_}xf32>"
            e(f"      %msc = stream.binding.subspan %esc[%c0] : !stream.binding -> {v_t}")
            e(f"      %msh = stream.binding.subspan %esh[%c0] : !stream.binding -> {v_t}")
        if self.residual:
            r_t = self._residual_memref()
            e(f"      %mres = stream.binding.subspan %resid[%c0] : !stream.binding -> {r_t}")
        if self.out_next is not None:
            o_t = self._out_next_memref()
            e(f"      %mnext = stream.binding.subspan %onext[%c0] : !stream.binding -> {o_t}")
        if self.out_strided is not None:
            s_t = self._out_strided_memref()
            e(f"      %mstr = stream.binding.subspan %ostr[%c0] : !stream.binding -> {s_t}")

    def _residual_memref(self) -> str:
        return f"memref<{self._residual_shape}>"

    def _out_next_memref(self) -> str:
        return f"memref<{self.out_next_size}x{self.out_next_dtype}>"

    def _out_strided_memref(self) -> str:
        return f"memref<{self.out_strided_size}xbf16>"

    def _emit_workgroup_prologue(self, e) -> None:
        """The scratch block (see the class doc); with :attr:`out_next`, the workgroups of the
        first row block write the zeros around the pixels of their batch entry and columns (the
        rows above and below them, the columns left and right of them), with
        :attr:`out_strided` the rows below its pixels; the others write only pixels."""
        if self._per_pixel:
            p = "      "
            e(f"{p}%scr = memref.alloca() : {_SCRATCH_T}")
            e(f"{p}%scrp = memref.extract_aligned_pointer_as_index %scr : {_SCRATCH_T} -> index")
            e(f"{p}%scrp64 = arith.index_cast %scrp : index to i64")
            e(f"{p}%scrs = arith.constant {_SCRATCH_COLS * 4} : i64")
            e(f"{p}%scr16 = arith.constant {16 * _SCRATCH_COLS * 4} : i64")
        if self.out_next is not None:
            self._emit_out_next_zeros(e)
        if self.out_strided is not None:
            self._emit_out_strided_zeros(e)

    def _emit_out_strided_zeros(self, e) -> None:
        """The zero rows of :attr:`out_strided` below its pixels (written by the first row
        block's workgroups, for their batch entry and columns)."""
        rows, cols, sh, _ = self.out_strided  # type: ignore[misc]
        first = -(-self.oh // sh)
        if first >= rows:
            return
        p = "      "
        nvec, s_t = "vector<16xbf16>", self._out_strided_memref()
        e(f"{p}%zs_first = arith.cmpi eq, %wgy, %c0 : index")
        e(f"{p}scf.if %zs_first {{")
        e(f"{p}  %zs_zero = arith.constant dense<0.0> : {nvec}")
        e(f"{p}  %zs_r0 = arith.constant {first * cols} : index")
        e(f"{p}  %zs_r1 = arith.constant {rows * cols} : index")
        e(f"{p}  scf.for %zsp = %zs_r0 to %zs_r1 step %c1 {{")
        e(
            f"{p}    %zso = affine.apply affine_map<()[s0, s1, s2] -> ((s0 * {rows * cols} + s1) * "
            f"{self.np_} + s2)>()[%wgz, %zsp, %n0]"
        )
        for j in range(self.cols_per_workgroup // 16):
            e(f"{p}    %zso_{j} = affine.apply affine_map<()[s0] -> (s0 + {16 * j})>()[%zso]")
            e(f"{p}    vector.store %zs_zero, %mstr[%zso_{j}] : {s_t}, {nvec}")
        e(f"{p}  }}")
        e(f"{p}}}")

    def _emit_out_next_zeros(self, e) -> None:
        """The zeros around :attr:`out_next`'s pixels (see :meth:`_emit_workgroup_prologue`)."""
        rows, cols, ph, pw = self._out_next_padded
        nv = self.cols_per_workgroup // 16
        p = "      "
        e(f"{p}%zb_first = arith.cmpi eq, %wgy, %c0 : index")
        e(f"{p}scf.if %zb_first {{")
        nvec = f"vector<16x{self.out_next_dtype}>"
        e(f"{p}  %zb_zero = arith.constant dense<0.0> : {nvec}")
        bands = []  # (first row, end row, first column, end column)
        if ph:
            bands.append((0, ph, 0, cols))
        if ph + self.oh < rows:
            bands.append((ph + self.oh, rows, 0, cols))
        if pw:
            bands.append((ph, ph + self.oh, 0, pw))
        if pw + self.ow < cols:
            bands.append((ph, ph + self.oh, pw + self.ow, cols))
        o_t = self._out_next_memref()
        for i, (r0, r1, x0, x1) in enumerate(bands):
            for name, v in (("r0", r0), ("r1", r1), ("x0", x0), ("x1", x1)):
                e(f"{p}  %zb{i}{name} = arith.constant {v} : index")
            e(f"{p}  scf.for %zr{i} = %zb{i}r0 to %zb{i}r1 step %c1 {{")
            e(f"{p}    scf.for %zx{i} = %zb{i}x0 to %zb{i}x1 step %c1 {{")
            e(
                f"{p}      %zo{i} = affine.apply affine_map<()[s0, s1, s2, s3] -> "
                f"{self._out_next_map('s1', 's2')}>()[%wgz, %zr{i}, %zx{i}, %n0]"
            )
            for j in range(nv):
                e(
                    f"{p}      %zo{i}_{j} = affine.apply affine_map<()[s0] -> (s0 + {16 * j})>()"
                    f"[%zo{i}]"
                )
                e(f"{p}      vector.store %zb_zero, %mnext[%zo{i}_{j}] : {o_t}, {nvec}")
            e(f"{p}    }}")
            e(f"{p}  }}")
        e(f"{p}}}")

    def _c_block(self, e, p: str) -> tuple[str, str, str]:
        if self._per_pixel:
            return "%scrp64", "%scrs", "%scr16"
        return super()._c_block(e, p)

    def _emit_after_store(self, e, p: str) -> None:
        if not (self.scale_shift or self.relu or self._per_pixel):
            return
        v_t, c_t, vec = f"memref<{self.np_}xf32>", f"memref<?x{self.np_}xf32>", "vector<16xf32>"
        e(f"{p}%ecol1 = arith.addi %ncol, %c16 : index")
        cols = ("%ncol", "%ecol1")
        if self.scale_shift:
            for h, col in enumerate(cols):
                e(f"{p}%esv{h} = vector.load %msc[{col}] : {v_t}, {vec}")
                e(f"{p}%etv{h} = vector.load %msh[{col}] : {v_t}, {vec}")
        if self.relu:
            e(f"{p}%ezero = arith.constant dense<0.0> : {vec}")
        e(f"{p}scf.for %er = %c0 to %left step %c1 {{")
        e(f"{p}  %erow = arith.addi %grow, %er : index")
        q = p + "  "
        per_pixel = self._per_pixel
        if per_pixel:  # only the grid's first ow columns are pixels
            e(f"{q}%err = arith.addi %ms, %er : index")
            e(f"{q}%eox = affine.apply affine_map<()[s0] -> (s0 mod {self.wp})>()[%err]")
            e(f"{q}%eow = arith.constant {self.ow} : index")
            e(f"{q}%epix = arith.cmpi ult, %eox, %eow : index")
            e(f"{q}scf.if %epix {{")
            q += "  "
            e(f"{q}%eoy = affine.apply affine_map<()[s0] -> (s0 floordiv {self.wp})>()[%err]")
            if self.residual and self.residual_layout is None:
                e(
                    f"{q}%eres = affine.apply affine_map<()[s0, s1, s2] -> "
                    f"(s0 * {self.oh * self.ow} + s1 * {self.ow} + s2)>()[%wgz, %eoy, %eox]"
                )
            elif self.residual:  # bf16, flat, as its producer's out_next result
                rrows, rcols, rph, rpw = self.residual_layout  # type: ignore[misc]
                _emit_pixel_index(
                    e,
                    q,
                    "%eres",
                    f"(((s0 * {rrows} + s1 + {rph}) * {rcols} + s2 + {rpw}) * {self.np_} + s3)",
                )
            if self.out_next is not None:
                _, _, ph, pw = self.out_next
                _emit_pixel_index(e, q, "%enx", self._out_next_map(f"s1 + {ph}", f"s2 + {pw}"))
            if self.out_strided is not None:
                srows, scols, ssh, ssw = self.out_strided
                _emit_pixel_index(
                    e,
                    q,
                    "%esi",
                    f"(((s0 * {srows} + s1 floordiv {ssh}) * {scols} + s2 floordiv {ssw}) * "
                    f"{self.np_} + s3)",
                )
                e(f"{q}%esyr = affine.apply affine_map<()[s0] -> (s0 mod {ssh})>()[%eoy]")
                e(f"{q}%esxr = affine.apply affine_map<()[s0] -> (s0 mod {ssw})>()[%eox]")
                e(f"{q}%esyz = arith.cmpi eq, %esyr, %c0 : index")
                e(f"{q}%esxz = arith.cmpi eq, %esxr, %c0 : index")
                e(f"{q}%estr = arith.andi %esyz, %esxz : i1")
        r_t = self._residual_memref()
        o_t = self._out_next_memref() if self.out_next is not None else ""
        native = "avx512_bf16" in cpu_flags()
        for h, col in enumerate(cols):
            if per_pixel:  # the block's row er, columns 16 h ... from the scratch block
                e(f"{q}%ev{h} = vector.load %scr[%er, %c{16 * h}] : {_SCRATCH_T}, {vec}")
            else:
                e(f"{q}%ev{h} = vector.load %mc[%erow, {col}] : {c_t}, {vec}")
            v = f"%ev{h}"
            if self.scale_shift:
                e(f"{q}%ey{h} = vector.fma {v}, %esv{h}, %etv{h} : {vec}")
                v = f"%ey{h}"
            if self.residual and self.residual_layout is None:
                e(f"{q}%erv{h} = vector.load %mres[%eres, {col}] : {r_t}, {vec}")
            elif self.residual:
                idx = "%eres" if h == 0 else "%eres1"
                e(f"{q}%erb{h} = vector.load %mres[{idx}] : {r_t}, vector<16xbf16>")
                e(f"{q}%erv{h} = arith.extf %erb{h} : vector<16xbf16> to {vec}")
            if self.residual:
                e(f"{q}%era{h} = arith.addf {v}, %erv{h} : {vec}")
                v = f"%era{h}"
            if self.relu:
                e(relu_line(q, f"%ez{h}", v, "%ezero"))
                v = f"%ez{h}"
            if self.f32_out:
                e(f"{q}vector.store {v}, %mc[%erow, {col}] : {c_t}, {vec}")
            next_bf16 = self.out_next is not None and not self.out_next_f32
            if next_bf16 or self.out_strided is not None:
                _to_bf16(e, q, f"%ebf{h}", v, native)
            idx = "%enx" if h == 0 else "%enx1"
            if self.out_next is not None and self.out_next_f32:
                e(f"{q}vector.store {v}, %mnext[{idx}] : {o_t}, {vec}")
            elif next_bf16:
                e(f"{q}vector.store %ebf{h}, %mnext[{idx}] : {o_t}, vector<16xbf16>")
            if self.out_strided is not None:
                s_t = self._out_strided_memref()
                e(f"{q}scf.if %estr {{")
                sidx = "%esi" if h == 0 else "%esi1"
                e(f"{q}  vector.store %ebf{h}, %mstr[{sidx}] : {s_t}, vector<16xbf16>")
                e(f"{q}}}")
        if per_pixel:
            e(f"{p}  }}")
        e(f"{p}}}")

    # -- A: the padded input, read in place -------------------------------------------------

    def _a_memref(self) -> tuple[str, str, int]:
        return f"memref<{self.input_size}xbf16>", "", 1

    def _a_row_bytes(self) -> int:
        return self.c * 2

    def _emit_a_strip_base(self, e) -> None:
        image = self.image_rows * self.wp * self.c * 2
        e(
            f"        %arow0i = affine.apply affine_map<()[s0, s1, s2] -> (s0 + s1 * {image} "
            f"+ s2 * {self.c * 2})>()[%aaddr, %wgz, %ms]"
        )

    def _block_live(self, ky: int, kx: int, block: int) -> bool:
        """Whether 32-channel block ``block`` of tap ``(ky, kx)`` has weights that are not
        zero by construction: with :attr:`s2d`, whether a phase ``(py, px)`` the block's
        channels come from is inside the original kernel (``sh ky + py < kh`` and ``sw kx
        + px < kw``; the channels are ``(py, px, c)``, :class:`AmxConvPlan`)."""
        if self.s2d is None:
            return True
        sh, sw, kh, kw = self.s2d
        per_phase = self.c // (sh * sw)
        first, last = block * _C_STEP // per_phase, ((block + 1) * _C_STEP - 1) // per_phase
        return any(
            sh * ky + ph // sw < kh and sw * kx + ph % sw < kw for ph in range(first, last + 1)
        )

    def k_runs(self) -> list[tuple[int, int, int, int]]:
        """The reduction's steps: runs ``(ky, kx, first block, blocks)`` of consecutive
        32-channel blocks of a tap whose weights are not all zero (:meth:`_block_live`), in
        ``B``'s order."""
        runs: list[tuple[int, int, int, int]] = []
        for ky in range(self.kh):
            for kx in range(self.kw):
                for b in range(self.c // _C_STEP):
                    if not self._block_live(ky, kx, b):
                        continue
                    if runs and runs[-1][:2] == (ky, kx) and sum(runs[-1][2:]) == b:
                        runs[-1] = (ky, kx, runs[-1][2], runs[-1][3] + 1)
                    else:
                        runs.append((ky, kx, b, 1))
        return runs

    @property
    def _skips_blocks(self) -> bool:
        """Whether :meth:`k_runs` leaves blocks out (else every tap's every block runs)."""
        if self.s2d is None or self.c % _C_STEP:
            return False
        return sum(r[3] for r in self.k_runs()) < self.kh * self.kw * (self.c // _C_STEP)

    def _emit_k_loop(self, e, p: str) -> tuple[str, list[str]]:
        if self.c == _HALF_STEP:
            return self._emit_k_loop_pairs(e, p)
        if self._skips_blocks:
            return self._emit_k_loop_runs(e, p)
        blocks = self.c // _C_STEP
        e(f"{p}%kyn = arith.constant {self.kh} : index")
        e(f"{p}%kxn = arith.constant {self.kw} : index")
        e(f"{p}%ccn = arith.constant {blocks} : index")
        e(f"{p}scf.for %ky = %c0 to %kyn step %c1 {{")
        e(f"{p}  scf.for %kx = %c0 to %kxn step %c1 {{")
        e(f"{p}    scf.for %cc = %c0 to %ccn step %c1 {{")
        q = p + "      "
        # A: tap (ky, kx) is ky * wp + kx pixels on, 32 channels a step; B: tile (ky, kx, cc)
        e(
            f"{q}%kai = affine.apply affine_map<()[s0, s1, s2] -> (s0 * {self.wp * self.c * 2} "
            f"+ s1 * {self.c * 2} + s2 * 64)>()[%ky, %kx, %cc]"
        )
        e(
            f"{q}%kbi = affine.apply affine_map<()[s0, s1, s2] -> (s0 * {self.kw * blocks * 1024} "
            f"+ s1 * {blocks * 1024} + s2 * 1024)>()[%ky, %kx, %cc]"
        )
        e(f"{q}%ka = arith.index_cast %kai : index to i64")
        e(f"{q}%kb = arith.index_cast %kbi : index to i64")
        return q, [f"{p}    }}", f"{p}  }}", f"{p}}}"]

    def _emit_k_loop_runs(self, e, p: str) -> tuple[str, list[str]]:
        """The reduction over :meth:`k_runs` only: a loop over the runs, whose A and B byte
        offsets and lengths are read from constant vectors, around a loop over a run's
        blocks."""
        runs = self.k_runs()
        blocks = self.c // _C_STEP
        n = len(runs)
        a0 = [(ky * self.wp + kx) * self.c * 2 + b * 64 for ky, kx, b, _ in runs]
        b0 = [((ky * self.kw + kx) * blocks + b) * 1024 for ky, kx, b, _ in runs]
        for name, vals in (("%kra", a0), ("%krb", b0), ("%krc", [r[3] for r in runs])):
            e(f"{p}{name} = arith.constant dense<{vals}> : vector<{n}xindex>")
        e(f"{p}%krn = arith.constant {n} : index")
        e(f"{p}scf.for %kr = %c0 to %krn step %c1 {{")
        q = p + "  "
        for name in ("%kra", "%krb", "%krc"):
            e(f"{q}{name}0 = vector.extract {name}[%kr] : index from vector<{n}xindex>")
        e(f"{q}scf.for %cc = %c0 to %krc0 step %c1 {{")
        q += "  "
        e(f"{q}%kai = affine.apply affine_map<()[s0, s1] -> (s0 + s1 * 64)>()[%kra0, %cc]")
        e(f"{q}%kbi = affine.apply affine_map<()[s0, s1] -> (s0 + s1 * 1024)>()[%krb0, %cc]")
        e(f"{q}%ka = arith.index_cast %kai : index to i64")
        e(f"{q}%kb = arith.index_cast %kbi : index to i64")
        return q, [f"{p}  }}", f"{p}}}"]

    def _emit_k_loop_pairs(self, e, p: str) -> tuple[str, list[str]]:
        """The reduction of a 16-channel input: each step's A tile rows are the 64 bytes of
        two neighbouring pixels, taps ``(ky, kx)`` and ``(ky, kx + 1)`` (the rows 32 bytes apart,
        overlapping), against the B tile of ``k = (ky, kx, c)`` to ``(ky, kx + 1, c)``: the
        layout of ``k = (ky, kx, c)`` in steps of 32, as for 32 channels."""
        e(f"{p}%kyn = arith.constant {self.kh} : index")
        e(f"{p}%kxn = arith.constant {self.kw} : index")
        e(f"{p}%c2 = arith.constant 2 : index")
        e(f"{p}scf.for %ky = %c0 to %kyn step %c1 {{")
        e(f"{p}  scf.for %kx = %c0 to %kxn step %c2 {{")
        q = p + "    "
        e(
            f"{q}%kai = affine.apply affine_map<()[s0, s1] -> (s0 * {self.wp * self.c * 2} "
            f"+ s1 * {self.c * 2})>()[%ky, %kx]"
        )
        e(
            f"{q}%kbi = affine.apply affine_map<()[s0, s1] -> (s0 * {self.kw * 512} "
            f"+ s1 * 512)>()[%ky, %kx]"
        )
        e(f"{q}%ka = arith.index_cast %kai : index to i64")
        e(f"{q}%kb = arith.index_cast %kbi : index to i64")
        return q, [f"{p}  }}", f"{p}}}"]
