"""llvm-cpu: element-wise ops whose lowering calls a C math library function IREE 3.13's
executables do not link, written in the compile copy with ops that IREE expands itself.

IREE 3.13 lowers ``math.log10`` on llvm-cpu to a call of ``log10f``, which no executable
provides: ``torch.log10`` of an f32 tensor (a decibel conversion, ``10 * log10(power)``) fails
in ``iree-compile`` with ``iree-lld: error: undefined symbol: log10f``
(``tools/op_accuracy.py`` found it; docs/performance.md, section 27). Here each f32
``torch.aten.log10`` becomes ``log(x) * (1 / ln 10)``: IREE expands ``log`` itself, and the
product adds one rounding (within 1.5e-7 relative of the exact value, eager's ``log10f`` 6e-8;
``log10(10)`` can come out one ulp below 1, where eager's is exact). Zero, negative, infinite
and NaN arguments give eager's ``-inf``, NaN, ``inf`` and NaN.
"""

from __future__ import annotations

import math
from typing import Any

from .torch_ir import Builder, TensorType, walk

__all__ = ["INV_LN10", "log10_ops", "rewrite_log10"]

#: ``1 / ln 10``, the factor from ``log`` to ``log10``.
INV_LN10 = 1 / math.log(10)

_LOG10 = "torch.aten.log10"


def log10_ops(module_op: Any) -> list[Any]:
    """The f32 ``torch.aten.log10`` ops of ``module_op``."""
    found = []
    for o in walk(getattr(module_op, "operation", module_op)):
        if o.name != _LOG10 or len(list(o.operands)) != 1:
            continue
        xt, rt = TensorType.of(o.operands[0]), TensorType.of(o.results[0])
        if xt is not None and rt is not None and xt.dtype == rt.dtype == "f32":
            found.append(o)
    return found


def rewrite_log10(module_op: Any) -> int:
    """Rewrites, in place, each of :func:`log10_ops` as ``log(x) * (1 / ln 10)``.

    Returns:
        How many ops were rewritten.
    """
    found = log10_ops(module_op)
    for op in found:
        b = Builder(op)
        t = str(op.results[0].type)
        log = b.op("torch.aten.log", t, [op.operands[0]])
        scaled = b.op("torch.aten.mul.Scalar", t, [log, b.float(INV_LN10)])
        op.results[0].replace_all_uses_with(scaled)
        op.erase()
    return len(found)
