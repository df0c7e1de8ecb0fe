"""``torch.sin``, ``torch.cos``, ``torch.tan`` (llvm-cpu), ``torch.atan``, ``torch.atan2`` and
``torch.asin`` (llvm-cpu and Vulkan), f32, by turbine's own code in the compile copy: accurate,
for large arguments too.

IREE 3.13 expands ``math.sin`` / ``math.cos`` with one f32 constant for ``pi / 2`` in its range
reduction, ``r = x - k * 1.5707964``: the constant's error (4.4e-8) grows with ``k``, so the
result is off by about ``2.8e-8 * |x|``: 2.8e-5 at ``|x|`` = 1000, 1.1e-4 at 4096, 9e-4 at 32768,
2.8e-2 at 1e6 (eager: 3.6e-8 everywhere; docs/performance.md, section 27). Rotary position
embeddings compute ``cos`` and ``sin`` of ``position * frequency`` in the graph (Hugging Face's
Llama, Qwen, Mistral; ``inv_freq[0]`` is 1, so the argument is the position), so a long decode's
rotations drift. Here each f32 ``sin`` / ``cos`` becomes a call of an element-wise function
(:mod:`.elementwise`) computing, per element::

    p + err = x * 2 / pi      (p = x * T0 rounded; err = its rounding error, an FMA, + x T1 + x T2)
    k = floor(p + 1/2),  f = (p - k) + err,  k2 = floor(f + 1/2),  f = f - k2
    r = f * pi / 2            (pi / 2 in two parts);  quadrant = (k + k2) mod 4
    s = r + r^3 S(r^2),  c = 1 - r^2 / 2 + r^4 C(r^2)   (|r| <= pi / 4, degree 2 in r^2 each)
    sin x = +-s or +-c by the quadrant (cos: the quadrant plus one)
    tan x = s / c in even quadrants, -c / s in odd ones

IREE's ``tan`` is its ``sin`` over its ``cos``, so the same drift, divided by a small ``cos``
near the poles, made it 0.66 off in relative terms over -100 .. 100 (5.5e-6 at x = 30, 9.6e-4
at 1e4; eager 8.4e-8); this form is within 2.5e-7 there (2.1e-6 up to 1e4, near the poles).

``T0 + T1 + T2`` is ``2 / pi`` in three f32 parts and ``p - k`` is exact, so ``f``, the
fraction of ``x 2 / pi``, is right to the rounding of ``x T1`` (which can exceed 1/2 for large
``|x|``, hence the second rounding). The polynomials are minimax fits for relative error on
``[0, pi / 4]`` (3.8e-9 and 1.2e-10; ``tools/fit_sin_cos.py``). Measured against float64:
within 1.3e-7 for ``|x|`` up to 1e7 (IREE's: 2.8e-2 at 1e6), 4.3e-7 up to 1e8, 1.3e-5 up to
3.3e9; beyond 2^31 ``pi / 2`` the quadrant overflows and the values, though within [-1, 1],
are wrong (f32 arguments there are 256 or more apart). NaN and infinities give NaN, as eager;
subnormal arguments are flushed to zero (IREE's CPU code flushes them). About 1.3x IREE's time
a value (0.75 against 0.56 ns on a Zen 3 core), a small share of any model. The reduction
relies on fused FMAs, which llvm-cpu has; Vulkan's ``Fma`` may round twice (on lavapipe this
form is still 1.9e-4 off at 4096), so other targets keep IREE's ``sin`` / ``cos`` / ``tan``.

IREE's ``atan`` is a polynomial 4.1e-6 off in relative terms (eager 7.8e-8). Here::

    a = |x|;  t, offset = -1 / a, pi / 2            (a > tan(3 pi / 8))
                        = (a - 1) / (a + 1), pi / 4 (a > tan(pi / 8))
                        = a, 0                      (otherwise)
    atan x = sign(x) (offset + t + t^3 P(t^2))      (|t| <= tan(pi / 8); the offset in two parts)

with ``P`` of four terms (minimax for relative error, 2.1e-8; ``tools/fit_atan.py``): within
1.3e-7 relative of float64 from 1e-30 to 1e30 in magnitude; infinities give ``+-pi / 2``, NaN
NaN, ``-0`` ``-0``. One division a value.

IREE's ``atan2`` has the same polynomial (4.1e-6 off) and returns NaN for ``atan2(0, 0)``
(eager: 0). ``atan2(y, x)`` of two f32 tensors of the result's shape (a broadcast operand keeps
IREE's) is here ``atan q`` of ``q = min(|x|, |y|) / max(|x|, |y|)`` (0 for two zeros, 1 for two
infinities), reduced as above by ``(min - max) / (min + max)``, then ``k pi / 4 +- s`` with
``k`` 0 .. 4 by the swap and the sign bit of ``x`` (a table of ``k pi / 4`` in two parts, added
last), and the sign of ``y``: within 2e-7 relative of float64 (eager 6.9e-8; the reduced
branch's results near 0.39 lose about two ulp), C's special values for signed zeros,
infinities and NaN, and results below f32's smallest normal flushed to zero, as IREE's CPU
code flushes subnormals. ``asin x`` (IREE's 5e-7 off) is the same function of ``x`` and
``sqrt((1 - x) (1 + x))``: within 2.5e-7. ``atan``, ``atan2`` and ``asin`` are rewritten on
Vulkan too (``inverse_only``: they need no fused FMA; lavapipe 1.3e-7 and 1.7e-7 for the first
two, IREE's 4.1e-6 there).

``TURBINE_CPU_TRIG=iree`` leaves them to IREE (the A/B baseline).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from .elementwise import Body, f32_ops, rewrite_elementwise_ops

__all__ = [
    "ATAN_BOUNDS",
    "ATAN_POLY",
    "COS_POLY",
    "PIO2",
    "SIN_POLY",
    "TRIG_ENV",
    "TRIG_FUNC_PREFIX",
    "TWO_OVER_PI",
    "atan2_ops",
    "rewritable_trig",
    "rewrite_trig",
    "trig_enabled",
]

#: Environment variable: ``iree`` leaves ``sin``, ``cos``, ``tan``, ``atan``, ``atan2`` and
#: ``asin`` to IREE (the A/B baseline).
TRIG_ENV = "TURBINE_CPU_TRIG"

#: The private functions' names start so.
TRIG_FUNC_PREFIX = "__turbine_"

#: ``2 / pi`` as three f32 values (their sum), and ``pi / 2`` as two.
TWO_OVER_PI = (0.6366197466850281, 2.5682552973194106e-08, 2.937095479631555e-16)
PIO2 = (1.5707963705062866, -4.371138828673793e-08)

#: ``sin(r) = r + r^3 (S0 + S1 r^2 + S2 r^4)`` and ``cos(r) = 1 - r^2 / 2 + r^4 (C0 + C1 r^2 + C2
#: r^4)`` on ``|r| <= pi / 4`` (f32 values; minimax for relative error, ``tools/fit_sin_cos.py``).
SIN_POLY = (-0.16666655242443085, 0.00833216030150652, -0.00019515282474458218)
COS_POLY = (0.04166664555668831, -0.0013887316454201937, 2.44331567955669e-05)

#: ``atan(t) = t + t^3 (A0 + A1 t^2 + A2 t^4 + A3 t^6)`` on ``|t| <= tan(pi / 8)`` (f32 values;
#: minimax for relative error, ``tools/fit_atan.py``).
ATAN_POLY = (-0.3333294987678528, 0.19977709650993347, -0.1387767791748047, 0.08053722232580185)
#: ``k pi / 4`` for ``k`` 0 .. 4, each as an f32 and the f32 nearest its rounding error.
PI_QUARTERS = tuple(
    (
        float(np.float32(k * math.pi / 4)),
        float(np.float32(k * math.pi / 4 - float(np.float32(k * math.pi / 4)))),
    )
    for k in range(5)
)
#: ``tan(3 pi / 8)`` and ``tan(pi / 8)``: where the argument is reduced by ``pi / 2`` or ``pi / 4``.
ATAN_BOUNDS = (2.4142136573791504, 0.41421356797218323)

_OPS = {
    "torch.aten.sin": "sin",
    "torch.aten.cos": "cos",
    "torch.aten.tan": "tan",
    "torch.aten.atan": "atan",
    "torch.aten.asin": "asin",
}


def trig_enabled() -> bool:
    """Whether f32 ``sin`` / ``cos`` / ``tan`` / ``atan`` / ``asin`` / ``atan2`` are rewritten
    (unless ``TURBINE_CPU_TRIG=iree``)."""
    return os.environ.get(TRIG_ENV, "").strip().lower() != "iree"


def atan2_ops(module_op: Any) -> list[Any]:
    """The ``torch.aten.atan2`` ops of ``module_op`` on two f32 tensors of the result's sizes
    (a broadcast one keeps IREE's)."""
    return f32_ops(module_op, {"torch.aten.atan2"}, 2, tensors=2)


def rewritable_trig(module_op: Any, inverse_only: bool = False) -> list[Any]:
    """The f32 ``sin`` / ``cos`` / ``tan`` / ``atan`` / ``asin`` / ``atan2`` ops of ``module_op``
    that :func:`rewrite_trig` rewrites (``inverse_only``: ``atan``, ``asin`` and ``atan2``)."""
    return f32_ops(module_op, _unary(inverse_only), 1) + atan2_ops(module_op)


def _unary(inverse_only: bool) -> dict[str, str]:
    """The one-operand ops rewritten: all, or ``atan`` and ``asin`` alone."""
    return {k: v for k, v in _OPS.items() if v in ("atan", "asin")} if inverse_only else _OPS


def _body(kind: str) -> Body:
    def body(e: Any) -> str:
        for name, value in (
            *((f"tp{i}", c) for i, c in enumerate(TWO_OVER_PI)),
            *((f"pio{i}", c) for i, c in enumerate(PIO2)),
            ("half", 0.5),
            ("one", 1.0),
            ("mhalf", -0.5),
            *((f"s{i}", c) for i, c in enumerate(SIN_POLY)),
            *((f"c{i}", c) for i, c in enumerate(COS_POLY)),
        ):
            e(f"%{name} = arith.constant {value!r} : f32")
        for name, value in (("i1", 1), ("i2", 2), ("i30", 30)):
            e(f"%{name} = arith.constant {value} : i32")
        # x 2 / pi = p + err exactly enough: p rounded, err its rounding error (an FMA) plus x
        # times the rest of 2 / pi
        e("%p = arith.mulf %v, %tp0 : f32")
        e("%np = arith.negf %p : f32")
        e("%err0 = math.fma %v, %tp0, %np : f32")
        e("%err1 = math.fma %v, %tp1, %err0 : f32")
        e("%err = math.fma %v, %tp2, %err1 : f32")
        # k, an integer nearest p (floor(p + 1/2): one vroundps); p - k is exact
        e("%ph = arith.addf %p, %half : f32")
        e("%k = math.floor %ph : f32")
        e("%pk = arith.subf %p, %k : f32")
        e("%frac1 = arith.addf %pk, %err : f32")
        # err can exceed 1/2 for large |x| (x times the rest of 2 / pi): rounded off once more
        e("%fh = arith.addf %frac1, %half : f32")
        e("%k2 = math.floor %fh : f32")
        e("%frac = arith.subf %frac1, %k2 : f32")
        e("%ki1 = arith.fptosi %k : f32 to i32")
        e("%ki2 = arith.fptosi %k2 : f32 to i32")
        e("%ki = arith.addi %ki1, %ki2 : i32")
        q = "%ki"
        if kind == "cos":  # cos x = sin(x + pi / 2): one quadrant on
            e("%kc = arith.addi %ki, %i1 : i32")
            q = "%kc"
        # r = frac pi / 2, pi / 2 in two parts
        e("%rlo = arith.mulf %frac, %pio1 : f32")
        e("%r = math.fma %frac, %pio0, %rlo : f32")
        e("%t = arith.mulf %r, %r : f32")
        e("%sp1 = math.fma %s2, %t, %s1 : f32")
        e("%sp = math.fma %sp1, %t, %s0 : f32")
        e("%rt = arith.mulf %r, %t : f32")
        e("%sn = math.fma %rt, %sp, %r : f32")
        e("%cp1 = math.fma %c2, %t, %c1 : f32")
        e("%cp = math.fma %cp1, %t, %c0 : f32")
        e("%ch = math.fma %t, %mhalf, %one : f32")
        e("%tt = arith.mulf %t, %t : f32")
        e("%cs = math.fma %tt, %cp, %ch : f32")
        e(f"%odd = arith.andi {q}, %i1 : i32")
        e("%swap = arith.trunci %odd : i32 to i1")
        if kind == "tan":  # period pi: tan r, or -cos r / sin r one quadrant on
            e("%num = arith.select %swap, %cs, %sn : f32")
            e("%den = arith.select %swap, %sn, %cs : f32")
            e("%quo = arith.divf %num, %den : f32")
            e("%neg = arith.negf %quo : f32")
            e("%tan = arith.select %swap, %neg, %quo : f32")
            return "%tan"
        # odd quadrants take the other polynomial, quadrants 2 and 3 the opposite sign
        e("%val = arith.select %swap, %cs, %sn : f32")
        e(f"%upper = arith.andi {q}, %i2 : i32")
        e("%sign = arith.shli %upper, %i30 : i32")
        e("%bits = arith.bitcast %val : f32 to i32")
        e("%flip = arith.xori %bits, %sign : i32")
        e("%res = arith.bitcast %flip : i32 to f32")
        return "%res"

    return body


def _atan_body(e: Any) -> str:
    """``atan``: ``|x|`` reduced to ``|t| <= tan(pi / 8)`` (``t = -1 / |x|`` plus ``pi / 2``
    above ``tan(3 pi / 8)``, ``t = (|x| - 1) / (|x| + 1)`` plus ``pi / 4`` above ``tan(pi /
    8)``), the polynomial, the offset added in two parts, the sign of ``x``."""
    for name, value in (
        *((f"a{i}", c) for i, c in enumerate(ATAN_POLY)),
        ("hi", ATAN_BOUNDS[0]),
        ("lo", ATAN_BOUNDS[1]),
        ("one", 1.0),
        ("mone", -1.0),
        ("zero", 0.0),
        ("pio2h", PIO2[0]),
        ("pio2l", PIO2[1]),
        ("pio4h", PIO2[0] / 2),
        ("pio4l", PIO2[1] / 2),
    ):
        e(f"%{name} = arith.constant {value!r} : f32")
    e("%ax = math.absf %v : f32")
    e("%big = arith.cmpf ogt, %ax, %hi : f32")
    e("%mid = arith.cmpf ogt, %ax, %lo : f32")
    # the two reduced arguments, computed as one quotient: -1 / a, or (a - 1) / (a + 1)
    e("%am1 = arith.subf %ax, %one : f32")
    e("%ap1 = arith.addf %ax, %one : f32")
    e("%num = arith.select %big, %mone, %am1 : f32")
    e("%den = arith.select %big, %ax, %ap1 : f32")
    e("%quo = arith.divf %num, %den : f32")
    e("%t = arith.select %mid, %quo, %ax : f32")
    e("%oh1 = arith.select %mid, %pio4h, %zero : f32")
    e("%oh = arith.select %big, %pio2h, %oh1 : f32")
    e("%ol1 = arith.select %mid, %pio4l, %zero : f32")
    e("%ol = arith.select %big, %pio2l, %ol1 : f32")
    e("%z = arith.mulf %t, %t : f32")
    e("%p2 = math.fma %a3, %z, %a2 : f32")
    e("%p1 = math.fma %p2, %z, %a1 : f32")
    e("%p0 = math.fma %p1, %z, %a0 : f32")
    e("%tz = arith.mulf %t, %z : f32")
    e("%lo_t = math.fma %tz, %p0, %ol : f32")  # t^3 P(z) + the offset's low part
    e("%small = arith.addf %t, %lo_t : f32")
    e("%r = arith.addf %oh, %small : f32")
    e("%res = math.copysign %r, %v : f32")
    return "%res"


def _atan2_body(e: Any) -> str:
    """``atan2(y, x)`` (``%v``, ``%w``): the smaller magnitude over the larger, ``q`` in
    ``[0, 1]`` (0 where both are zero, 1 where both are infinite), ``atan q`` as in
    :func:`_atan_body` (``q`` above ``tan(pi / 8)`` by ``(q - 1) / (q + 1)`` plus ``pi / 4``),
    then ``pi / 2 - r`` where ``|y| > |x|``, ``pi - r`` where ``x`` is negative (its sign bit:
    ``-0`` too), the sign of ``y``: C's and torch's special values."""
    for name, value in (
        *((f"a{i}", c) for i, c in enumerate(ATAN_POLY)),
        ("lo", ATAN_BOUNDS[1]),
        ("one", 1.0),
        ("zero", 0.0),
    ):
        e(f"%{name} = arith.constant {value!r} : f32")
    e("%inf = arith.constant 0x7F800000 : f32")  # +inf
    e("%ay = math.absf %v : f32")
    e("%ax = math.absf %w : f32")
    e("%swap = arith.cmpf ogt, %ay, %ax : f32")
    e("%num = arith.select %swap, %ax, %ay : f32")
    e("%den = arith.select %swap, %ay, %ax : f32")
    e("%q0 = arith.divf %num, %den : f32")
    e("%yz = arith.cmpf oeq, %ay, %zero : f32")
    e("%xz = arith.cmpf oeq, %ax, %zero : f32")
    e("%zz = arith.andi %yz, %xz : i1")
    e("%yi = arith.cmpf oeq, %ay, %inf : f32")
    e("%xi = arith.cmpf oeq, %ax, %inf : f32")
    e("%ii = arith.andi %yi, %xi : i1")
    e("%q1 = arith.select %zz, %zero, %q0 : f32")
    e("%q = arith.select %ii, %one, %q1 : f32")
    e("%mid = arith.cmpf ogt, %q, %lo : f32")
    # (q - 1) / (q + 1) as (num - den) / (num + den): one rounding fewer (0 for two infinities)
    e("%dif = arith.subf %num, %den : f32")
    e("%sum = arith.addf %num, %den : f32")
    e("%red0 = arith.divf %dif, %sum : f32")
    e("%red = arith.select %ii, %zero, %red0 : f32")
    e("%t = arith.select %mid, %red, %q : f32")
    e("%z = arith.mulf %t, %t : f32")
    e("%p2 = math.fma %a3, %z, %a2 : f32")
    e("%p1 = math.fma %p2, %z, %a1 : f32")
    e("%p0 = math.fma %p1, %z, %a0 : f32")
    e("%tz = arith.mulf %t, %z : f32")
    # atan q = k pi / 4 + s (k: 0 or 1; s = t + t^3 P); |y| > |x| gives pi / 2 - atan q,
    # a negative x pi minus that: k' pi / 4 +- s, k' in 0 .. 4, the multiple in two parts
    # from a table and added last (one rounding)
    e("%s3 = arith.mulf %tz, %p0 : f32")
    e("%s = arith.addf %t, %s3 : f32")
    e("%i1 = arith.constant 1 : i32")
    e("%i2 = arith.constant 2 : i32")
    e("%i4 = arith.constant 4 : i32")
    e("%k0 = arith.extui %mid : i1 to i32")
    e("%k1s = arith.subi %i2, %k0 : i32")
    e("%k1 = arith.select %swap, %k1s, %k0 : i32")
    e("%xbits = arith.bitcast %w : f32 to i32")
    e("%izero = arith.constant 0 : i32")
    e("%xneg = arith.cmpi slt, %xbits, %izero : i32")
    e("%k2s = arith.subi %i4, %k1 : i32")
    e("%k = arith.select %xneg, %k2s, %k1 : i32")
    e("%flip = arith.xori %swap, %xneg : i1")  # s enters negated
    e("%ns = arith.negf %s : f32")
    e("%ss = arith.select %flip, %ns, %s : f32")
    hi, lo = "%zero", "%zero"
    for j in range(1, 5):
        e(f"%kh{j} = arith.constant {PI_QUARTERS[j][0]!r} : f32")
        e(f"%kl{j} = arith.constant {PI_QUARTERS[j][1]!r} : f32")
        e(f"%ic{j} = arith.constant {j} : i32")
        e(f"%is{j} = arith.cmpi eq, %k, %ic{j} : i32")
        e(f"%hsel{j} = arith.select %is{j}, %kh{j}, {hi} : f32")
        e(f"%lsel{j} = arith.select %is{j}, %kl{j}, {lo} : f32")
        hi, lo = f"%hsel{j}", f"%lsel{j}"
    e(f"%tail = arith.addf {lo}, %ss : f32")
    e(f"%r2 = arith.addf {hi}, %tail : f32")
    e("%res = math.copysign %r2, %v : f32")
    return "%res"


def _asin_body(e: Any) -> str:
    """``asin x = atan2(x, sqrt((1 - x) (1 + x)))`` (:func:`_atan2_body` with ``%w`` that
    square root: NaN beyond ``|x| = 1``, ``+-pi / 2`` at ``+-1``)."""
    e("%asin_one = arith.constant 1.0 : f32")
    e("%asin_m = arith.subf %asin_one, %v : f32")
    e("%asin_p = arith.addf %asin_one, %v : f32")
    e("%asin_q = arith.mulf %asin_m, %asin_p : f32")
    e("%w = math.sqrt %asin_q : f32")
    return _atan2_body(e)


def rewrite_trig(module_op: Any, inverse_only: bool = False) -> int:
    """Rewrites, in place, each of :func:`rewritable_trig` as a call of an element-wise
    function computing the module doc's form (one function per op kind and tensor type);
    ``inverse_only``: ``atan``, ``asin`` and ``atan2`` only (Vulkan, where the forward functions'
    range reduction would need fused FMAs).

    Returns:
        How many ops were rewritten.
    """

    def form(op: Any) -> tuple[str, str, Body]:
        kind = _OPS[op.name]
        bodies = {"atan": _atan_body, "asin": _asin_body}
        return kind, kind, bodies.get(kind) or _body(kind)

    unary = f32_ops(module_op, _unary(inverse_only), 1)
    count = rewrite_elementwise_ops(module_op, unary, TRIG_FUNC_PREFIX, form)
    atan2 = atan2_ops(module_op)
    return count + rewrite_elementwise_ops(
        module_op, atan2, TRIG_FUNC_PREFIX, lambda op: ("atan2", "atan2", _atan2_body), inputs=2
    )
