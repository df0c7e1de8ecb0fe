"""The AVX-512 depthwise-convolution kernel (fp32, channels-last), for the AVX-512 path's
depthwise convolutions (groups = channels = filters; MobileNet, EfficientNet, ConvNeXt) and
grouped ones of up to 16 channels a group with as many filters as channels (RegNet's);
:mod:`.direct_convs` rewrites them onto it (docs/performance.md, section 14).

IREE 3.13 compiles a depthwise convolution for CPUs into a dispatch that ran MobileNetV3's at
2-5 GFLOP/s (3.15 of the model's 5.9 ms a call, one thread, on the Xeon). A depthwise
convolution is ``out[n, oy, ox, c] = sum_{ky, kx} x[n, oy*sh + ky*dh, ox*sw + kx*dw, c] *
w[c, ky, kx]``: per channel, no reduction across channels, so it vectorizes over channels. This
kernel reads the zero-padded channels-last input (channels padded to a multiple of 16 with
zeros) and the weight packed once as ``[KH * KW, Cp]``:

- one workgroup per output row; for each 16-channel block, four output pixels at a time in
  four accumulators (a tap's weight vector loaded once for the four), the taps unrolled;
  a row's last pixels recompute the row's last pixel (clamped index, same value stored);
- the epilogue of :mod:`.epilogues` (per-channel scale and shift, ReLU) before the store;
  C is ``[N * OH * OW, Cp]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .activations import (
    ACTIVATIONS,
    emit_activation,
    emit_activation_constants,
    relu_line,
    store_activation,
)
from .convs import Conv
from .kernel_text import close_executable, open_static_executable

__all__ = ["DepthwiseConv"]

#: output pixels a step computes (one accumulator each)
_PIXELS = 4


@dataclass(frozen=True)
class DepthwiseConv:
    """One depthwise (or grouped) convolution executable for a static geometry ``g``
    (``g.f == g.c``).

    Attributes:
        group_width: channels per group, in and out (1: depthwise; a divisor of 16, so that
            no group straddles two vectors: the input vector is shuffled so that each output
            lane sees its group's ``j``-th input channel, one FMA per ``j``).
        scale, shift, relu, hardswish, silu, sigmoid, hardsigmoid: the epilogue
            (:mod:`.epilogues`): ``* scale[c]``, ``+ shift[c]`` (each a ``Cp``-float operand),
            then ``max(., 0)``, torch's hardswish, SiLU, sigmoid or hardsigmoid (one at
            most).
    """

    g: Conv
    group_width: int = 1
    scale: bool = False
    shift: bool = False
    relu: bool = False
    hardswish: bool = False
    silu: bool = False
    sigmoid: bool = False
    hardsigmoid: bool = False
    #: the fields the direct-convolution function's helpers read (never set here)
    residual: bool = False
    out_pad: tuple[int, int] = (0, 0)
    bf16: bool = False

    def __post_init__(self) -> None:
        if self.g.n is None or self.g.f != self.g.c:
            raise ValueError(f"depthwise kernel: static batch and F == C needed: {self.g}")
        if 16 % self.group_width or self.g.c % self.group_width:
            raise ValueError(f"depthwise kernel: group width {self.group_width} for {self.g}")

    @property
    def np_(self) -> int:
        """The channels padded to whole vectors."""
        return -(-self.g.c // 16) * 16

    @property
    def input_size(self) -> int:
        assert self.g.n is not None
        return self.g.n * self.g.hp * self.g.wp * self.np_

    @property
    def m(self) -> int:
        assert self.g.n is not None
        return self.g.n * self.g.oh * self.g.ow

    @property
    def c_rows(self) -> int:
        return self.m

    @property
    def taps(self) -> int:
        return self.g.kh * self.g.kw

    @property
    def epilogue(self) -> tuple[str, ...]:
        return tuple(s for s in ("scale", "shift", *ACTIVATIONS) if getattr(self, s))

    @property
    def activation(self) -> str | None:
        """The activation of the store other than ReLU, if any."""
        return store_activation(self)

    @property
    def name(self) -> str:
        g = self.g
        return (
            f"__turbine_avx512_f32_dwconv_n{g.n}_c{self.np_}_h{g.h}_w{g.w}_k{g.kh}x{g.kw}"
            f"_s{g.stride[0]}x{g.stride[1]}_p{g.padding[0]}x{g.padding[1]}"
            f"_d{g.dilation[0]}x{g.dilation[1]}"
            + (f"_gw{self.group_width}" if self.group_width > 1 else "")
            + "".join(f"_{s}" for s in self.epilogue)
        )

    def dispatch(self, a: str, w: str, *extra: str) -> str:
        """The ``flow.dispatch``: ``a`` the padded channels-last input (1-D, ``Cp``
        channels), ``w`` the packed weight (``KH * KW * Cp``), ``extra`` the scale and shift
        (``Cp`` each, as the epilogue has them) -> ``tensor<M x Cp x f32>``. The weight is
        ``[KH * KW, group_width, Cp]``: tap, input channel within the group, output channel."""
        vec_t = f"tensor<{self.np_}xf32>"
        wanted = [s for s in self.epilogue if s not in ACTIVATIONS]
        if len(extra) != len(wanted):
            raise ValueError(f"depthwise kernel: operands {extra} for {self.name}")
        operands = ", ".join([a, w, *extra])
        types = ", ".join(
            [
                f"tensor<{self.input_size}xf32>",
                f"tensor<{self.taps * self.group_width * self.np_}xf32>",
                *([vec_t] * len(extra)),
            ]
        )
        return (
            f"flow.dispatch @{self.name}::@{self.name}({operands}) : ({types}) -> "
            f"tensor<{self.m}x{self.np_}xf32>"
        )

    def executable(self) -> str:
        """The ``stream.executable`` (MLIR text) for a module's top level."""
        g = self.g
        assert g.n is not None
        cp, oh, ow, hp, wp = self.np_, g.oh, g.ow, g.hp, g.wp
        (sh, sw), (dh, dw) = g.stride, g.dilation
        vt = "vector<16xf32>"
        a_t = f"memref<{self.input_size}xf32>"
        gw = self.group_width
        w_t = f"memref<{self.taps * gw * cp}xf32>"
        v_t = f"memref<{cp}xf32>"
        c_t = f"memref<{self.m * cp}xf32>"
        out: list[str] = []
        e = out.append
        name = self.name
        binds = ["%a", "%w", *(f"%{s}" for s in self.epilogue if s not in ACTIVATIONS), "%c"]
        open_static_executable(e, name, (g.n * oh,), binds)
        p = "      "
        for const in sorted({0, 16, _PIXELS, cp, ow}):
            e(f"{p}%c{const} = arith.constant {const} : index")
        e(f"{p}%ma = stream.binding.subspan %a[%c0] : !stream.binding -> {a_t}")
        e(f"{p}%mw = stream.binding.subspan %w[%c0] : !stream.binding -> {w_t}")
        e(f"{p}%mc = stream.binding.subspan %c[%c0] : !stream.binding -> {c_t}")
        if self.scale:
            e(f"{p}%mscale = stream.binding.subspan %scale[%c0] : !stream.binding -> {v_t}")
        if self.shift:
            e(f"{p}%mshift = stream.binding.subspan %shift[%c0] : !stream.binding -> {v_t}")
        e(f"{p}%zero = arith.constant dense<0.0> : {vt}")
        if self.activation:
            emit_activation_constants(e, p)
        e(f"{p}%wg = stream.dispatch.workgroup.id[0] : index")
        e(f"{p}%oy = affine.apply affine_map<()[s0] -> (s0 mod {oh})>()[%wg]")
        e(f"{p}%img = affine.apply affine_map<()[s0] -> (s0 floordiv {oh})>()[%wg]")
        e(f"{p}scf.for %cb = %c0 to %c{cp} step %c16 {{")
        q = p + "  "
        if self.scale:
            e(f"{q}%sv = vector.load %mscale[%cb] : {v_t}, {vt}")
        if self.shift:
            e(f"{q}%bv = vector.load %mshift[%cb] : {v_t}, {vt}")
        e(f"{q}scf.for %oxb = %c0 to %c{ow} step %c{_PIXELS} {{")
        r = q + "  "
        for i in range(_PIXELS):  # the row's last pixels: the last one again
            e(f"{r}%ox{i} = affine.min affine_map<()[s0] -> (s0 + {i}, {ow - 1})>()[%oxb]")
        accs = ["%zero"] * _PIXELS
        for ky in range(g.kh):
            for kx in range(g.kw):
                t = ky * g.kw + kx
                xs = []
                for i in range(_PIXELS):
                    e(
                        f"{r}%xo{t}_{i} = affine.apply affine_map<()[s0, s1, s2, s3] -> "
                        f"(((s0 * {hp} + s1 * {sh} + {ky * dh}) * {wp} + s2 * {sw} + {kx * dw})"
                        f" * {cp} + s3)>()[%img, %oy, %ox{i}, %cb]"
                    )
                    e(f"{r}%xv{t}_{i} = vector.load %ma[%xo{t}_{i}] : {a_t}, {vt}")
                    xs.append(f"%xv{t}_{i}")
                for j in range(gw):
                    e(
                        f"{r}%wo{t}_{j} = affine.apply affine_map<()[s0] -> "
                        f"(s0 + {(t * gw + j) * cp})>()[%cb]"
                    )
                    e(f"{r}%wv{t}_{j} = vector.load %mw[%wo{t}_{j}] : {w_t}, {vt}")
                    # lane l: its group's j-th input channel, (l - l mod gw) + j
                    mask = ", ".join(str(lane - lane % gw + j) for lane in range(16))
                    for i in range(_PIXELS):
                        x = xs[i]
                        if gw > 1:
                            e(f"{r}%xs{t}_{j}_{i} = vector.shuffle {x}, {x} [{mask}] : {vt}, {vt}")
                            x = f"%xs{t}_{j}_{i}"
                        e(f"{r}%acc{t}_{j}_{i} = vector.fma {x}, %wv{t}_{j}, {accs[i]} : {vt}")
                        accs[i] = f"%acc{t}_{j}_{i}"
        for i in range(_PIXELS):
            v = accs[i]
            if self.scale:
                e(f"{r}%ys{i} = arith.mulf {v}, %sv : {vt}")
                v = f"%ys{i}"
            if self.shift:
                e(f"{r}%yb{i} = arith.addf {v}, %bv : {vt}")
                v = f"%yb{i}"
            if self.relu:
                e(relu_line(r, f"%yr{i}", v, "%zero"))
                v = f"%yr{i}"
            if self.activation:
                v = emit_activation(e, r, v, str(i), self.activation)
            e(
                f"{r}%co{i} = affine.apply affine_map<()[s0, s1, s2] -> ((s0 * {ow} + s1) * {cp} + s2)>"
                f"()[%wg, %ox{i}, %cb]"
            )
            e(f"{r}vector.store {v}, %mc[%co{i}] : {c_t}, {vt}")
        e(f"{q}}}")
        e(f"{p}}}")
        close_executable(e)
        return "\n".join(out)
