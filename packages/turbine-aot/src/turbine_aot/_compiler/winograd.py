"""Winograd convolutions F(m x m, 3 x 3) for the AVX-512 fp32 path: 3x3, stride-1 convolutions
as ``(m + 2)^2`` independent matmuls over transformed tiles (docs/performance.md, section 13).

A 3x3 convolution computes each ``m x m`` block of output pixels from an ``a x a`` tile of the
padded input (``a = m + 2``). Winograd's minimal filtering algorithm writes that as

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A

per channel pair, summed over the input channels: the element-wise product becomes, for each of
the ``a^2`` tile positions ``(i, j)``, a matmul ``V[i, j] (tiles x C) @ U[i, j] (C x F)``.
F(2 x 2, 3 x 3) does ``16 / (4 * 9)`` of the direct convolution's multiplications (2.25x fewer;
on a 7x7 output, whose 2x2 blocks overhang by one row and column, 1.72x), F(4 x 4, 3 x 3)
``36 / (16 * 9)`` (4x), at the cost of three passes over memory (input transform, matmul,
output transform) and a weight ``a^2 / 9`` times larger. Three dispatches:

- **input transform** (:meth:`WinogradConv.input_executable`): from the zero-padded channels-last
  input the direct kernel reads (the same flat layout, so a previous kernel can write it
  padded), ``V[i * a + j, t, c] = (B^T d_t B)[i, j]`` over 16-channel vectors, with
  additions only for F(2, 3); positions past the padded input (the last tile of an odd output)
  read zeros;
- **the matmuls**: :mod:`.avx512`'s fp32 kernel with one packed weight per position
  (``batch_b``), ``M[p, t, f] = sum_c V[p, t, c] U[p, c, f]``; the weight transform
  ``U = G g G^T`` (:meth:`WinogradConv.weight_transform`, a ``linalg.generic``) is computed
  and packed once, at load, by an initializer :mod:`.direct_convs` adds to the compile copy
  (IREE's constant hoisting refuses it: ``U`` is larger than the weight);
- **output transform** (:meth:`WinogradConv.output_executable`): ``A^T M_t A`` per tile, then
  the epilogue of :mod:`.epilogues` (scale, shift, residual, ReLU), stored channels-last as the
  direct kernel's C (zero-padded with ``out_pad`` for a following convolution), pixels past
  the output dropped.

The transforms' coefficients are exact in binary for F(2, 3) (0, +-1, +-1/2); F(4, 3)'s
include 1/6, 1/12, 1/24, whose rounding and the larger sums it adds make its error grow
(measured in docs/performance.md, section 13).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from .activations import relu_line
from .avx512 import Avx512Gemm
from .convs import Conv
from .host import cpu_vendor
from .kernel_text import close_executable, open_static_executable

__all__ = [
    "WINOGRAD_ENV",
    "WinogradConv",
    "winograd_choice",
    "winograd_matrices",
]

#: ``off``: no convolution on Winograd; ``2`` / ``4``: F(2x2, 3x3) / F(4x4, 3x3) for every
#: convolution :meth:`WinogradConv.supports` accepts, whatever its size (for measurements);
#: unset or empty: the measured choice (:func:`winograd_choice`).
WINOGRAD_ENV = "TURBINE_CPU_WINOGRAD"

_F = Fraction


def winograd_matrices(
    m: int,
) -> tuple[list[list[Fraction]], list[list[Fraction]], list[list[Fraction]]]:
    """``(B^T, G, A^T)`` of F(m x m, 3 x 3), m 2 (points 0, 1, -1, inf) or 4 (0, 1, -1, 2, -2,
    inf): ``y = A^T [(G g) * (B^T d)]`` is the valid correlation of ``d`` (``m + 2`` values)
    with ``g`` (3 taps)."""
    if m == 2:
        bt = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
        g = [[1, 0, 0], [_F(1, 2)] * 3, [_F(1, 2), _F(-1, 2), _F(1, 2)], [0, 0, 1]]
        at = [[1, 1, 1, 0], [0, 1, -1, -1]]
    elif m == 4:
        bt = [
            [4, 0, -5, 0, 1, 0],
            [0, -4, -4, 1, 1, 0],
            [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0],
            [0, 2, -1, -2, 1, 0],
            [0, 4, 0, -5, 0, 1],
        ]
        g = [
            [_F(1, 4), 0, 0],
            [_F(-1, 6)] * 3,
            [_F(-1, 6), _F(1, 6), _F(-1, 6)],
            [_F(1, 24), _F(1, 12), _F(1, 6)],
            [_F(1, 24), _F(-1, 12), _F(1, 6)],
            [0, 0, 1],
        ]
        at = [
            [1, 1, 1, 1, 1, 0],
            [0, 1, -1, 2, -2, 0],
            [0, 1, 1, 4, 4, 0],
            [0, 1, -1, 8, -8, 1],
        ]
    else:
        raise ValueError(f"Winograd: F({m}, 3) is not implemented (2 or 4)")

    def frac(rows: Any) -> list[list[Fraction]]:
        return [[_F(v) for v in row] for row in rows]

    return frac(bt), frac(g), frac(at)


def _f32(v: Fraction) -> str:
    return f"{float(v):.9e}"


class _Combiner:
    """Emits linear combinations of ``vector<16xf32>`` values with constant coefficients:
    additions and subtractions for +-1, FMAs otherwise (splat constants defined once)."""

    vt = "vector<16xf32>"

    def __init__(self, e: Any, p: str) -> None:
        self.e, self.p = e, p
        self.consts: dict[Fraction, str] = {}

    def const(self, v: Fraction) -> str:
        if v not in self.consts:
            name = f"%k{len(self.consts)}"
            self.e(f"{self.p}{name} = arith.constant dense<{_f32(v)}> : {self.vt}")
            self.consts[v] = name
        return self.consts[v]

    def combine(self, out: str, coeffs: list[Fraction], values: list[str]) -> str:
        """``out = sum coeffs[i] * values[i]``; returns the name holding it."""
        e, p, vt = self.e, self.p, self.vt
        terms = [(c, v) for c, v in zip(coeffs, values) if c != 0]
        if not terms:
            return "%zero"
        # a +1 term first, if any: no negation or multiplication to start from
        terms.sort(key=lambda cv: cv[0] != 1)
        c0, v0 = terms[0]
        if c0 == 1:
            acc = v0
        elif c0 == -1:
            e(f"{p}{out}_0 = arith.negf {v0} : {vt}")
            acc = f"{out}_0"
        else:
            e(f"{p}{out}_0 = arith.mulf {v0}, {self.const(c0)} : {vt}")
            acc = f"{out}_0"
        for i, (c, v) in enumerate(terms[1:], 1):
            name = f"{out}_{i}"
            if c == 1:
                e(f"{p}{name} = arith.addf {acc}, {v} : {vt}")
            elif c == -1:
                e(f"{p}{name} = arith.subf {acc}, {v} : {vt}")
            else:
                e(f"{p}{name} = vector.fma {v}, {self.const(c)}, {acc} : {vt}")
            acc = name
        return acc


@dataclass(frozen=True)
class WinogradConv:
    """The Winograd form of one 3x3 stride-1 convolution (static geometry ``g``).

    Attributes:
        g: the convolution.
        tile: ``m`` of F(m x m, 3 x 3): 2 or 4.
        scale, shift, residual, relu: the output transform's epilogue (:mod:`.epilogues`), as
            :class:`.avx512_conv.Avx512Conv`'s.
        out_pad: the output written zero-padded by ``(rows, columns)`` on each side, as the
            next convolution reads it; ``(0, 0)``: ``[M, F]``.
    """

    g: Conv
    tile: int = 2
    scale: bool = False
    shift: bool = False
    residual: bool = False
    relu: bool = False
    out_pad: tuple[int, int] = (0, 0)
    #: never bf16 (the field the direct-convolution function's helpers read)
    bf16: bool = False

    @staticmethod
    def supports(g: Conv) -> bool:
        """A 3x3 stride-1, undilated convolution with a static batch and channels in
        multiples of 16 (the transforms' vectors)."""
        return (
            g.n is not None
            and (g.kh, g.kw) == (3, 3)
            and g.stride == (1, 1)
            and g.dilation == (1, 1)
            and g.c % 16 == 0
            and g.f % 16 == 0
            and g.padding[0] <= 1
            and g.padding[1] <= 1
        )

    def __post_init__(self) -> None:
        if not self.supports(self.g):
            raise ValueError(f"Winograd: unsupported convolution {self.g}")
        if self.tile not in (2, 4):
            raise ValueError(f"Winograd: tile {self.tile} (2 or 4)")

    # ------------------------------------------------------------------------------- geometry
    @property
    def alpha(self) -> int:
        """The input tile's side, ``m + 2``."""
        return self.tile + 2

    @property
    def positions(self) -> int:
        return self.alpha * self.alpha

    @property
    def th(self) -> int:
        return -(-self.g.oh // self.tile)

    @property
    def tw(self) -> int:
        return -(-self.g.ow // self.tile)

    @property
    def tiles(self) -> int:
        assert self.g.n is not None
        return self.g.n * self.th * self.tw

    @property
    def input_size(self) -> int:
        """Elements of the padded channels-last input (the direct kernel's layout)."""
        assert self.g.n is not None
        return self.g.n * self.g.hp * self.g.wp * self.g.c

    @property
    def m(self) -> int:
        """The output pixels."""
        assert self.g.n is not None
        return self.g.n * self.g.oh * self.g.ow

    @property
    def np_(self) -> int:
        """The output's channels (no padding: the output transform writes ``F``)."""
        return self.g.f

    @property
    def c_rows(self) -> int:
        assert self.g.n is not None
        qh, qw = self.out_pad
        return self.g.n * (self.g.oh + 2 * qh) * (self.g.ow + 2 * qw)

    @property
    def epilogue(self) -> tuple[str, ...]:
        steps = ("scale", "shift", "residual", "relu")
        return tuple(s for s in steps if getattr(self, s))

    @property
    def gemm(self) -> Avx512Gemm:
        """The matmul kernel: one packed ``C x F`` weight per tile position. On Intel, the
        direct kernel's blocking (6 x 64 register blocks in 96-row workgroups, the next
        reduction block prefetched into L2): on the Xeon 3-10 % faster per layer than the
        matmul kernel's default (4 x 64, 128 rows, no prefetch), which AMD keeps (not
        measured there)."""
        kernel = Avx512Gemm.for_shape(self.g.c, self.g.f, batch_b=True)
        if cpu_vendor() == "GenuineIntel":
            kernel = replace(kernel, mr=6, rows_per_workgroup=96, prefetch=1)
        return kernel

    @property
    def name(self) -> str:
        g = self.g
        return (
            f"__turbine_winograd_f{self.tile}x3_n{g.n}_c{g.c}_h{g.h}_w{g.w}_f{g.f}"
            f"_p{g.padding[0]}x{g.padding[1]}"
            + "".join(f"_{s}" for s in self.epilogue)
            + (f"_opad{self.out_pad[0]}x{self.out_pad[1]}" if any(self.out_pad) else "")
        )

    @property
    def input_name(self) -> str:
        g = self.g
        return (
            f"__turbine_winograd_f{self.tile}x3_in_n{g.n}_c{g.c}_h{g.h}_w{g.w}"
            f"_p{g.padding[0]}x{g.padding[1]}"
        )

    # ---------------------------------------------------------------------------- dispatches
    def input_dispatch(self, a: str) -> str:
        """The input transform's ``flow.dispatch``: ``a`` the padded input (1-D) ->
        ``tensor<(a^2 * tiles) x C x f32>``."""
        n = self.input_name
        return (
            f"flow.dispatch @{n}::@{n}({a}) : (tensor<{self.input_size}xf32>) -> "
            f"tensor<{self.positions * self.tiles}x{self.g.c}xf32>"
        )

    def output_dispatch(self, mm: str, *extra: str) -> str:
        """The output transform's ``flow.dispatch``: ``mm`` the matmuls' result
        (``(a^2 * tiles) x Np``), ``extra`` the epilogue's operands (scale, shift: ``F``
        floats; residual: ``M x F``) -> ``tensor<c_rows x F x f32>``."""
        f = self.g.f
        types = {
            "scale": f"tensor<{f}xf32>",
            "shift": f"tensor<{f}xf32>",
            "residual": f"tensor<{self.m}x{f}xf32>",
        }
        extra_t = [types[s] for s in self.epilogue if s in types]
        if len(extra) != len(extra_t):
            raise ValueError(f"Winograd: operands {extra} for {self.name}")
        rows = self.positions * self.tiles
        operands = ", ".join([mm, *extra])
        operand_t = ", ".join([f"tensor<{rows}x{self.gemm.np_}xf32>", *extra_t])
        n = self.name
        return (
            f"flow.dispatch @{n}::@{n}({operands}) : ({operand_t}) -> tensor<{self.c_rows}x{f}xf32>"
        )

    def weight_transform(self, e: Any, w: str) -> str:
        """Emits ``%wu``: ``U = G w G^T`` as ``tensor<a^2 x C x F>`` from ``w``
        (``tensor<F x C x 3 x 3>``); returns its name."""
        g, a = self.g, self.alpha
        _, gm, _ = winograd_matrices(self.tile)
        flat = ", ".join(_f32(v) for row in gm for v in row)
        gm_t = f"tensor<{a}x3xf32>"
        u4_t = f"tensor<{a}x{a}x{g.c}x{g.f}xf32>"
        e(f"  %wg_g = arith.constant dense<[{flat}]> : tensor<{a * 3}xf32>")
        e(
            f"  %wg_gm = tensor.expand_shape %wg_g [[0, 1]] output_shape [{a}, 3] : "
            f"tensor<{a * 3}xf32> into {gm_t}"
        )
        e("  %wg_zero = arith.constant 0.0 : f32")
        e(f"  %wg_empty = tensor.empty() : {u4_t}")
        e(f"  %wg_init = linalg.fill ins(%wg_zero : f32) outs(%wg_empty : {u4_t}) -> {u4_t}")
        e(
            "  %wg_u4 = linalg.generic {indexing_maps = ["
            "affine_map<(i, j, c, f, p, q) -> (i, p)>, "
            "affine_map<(i, j, c, f, p, q) -> (f, c, p, q)>, "
            "affine_map<(i, j, c, f, p, q) -> (j, q)>, "
            "affine_map<(i, j, c, f, p, q) -> (i, j, c, f)>], iterator_types = "
            '["parallel", "parallel", "parallel", "parallel", "reduction", "reduction"]} '
            f"ins(%wg_gm, {w}, %wg_gm : {gm_t}, tensor<{g.f}x{g.c}x3x3xf32>, {gm_t}) "
            f"outs(%wg_init : {u4_t}) {{"
        )
        e("  ^bb0(%gi: f32, %wv: f32, %gj: f32, %acc: f32):")
        e("    %t0 = arith.mulf %gi, %wv : f32")
        e("    %t1 = arith.mulf %t0, %gj : f32")
        e("    %t2 = arith.addf %acc, %t1 : f32")
        e("    linalg.yield %t2 : f32")
        e(f"  }} -> {u4_t}")
        e(
            f"  %wu = tensor.collapse_shape %wg_u4 [[0, 1], [2], [3]] : {u4_t} into "
            f"tensor<{a * a}x{g.c}x{g.f}xf32>"
        )
        return "%wu"

    # --------------------------------------------------------------------------- executables
    def input_executable(self) -> str:
        """The input transform's ``stream.executable``: one workgroup per tile row."""
        g, a, m = self.g, self.alpha, self.tile
        assert g.n is not None
        bt, _, _ = winograd_matrices(m)
        c, hp, wp, th, tw, tiles = g.c, g.hp, g.wp, self.th, self.tw, self.tiles
        vt = "vector<16xf32>"
        a_t = f"memref<{self.input_size}xf32>"
        v_t = f"memref<{self.positions * tiles * c}xf32>"
        out: list[str] = []
        e = out.append
        name = self.input_name
        open_static_executable(e, name, (g.n * th,), ["%a", "%v"])
        p = "      "
        for const in sorted({0, 1, 16, c, tw}):
            e(f"{p}%c{const} = arith.constant {const} : index")
        e(f"{p}%ma = stream.binding.subspan %a[%c0] : !stream.binding -> {a_t}")
        e(f"{p}%mv = stream.binding.subspan %v[%c0] : !stream.binding -> {v_t}")
        e(f"{p}%zero = arith.constant dense<0.0> : {vt}")
        e(f"{p}%wg = stream.dispatch.workgroup.id[0] : index")
        # rows and columns of a tile past the padded input read zeros (static: the last ones)
        rows_out = [r for r in range(a) if (th - 1) * m + r >= hp]
        cols_out = [q for q in range(a) if (tw - 1) * m + q >= wp]
        e(f"{p}%ty = affine.apply affine_map<()[s0] -> (s0 mod {th})>()[%wg]")
        e(f"{p}%img = affine.apply affine_map<()[s0] -> (s0 floordiv {th})>()[%wg]")
        if rows_out:
            e(f"{p}%tylast = arith.constant {th - 1} : index")
            e(f"{p}%rowedge = arith.cmpi eq, %ty, %tylast : index")
        e(f"{p}scf.for %tx = %c0 to %c{tw} step %c1 {{")
        q = p + "  "
        e(f"{q}%t = affine.apply affine_map<()[s0, s1] -> (s0 * {tw} + s1)>()[%wg, %tx]")
        if cols_out:
            e(f"{q}%txlast = arith.constant {tw - 1} : index")
            e(f"{q}%coledge = arith.cmpi eq, %tx, %txlast : index")
        e(f"{q}scf.for %cb = %c0 to %c{c} step %c16 {{")
        r = q + "  "
        comb = _Combiner(e, r)
        d: dict[tuple[int, int], str] = {}
        for i in range(a):
            for j in range(a):
                # the element offset of (img, ty*m + i, tx*m + j, cb); a position past the
                # padded input (the last tile's) reads some element inside it (then zeroed)
                off = f"((s0 * {hp} + s1 * {m} + {i}) * {wp} + s2 * {m} + {j}) * {c} + s3"
                if i in rows_out or j in cols_out:
                    e(
                        f"{r}%o{i}_{j} = affine.min affine_map<()[s0, s1, s2, s3] -> "
                        f"({off}, {self.input_size - 16})>()[%img, %ty, %tx, %cb]"
                    )
                else:
                    e(
                        f"{r}%o{i}_{j} = affine.apply affine_map<()[s0, s1, s2, s3] -> "
                        f"({off})>()[%img, %ty, %tx, %cb]"
                    )
                e(f"{r}%d{i}_{j}l = vector.load %ma[%o{i}_{j}] : {a_t}, {vt}")
                v = f"%d{i}_{j}l"
                conds = []
                if i in rows_out:
                    conds.append("%rowedge")
                if j in cols_out:
                    conds.append("%coledge")
                if conds:
                    cond = conds[0]
                    if len(conds) == 2:
                        e(f"{r}%e{i}_{j} = arith.ori %rowedge, %coledge : i1")
                        cond = f"%e{i}_{j}"
                    e(f"{r}%d{i}_{j} = arith.select {cond}, %zero, {v} : {vt}")
                    v = f"%d{i}_{j}"
                d[i, j] = v
        # t = B^T d (over rows), then v = t B (over columns)
        t: dict[tuple[int, int], str] = {}
        for i in range(a):
            for j in range(a):
                t[i, j] = comb.combine(f"%t{i}_{j}", bt[i], [d[k, j] for k in range(a)])
        for i in range(a):
            for j in range(a):
                v = comb.combine(f"%v{i}_{j}", bt[j], [t[i, k] for k in range(a)])
                pos = i * a + j
                e(
                    f"{r}%s{i}_{j} = affine.apply affine_map<()[s0, s1] -> "
                    f"(({pos * tiles} + s0) * {c} + s1)>()[%t, %cb]"
                )
                e(f"{r}vector.store {v}, %mv[%s{i}_{j}] : {v_t}, {vt}")
        e(f"{q}}}")
        e(f"{p}}}")
        close_executable(e)
        return "\n".join(out)

    def output_executable(self) -> str:
        """The output transform's ``stream.executable`` (with the epilogue and the zero border
        of :attr:`out_pad`): one workgroup per tile row."""
        g, a, m = self.g, self.alpha, self.tile
        assert g.n is not None
        _, _, at = winograd_matrices(m)
        f, oh, ow, th, tw, tiles = g.f, g.oh, g.ow, self.th, self.tw, self.tiles
        qh, qw = self.out_pad
        ohp, owp = oh + 2 * qh, ow + 2 * qw
        npg = self.gemm.np_
        vt = "vector<16xf32>"
        m_t = f"memref<{self.positions * tiles * npg}xf32>"
        c_t = f"memref<{self.c_rows * f}xf32>"
        v_t = f"memref<{f}xf32>"
        r_t = f"memref<{self.m * f}xf32>"
        out: list[str] = []
        e = out.append
        name = self.name
        binds = ["%m", *(f"%{s}" for s in self.epilogue if s != "relu"), "%c"]
        open_static_executable(e, name, (g.n * th,), binds)
        p = "      "
        for const in sorted({0, 1, 16, f, tw}):
            e(f"{p}%c{const} = arith.constant {const} : index")
        e(f"{p}%mm = stream.binding.subspan %m[%c0] : !stream.binding -> {m_t}")
        e(f"{p}%mc = stream.binding.subspan %c[%c0] : !stream.binding -> {c_t}")
        if self.scale:
            e(f"{p}%mscale = stream.binding.subspan %scale[%c0] : !stream.binding -> {v_t}")
        if self.shift:
            e(f"{p}%mshift = stream.binding.subspan %shift[%c0] : !stream.binding -> {v_t}")
        if self.residual:
            e(f"{p}%mres = stream.binding.subspan %residual[%c0] : !stream.binding -> {r_t}")
        e(f"{p}%zero = arith.constant dense<0.0> : {vt}")
        e(f"{p}%wg = stream.dispatch.workgroup.id[0] : index")
        e(f"{p}%ty = affine.apply affine_map<()[s0] -> (s0 mod {th})>()[%wg]")
        e(f"{p}%img = affine.apply affine_map<()[s0] -> (s0 floordiv {th})>()[%wg]")
        if qh or qw:
            self._zero_border(e, p, c_t)
        # output rows / columns of a tile past the output (static: the last tile's)
        rows_out = [r for r in range(m) if (th - 1) * m + r >= oh]
        cols_out = [q for q in range(m) if (tw - 1) * m + q >= ow]
        if rows_out:
            e(f"{p}%tylast = arith.constant {th - 1} : index")
            e(f"{p}%rowin = arith.cmpi ne, %ty, %tylast : index")
        e(f"{p}scf.for %tx = %c0 to %c{tw} step %c1 {{")
        q = p + "  "
        e(f"{q}%t = affine.apply affine_map<()[s0, s1] -> (s0 * {tw} + s1)>()[%wg, %tx]")
        if cols_out:
            e(f"{q}%txlast = arith.constant {tw - 1} : index")
            e(f"{q}%colin = arith.cmpi ne, %tx, %txlast : index")
        e(f"{q}scf.for %cb = %c0 to %c{f} step %c16 {{")
        r = q + "  "
        comb = _Combiner(e, r)
        mv: dict[tuple[int, int], str] = {}
        for i in range(a):
            for j in range(a):
                pos = i * a + j
                e(
                    f"{r}%o{i}_{j} = affine.apply affine_map<()[s0, s1] -> "
                    f"(({pos * tiles} + s0) * {npg} + s1)>()[%t, %cb]"
                )
                e(f"{r}%m{i}_{j} = vector.load %mm[%o{i}_{j}] : {m_t}, {vt}")
                mv[i, j] = f"%m{i}_{j}"
        if self.scale:
            e(f"{r}%sv = vector.load %mscale[%cb] : {v_t}, {vt}")
        if self.shift:
            e(f"{r}%bv = vector.load %mshift[%cb] : {v_t}, {vt}")
        s: dict[tuple[int, int], str] = {}
        for i in range(m):  # s = A^T M (over rows)
            for j in range(a):
                s[i, j] = comb.combine(f"%s{i}_{j}", at[i], [mv[k, j] for k in range(a)])
        for i in range(m):
            for j in range(m):  # y = s A (over columns)
                y = comb.combine(f"%y{i}_{j}", at[j], [s[i, k] for k in range(a)])
                conds = ([] if i not in rows_out else ["%rowin"]) + (
                    [] if j not in cols_out else ["%colin"]
                )
                w = r
                if conds:
                    cond = conds[0]
                    if len(conds) == 2:
                        e(f"{r}%in{i}_{j} = arith.andi %rowin, %colin : i1")
                        cond = f"%in{i}_{j}"
                    e(f"{r}scf.if {cond} {{")
                    w = r + "  "
                if self.scale:
                    e(f"{w}%ys{i}_{j} = arith.mulf {y}, %sv : {vt}")
                    y = f"%ys{i}_{j}"
                if self.shift:
                    e(f"{w}%yb{i}_{j} = arith.addf {y}, %bv : {vt}")
                    y = f"%yb{i}_{j}"
                if self.residual:
                    e(
                        f"{w}%ro{i}_{j} = affine.apply affine_map<()[s0, s1, s2, s3] -> "
                        f"(((s0 * {oh} + s1 * {m} + {i}) * {ow} + s2 * {m} + {j}) * {f} + s3)>"
                        "()[%img, %ty, %tx, %cb]"
                    )
                    e(f"{w}%rv{i}_{j} = vector.load %mres[%ro{i}_{j}] : {r_t}, {vt}")
                    e(f"{w}%ya{i}_{j} = arith.addf {y}, %rv{i}_{j} : {vt}")
                    y = f"%ya{i}_{j}"
                if self.relu:
                    e(relu_line(w, f"%yr{i}_{j}", y, "%zero"))
                    y = f"%yr{i}_{j}"
                e(
                    f"{w}%co{i}_{j} = affine.apply affine_map<()[s0, s1, s2, s3] -> "
                    f"(((s0 * {ohp} + s1 * {m} + {i + qh}) * {owp} + s2 * {m} + {j + qw}) * {f}"
                    " + s3)>()[%img, %ty, %tx, %cb]"
                )
                e(f"{w}vector.store {y}, %mc[%co{i}_{j}] : {c_t}, {vt}")
                if conds:
                    e(f"{r}}}")
        e(f"{q}}}")
        e(f"{p}}}")
        close_executable(e)
        return "\n".join(out)

    def _zero_border(self, e: Any, p: str, c_t: str) -> None:
        """Each workgroup zeroes the border columns of its output rows; the first and last
        tile rows also the border rows above and below the output."""
        g, m = self.g, self.tile
        f, oh, ow, th = g.f, g.oh, g.ow, self.th
        qh, qw = self.out_pad
        ohp, owp = oh + 2 * qh, ow + 2 * qw
        vt = "vector<16xf32>"
        # padded rows [lo, hi) of this workgroup: its tile's output rows, plus the border
        # rows above (first tile row) or below (last)
        e(f"{p}%zlo = affine.apply affine_map<()[s0] -> (s0 * {m} + {qh})>()[%ty]")
        e(f"{p}%zhi = affine.min affine_map<()[s0] -> (s0 * {m} + {m + qh}, {oh + qh})>()[%ty]")
        e(f"{p}%zfirst = arith.cmpi eq, %ty, %c0 : index")
        e(f"{p}%zlast_t = arith.constant {th - 1} : index")
        e(f"{p}%zlast = arith.cmpi eq, %ty, %zlast_t : index")
        e(f"{p}%zc0 = arith.constant 0 : index")
        e(f"{p}%zcend = arith.constant {ohp} : index")
        e(f"{p}%zlo2 = arith.select %zfirst, %zc0, %zlo : index")
        e(f"{p}%zhi2 = arith.select %zlast, %zcend, %zhi : index")
        e(f"{p}%zin_lo = arith.constant {qh} : index")
        e(f"{p}%zin_hi = arith.constant {oh + qh} : index")
        e(f"{p}%zowp = arith.constant {owp} : index")
        e(f"{p}scf.for %zr = %zlo2 to %zhi2 step %c1 {{")
        e(f"{p}  %zb1 = arith.cmpi ult, %zr, %zin_lo : index")
        e(f"{p}  %zb2 = arith.cmpi uge, %zr, %zin_hi : index")
        e(f"{p}  %zrow_b = arith.ori %zb1, %zb2 : i1")
        e(f"{p}  scf.for %zx = %c0 to %zowp step %c1 {{")
        e(f"{p}    %zqw = arith.constant {qw} : index")
        e(f"{p}    %zqw_hi = arith.constant {ow + qw} : index")
        e(f"{p}    %zb3 = arith.cmpi ult, %zx, %zqw : index")
        e(f"{p}    %zb4 = arith.cmpi uge, %zx, %zqw_hi : index")
        e(f"{p}    %zb34 = arith.ori %zb3, %zb4 : i1")
        e(f"{p}    %zb = arith.ori %zrow_b, %zb34 : i1")
        e(f"{p}    scf.if %zb {{")
        e(
            f"{p}      %zo = affine.apply affine_map<()[s0, s1, s2] -> "
            f"((s0 * {ohp} + s1) * {owp * f} + s2 * {f})>()[%img, %zr, %zx]"
        )
        e(f"{p}      scf.for %zf = %c0 to %c{f} step %c16 {{")
        e(f"{p}        %zof = arith.addi %zo, %zf : index")
        e(f"{p}        vector.store %zero, %mc[%zof] : {c_t}, {vt}")
        e(f"{p}      }}")
        e(f"{p}    }}")
        e(f"{p}  }}")
        e(f"{p}}}")


def winograd_choice(g: Conv) -> int:
    """The F(m, 3) tile for ``g`` on the AVX-512 fp32 path (0: the direct kernel):
    ``$TURBINE_CPU_WINOGRAD`` (``off``, ``2``, ``4``) when set, else the measured choice
    (docs/performance.md, section 13)."""
    if not WinogradConv.supports(g):
        return 0
    spec = os.environ.get(WINOGRAD_ENV, "").strip().lower()
    if spec == "off":
        return 0
    if spec in ("2", "4"):
        return int(spec)
    if spec:
        raise ValueError(f"{WINOGRAD_ENV}={spec!r}: expected off, 2 or 4")
    # Measured on the Xeon, one thread, ResNet's layers alone (benchmarks/conv_layers.py, JSON
    # under benchmarks/results/winograd-2026-12-03/): the direct kernel 1.61 / 1.32 / 1.34 /
    # 1.47 ms at 56 / 28 / 14 / 7 pixels a side (64 / 128 / 256 / 512 channels), F(2, 3)
    # 1.46 / 0.96 / 0.80 / 1.10, F(4, 3) 0.95 / 0.67 / 0.73 / 1.87 (docs/performance.md,
    # section 13). At 14 x 14 F(2, 3) is within 10 % of F(4, 3) with the smaller error and
    # weight; few channels leave the matmuls too little to do for the transforms' passes.
    if g.c < 64 or g.f < 64:
        return 0
    pixels = g.oh * g.ow
    if pixels >= 28 * 28:
        return 4
    if pixels >= 7 * 7:
        return 2
    return 0
