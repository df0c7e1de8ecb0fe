"""Fits the rational functions of turbine's CPU GELU (``turbine_aot._compiler.gelu``): ``erf(x /
sqrt 2) ~ x P(x^2) / Q(x^2)`` on ``[0, 5.5]`` for the exact GELU (``--form erf``), ``tanh(sqrt(2 /
pi) (x + 0.044715 x^3)) ~ x P(x^2) / Q(x^2)`` on ``[0, 5.3]`` for the tanh form (``--form
tanh``), minimax in relative error; then picks the clamp ``c`` (an f32 value above 5.2) where
the f32 evaluation gives exactly 1.

Method: a linearized least-squares fit in a Chebyshev basis (``P - f Q``, reweighted by the
previous ``Q``: Sanathanan-Koerner), with Lawson's multiplicative weights driving it toward the
minimax error; ``Q`` is checked positive on the interval (no pole). Then the coefficients are
rounded to f32 and the clamp searched among f32 values in the f32 Horner-with-FMA evaluation
the compiled function performs (FMAs emulated in float64, exact for these products).

Usage::

    python tools/fit_gelu_erf.py [--form tanh]   # prints P, Q, the clamp and the errors

Output for the defaults (degrees 5 / 5, 2026-12-05): max relative error of ``P / Q`` 1.7e-8
(erf) and 1.9e-8 (tanh) in float64; GELU in f32 within 1.9e-7 relative for ``x >= 0``.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from numpy.polynomial import chebyshev as cheb
from numpy.polynomial import polynomial as poly


def target(x: float, form: str) -> float:
    """What ``r`` approximates: ``erf(x / sqrt 2)`` (the exact GELU is ``x (1 + r) / 2``) or,
    for the tanh form, ``tanh(sqrt(2 / pi) (x + 0.044715 x^3))``."""
    if form == "erf":
        return math.erf(x / math.sqrt(2))
    return math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))


def fit(
    limit: float, n_p: int, n_q: int, nodes: int = 20000, form: str = "erf"
) -> tuple[np.ndarray, np.ndarray, float]:
    """``(p, q, max_rel_err)``: monomial coefficients in ``t = x^2``, lowest first, ``q[0] = 1``."""
    u = np.cos(np.linspace(0, math.pi, nodes))  # Chebyshev points of [-1, 1]
    t_max = limit * limit
    x = np.sqrt((u + 1) / 2 * t_max)
    x[x == 0] = 1e-6
    g = np.array([target(v, form) / v for v in x])  # the target of P / Q
    vp, vq = cheb.chebvander(u, n_p - 1), cheb.chebvander(u, n_q - 1)
    q_prev, w, best = np.ones(nodes), np.ones(nodes), None
    for it in range(300):
        scale = np.sqrt(w) / (q_prev * g)
        a = np.concatenate([vp, -g[:, None] * vq[:, 1:]], 1) * scale[:, None]
        sol, *_ = np.linalg.lstsq(a, g * vq[:, 0] * scale, rcond=None)
        cp, cq = sol[:n_p], np.concatenate([[1.0], sol[n_p:]])
        num, den = vp @ cp, vq @ cq
        err = (num / den - g) / g
        worst = float(np.abs(err).max())
        if den.min() > 0 and (best is None or worst < best[0]):
            best = (worst, cp, cq)
        q_prev = den
        if it > 20:  # Lawson: weight where the error is large
            w = w * np.abs(err)
            w /= w.sum()
    assert best is not None, "no pole-free fit"
    worst, cp, cq = best

    def monomials(c: np.ndarray) -> np.ndarray:  # Chebyshev in u = 2 t / t_max - 1 -> t
        out, power = np.zeros(len(c)), np.array([1.0])
        for a in cheb.cheb2poly(c):
            out[: len(power)] += a * power
            power = poly.polymul(power, [-1.0, 2.0 / t_max])
        return out

    p, q = monomials(cp), monomials(cq)
    return p / q[0], q / q[0], worst


def r_f32(x: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``x P(x^2) / Q(x^2)`` as the compiled function computes it in f32."""

    def fma(a, b, c):
        return (a.astype(np.float64) * b + c).astype(np.float32)

    x = x.astype(np.float32)
    t = x * x
    num, den = np.full_like(t, p[-1]), np.full_like(t, q[-1])
    for c in p[-2::-1]:
        num = fma(num, t, np.float32(c))
    for c in q[-2::-1]:
        den = fma(den, t, np.float32(c))
    return (x * num) / den


def exact_gelu(x: float, form: str) -> float:
    """The GELU of ``form`` in float64, without ``1 + r``'s cancellation for negative ``x``."""
    if form == "erf":
        return 0.5 * x * math.erfc(-x / math.sqrt(2))
    minus_2u = -2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
    return 0.0 if minus_2u > 700 else x / (1 + math.exp(minus_2u))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--form", choices=("erf", "tanh"), default="erf")
    ap.add_argument("--limit", type=float, default=None, help="5.5 (erf) / 5.3 (tanh)")
    ap.add_argument("--numerator-terms", type=int, default=6)
    ap.add_argument("--denominator-terms", type=int, default=6)
    args = ap.parse_args()
    limit = args.limit or (5.5 if args.form == "erf" else 5.3)
    p, q, worst = fit(limit, args.numerator_terms, args.denominator_terms, form=args.form)
    p32, q32 = p.astype(np.float32), q.astype(np.float32)
    print(f"max relative error of P / Q (float64): {worst:.3g}")
    grid = np.arange(np.float32(5.2), np.float32(limit), np.float32(1e-4), dtype=np.float32)
    ones = grid[r_f32(grid, p32, q32) == 1.0]
    clamp = np.float32(ones[len(ones) // 2])
    print("P =", [float(v) for v in p32])
    print("Q =", [float(v) for v in q32])
    print("CLAMP =", float(clamp))
    x = np.linspace(0, 12, 1200001).astype(np.float32)
    r = r_f32(np.minimum(x, clamp), p32, q32)
    h = np.float32(0.5) * x
    gelu = (h.astype(np.float64) * r + h).astype(np.float32)
    exact = np.array([exact_gelu(v, args.form) for v in x.astype(np.float64)])
    rel = np.abs(gelu - exact) / np.maximum(exact, 1e-30)
    print(f"GELU, x in [0, 12]: max relative error {rel.max():.3g}")


if __name__ == "__main__":
    main()
