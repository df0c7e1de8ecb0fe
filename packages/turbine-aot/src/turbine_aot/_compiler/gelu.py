"""llvm-cpu: torch's exact GELU (``gelu(x, approximate="none")``, ``x Phi(x)``) computed by a
rational ``erf`` of turbine's own in the compile copy.

torch-mlir lowers ``torch.aten.gelu`` to ``0.5 x (1 + erf(x / sqrt 2))`` and IREE 3.13 expands
``math.erf`` into a piecewise rational approximation whose coefficients it selects per element
among three intervals (a compare and a select per coefficient and interval) before one
division: 1.26 ns a value on an AMD EPYC Zen 3 core, 12 % of ConvNeXt-atto's call there
(docs/performance.md, section 26). Here each f32 GELU becomes a call of a private function over
builtin tensors (IREE inlines it; one element-wise dispatch as before) that computes, per element,
with ``c`` = :data:`CLAMP`::

    xc = min(max(x, -c), c);  t = xc * xc
    r  = xc * P(t) / Q(t)                 (P degree 5, Q degree 5, Horner, one FMA a term)
    h  = 0.5 * x;  gelu = fma(h, r, h)    (h (1 + r))

``r`` is ``erf(x / sqrt 2)`` to 1.7e-8 relative on ``[0, c]`` (a minimax fit made by
``tools/fit_gelu_erf.py``); ``c`` is a point where ``r`` evaluates in f32 to exactly 1 (and, the
function being odd, -1 at ``-c``), so every ``|x| >= c`` gets ``r = +-1`` and ``gelu`` exactly
``x`` (the exact GELU rounded to f32 there) or 0 (the exact value is above -1.7e-7). The result is within 1.9e-7 relative of the exact GELU for ``x >= 0``
(eager's 5.2e-7, IREE's form's 1.9e-7), and within 2 ulp of the result's magnitude elsewhere
(``1 + r`` cancels for negative ``x`` as it does in eager's and IREE's forms); NaN and infinities
give eager's values (``gelu(-inf)`` is NaN in all three). About 17 vector instructions for 8
values, no selects of coefficients.

Taken: ``torch.aten.gelu`` with ``approximate="none"`` of an f32 tensor (static or dynamic
sizes). The tanh form and other dtypes stay as they are. ``TURBINE_CPU_GELU=iree`` leaves every
GELU to IREE (the A/B baseline).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .torch_ir import Builder, TensorType, TopLevel, builtin_tensor, walk

__all__ = [
    "CLAMP",
    "GELU_ENV",
    "GELU_FUNC_PREFIX",
    "P",
    "Q",
    "erf_gelus",
    "fast_gelu_enabled",
    "gelu_function",
    "rewrite_gelus",
]

#: Environment variable: ``iree`` leaves GELU's ``erf`` to IREE (the A/B baseline).
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


def _taken(op: Any) -> bool:
    if op.name != _GELU or len(list(op.operands)) != 2:
        return False
    xt, rt = TensorType.of(op.operands[0]), TensorType.of(op.results[0])
    return (
        xt is not None
        and rt is not None
        and xt.dtype == "f32"
        and rt.dtype == "f32"
        and rt.sizes == xt.sizes
        and _approximate(op) == "none"
    )


def erf_gelus(module_op: Any) -> list[Any]:
    """The GELUs of ``module_op`` that :func:`rewrite_gelus` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if _taken(o)]


def gelu_function(name: str, sizes: Sequence[int | None]) -> str:
    """The private function ``@name(%x) -> gelu(%x)`` over the builtin f32 tensor of ``sizes``
    (``None``: a dynamic size), computing the module doc's form element by element."""
    t = builtin_tensor(sizes, "f32")
    rank = len(sizes)
    lines = [f"func.func private @{name}(%x: {t}) -> {t} {{"]
    e = lines.append
    dims = []
    for i, s in enumerate(sizes):
        if s is None:
            e(f"  %c{i} = arith.constant {i} : index")
            e(f"  %d{i} = tensor.dim %x, %c{i} : {t}")
            dims.append(f"%d{i}")
    e(f"  %init = tensor.empty({', '.join(dims)}) : {t}")
    loops = ", ".join(f"d{i}" for i in range(rank))
    ident = f"affine_map<({loops}) -> ({loops})>"
    iterators = ", ".join(['"parallel"'] * rank)
    e(
        f"  %y = linalg.generic {{indexing_maps = [{ident}, {ident}], "
        f"iterator_types = [{iterators}]}} ins(%x : {t}) outs(%init : {t}) {{"
    )
    e("  ^bb0(%v: f32, %o: f32):")
    for label, value in (("lo", -CLAMP), ("hi", CLAMP), ("half", 0.5)):
        e(f"    %{label} = arith.constant {value!r} : f32")
    for which, coeffs in (("p", P), ("q", Q)):
        for i, c in enumerate(coeffs):
            e(f"    %{which}c{i} = arith.constant {c!r} : f32")
    # max(x, -c) and min(., c) as compare + select (one x86 instruction each; a NaN x goes
    # through as NaN, and h carries it into the result anyway)
    e("    %below = arith.cmpf ogt, %lo, %v : f32")
    e("    %xa = arith.select %below, %lo, %v : f32")
    e("    %above = arith.cmpf olt, %hi, %xa : f32")
    e("    %xc = arith.select %above, %hi, %xa : f32")
    e("    %t = arith.mulf %xc, %xc : f32")
    for which, coeffs in (("p", P), ("q", Q)):
        acc = f"%{which}c{len(coeffs) - 1}"
        for i in range(len(coeffs) - 2, -1, -1):
            e(f"    %{which}{i} = math.fma {acc}, %t, %{which}c{i} : f32")
            acc = f"%{which}{i}"
    e("    %num = arith.mulf %xc, %p0 : f32")
    e("    %r = arith.divf %num, %q0 : f32")
    e("    %h = arith.mulf %v, %half : f32")
    e("    %g = math.fma %h, %r, %h : f32")
    e("    linalg.yield %g : f32")
    e(f"  }} -> {t}")
    e(f"  return %y : {t}")
    e("}")
    return "\n".join(lines)


def rewrite_gelus(module_op: Any) -> int:
    """Rewrites, in place, each of :func:`erf_gelus` as a call of :func:`gelu_function` (one
    function per tensor type).

    Returns:
        How many GELUs were rewritten.
    """
    op = getattr(module_op, "operation", module_op)
    top = TopLevel(op)
    found = erf_gelus(op)
    functions: dict[tuple[int | None, ...], str] = {}
    for gelu in found:
        xt = TensorType.of(gelu.operands[0])
        assert xt is not None
        sizes = tuple(xt.sizes)
        t = builtin_tensor(sizes, "f32")
        if sizes not in functions:
            functions[sizes] = top.unique(f"{GELU_FUNC_PREFIX}_{len(functions)}")
            top.append(gelu_function(functions[sizes], sizes))
        back = Builder(gelu).call_on_builtins(
            functions[sizes], [(gelu.operands[0], t)], t, gelu.results[0].type
        )
        gelu.results[0].replace_all_uses_with(back)
        gelu.erase()
    return len(found)
