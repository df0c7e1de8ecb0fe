"""Compile-time rewrite of float -> integer casts that IREE 3.13 gets wrong.

torch converts a float to an integer dtype by truncating toward zero (C's cast). Two lowerings
in IREE 3.13 compute something else, with no error:

- float -> ``uint8`` on every target: torch-mlir lowers it as ``arith.fptosi`` to the signless
  ``i8``, which saturates at 127 on ``llvm-cpu`` (``200.7 -> 127``, eager ``200``) and wraps
  differently on ``vmvx``. Written as float -> ``int32`` -> ``uint8`` the value is right for
  every value a ``uint8`` holds (and negative inputs wrap as eager's do on x86: ``-1.5 -> 255``).
  ``int8`` / ``int16`` / ``uint16`` go through ``int32`` too (out-of-range values then wrap as
  eager's do instead of saturating), ``uint32`` through ``int64``.
- every float -> integer cast on ``vmvx``: its VM rounds to nearest (``2.5 -> 3``,
  ``-3.7 -> -4``, eager ``2`` and ``-3``). A ``trunc`` first makes the value integral, so the
  cast is exact whatever the rounding.

:func:`fix_float_to_int_casts` rewrites a module in place; the compile path applies it to the
copy handed to IREE (``rewrites.module_for_compile``), so the exported IR stays the
one the reference emits.
"""

from __future__ import annotations

from typing import Any

from .torch_ir import Builder, TensorType, walk

__all__ = ["CAST_OPS", "fix_float_to_int_casts", "float_to_int_casts"]

#: The torch-dialect ops that convert a tensor's dtype (operand 0 is the tensor).
CAST_OPS = frozenset(
    {
        "torch.aten._to_copy",
        "torch.aten.to.dtype",
        "torch.aten.to.dtype_layout",
        "torch.prims.convert_element_type",
    }
)
_FLOATS = frozenset({"f16", "bf16", "f32", "f64"})
_INTS = frozenset({"si8", "si16", "si32", "si64", "ui8", "ui16", "ui32"})
# narrow result -> the signed type to convert through: it holds every value of the result type,
# and the integer narrowing after it wraps as eager does on x86 (int8 of 128.5 is -128, not the
# 127 a saturating f32 -> i8 conversion gives)
_VIA = {
    "si8": ("si32", 3),
    "si16": ("si32", 3),
    "ui8": ("si32", 3),
    "ui16": ("si32", 3),
    "ui32": ("si64", 4),
}  # torch dtype codes


def _needs_fix(op: Any, vmvx: bool) -> bool:
    if op.name not in CAST_OPS or not len(op.operands) or len(op.results) != 1:
        return False
    src, dst = TensorType.of(op.operands[0]), TensorType.of(op.results[0])
    if src is None or dst is None or src.dtype not in _FLOATS or dst.dtype not in _INTS:
        return False
    return vmvx or dst.dtype in _VIA


def float_to_int_casts(module_op: Any, vmvx: bool) -> list[Any]:
    """The casts of ``module_op`` that :func:`fix_float_to_int_casts` would rewrite."""
    return [op for op in walk(getattr(module_op, "operation", module_op)) if _needs_fix(op, vmvx)]


def fix_float_to_int_casts(module_op: Any, vmvx: bool) -> int:
    """Rewrites, in place, float -> narrow integer casts (8/16-bit, uint32) to go through a
    wider signed type and, with ``vmvx``, every float -> integer cast to truncate first (see the
    module doc).

    Returns:
        How many casts were rewritten.
    """
    casts = float_to_int_casts(module_op, vmvx)
    for op in casts:
        b = Builder(op)
        x = op.operands[0]
        src, dst = TensorType.of(x), TensorType.of(op.results[0])
        assert src is not None and dst is not None
        if vmvx:
            x = b.op("torch.aten.trunc", src.asm(), [x])
        if dst.dtype in _VIA:
            via, code = _VIA[dst.dtype]
            x = b.op("torch.prims.convert_element_type", src.with_sizes(src.sizes, via).asm(),
                     [x, b.int(code)])  # fmt: skip
        op.operands[0] = x
    return len(casts)
