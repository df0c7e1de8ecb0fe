"""torchao's symmetric activation scale as one reduction, in the module handed to IREE (CPUs).

torchao's dynamic int8 activation quantization (``Int8DynamicActivationInt8WeightConfig``,
``Int8DynamicActivationIntxWeightConfig``) takes each row's scale from
``max(-min(amin(x), 0), max(amax(x), 0))``: two reductions over the row, which IREE 3.13 makes
two dispatches, and a third for the scalar arithmetic after them. That expression is exactly
``amax(|x|)`` (negation, ``abs``, ``min`` and ``max`` are exact in floating point; a NaN in the
row propagates through both forms), one reduction with the ``abs`` fused in, and IREE then fuses
the scale's arithmetic into it too. The rewrite matches the torch ops torch.export writes for
torchao's ``choose_qparams_affine`` and nothing else; the results are bitwise the same.

An LLM decode step quantizes four activations per layer: the rewrite removes two of the four
dispatches each (docs/llms.md, "Where a step's time goes, per dispatch").
"""

from __future__ import annotations

from typing import Any

from .torch_ir import (
    Builder,
    TensorType,
    constant,
    constant_int_list,
    erase_unused,
    producer,
    walk,
)

__all__ = ["abs_max_patterns", "rewrite_abs_max"]

#: The element-wise min / max as torch.export writes them (``aten.minimum``, or
#: ``aten.min.other`` where the export keeps torchao's spelling).
_MINIMUM = ("torch.aten.minimum", "torch.aten.min.other")
_MAXIMUM = ("torch.aten.maximum", "torch.aten.max.other")
#: What the rewritten expression leaves unused (erased with it).
_REMOVABLE = frozenset(
    {
        "torch.aten.neg",
        *_MINIMUM,
        *_MAXIMUM,
        "torch.aten.zeros_like",
        "torch.aten.amin",
        "torch.aten.amax",
    }
)


def _clamped(value: Any, inner: str, clamp: tuple[str, ...]) -> Any:
    """The ``inner`` reduction op of ``clamp(inner(x), zeros_like(inner(x)))``, else None."""
    op = producer(value)
    if op is None or op.name not in clamp:
        return None
    red, zeros = (producer(v) for v in op.operands)
    if red is None or zeros is None or red.name != inner or zeros.name != "torch.aten.zeros_like":
        return None
    if zeros.operands[0] != red.result:
        return None
    return red


def _match(op: Any) -> tuple[Any, Any] | None:
    """``(x, amax_op)`` where ``op`` is ``maximum(neg(minimum(amin(x), 0)), maximum(amax(x),
    0))`` with the same dims and keepdim on both reductions; else None."""
    if op.name not in _MAXIMUM or len(op.operands) != 2:
        return None
    neg = producer(op.operands[0])
    if neg is None or neg.name != "torch.aten.neg":
        return None
    amin = _clamped(neg.operands[0], "torch.aten.amin", _MINIMUM)
    amax = _clamped(op.operands[1], "torch.aten.amax", _MAXIMUM)
    if amin is None or amax is None or amin.operands[0] != amax.operands[0]:
        return None
    dims = [constant_int_list(r.operands[1]) for r in (amin, amax)]
    keep = [constant(r.operands[2]) for r in (amin, amax)]
    if dims[0] is None or dims[0] != dims[1] or keep[0] != keep[1] or keep[0] is not True:
        return None
    x = amin.operands[0]
    if TensorType.of(x) is None or TensorType.of(op.result) is None:
        return None
    return x, amax


def abs_max_patterns(module_op: Any) -> list[Any]:
    """The ``maximum`` ops of ``module_op`` that :func:`rewrite_abs_max` rewrites."""
    return [op for op in walk(getattr(module_op, "operation", module_op)) if _match(op)]


def rewrite_abs_max(module_op: Any) -> int:
    """Rewrites each matched scale expression to ``amax(abs(x))`` in place; returns how many."""
    done = 0
    for op in abs_max_patterns(module_op):
        # matched again: an earlier rewrite may have replaced this expression's ``x`` (the
        # scale of a scale), and the match reads the current operands
        matched = _match(op)
        if matched is None:
            continue
        x, amax = matched
        xt, out_t = TensorType.of(x), TensorType.of(op.result)
        assert xt is not None and out_t is not None
        b = Builder(op)
        magnitude = b.op("torch.aten.abs", xt.asm(), [x])
        new = b.op("torch.aten.amax", out_t.asm(), [magnitude, amax.operands[1], amax.operands[2]])
        old = list(op.operands)
        op.result.replace_all_uses_with(new)
        op.erase()
        for v in old:
            erase_unused(v, _REMOVABLE)
        done += 1
    return done
