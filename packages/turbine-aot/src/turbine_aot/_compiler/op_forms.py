"""Element-wise ops IREE 3.13 cannot compile as exported, written in the compile copy in
equivalent forms it can (found by ``tools/op_accuracy.py``; docs/performance.md, section 27).

- llvm-cpu: IREE lowers ``math.log10`` to a call of ``log10f``, which no executable provides:
  ``torch.log10`` of an f32 tensor (a decibel conversion, ``10 * log10(power)``) fails in
  ``iree-compile`` with ``iree-lld: error: undefined symbol: log10f``. Each f32
  ``torch.aten.log10`` becomes ``log(x) * (1 / ln 10)`` (:func:`rewrite_log10`): IREE expands
  ``log`` itself, and the product adds one rounding (within 1.5e-7 relative of the exact value,
  eager's ``log10f`` 6e-8; ``log10(10)`` can come out one ulp below 1, where eager's is exact).
  Zero, negative, infinite and NaN arguments give eager's ``-inf``, NaN, ``inf`` and NaN.
- every target: torch-mlir has no lowering for ``torch.aten.fmod.Scalar`` (``torch.fmod(x,
  1.3)``: "failed to legalize operation 'torch.constant.float'"), but lowers the tensor form
  tensor form. Each becomes ``fmod.Tensor`` of ``x`` and the scalar as a 0-d tensor of ``x``'s
  dtype (:func:`rewrite_fmod_scalars`). That is IREE's ``x - trunc(x / y) y``: where ``x / y``
  rounds onto an integer it is one divisor away from eager's exact ``fmod`` (2 of 200 K points
  over -100 .. 100 by 1.3), as ``torch.fmod`` of two tensors always was.
"""

from __future__ import annotations

import math
from typing import Any

from .elementwise import f32_same_shape
from .torch_ir import Builder, TensorType, walk

__all__ = ["INV_LN10", "fmod_scalars", "log10_ops", "rewrite_fmod_scalars", "rewrite_log10"]

#: ``1 / ln 10``, the factor from ``log`` to ``log10``.
INV_LN10 = 1 / math.log(10)

_LOG10 = "torch.aten.log10"
_FMOD_SCALAR = "torch.aten.fmod.Scalar"

#: torch's ScalarType numbers of the float dtypes a 0-d divisor is made in.
_SCALAR_TYPES = {"f16": 5, "f32": 6, "f64": 7, "bf16": 15}


def log10_ops(module_op: Any) -> list[Any]:
    """The f32 ``torch.aten.log10`` ops of ``module_op``."""
    found = []
    for o in walk(getattr(module_op, "operation", module_op)):
        if o.name == _LOG10 and len(list(o.operands)) == 1 and f32_same_shape(o):
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


def fmod_scalars(module_op: Any) -> list[Any]:
    """The ``torch.aten.fmod.Scalar`` ops of ``module_op`` on a float tensor of that dtype."""
    found = []
    for o in walk(getattr(module_op, "operation", module_op)):
        if o.name != _FMOD_SCALAR or len(list(o.operands)) != 2:
            continue
        xt, rt = TensorType.of(o.operands[0]), TensorType.of(o.results[0])
        if xt is not None and rt is not None and xt.dtype == rt.dtype in _SCALAR_TYPES:
            found.append(o)
    return found


def rewrite_fmod_scalars(module_op: Any) -> int:
    """Rewrites, in place, each of :func:`fmod_scalars` as ``fmod.Tensor(x, tensor(s))``, the
    divisor a 0-d tensor of ``x``'s dtype.

    Returns:
        How many ops were rewritten.
    """
    found = fmod_scalars(module_op)
    for op in found:
        b = Builder(op)
        rt = TensorType.of(op.results[0])
        assert rt is not None
        zero_d = TensorType([], rt.dtype).asm()
        divisor = b.op(
            "torch.aten.scalar_tensor",
            zero_d,
            [op.operands[1], b.int(_SCALAR_TYPES[rt.dtype]), b.none(), b.none(), b.none()],
        )
        result = b.op("torch.aten.fmod.Tensor", str(op.results[0].type), [op.operands[0], divisor])
        op.results[0].replace_all_uses_with(result)
        op.erase()
    return len(found)
