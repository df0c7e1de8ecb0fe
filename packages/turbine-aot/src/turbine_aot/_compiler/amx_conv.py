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
its tiles are stored, while it is in the cache; a residual add stays IREE's.

Measured: docs/performance.md, section 8 ("Convolutions on AMX").
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .amx import AmxGemm, padded
from .convs import Conv

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
    py``. The zero taps cost products (a 3x3 stride-2 convolution computes 16 taps for 9; a
    ResNet stem's 7x7 stride-2 over 3 channels, 16 taps of 32 channels, 512 products an output
    for 147), on a unit about ten times faster than the AVX512-BF16 kernel here (ResNet-18's
    strided 3x3s: ~1 ms each there). A strided 1x1 convolution instead reads every ``sh``-th
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
    while (sh * sw * c_pad) % _C_STEP:
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
    )
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
    """

    c: int = field(default=_C_STEP, kw_only=True)
    kh: int = field(default=1, kw_only=True)
    kw: int = field(default=1, kw_only=True)
    oh: int = field(default=1, kw_only=True)
    wp: int = field(default=1, kw_only=True)
    n: int = field(default=1, kw_only=True)
    scale_shift: bool = field(default=False, kw_only=True)
    relu: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.c % _C_STEP or self.kp != self.kh * self.kw * self.c or self.batch_b:
            raise ValueError(f"AMX convolution: channels must be a multiple of 32: {self}")

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
        epilogue = ("_ss" if self.scale_shift else "") + ("_relu" if self.relu else "")
        return (
            f"__turbine_amx_bf16_conv_{self.n}x{self.image_rows}x{self.wp}x{self.c}"
            f"_k{self.kh}x{self.kw}_f{self.np_}{epilogue}{perm}"
            f"_{self.rows_per_workgroup}x{self.cols_per_workgroup}"
        )

    def conv_dispatch(
        self, a: str, b: str, scale_shift: tuple[str, str] | None = None
    ) -> list[str]:
        """Lines computing ``%cm`` (``tensor<{n * m}x{np_}xf32>``) from ``a`` (the input,
        ``tensor<{input_size}xbf16>``), ``b`` (the packed weight) and, with
        :attr:`scale_shift`, the ``tensor<{np_}xf32>`` scale and shift."""
        if bool(scale_shift) != self.scale_shift:
            raise ValueError(f"{self.name}: scale and shift operands {scale_shift!r}")
        rows = self.n * self.m
        b_elems = self.packed_b_size
        vec_t = f"tensor<{self.np_}xf32>"
        extra = "".join(f", {v}" for v in scale_shift or ())
        extra_t = f", {vec_t}, {vec_t}" if scale_shift else ""
        return [
            f"  %amx_m = arith.constant {self.m} : index",
            f"  %amx_n = arith.constant {self.n} : index",
            f"  %amx_rows = arith.constant {rows} : index",
            f"  %cmd = flow.dispatch @{self.name}::@{self.name}[%amx_m, %amx_n]({a}, {b}{extra}, "
            f"%amx_m, %amx_n) : (tensor<{self.input_size}xbf16>, tensor<{b_elems}xbf16>{extra_t}, "
            f"index, index) -> tensor<?x{self.np_}xf32>{{%amx_rows}}",
            f"  %cm = tensor.cast %cmd : tensor<?x{self.np_}xf32> to tensor<{rows}x{self.np_}xf32>",
        ]

    # -- the epilogue: scale, shift and ReLU over each stored block of C ------------------------

    def _bindings(self) -> list[str]:
        return ["%a", "%b", "%esc", "%esh", "%c"] if self.scale_shift else ["%a", "%b", "%c"]

    def _emit_extra_subspans(self, e) -> None:
        if self.scale_shift:
            v_t = f"memref<{self.np_}xf32>"
            e(f"      %msc = stream.binding.subspan %esc[%c0] : !stream.binding -> {v_t}")
            e(f"      %msh = stream.binding.subspan %esh[%c0] : !stream.binding -> {v_t}")

    def _emit_after_store(self, e, p: str) -> None:
        if not (self.scale_shift or self.relu):
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
        for h, col in enumerate(cols):
            e(f"{p}  %ev{h} = vector.load %mc[%erow, {col}] : {c_t}, {vec}")
            v = f"%ev{h}"
            if self.scale_shift:
                e(f"{p}  %ey{h} = vector.fma {v}, %esv{h}, %etv{h} : {vec}")
                v = f"%ey{h}"
            if self.relu:
                e(f"{p}  %ez{h} = arith.maximumf {v}, %ezero : {vec}")
                v = f"%ez{h}"
            e(f"{p}  vector.store {v}, %mc[%erow, {col}] : {c_t}, {vec}")
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

    def _emit_k_loop(self, e, p: str) -> tuple[str, list[str]]:
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
