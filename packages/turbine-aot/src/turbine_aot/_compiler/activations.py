"""The activations turbine's CPU kernels compute in their stores (:mod:`.avx512`'s matmul and
direct-convolution epilogues, :mod:`.depthwise`'s): torch's hardswish, SiLU, sigmoid and
hardsigmoid over ``vector<16xf32>`` values, in the order of the ops IREE compiles from torch-mlir
for each; and ReLU as torch's (:func:`relu_line`). Hardswish, sigmoid and hardsigmoid are then
the unfused program's values bit for bit;
SiLU's ``exp`` is turbine's own (range reduction and a polynomial, without the special cases of
IREE's ``math.exp`` that SiLU does not need; as accurate: docs/performance.md, section 25), and
``TURBINE_CPU_SILU=iree`` computes it with IREE's ``math.exp``, the A/B baseline.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "ACTIVATIONS",
    "SILU_ENV",
    "emit_activation",
    "emit_activation_constants",
    "emit_exp",
    "fast_silu_enabled",
    "relu_line",
    "store_activation",
]

#: Environment variable: ``iree`` computes SiLU's ``exp`` with IREE's ``math.exp`` (the A/B
#: baseline); unset or anything else, turbine's polynomial.
SILU_ENV = "TURBINE_CPU_SILU"


def fast_silu_enabled() -> bool:
    """Whether the kernels' SiLU computes ``exp`` by turbine's own polynomial (unless
    ``TURBINE_CPU_SILU=iree``)."""
    return os.environ.get(SILU_ENV, "").strip().lower() != "iree"


#: The epilogue steps that take no operand: the activations a kernel's store may apply
#: (a kernel has a bool field of each name; the ones after ``relu`` are
#: :func:`emit_activation`'s).
ACTIVATIONS = ("relu", "hardswish", "silu", "sigmoid", "hardsigmoid")


def relu_line(p: str, result: str, v: str, zero: str) -> str:
    """The lines computing ``result = relu(v)`` over a ``vector<16xf32>`` (``zero`` one of
    zeros) as torch computes it, ``v < 0 ? 0 : v``: NaN stays NaN and ``-0.0`` stays ``-0.0``
    (``arith.maximumf`` turns ``-0.0`` into ``0.0`` and costs a max, a NaN compare and a blend).
    Plain ``arith`` ops, so it compiles for whatever CPU the module targets: LLVM makes one
    ``vmaxps`` with ``v`` as its second source of them on AVX-512 (x86 returns the second
    source where either is NaN or both are zeros), a compare and an ``and`` on AVX2. It was an
    AVX-512 ``vmaxps`` in inline assembly where the kernels were blocked for AVX-512, which a
    build for a CPU without AVX-512 (``--turbine-cpu-matmul=avx512`` there) compiled to wrong
    values without an error (docs/performance.md, section 29)."""
    return (
        f"{p}{result}_neg = arith.cmpf olt, {v}, {zero} : vector<16xf32>\n"
        f"{p}{result} = arith.select {result}_neg, {zero}, {v} : vector<16xi1>, vector<16xf32>"
    )


def store_activation(kernel: Any) -> str | None:
    """The activation of ``kernel``'s store other than ReLU (one of ``ACTIVATIONS[1:]``,
    each a bool field of the kernel), if any."""
    return next((a for a in ACTIVATIONS[1:] if getattr(kernel, a)), None)


#: The polynomial of :func:`emit_activation`'s SiLU: ``exp(r)`` on ``|r| <= ln(2) / 2`` as
#: ``1 + r (c1 + r (c2 + ... + r c6))``, fitted for relative error (at most 1.6 ulp in f32).
_EXP_POLY = (
    1.0,
    0.49999994039535522,
    0.16666431725025177,
    0.041668001562356949,
    0.0083741554990410805,
    0.0013843652559444308,
)


def emit_activation_constants(e: Any, p: str) -> None:
    """Emits the vectors :func:`emit_activation` uses (``%act_zero``, ``%act_one``,
    ``%act_three``, ``%act_six`` and the constants of SiLU's ``exp``), in the region where it
    is called (the unused ones are dropped by the compiler)."""
    vt = "vector<16xf32>"
    for name, value in (("zero", 0.0), ("one", 1.0), ("three", 3.0), ("six", 6.0)):
        e(f"{p}%act_{name} = arith.constant dense<{value}> : {vt}")
    for name, value in (
        ("lo", -86.5),  # exp's argument clamped: 2^n stays a normal float's exponent
        ("hi", 88.0),
        ("log2e", 1.44269502162933349609375),
        ("magic", 12582912.0),  # 1.5 * 2^23: adding it rounds to an integer
        ("nln2hi", -0.693359375),  # ln 2 in two parts (Cody and Waite)
        ("nln2lo", 2.12194440e-4),
    ):
        e(f"{p}%act_e{name} = arith.constant dense<{value!r}> : {vt}")
    for i, c in enumerate(_EXP_POLY, 1):
        e(f"{p}%act_ec{i} = arith.constant dense<{c!r}> : {vt}")
    e(f"{p}%act_e23 = arith.constant dense<23> : vector<16xi32>")


def emit_exp(e: Any, p: str, t: str, tag: str) -> str:
    """``exp(t)`` of ``t`` (``vector<16xf32>``) clamped to [-86.5, 88]: ``t = n ln 2 + r``,
    ``exp(r)`` by :data:`_EXP_POLY`, times ``2^n`` added into the exponent's bits; within 2 ulp
    of the exact value over that range. A NaN goes through the clamp but not reliably through
    the exponent's addition: SiLU's last product with ``x`` makes its result NaN again.
    Fewer and cheaper instructions than IREE's ``math.exp``, whose special cases SiLU does not
    need (docs/performance.md, section 25)."""
    vt, it = "vector<16xf32>", "vector<16xi32>"
    # max(t, lo) and min(., hi) as compare + select, one x86 instruction each
    e(f"{p}%exl_{tag} = arith.cmpf ogt, %act_elo, {t} : {vt}")
    e(f"{p}%exa_{tag} = arith.select %exl_{tag}, %act_elo, {t} : vector<16xi1>, {vt}")
    e(f"{p}%exh_{tag} = arith.cmpf olt, %act_ehi, %exa_{tag} : {vt}")
    e(f"{p}%exb_{tag} = arith.select %exh_{tag}, %act_ehi, %exa_{tag} : vector<16xi1>, {vt}")
    e(f"{p}%exz_{tag} = vector.fma %exb_{tag}, %act_elog2e, %act_emagic : {vt}")
    e(f"{p}%exn_{tag} = arith.subf %exz_{tag}, %act_emagic : {vt}")
    e(f"{p}%exr1_{tag} = vector.fma %exn_{tag}, %act_enln2hi, %exb_{tag} : {vt}")
    e(f"{p}%exr_{tag} = vector.fma %exn_{tag}, %act_enln2lo, %exr1_{tag} : {vt}")
    acc = f"%act_ec{len(_EXP_POLY)}"
    for i in range(len(_EXP_POLY) - 1, 0, -1):
        e(f"{p}%exc{i}_{tag} = vector.fma {acc}, %exr_{tag}, %act_ec{i} : {vt}")
        acc = f"%exc{i}_{tag}"
    e(f"{p}%exc0_{tag} = vector.fma {acc}, %exr_{tag}, %act_one : {vt}")
    # z's mantissa ends in n (two's complement): shifted into the exponent field, added to p's
    e(f"{p}%exzi_{tag} = arith.bitcast %exz_{tag} : {vt} to {it}")
    e(f"{p}%exs_{tag} = arith.shli %exzi_{tag}, %act_e23 : {it}")
    e(f"{p}%exci_{tag} = arith.bitcast %exc0_{tag} : {vt} to {it}")
    e(f"{p}%exq_{tag} = arith.addi %exci_{tag}, %exs_{tag} : {it}")
    e(f"{p}%exv_{tag} = arith.bitcast %exq_{tag} : {it} to {vt}")
    return f"%exv_{tag}"


def emit_activation(e: Any, p: str, v: str, tag: str, kind: str) -> str:
    """Emits torch's ``kind`` activation (``hardswish``, ``silu``, ``sigmoid`` or
    ``hardsigmoid``) of ``v`` (``vector<16xf32>``) in the order and rounding of the ops IREE
    compiles from ``torch.aten.hardswish`` (``min(max(x + 3, 0), 6) / 6 * x``),
    ``torch.aten.silu`` (``1 / (1 + exp(-x)) * x``), ``torch.aten.sigmoid`` (``1 / (1 +
    exp(-x))``) and ``torch.aten.hardsigmoid`` (``max(min((x + 3) / 6, 1), 0)``); returns the
    result's name. SiLU's ``exp`` is :func:`emit_exp` (unless ``TURBINE_CPU_SILU=iree``:
    IREE's ``math.exp``), the others' values are IREE's own. Needs
    :func:`emit_activation_constants` in the same region."""
    vt = "vector<16xf32>"
    if kind == "hardswish":
        e(f"{p}%hsa{tag} = arith.addf {v}, %act_three : {vt}")
        e(f"{p}%hsb{tag} = arith.maximumf %hsa{tag}, %act_zero : {vt}")
        e(f"{p}%hsc{tag} = arith.minimumf %hsb{tag}, %act_six : {vt}")
        e(f"{p}%hsd{tag} = arith.divf %hsc{tag}, %act_six : {vt}")
        e(f"{p}%hse{tag} = arith.mulf %hsd{tag}, {v} : {vt}")
        return f"%hse{tag}"
    if kind in ("silu", "sigmoid"):  # SiLU: the sigmoid, times x
        e(f"{p}%sga{tag} = arith.negf {v} : {vt}")
        if kind == "silu" and fast_silu_enabled():
            exp = emit_exp(e, p, f"%sga{tag}", tag)
        else:
            e(f"{p}%sgb{tag} = math.exp %sga{tag} : {vt}")
            exp = f"%sgb{tag}"
        e(f"{p}%sgc{tag} = arith.addf {exp}, %act_one : {vt}")
        e(f"{p}%sgd{tag} = arith.divf %act_one, %sgc{tag} : {vt}")
        if kind == "sigmoid":
            return f"%sgd{tag}"
        e(f"{p}%sie{tag} = arith.mulf %sgd{tag}, {v} : {vt}")
        return f"%sie{tag}"
    if kind == "hardsigmoid":
        e(f"{p}%hga{tag} = arith.addf {v}, %act_three : {vt}")
        e(f"{p}%hgb{tag} = arith.divf %hga{tag}, %act_six : {vt}")
        e(f"{p}%hgc{tag} = arith.minimumf %hgb{tag}, %act_one : {vt}")
        e(f"{p}%hgd{tag} = arith.maximumf %hgc{tag}, %act_zero : {vt}")
        return f"%hgd{tag}"
    raise ValueError(f"no activation {kind!r}")
