"""llvm-cpu: torch's GELU, exact (``x Phi(x)``) and tanh form, f32, computed by a rational
function of turbine's own in the compile copy.

torch-mlir lowers ``torch.aten.gelu`` to ``0.5 x (1 + erf(x / sqrt 2))``, or for
``approximate="tanh"`` (GPT-2's, Gemma's) to ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715
x^3)))``. IREE 3.13 expands ``math.erf`` into a rational approximation on three intervals whose
coefficients it selects per element (a compare and a select per coefficient and interval)
before one division: 1.26 ns a value on an AMD EPYC Zen 3 core, 12 % of ConvNeXt-atto's call
there; the tanh form with its ``math.tanh`` 0.83 ns, and that form is up to 5.1e-5 off through a
wrong constant in torch-mlir's lowering (below; docs/performance.md, section 26). Here each f32
GELU becomes a call of a private element-wise function (:mod:`.elementwise`; IREE inlines it:
one dispatch as before) that computes, per element, with ``P``, ``Q``, ``c`` of the form
(:data:`FORMS`)::

    xc = min(max(x, -c), c);  t = xc * xc
    r  = xc * P(t) / Q(t)                 (P degree 5, Q degree 5, Horner, one FMA a term)
    h  = 0.5 * x;  gelu = fma(h, r, h)    (h (1 + r))

``r`` is ``erf(x / sqrt 2)`` (exact form) or ``tanh(sqrt(2 / pi) (x + 0.044715 x^3))`` (tanh
form: odd in ``x`` too) to 1.7e-8 / 1.9e-8 relative on ``[0, c]`` (minimax fits made by
``tools/fit_gelu_erf.py``); ``c`` is a point where ``r`` evaluates in f32 to exactly 1 (and,
the function being odd, -1 at ``-c``), so every ``|x| >= c`` gets ``r = +-1`` and ``gelu``
exactly ``x`` (the GELU rounded to f32 there) or 0 (the GELU is above -1.7e-7 there). The
result is within 1.9e-7 relative of the exact value for ``x >= 0`` (eager's 5.2e-7 and 1.4e-7
for the two forms, IREE's 1.9e-7 and 5.6e-5), and within 2 ulp of ``max(|x|, 1)`` elsewhere
(``1 + r`` cancels for negative ``x`` as it does in eager's and IREE's code); NaN and infinities
give eager's values (``gelu(-inf)`` is NaN in all: ``-inf * 0``). About 17 vector instructions
for 8 values, no selects of coefficients: 0.47 ns a value.

Taken: ``torch.aten.gelu`` of an f32 tensor (static or dynamic sizes), either form; other
dtypes stay as they are. ``TURBINE_CPU_GELU=iree`` leaves every GELU to IREE (the A/B
baseline).

**Every target**: torch-mlir lowers the tanh form with ``sqrt(2 / pi)`` written as ``0.797724``
(it is 0.7978846), so that the GELU IREE computes is up to 5.1e-5 off at ``x`` near 1.3 (eager:
4.3e-7). Where the rational form above does not apply (other targets, ``TURBINE_CPU_GELU=iree``),
an f32 tanh-form GELU is written out as the torch ops of eager's formula, ``0.5 x (1 +
tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``, with the right constant
(:func:`rewrite_tanh_gelus_as_ops`). f16 and bf16 ones keep torch-mlir's lowering (the error is
far below their precision); f64 ones too (IREE 3.13 cannot link an f64 ``tanh`` on llvm-cpu
either way).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .elementwise import Body, elementwise_function, f32_ops, rewrite_elementwise_ops
from .torch_ir import Builder, replace_each

__all__ = [
    "CLAMP",
    "CLAMP_TANH",
    "FORMS",
    "GELU_ENV",
    "GELU_FUNC_PREFIX",
    "P_TANH",
    "Q_TANH",
    "P",
    "Q",
    "fast_gelu_enabled",
    "gelu_function",
    "rewritable_gelus",
    "rewrite_gelus",
    "rewrite_tanh_gelus_as_ops",
    "tanh_gelus",
]

#: Environment variable: ``iree`` leaves every GELU to IREE's ``math.erf`` / ``math.tanh`` (the
#: A/B baseline).
GELU_ENV = "TURBINE_CPU_GELU"

#: The private functions' names start so.
GELU_FUNC_PREFIX = "__turbine_gelu"

#: ``erf(x / sqrt 2) ~ x P(x^2) / Q(x^2)``: the numerator's and the denominator's coefficients,
#: lowest degree first, each an f32 value (``tools/fit_gelu_erf.py``).
P = (
    0.7978845238685608,
    0.0669177994132042,
    0.009302965365350246,
    0.0003291476459708065,
    1.260318276763428e-05,
    4.5862307729294116e-08,
)
Q = (
    1.0,
    0.25053542852401733,
    0.028416134417057037,
    0.0018606464145705104,
    7.216705853352323e-05,
    1.1990283610430197e-06,
)
#: ``x`` is clamped to ``[-CLAMP, CLAMP]`` for ``r``; ``r(CLAMP)`` is exactly 1.0 in f32, and
#: ``CLAMP`` is the exact GELU of ``CLAMP`` rounded to f32 (an f32 value).
CLAMP = 5.417895317077637

#: The tanh form's ``tanh(sqrt(2 / pi) (x + 0.044715 x^3)) ~ x P_TANH(x^2) / Q_TANH(x^2)``
#: (``tools/fit_gelu_erf.py --form tanh``), clamped at ``CLAMP_TANH`` as :data:`CLAMP`.
P_TANH = (
    0.7978845834732056,
    0.061199650168418884,
    0.007291432470083237,
    0.00027060872525908053,
    1.4126467249298003e-05,
    4.794985031253418e-08,
)
Q_TANH = (
    1.0,
    0.24419431388378143,
    0.024466438218951225,
    0.0013096488546580076,
    7.630823529325426e-05,
    1.3138869690010324e-06,
)
CLAMP_TANH = 5.253472328186035

#: Per ``approximate``: the numerator, the denominator and the clamp.
FORMS = {"none": (P, Q, CLAMP), "tanh": (P_TANH, Q_TANH, CLAMP_TANH)}

_GELU = "torch.aten.gelu"


def fast_gelu_enabled() -> bool:
    """Whether f32 GELUs are computed by :func:`gelu_function` (unless
    ``TURBINE_CPU_GELU=iree``)."""
    return os.environ.get(GELU_ENV, "").strip().lower() != "iree"


def _approximate(op: Any) -> str | None:
    """The ``approximate`` string of a ``torch.aten.gelu``, if it is a constant."""
    from turbine_ir.ir import StringAttr

    owner = op.operands[1].owner
    if getattr(owner, "name", None) != "torch.constant.str":
        return None
    return str(StringAttr(owner.attributes["value"]).value)


def rewritable_gelus(module_op: Any) -> list[Any]:
    """The GELUs of ``module_op`` that :func:`rewrite_gelus` rewrites: f32, either form."""
    return [o for o in f32_ops(module_op, {_GELU}, 2) if _approximate(o) in FORMS]


def gelu_function(name: str, sizes: Sequence[int | None], approximate: str = "none") -> str:
    """The private function ``@name(%x) -> gelu(%x)`` over the builtin f32 tensor of ``sizes``
    (``None``: a dynamic size), computing the module doc's form of ``approximate`` (``none``
    or ``tanh``) element by element."""
    return elementwise_function(name, sizes, _body(approximate))


def _body(approximate: str) -> Body:
    return lambda e: _rational_form(e, *FORMS[approximate])


def _rational_form(e: Any, p: Sequence[float], q: Sequence[float], clamp: float) -> str:
    """The body of the module doc's form for ``r = x p(x^2) / q(x^2)`` clamped at ``clamp``;
    returns its result's name."""
    for label, value in (("lo", -clamp), ("hi", clamp), ("half", 0.5)):
        e(f"%{label} = arith.constant {value!r} : f32")
    for which, coeffs in (("p", p), ("q", q)):
        for i, c in enumerate(coeffs):
            e(f"%{which}c{i} = arith.constant {c!r} : f32")
    # max(x, -c) and min(., c) as compare + select (one x86 instruction each; a NaN x goes
    # through as NaN, and h carries it into the result anyway)
    e("%below = arith.cmpf ogt, %lo, %v : f32")
    e("%xa = arith.select %below, %lo, %v : f32")
    e("%above = arith.cmpf olt, %hi, %xa : f32")
    e("%xc = arith.select %above, %hi, %xa : f32")
    e("%t = arith.mulf %xc, %xc : f32")
    for which, coeffs in (("p", p), ("q", q)):
        acc = f"%{which}c{len(coeffs) - 1}"
        for i in range(len(coeffs) - 2, -1, -1):
            e(f"%{which}{i} = math.fma {acc}, %t, %{which}c{i} : f32")
            acc = f"%{which}{i}"
    e("%num = arith.mulf %xc, %p0 : f32")
    e("%r = arith.divf %num, %q0 : f32")
    e("%h = arith.mulf %v, %half : f32")
    e("%g = math.fma %h, %r, %h : f32")
    # below the clamp h r + h is exactly 0 (r = -1), but -inf gives inf - inf: 0 there too
    # (eager's own GELU gives NaN at -inf, and at +inf on AVX-512 hosts)
    e("%zero = arith.constant 0.0 : f32")
    e("%gz = arith.select %below, %zero, %g : f32")
    return "%gz"


def rewrite_gelus(module_op: Any) -> int:
    """Rewrites, in place, each of :func:`rewritable_gelus` as a call of :func:`gelu_function`
    (one function per form and tensor type).

    Returns:
        How many GELUs were rewritten.
    """

    def form(gelu: Any) -> tuple[str, str, Body]:
        approximate = _approximate(gelu)
        assert approximate is not None
        return approximate, "" if approximate == "none" else "_tanh", _body(approximate)

    return rewrite_elementwise_ops(module_op, rewritable_gelus(module_op), GELU_FUNC_PREFIX, form)


#: ``sqrt(2 / pi)``, the tanh form's scale (torch-mlir's ``0.797724`` is off in the fourth
#: digit), and its cube's coefficient.
SQRT_2_OVER_PI = 0.7978845608028654
KAPPA = 0.044715


def tanh_gelus(module_op: Any) -> list[Any]:
    """The f32 tanh-form GELUs of ``module_op`` (:func:`rewrite_tanh_gelus_as_ops`)."""
    return [o for o in f32_ops(module_op, {_GELU}, 2) if _approximate(o) == "tanh"]


def rewrite_tanh_gelus_as_ops(module_op: Any) -> int:
    """Rewrites, in place, each of :func:`tanh_gelus` as the torch ops of eager's formula,
    ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`` (``x^3`` as ``x * x * x``), with the
    right ``sqrt(2 / pi)`` (module doc).

    Returns:
        How many GELUs were rewritten.
    """
    return replace_each(tanh_gelus(module_op), _tanh_formula)


def _tanh_formula(b: Builder, gelu: Any) -> Any:
    """The torch ops of :func:`rewrite_tanh_gelus_as_ops` for ``gelu``, before it; returns the
    result."""
    x, t = gelu.operands[0], str(gelu.results[0].type)

    def op(name: str, *operands: Any) -> Any:
        return b.op(name, t, list(operands))

    cube = op("torch.aten.mul.Tensor", op("torch.aten.mul.Tensor", x, x), x)
    kappa_cube = op("torch.aten.mul.Scalar", cube, b.float(KAPPA))
    inner = op("torch.aten.add.Tensor", x, kappa_cube, b.int(1))
    tanh = op("torch.aten.tanh", op("torch.aten.mul.Scalar", inner, b.float(SQRT_2_OVER_PI)))
    one_plus = op("torch.aten.add.Scalar", tanh, b.float(1.0), b.int(1))
    return op("torch.aten.mul.Tensor", op("torch.aten.mul.Scalar", x, b.float(0.5)), one_plus)
