"""How close each element-wise op compiled by turbine (llvm-cpu, the default flags) is to the
exact value, next to eager's: max absolute and relative error against the same op in float64,
over a range of arguments per op (200 K points). A measurement, not a test: an op whose absolute
or relative error is over 10x eager's and above 1e-6 is marked ``<<<``. docs/performance.md,
section 27, has the findings of 2026-12-05 (IREE's ``sin`` / ``cos`` for large arguments,
``tan``, ``atan``, ``atan2``, ``asinh``, the ELUs, ``sinh``, ``atanh``, ``acosh``,
``log_sigmoid``: since rewritten).

Usage::

    python tools/op_accuracy.py            # every op
    python tools/op_accuracy.py sin cos    # some
"""

from __future__ import annotations

import sys
import warnings

import torch

import turbine_aot
from turbine_aot.runtime import load_module

F = torch.nn.functional

#: name: (function of one f32 tensor, (lowest, highest) argument)
OPS = {
    "tanh": (torch.tanh, (-10, 10)),
    "sigmoid": (torch.sigmoid, (-30, 30)),
    "erf": (torch.erf, (-5, 5)),
    "erfc": (torch.erfc, (-5, 9)),
    "exp": (torch.exp, (-80, 80)),
    "expm1": (torch.expm1, (-10, 10)),
    "log": (torch.log, (1e-6, 1e6)),
    "log1p": (torch.log1p, (-0.99, 100)),
    "log2": (torch.log2, (1e-6, 1e6)),
    "log10": (torch.log10, (1e-6, 1e6)),
    "softplus": (F.softplus, (-30, 30)),
    "mish": (F.mish, (-20, 20)),
    "elu": (F.elu, (-10, 10)),
    "selu": (F.selu, (-10, 10)),
    "celu": (F.celu, (-10, 10)),
    "silu": (F.silu, (-30, 30)),
    "hardswish": (F.hardswish, (-6, 6)),
    "hardsigmoid": (F.hardsigmoid, (-6, 6)),
    "logsigmoid": (F.logsigmoid, (-30, 30)),
    "gelu": (F.gelu, (-8, 8)),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), (-8, 8)),
    "atan": (torch.atan, (-100, 100)),
    "asin": (torch.asin, (-1, 1)),
    "acos": (torch.acos, (-1, 1)),
    "sin": (torch.sin, (-100, 100)),
    "cos": (torch.cos, (-100, 100)),
    "tan": (torch.tan, (-1.5, 1.5)),
    "tan_poles": (torch.tan, (-100, 100)),
    "sinh": (torch.sinh, (-10, 10)),
    "cosh": (torch.cosh, (-10, 10)),
    "asinh": (torch.asinh, (-100, 100)),
    "acosh": (torch.acosh, (1, 100)),
    "atanh": (torch.atanh, (-0.99, 0.99)),
    "rsqrt": (torch.rsqrt, (1e-6, 1e6)),
    "sqrt": (torch.sqrt, (0, 1e6)),
    "reciprocal": (torch.reciprocal, (0.001, 1000)),
    "pow2.5": (lambda x: torch.pow(x, 2.5), (0, 100)),
    "softsign": (F.softsign, (-100, 100)),
    "tanhshrink": (F.tanhshrink, (-10, 10)),
    "logit": (lambda x: torch.logit(x), (0.001, 0.999)),
    "lgamma": (torch.lgamma, (0.1, 20)),
    "digamma": (torch.digamma, (0.1, 20)),
    "erfinv": (torch.erfinv, (-0.999, 0.999)),
    "sinc": (torch.sinc, (-10, 10)),
    "softmax": (lambda x: torch.softmax(x.reshape(-1, 100), -1).reshape(-1), (-30, 30)),
    "log_softmax": (lambda x: torch.log_softmax(x.reshape(-1, 100), -1).reshape(-1), (-30, 30)),
    "rrelu_eval": (lambda x: F.rrelu(x, training=False), (-10, 10)),
    "elu_a": (lambda x: F.elu(x, alpha=0.5), (-10, 10)),
    "leaky": (lambda x: F.leaky_relu(x, 0.01), (-10, 10)),
    "hardtanh": (F.hardtanh, (-3, 3)),
    "relu6": (F.relu6, (-3, 9)),
    "glu": (lambda x: F.glu(x.reshape(-1, 2), -1).reshape(-1).repeat(2), (-10, 10)),
    "atan2": (lambda x: torch.atan2(x, x.flip(0)), (-10, 10)),
    "fmod": (lambda x: torch.fmod(x, 1.3), (-100, 100)),
    "remainder": (lambda x: torch.remainder(x, 1.3), (-100, 100)),
    "round": (torch.round, (-100, 100)),
    "trunc": (torch.trunc, (-100, 100)),
    "frac": (torch.frac, (-100, 100)),
}


def measure(name: str) -> str:
    f, (lo, hi) = OPS[name]

    class M(torch.nn.Module):
        def forward(self, x):
            return f(x)

    x = torch.linspace(lo, hi, 200000)
    try:
        got = load_module(turbine_aot.export(M(), args=(x,)).compile(save_to=None)).main(x)
    except Exception as e:  # an op that does not export or compile is reported, not hidden
        return f"{name:12s} FAILED {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    ref = f(x.double())
    ok = torch.isfinite(ref)

    def errs(y):
        d = (y.double() - ref)[ok].abs()
        return d.max().item(), (d / ref[ok].abs().clamp_min(1e-30)).max().item()

    ga, gr = errs(got)
    ea, er = errs(f(x))
    worse = (ga > 10 * max(ea, 1e-7) and ga > 1e-6) or (gr > 10 * max(er, 1e-7) and gr > 1e-6)
    flag = "  <<<" if worse else ""
    return (
        f"{name:12s} turbine abs {ga:9.3g} rel {gr:9.3g} | eager abs {ea:9.3g} rel {er:9.3g}{flag}"
    )


def main() -> None:
    warnings.filterwarnings("ignore")
    for name in sys.argv[1:] or list(OPS):
        print(measure(name), flush=True)


if __name__ == "__main__":
    main()
