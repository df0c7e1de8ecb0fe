"""Fits the polynomial of turbine's CPU ``atan`` (``turbine_aot._compiler.trig``) on
``|t| <= tan(pi / 8)``: ``atan(t) = t + t^3 P(t^2)``, ``P`` of four terms, minimax in relative
error (least squares on Chebyshev points with Lawson's multiplicative weights, as
``tools/fit_sin_cos.py``), rounded to f32.

Usage::

    python tools/fit_atan.py     # prints ATAN_POLY and its error in float64

Output (2026-12-05): relative error 2.1e-8 (a third of an f32 ulp).
"""

from __future__ import annotations

import math

import numpy as np
from fit_sin_cos import lawson


def main() -> None:
    half = math.tan(math.pi / 8) / 2
    t = np.cos(np.linspace(0, math.pi, 20001)) * half + half  # Chebyshev points of [0, tan(pi/8)]
    t = t[t > 1e-4]
    z = t * t
    a = np.stack([z**i for i in range(4)], 1)
    err, c = lawson(a, (np.arctan(t) - t) / t**3, t**3 / np.arctan(t))
    print("ATAN_POLY =", tuple(float(np.float32(x)) for x in c), f"# {err:.2g}")


if __name__ == "__main__":
    main()
