"""The element-wise ops after a kernel call that turbine's AVX-512 kernels absorb into the store of
their last reduction block (docs/performance.md, section 11), and the switch that turns this off.

Without it every kernel dispatch (:mod:`.avx512`, :mod:`.avx512_conv`) is followed by an IREE
element-wise dispatch that re-reads and re-writes the whole output for a bias add or a ReLU, and
at two threads every dispatch pays a wake-up of IREE's task workers. The rewrites ask here which
ops after a kernel's result they may absorb: exactly the patterns below, on values with one use,
else the ops stay as they are; :func:`replace_with_absorbed` then replaces the kernel's op and
the absorbed ones by the call's result.

- matmuls (:mod:`.matmuls`): ``+ bias`` (a ``[N]`` vector: a linear's or addmm's own bias, or
  a ``torch.aten.add.Tensor`` of one), then ``torch.aten.relu``.
- direct convolutions (:mod:`.direct_convs`): the convolution's bias, an eval-mode
  ``torch.aten.batch_norm`` (folded into a per-channel scale and shift, computed from its
  parameters in the program, so that IREE hoists them with the weights:
  ``scale = weight / sqrt(var + eps)``, ``shift = bias - mean * scale``) or a chain of
  per-channel ``sub`` / ``mul`` / ``add`` (a batch norm as ``torch.export`` decomposes it:
  torchvision's ResNet-50; folded the same way), a residual
  ``torch.aten.add.Tensor`` of a same-shape tensor, then ``torch.aten.relu``, each only after
  the ones before it. The direct (not its Winograd form) and the depthwise kernels also take
  ``torch.aten.hardswish`` or ``torch.aten.silu`` in the ReLU's place (MobileNetV3's and
  EfficientNet's), or ``torch.aten.sigmoid`` / ``torch.aten.hardsigmoid`` (the gate of a
  squeeze-excitation block, which IREE would otherwise compute again for every element of the
  activation it scales), computed in the order of IREE's own code for them
  (:func:`.activations.emit_activation`).

A direct convolution whose (absorbed) output is read only by another direct convolution, or
by a depthwise one, with padding writes it zero-padded as that one reads it, so IREE copies
nothing between the two kernels (docs/performance.md, sections 11 and 24).

``TURBINE_CPU_EPILOGUES=keep`` keeps the ops as separate dispatches, ``=nopad`` absorbs them but
writes no padded outputs; for A/B measurements of the two latest steps, ``=no-depthwise-pad``
writes padded outputs for direct consumers only, ``=no-gates`` leaves sigmoids and hardsigmoids
to IREE (the words combine, comma-separated).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .torch_ir import TensorType, constant

__all__ = [
    "EPILOGUE_ENV",
    "BatchNorm",
    "channel_affine",
    "depthwise_padded_outputs_enabled",
    "eval_batch_norm",
    "fusion_enabled",
    "gates_enabled",
    "only_user",
    "padded_outputs_enabled",
    "replace_with_absorbed",
    "same_shape_add",
]

#: Environment variable: ``keep`` leaves the element-wise ops after the kernels to IREE,
#: ``nopad`` writes no convolution output padded for the next one.
EPILOGUE_ENV = "TURBINE_CPU_EPILOGUES"


def _words() -> set[str]:
    """The comma-separated words of ``TURBINE_CPU_EPILOGUES``."""
    return {w.strip() for w in os.environ.get(EPILOGUE_ENV, "").lower().split(",") if w.strip()}


def fusion_enabled() -> bool:
    """Whether the rewrites absorb element-wise ops into the kernels (unless
    ``TURBINE_CPU_EPILOGUES=keep``)."""
    return "keep" not in _words()


def padded_outputs_enabled() -> bool:
    """Whether a convolution kernel may write its output padded for the next one (with the
    epilogues, unless ``TURBINE_CPU_EPILOGUES=nopad``)."""
    return fusion_enabled() and "nopad" not in _words()


def depthwise_padded_outputs_enabled() -> bool:
    """Whether a direct convolution kernel may write its output padded for a depthwise one
    (with padded outputs, unless ``TURBINE_CPU_EPILOGUES=no-depthwise-pad``)."""
    return padded_outputs_enabled() and "no-depthwise-pad" not in _words()


def gates_enabled() -> bool:
    """Whether the kernels absorb a sigmoid or hardsigmoid (with the epilogues, unless
    ``TURBINE_CPU_EPILOGUES=no-gates``)."""
    return fusion_enabled() and "no-gates" not in _words()


def only_user(value: Any, name: str) -> Any:
    """The op named ``name`` that is ``value``'s one use (as its first operand), else None."""
    uses = list(value.uses)
    if len(uses) != 1:
        return None
    owner = uses[0].owner
    if getattr(owner, "name", None) != name or uses[0].operand_number != 0:
        return None
    return owner


@dataclass(frozen=True)
class BatchNorm:
    """An eval-mode ``torch.aten.batch_norm`` over ``[N, C, ...]``: ``op``, its per-channel
    ``weight``, ``bias``, ``mean``, ``var`` (torch values) and ``eps``."""

    op: Any
    weight: Any
    bias: Any
    mean: Any
    var: Any
    eps: float


def eval_batch_norm(value: Any, channels: int) -> BatchNorm | None:
    """The eval-mode batch norm (``training`` false, affine, running statistics, all ``[channels]``
    f32) that is ``value``'s one use, else None."""
    bn = only_user(value, "torch.aten.batch_norm")
    if bn is None or len(bn.operands) != 9:
        return None
    _, weight, bias, mean, var, training, _momentum, eps, _cudnn = bn.operands
    if constant(training) is not False or not isinstance(constant(eps), float):
        return None
    for v in (weight, bias, mean, var):
        t = TensorType.of(v)
        if t is None or (t.sizes, t.dtype) != ([channels], "f32"):
            return None
    return BatchNorm(bn, weight, bias, mean, var, float(constant(eps)))


def same_shape_add(value: Any) -> tuple[Any, Any] | None:
    """``(add, other)``: the ``torch.aten.add.Tensor(value, other, 1)`` that is ``value``'s one
    use, ``other`` of ``value``'s own type (a residual connection), else None."""
    add = only_user(value, "torch.aten.add.Tensor")
    if add is None:
        return None
    other, alpha = list(add.operands)[1:]
    if constant(alpha) not in (1, 1.0) or str(other.type) != str(value.type):
        return None
    if str(add.results[0].type) != str(value.type):
        return None
    return add, other


#: The per-channel ops :func:`channel_affine` absorbs.
_AFFINE_OPS = {
    "torch.aten.sub.Tensor": "sub",
    "torch.aten.mul.Tensor": "mul",
    "torch.aten.add.Tensor": "add",
}


def channel_affine(value: Any, channels: int) -> list[tuple[Any, str, Any]]:
    """The chain of ``(op, kind, param)`` after ``value`` (``[N, channels, H, W]``), each op the
    one use of the value before it: ``value - param``, ``value * param``, ``value + param``
    (alpha 1) with ``param`` one f32 value per channel (``[channels, 1, 1]`` or
    ``[1, channels, 1, 1]``): a batch norm as ``torch.export`` decomposes it (``(x - mean) *
    invstd * weight + bias``), or any per-channel scale and shift."""
    steps: list[tuple[Any, str, Any]] = []
    while True:
        uses = list(value.uses)
        if len(uses) != 1 or uses[0].operand_number != 0:
            return steps
        op = uses[0].owner
        kind = _AFFINE_OPS.get(getattr(op, "name", ""))
        if kind is None:
            return steps
        operands = list(op.operands)
        param = operands[1]
        if kind != "mul" and (len(operands) != 3 or constant(operands[2]) not in (1, 1.0)):
            return steps
        pt = TensorType.of(param)
        if (
            pt is None
            or pt.dtype != "f32"
            or pt.sizes not in ([channels, 1, 1], [1, channels, 1, 1])
        ):
            return steps
        if str(op.results[0].type) != str(value.type):
            return steps
        steps.append((op, kind, param))
        value = op.results[0]


def replace_with_absorbed(op: Any, absorbed: list[Any], result: Any) -> None:
    """Replaces ``op`` and the ops ``absorbed`` after it (in order: the last one's result is
    what the rest of the program reads) by ``result``, and erases them."""
    if absorbed:
        absorbed[-1].results[0].replace_all_uses_with(result)
    for fused in reversed(absorbed):
        fused.erase()
    op.results[0].replace_all_uses_with(result)
    op.erase()
