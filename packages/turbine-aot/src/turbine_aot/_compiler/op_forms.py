"""Element-wise ops IREE 3.13 cannot compile, or computes wrongly, as exported, written in the
compile copy in equivalent forms it compiles right (found by ``tools/op_accuracy.py``;
docs/performance.md, section 27).

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
- CPU targets: IREE expands ``math.asinh`` as ``log(x + sqrt(x^2 + 1))``, which cancels for
  negative ``x`` (1.2e-3 off at -100; eager 2.9e-7). Each f32 ``torch.aten.asinh`` becomes
  ``sign(x) asinh(|x|)`` with ``asinh(a) = log1p(a + a^2 / (1 + sqrt(1 + a^2)))`` (no
  cancellation), and ``log(a) + ln 2`` above ``a = 4096`` (where ``a^2`` would overflow further
  on; the terms dropped are below 2e-9 relative) (:func:`rewrite_asinh`). Not on GPU targets:
  Vulkan's ``log1p`` is ``log(1 + y)`` (2e-4 off in relative terms at 2.5e-4 on lavapipe), on
  which this form is no better.
- CPU targets and Vulkan: torch-mlir lowers ``elu`` / ``selu`` / ``celu`` with ``exp(x) - 1``
  for negative ``x``, which cancels near 0: 4e-4 off in relative terms just below 0 on
  llvm-cpu, 100 % on lavapipe (eager's ``expm1``: 6e-8). Each f32 one becomes ``where(x > 0,
  x scale, expm1(x input_scale) alpha scale)`` (:func:`rewrite_elus`): within 2.5e-7 on the
  CPU targets, 1.1e-6 on lavapipe (its ``expm1``).
- CPU targets: IREE's ``sinh``, ``atanh``, ``acosh`` and torch-mlir's ``log_sigmoid`` cancel
  (``(e^x - e^-x) / 2`` near 0: 3.8e-4 off in relative terms; ``log((1 + x) / (1 - x)) / 2``
  near 0: 6e-3; ``log(x + sqrt(x^2 - 1))`` near 1: 1.5e-6; ``log(sigmoid(x))`` for large
  ``x``: 0 where it is ``-e^-x``). Each f32 one becomes a form without the cancellation
  (:func:`rewrite_cancelling_ops`): ``sinh x = sign(x) (u + u / (u + 1)) / 2`` with ``u =
  expm1 |x|`` (``e^|x| / 2`` above 88, where ``u`` overflows); ``atanh x = sign(x) log1p(2 a /
  (1 - a)) / 2``, ``a = |x|``; ``acosh x = log1p(t + sqrt(2 t + t^2))``, ``t = x - 1``
  (``log x + ln 2`` above 4096); ``log_sigmoid x = min(x, 0) - log1p(e^-|x|)``. Not on
  Vulkan, whose ``log1p`` is ``log(1 + y)``. ``sinh`` and ``cosh`` above ``|x|`` = 88 are
  ``(e^(|x| / 2) / 2) e^(|x| / 2)`` (with ``x``'s sign for ``sinh``): ``e^|x| / 2`` overflowed
  from 88.7 on, where they are finite up to 89.4 (``cosh(88.8)`` was inf, eager 1.84e38);
  below, ``cosh x = (e^|x| + 1 / e^|x|) / 2`` (vmvx has no lowering of ``math.cosh``: "failed
  to legalize operation 'math.cosh'").
- vmvx: IREE 3.13 has no vmvx lowering of ``math.tan`` or ``math.asin`` (``iree-compile``:
  "failed to legalize operation 'math.tan'"). Each f32 ``torch.aten.tan`` becomes ``sin(x) /
  cos(x)`` (:func:`rewrite_vmvx_trig`), which is what IREE computes for ``tan`` elsewhere, and
  each ``asin`` ``atan2(x, sqrt((1 - x) (1 + x)))``; vmvx's ``sin``, ``cos`` and ``atan2`` are
  accurate (``sin`` 3.2e-8 at 4096), so its ``tan`` is within 1.5e-7 relative over -100 ..
  100, poles included, and ``asin`` within 2.5e-7. (llvm-cpu's are turbine's own, :mod:`.trig`.)
- every target: torch-mlir has no lowering for ``isfinite``, ``signbit`` and ``copysign``
  ("failed to legalize operation 'torch.aten.isfinite'"). Each of a float tensor becomes
  (:func:`rewrite_sign_ops`): ``isfinite(x)`` as ``|x| < inf`` (an ordered compare: false for
  NaN; on vmvx, whose compares treat NaN as a number, the bits' magnitude below those of
  ``inf``), ``signbit(x)`` as the bits, viewed as a signed integer, below 0 (``-0.0`` and
  ``-nan`` included, as eager), ``copysign(a, b)`` as ``where(signbit(b), -|a|, |a|)``.
- Vulkan: ``argmax`` / ``argmin`` and the indices of ``max.dim`` / ``min.dim`` over a dimension
  that is not the innermost come out all zeros (a ``[3, 5]`` tensor's ``argmax(dim=0)`` on
  lavapipe: ``[0, 0, 0, 0, 0]``; ``[2, 64]`` fails to compile); over the innermost one they are
  right. Each becomes the same reduction over the innermost dimension of ``x`` permuted so that
  the reduced dimension comes last (``unsqueeze``-d back where ``keepdim``)
  (:func:`rewrite_inner_index_reductions`); one transpose dispatch more.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .elementwise import f32_ops
from .nan_forms import FLOAT_BITS, float_bits
from .torch_ir import Builder, TensorType, constant, replace_each, walk

__all__ = [
    "ASINH_LARGE",
    "INV_LN10",
    "asinh_ops",
    "cancelling_ops",
    "elu_ops",
    "fmod_scalars",
    "inner_index_reductions",
    "log10_ops",
    "rewrite_asinh",
    "rewrite_cancelling_ops",
    "rewrite_elus",
    "rewrite_fmod_scalars",
    "rewrite_inner_index_reductions",
    "rewrite_log10",
    "rewrite_sign_ops",
    "rewrite_vmvx_trig",
    "sign_ops",
    "vmvx_trig_ops",
]

#: ``1 / ln 10``, the factor from ``log`` to ``log10``.
INV_LN10 = 1 / math.log(10)

_LOG10 = "torch.aten.log10"
_FMOD_SCALAR = "torch.aten.fmod.Scalar"

#: torch's ScalarType numbers of the float dtypes a 0-d divisor is made in.
_SCALAR_TYPES = {"f16": 5, "f32": 6, "f64": 7, "bf16": 15}


def _emitter(b: Builder, op: Any) -> tuple[Any, Callable[..., Any], str]:
    """What a form is written with: ``op``'s first operand, ``f(name, *operands, result=<op's
    result type>)`` emitting a torch op before ``op``, and the boolean tensor type of the
    result's sizes."""
    t = str(op.results[0].type)
    rt = TensorType.of(op.results[0])
    assert rt is not None

    def f(name: str, *operands: Any, result: str = t) -> Any:
        return b.op(name, result, list(operands))

    return op.operands[0], f, TensorType(rt.sizes, "i1").asm()


def log10_ops(module_op: Any) -> list[Any]:
    """The f32 ``torch.aten.log10`` ops of ``module_op``."""
    return f32_ops(module_op, {_LOG10}, 1)


def rewrite_log10(module_op: Any) -> int:
    """Rewrites, in place, each of :func:`log10_ops` as ``log(x) * (1 / ln 10)``.

    Returns:
        How many ops were rewritten.
    """
    return replace_each(log10_ops(module_op), _log10_form)


def _log10_form(b: Builder, op: Any) -> Any:
    t = str(op.results[0].type)
    log = b.op("torch.aten.log", t, [op.operands[0]])
    return b.op("torch.aten.mul.Scalar", t, [log, b.float(INV_LN10)])


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
    return replace_each(fmod_scalars(module_op), _fmod_form)


def _fmod_form(b: Builder, op: Any) -> Any:
    rt = TensorType.of(op.results[0])
    assert rt is not None
    zero_d = TensorType([], rt.dtype).asm()
    divisor = b.op(
        "torch.aten.scalar_tensor",
        zero_d,
        [op.operands[1], b.int(_SCALAR_TYPES[rt.dtype]), b.none(), b.none(), b.none()],
    )
    return b.op("torch.aten.fmod.Tensor", str(op.results[0].type), [op.operands[0], divisor])


#: Above this ``|x|``, ``asinh(x)`` is ``sign(x) (log |x| + ln 2)`` (and ``acosh x`` is
#: ``log x + ln 2``).
ASINH_LARGE = 4096.0


def asinh_ops(module_op: Any) -> list[Any]:
    """The f32 ``torch.aten.asinh`` ops of ``module_op``."""
    return f32_ops(module_op, {"torch.aten.asinh"}, 1)


def rewrite_asinh(module_op: Any) -> int:
    """Rewrites, in place, each of :func:`asinh_ops` in the module doc's form.

    Returns:
        How many ops were rewritten.
    """
    return replace_each(asinh_ops(module_op), _asinh_form)


def _asinh_form(b: Builder, op: Any) -> Any:
    """The torch ops of :func:`rewrite_asinh` for ``op``, before it; returns the result."""
    x, f, bools = _emitter(b, op)
    a = f("torch.aten.abs", x)
    sq = f("torch.aten.mul.Tensor", a, a)
    root = f("torch.aten.sqrt", f("torch.aten.add.Scalar", sq, b.float(1.0), b.int(1)))
    frac = f("torch.aten.div.Tensor", sq, f("torch.aten.add.Scalar", root, b.float(1.0), b.int(1)))
    small = f("torch.aten.log1p", f("torch.aten.add.Tensor", a, frac, b.int(1)))
    large = f("torch.aten.add.Scalar", f("torch.aten.log", a), b.float(math.log(2.0)), b.int(1))
    is_large = f("torch.aten.gt.Scalar", a, b.float(ASINH_LARGE), result=bools)
    y = f("torch.aten.where.self", is_large, large, small)
    negative = f("torch.aten.lt.Scalar", x, b.float(0.0), result=bools)
    return f("torch.aten.where.self", negative, f("torch.aten.neg", y), y)


def vmvx_trig_ops(module_op: Any) -> list[Any]:
    """The f32 ``torch.aten.tan`` and ``torch.aten.asin`` ops of ``module_op``."""
    return f32_ops(module_op, {"torch.aten.tan", "torch.aten.asin"}, 1)


def rewrite_vmvx_trig(module_op: Any) -> int:
    """Rewrites, in place, each of :func:`vmvx_trig_ops` as ``sin(x) / cos(x)`` or
    ``atan2(x, sqrt((1 - x) (1 + x)))`` (for vmvx, which cannot compile ``math.tan`` and
    ``math.asin``).

    Returns:
        How many ops were rewritten.
    """
    return replace_each(vmvx_trig_ops(module_op), _vmvx_trig_form)


def _vmvx_trig_form(b: Builder, op: Any) -> Any:
    x, f, _ = _emitter(b, op)
    if op.name == "torch.aten.tan":
        return f("torch.aten.div.Tensor", f("torch.aten.sin", x), f("torch.aten.cos", x))
    below = f("torch.aten.rsub.Scalar", x, b.float(1.0), b.int(1))
    above = f("torch.aten.add.Scalar", x, b.float(1.0), b.int(1))
    root = f("torch.aten.sqrt", f("torch.aten.mul.Tensor", below, above))
    return f("torch.aten.atan2", x, root)


#: SELU's ``alpha`` and ``scale`` (torch's constants).
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
_ELUS = ("torch.aten.elu", "torch.aten.selu", "torch.aten.celu")


def elu_ops(module_op: Any) -> list[Any]:
    """The f32 ``torch.aten.elu`` / ``selu`` / ``celu`` ops of ``module_op``."""
    return [o for n, k in zip(_ELUS, (4, 1, 2)) for o in f32_ops(module_op, {n}, k)]


def rewrite_elus(module_op: Any) -> int:
    """Rewrites, in place, each of :func:`elu_ops` with ``expm1`` (the module doc's form).

    Returns:
        How many ops were rewritten.
    """
    return replace_each(elu_ops(module_op), _elu_form)


def _elu_form(b: Builder, op: Any) -> Any:
    """``where(x > 0, x scale, expm1(x input_scale) alpha scale)`` for ``op``, before it."""
    x, f, bools = _emitter(b, op)
    if op.name == "torch.aten.elu":  # (x, alpha, scale, input_scale)
        alpha, scale, input_scale = op.operands[1], op.operands[2], op.operands[3]
        small = f("torch.aten.expm1", f("torch.aten.mul.Scalar", x, input_scale))
        low = f("torch.aten.mul.Scalar", f("torch.aten.mul.Scalar", small, alpha), scale)
        high = f("torch.aten.mul.Scalar", x, scale)
    elif op.name == "torch.aten.selu":
        low = f("torch.aten.mul.Scalar", f("torch.aten.expm1", x), b.float(SELU_ALPHA * SELU_SCALE))
        high = f("torch.aten.mul.Scalar", x, b.float(SELU_SCALE))
    else:  # celu (x, alpha): alpha expm1(x / alpha)
        alpha = op.operands[1]
        small = f("torch.aten.expm1", f("torch.aten.div.Scalar", x, alpha))
        low = f("torch.aten.mul.Scalar", small, alpha)
        high = x
    positive = f("torch.aten.gt.Scalar", x, b.float(0.0), result=bools)
    return f("torch.aten.where.self", positive, high, low)


#: Above this ``|x|``, ``sinh`` is ``e^|x| / 2`` (``expm1`` overflows a little further on).
SINH_LARGE = 88.0
#: The ops :func:`rewrite_cancelling_ops` writes without their cancellation.
_CANCELLING = (
    "torch.aten.sinh",
    "torch.aten.cosh",
    "torch.aten.atanh",
    "torch.aten.acosh",
    "torch.aten.log_sigmoid",
)


def cancelling_ops(module_op: Any) -> list[Any]:
    """The f32 ``sinh`` / ``cosh`` / ``atanh`` / ``acosh`` / ``log_sigmoid`` ops of ``module_op``."""
    return f32_ops(module_op, set(_CANCELLING), 1)


def rewrite_cancelling_ops(module_op: Any) -> int:
    """Rewrites, in place, each of :func:`cancelling_ops` in the module doc's form.

    Returns:
        How many ops were rewritten.
    """
    return replace_each(cancelling_ops(module_op), _cancelling_form)


def _half_exp(f: Callable[..., Any], half: Callable[[Any], Any], a: Any) -> Any:
    """``e^a / 2`` as ``(e^(a / 2) / 2) e^(a / 2)``: finite up to ``a`` = 89.4, where
    ``e^a`` itself overflows from 88.7 on."""
    h = f("torch.aten.exp", half(a))
    return f("torch.aten.mul.Tensor", half(h), h)


def _cancelling_form(b: Builder, op: Any) -> Any:
    """The torch ops of :func:`rewrite_cancelling_ops` for ``op``, before it."""
    x, f, bools = _emitter(b, op)

    def half(v: Any) -> Any:
        return f("torch.aten.mul.Scalar", v, b.float(0.5))

    def odd(v: Any) -> Any:  # v of |x|, with x's sign; x itself at +-0 (keeps -0)
        negative = f("torch.aten.lt.Scalar", x, b.float(0.0), result=bools)
        signed = f("torch.aten.where.self", negative, f("torch.aten.neg", v), v)
        zero = f("torch.aten.eq.Scalar", x, b.float(0.0), result=bools)
        return f("torch.aten.where.self", zero, x, signed)

    if op.name == "torch.aten.cosh":
        a = f("torch.aten.abs", x)
        large = f("torch.aten.gt.Scalar", a, b.float(SINH_LARGE), result=bools)
        e = f("torch.aten.exp", a)
        near = half(f("torch.aten.add.Tensor", e, f("torch.aten.reciprocal", e), b.int(1)))
        return f("torch.aten.where.self", large, _half_exp(f, half, a), near)
    if op.name == "torch.aten.log_sigmoid":
        low = f("torch.aten.clamp_max", x, b.float(0.0))
        tail = f(
            "torch.aten.log1p", f("torch.aten.exp", f("torch.aten.neg", f("torch.aten.abs", x)))
        )
        return f("torch.aten.sub.Tensor", low, tail, b.int(1))
    if op.name == "torch.aten.acosh":
        s = f("torch.aten.sub.Scalar", x, b.float(1.0), b.int(1))
        root = f(
            "torch.aten.sqrt",
            f(
                "torch.aten.add.Tensor",
                f("torch.aten.mul.Scalar", s, b.float(2.0)),
                f("torch.aten.mul.Tensor", s, s),
                b.int(1),
            ),
        )
        near = f("torch.aten.log1p", f("torch.aten.add.Tensor", s, root, b.int(1)))
        far = f("torch.aten.add.Scalar", f("torch.aten.log", x), b.float(math.log(2.0)), b.int(1))
        large = f("torch.aten.gt.Scalar", x, b.float(ASINH_LARGE), result=bools)
        return f("torch.aten.where.self", large, far, near)
    a = f("torch.aten.abs", x)
    if op.name == "torch.aten.atanh":
        ratio = f(
            "torch.aten.div.Tensor",
            f("torch.aten.mul.Scalar", a, b.float(2.0)),
            f("torch.aten.rsub.Scalar", a, b.float(1.0), b.int(1)),
        )
        return odd(half(f("torch.aten.log1p", ratio)))
    # sinh
    u = f("torch.aten.expm1", a)
    frac = f("torch.aten.div.Tensor", u, f("torch.aten.add.Scalar", u, b.float(1.0), b.int(1)))
    near = half(f("torch.aten.add.Tensor", u, frac, b.int(1)))
    far = _half_exp(f, half, a)
    large = f("torch.aten.gt.Scalar", a, b.float(SINH_LARGE), result=bools)
    return odd(f("torch.aten.where.self", large, far, near))


#: Reductions to an index (argmax: one result) and to (values, indices): the indices' form.
_INDEX_REDUCTIONS = {
    "torch.aten.argmax": "torch.aten.argmax",
    "torch.aten.argmin": "torch.aten.argmin",
    "torch.aten.max.dim": "torch.aten.argmax",
    "torch.aten.min.dim": "torch.aten.argmin",
}


def inner_index_reductions(module_op: Any) -> list[Any]:
    """The ``argmax`` / ``argmin`` / ``max.dim`` / ``min.dim`` ops of ``module_op`` over one
    dimension (a constant) that is not the innermost of a ranked tensor."""
    found = []
    for o in walk(getattr(module_op, "operation", module_op)):
        if o.name not in _INDEX_REDUCTIONS or len(list(o.operands)) != 3:
            continue
        xt = TensorType.of(o.operands[0])
        dim = constant(o.operands[1])
        if xt is None or not isinstance(dim, int) or isinstance(dim, bool) or len(xt.sizes) < 2:
            continue
        if dim % len(xt.sizes) != len(xt.sizes) - 1:
            found.append(o)
    return found


def rewrite_inner_index_reductions(module_op: Any) -> int:
    """Rewrites, in place, each of :func:`inner_index_reductions` over the innermost dimension
    of its operand permuted (the module doc's form): ``argmax`` / ``argmin`` replaced, the
    indices of ``max.dim`` / ``min.dim`` replaced (their values are right and stay).

    Returns:
        How many ops were rewritten.
    """
    ops = inner_index_reductions(module_op)
    for op in ops:
        indices = (
            op.results[0]
            if op.name in ("torch.aten.argmax", "torch.aten.argmin")
            else op.results[1]
        )
        value = _inner_index_form(Builder(op), op, indices)
        indices.replace_all_uses_with(value)
        if op.name in ("torch.aten.argmax", "torch.aten.argmin"):
            op.erase()
    return len(ops)


def _inner_index_form(b: Builder, op: Any, indices: Any) -> Any:
    x = op.operands[0]
    xt, it = TensorType.of(x), TensorType.of(indices)
    assert xt is not None and it is not None
    rank = len(xt.sizes)
    dim = constant(op.operands[1]) % rank
    order = [i for i in range(rank) if i != dim] + [dim]
    moved = b.op(
        "torch.aten.permute",
        xt.with_sizes([xt.sizes[i] for i in order]).asm(),
        [x, b.int_list(order)],
    )
    reduced = it.with_sizes([xt.sizes[i] for i in order[:-1]])
    value = b.op(_INDEX_REDUCTIONS[op.name], reduced.asm(), [moved, b.int(rank - 1), b.false()])
    if constant(op.operands[2]) is True:  # keepdim: the reduced dimension back, as size 1
        value = b.op("torch.aten.unsqueeze", str(indices.type), [value, b.int(dim)])
    return value


_SIGN_OPS = ("torch.aten.isfinite", "torch.aten.signbit", "torch.aten.copysign.Tensor")


def sign_ops(module_op: Any) -> list[Any]:
    """The ``isfinite`` / ``signbit`` / ``copysign.Tensor`` ops of ``module_op`` on float
    tensors (both of ``copysign``'s of one dtype, its result of that dtype too)."""
    found = []
    for o in walk(getattr(module_op, "operation", module_op)):
        if o.name not in _SIGN_OPS:
            continue
        types = [TensorType.of(v) for v in o.operands]
        if not types or any(t is None or t.dtype not in FLOAT_BITS for t in types):
            continue
        if o.name == "torch.aten.copysign.Tensor":
            r = TensorType.of(o.results[0])
            if r is None or len({t.dtype for t in types if t is not None} | {r.dtype}) != 1:
                continue
        found.append(o)
    return found


def rewrite_sign_ops(module_op: Any, by_bits: bool = False) -> int:
    """Rewrites, in place, each of :func:`sign_ops` in the module doc's form (``by_bits``:
    ``isfinite`` from the bits, for vmvx).

    Returns:
        How many ops were rewritten.
    """
    return replace_each(sign_ops(module_op), lambda b, op: _sign_form(b, op, by_bits))


def _signbit(b: Builder, x: Any) -> Any:
    xt = TensorType.of(x)
    assert xt is not None
    flags = TensorType(xt.sizes, "i1").asm()
    return b.op("torch.aten.lt.Scalar", flags, [float_bits(b, x, xt), b.int(0)])


def _sign_form(b: Builder, op: Any, by_bits: bool) -> Any:
    x = op.operands[0]
    xt = TensorType.of(x)
    assert xt is not None
    t = str(op.results[0].type)
    if op.name == "torch.aten.signbit":
        return _signbit(b, x)
    if op.name == "torch.aten.isfinite":
        if by_bits:
            _, _, mask, inf = FLOAT_BITS[xt.dtype]
            bits = float_bits(b, x, xt)
            magnitude = b.op("torch.aten.__and__.Scalar", str(bits.type), [bits, b.int(mask)])
            return b.op("torch.aten.lt.Scalar", t, [magnitude, b.int(inf)])
        magnitude = b.op("torch.aten.abs", str(x.type), [x])
        return b.op("torch.aten.lt.Scalar", t, [magnitude, b.float(math.inf)])
    magnitude = b.op("torch.aten.abs", str(x.type), [x])
    negative = b.op("torch.aten.neg", str(x.type), [magnitude])
    return b.op("torch.aten.where.self", t, [_signbit(b, op.operands[1]), negative, magnitude])
