"""llvm-cpu: the compile copy's fp32 softmaxes written as ``exp(x - max) * (1 / sum)``, a form
IREE 3.13 does not raise to its own softmax op.

IREE 3.13 recognizes ``exp(x - amax(x)) / sum(exp(...))`` (and ``torch.aten.softmax`` /
``_softmax``, which lower to it) as a softmax and compiles it for CPUs into one dispatch whose
code is slow: measured on 4 x 128 x 128 (one BERT layer's attention probabilities, Intel Xeon,
one thread) the softmax dispatch took 160 µs, and the mask add before it, now a dispatch of its
own, 27 µs. Written as the maximum, the exponentials' sum, its reciprocal and a multiply, IREE
keeps the element-wise ops and reductions as they are: four dispatches of 57 µs in all
(docs/performance.md, "Softmax on CPUs"). The values differ from the division by at most one
rounding of the reciprocal (a relative 1.2e-7); a row of all ``-inf`` gives NaN in both forms,
as in eager.

Rewritten: ``torch.aten.softmax.int`` without a dtype and ``torch.aten._softmax`` without
``half_to_float``, of f32 tensors of static shape, over any dimension; among them the
softmaxes that :mod:`.attention` writes for scaled-dot-product attention on CPUs. Where the
kernels are built for AVX-512, a static one over the last dimension is instead one dispatch
of turbine's own, each row in one pass (:mod:`.row_softmax`: wav2vec2's attention over 199
keys 1.26x faster, docs/performance.md section 32).
``TURBINE_CPU_SOFTMAX=keep`` leaves them to IREE (A/B measurements; part of the compile cache's
key).

**Static shapes only: IREE 3.13 computes this form wrongly with dynamic ones.** Between two
batched matmuls (attention: ``softmax(mask(q @ k^T)) @ v``) with a dynamic batch, a program
that writes its softmax as ``exp(s - amax(s)) * reciprocal(sum(...))`` gets results off by
order 1 (whether turbine or the model wrote it), where IREE's own softmax op is right
(``tests/test_cpu_softmax.py`` pins both, the wrong one so that it fails once IREE is fixed).
That case is wrong in IREE's AVX-512 code; its AVX2 code gets it right but is wrong over a
dynamic *sequence* (the reduced size dynamic: lengths with a vector remainder), so the rule is
the same on every CPU (docs/performance.md, section 12).
A softmax over a dynamic shape therefore stays IREE's, and a model's own softmax spelled that
way over a dynamic shape is handed to IREE as its softmax op (:func:`rewrite_reciprocal_forms`,
applied whatever ``TURBINE_CPU_SOFTMAX`` says: it is a correctness fix).

The wrong values over a dynamic sequence come from IREE's own code for the product the form
feeds (``p @ v``, a dynamic reduction) with the form fused into it: where that product is a
call of turbine's dynamic-size kernel (:mod:`.dynamic_matmuls`), which IREE cannot fuse into,
the same program is right. So where the kernels are built for AVX2 (where that was measured:
docs/performance.md, section 20) a softmax over a dynamic shape whose every use is such a
product is rewritten too (``dynamic=True``), on the builds of :data:`DYNAMIC_SOFTMAX_ISAS`:
AVX2 (checked on an AMD Zen 3) and AVX-512 (checked on an Intel Xeon with modules built for
``x86-64-v4``, ``benchmarks/dynamic_softmax_prebuilt.py``: right at every length, where the
same form fed to IREE's own products is off by 2.5-4.1 at lengths 5, 24 and 37; over a dynamic
batch, whose products the kernel takes too, likewise: section 20).
"""

from __future__ import annotations

import math
import os
from typing import Any

from .dynamic_matmuls import takes_dynamic_matmul
from .isa import kernel_isa
from .row_softmax import RowSoftmax
from .torch_ir import (
    NOT_CONSTANT,
    VIEW_OPS,
    Builder,
    TensorType,
    TopLevel,
    builtin_tensor,
    constant,
    constant_int_list,
    erase_unused,
    producer,
    walk,
)

__all__ = [
    "CPU_SOFTMAX_ENV",
    "DYNAMIC_SOFTMAX_ISAS",
    "reciprocal_forms",
    "rewrite_reciprocal_forms",
    "rewrite_softmaxes",
    "softmax_enabled",
    "softmaxes",
]

#: Environment variable: ``keep`` leaves fp32 softmaxes to IREE's own softmax.
CPU_SOFTMAX_ENV = "TURBINE_CPU_SOFTMAX"

#: The kernel instruction sets (:mod:`.isa`) whose builds rewrite a softmax over a dynamic shape
#: that feeds only the dynamic-size kernel (``rewrite_softmaxes(dynamic=True)``): those where
#: the result was checked against eager on a CPU of that set (docs/performance.md, section 20).
DYNAMIC_SOFTMAX_ISAS: tuple[str, ...] = ("avx2", "avx512")

_SOFTMAX_INT = "torch.aten.softmax.int"
_SOFTMAX = "torch.aten._softmax"


def softmax_enabled() -> bool:
    """Whether :func:`rewrite_softmaxes` applies (unless ``TURBINE_CPU_SOFTMAX=keep``)."""
    return os.environ.get(CPU_SOFTMAX_ENV, "").strip().lower() != "keep"


def _dim(op: Any, dynamic: bool = False) -> int | None:
    """The reduced dimension (non-negative) of a softmax this rewrite takes, else None;
    ``dynamic``: also over a dynamic shape where every use is a product on the dynamic-size
    kernel (module doc)."""
    if op.name not in (_SOFTMAX_INT, _SOFTMAX) or len(op.operands) != 3:
        return None
    xt, out_t = TensorType.of(op.operands[0]), TensorType.of(op.result)
    if xt is None or out_t is None or xt.dtype != "f32" or out_t.dtype != "f32":
        return None
    # IREE 3.13 miscompiles this form with dynamic shapes where it fuses it into its own
    # products (module doc)
    if None in xt.sizes and not (dynamic and _only_into_dynamic_kernel(op.result)):
        return None
    dim = constant(op.operands[1])
    last = constant(op.operands[2])
    if dim is NOT_CONSTANT or not isinstance(dim, int) or isinstance(dim, bool):
        return None
    if (op.name == _SOFTMAX_INT and last is not None) or (
        op.name == _SOFTMAX and last is not False
    ):
        return None
    rank = len(xt.sizes)
    if not -rank <= dim < rank:
        return None
    return dim % rank


def _row_kernel(xt: TensorType, dim: int) -> bool:
    """Whether the softmax of ``xt`` over ``dim`` is :class:`.row_softmax.RowSoftmax`'s:
    static, over the last dimension, where the kernels are built for AVX-512 (where it was
    measured: docs/performance.md, section 32)."""
    return (
        None not in xt.sizes
        and all(s > 0 for s in xt.sizes)  # type: ignore[operator]
        and dim == len(xt.sizes) - 1
        and len(xt.sizes) >= 2
        and kernel_isa() == "avx512"
    )


def _only_into_dynamic_kernel(value: Any) -> bool:
    """Whether every use of ``value`` is the left operand of a product the dynamic-size kernel
    takes (:mod:`.dynamic_matmuls`), directly or through a reshape (the grouped attention's)."""
    uses = list(value.uses)
    if not uses:
        return False
    for use in uses:
        owner = use.owner
        name = getattr(owner, "name", None)
        if name in VIEW_OPS and use.operand_number == 0:
            if not _only_into_dynamic_kernel(owner.results[0]):
                return False
        elif use.operand_number != 0 or not takes_dynamic_matmul(owner):
            return False
    return True


def softmaxes(module_op: Any, dynamic: bool = False) -> list[Any]:
    """The softmax ops of ``module_op`` that :func:`rewrite_softmaxes` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if _dim(o, dynamic) is not None]


def rewrite_softmaxes(module_op: Any, dynamic: bool = False) -> int:
    """Rewrites each of :func:`softmaxes` in place as ``exp(x - max) * (1 / sum)``, or as a
    call of :mod:`.row_softmax`'s kernel where :func:`_row_kernel` says so; returns how many.
    ``dynamic``: the products over dynamic sizes will be the dynamic-size kernel's, so a
    softmax over a dynamic shape whose every use is such a product is rewritten too."""
    done = 0
    top = TopLevel(getattr(module_op, "operation", module_op))
    for op in softmaxes(module_op, dynamic):
        dim = _dim(op, dynamic)
        assert dim is not None
        x = op.operands[0]
        xt = TensorType.of(x)
        assert xt is not None
        if _row_kernel(xt, dim):  # static, over the last dimension: one dispatch
            shape = [int(s) for s in xt.sizes]  # type: ignore[arg-type]
            kernel = RowSoftmax(math.prod(shape[:-1]), shape[-1])
            if kernel.name not in top:
                top.append(kernel.executable())
            fname = top.unique(f"__turbine_softmax_{done}")
            top.append(kernel.function(fname, shape))
            b = Builder(op, location=op.location)
            builtin_t = builtin_tensor(shape, "f32")
            out = b.call_on_builtins(fname, [(x, builtin_t)], builtin_t, op.result.type)
            op.result.replace_all_uses_with(out)
            op.erase()
            done += 1
            continue
        red_t = xt.with_sizes([1 if i == dim else s for i, s in enumerate(xt.sizes)]).asm()
        b = Builder(op, location=op.location)
        dims, keep = b.int_list([dim]), b.true()
        peak = b.op("torch.aten.amax", red_t, [x, dims, keep])
        shifted = b.op("torch.aten.sub.Tensor", xt.asm(), [x, peak, b.int(1)])
        exps = b.op("torch.aten.exp", xt.asm(), [shifted])
        total = b.op("torch.aten.sum.dim_IntList", red_t, [exps, dims, keep, b.none()])
        inverse = b.op("torch.aten.reciprocal", red_t, [total])
        out = b.op("torch.aten.mul.Tensor", xt.asm(), [exps, inverse])
        op.result.replace_all_uses_with(out)
        op.erase()
        done += 1
    return done


# ---------------------------------------------------------------------------------------------
# A model's own exp(x - amax(x)) * reciprocal(sum(...)) over a dynamic shape, back to a softmax

#: What the reciprocal form leaves unused once its result is a softmax (erased with it).
_FORM_OPS = frozenset(
    {
        "torch.aten.reciprocal",
        "torch.aten.sum.dim_IntList",
        "torch.aten.exp",
        "torch.aten.sub.Tensor",
        "torch.aten.amax",
    }
)


def _reduction(op: Any, name: str) -> tuple[Any, int] | None:
    """``(input, dim)`` of ``op`` when it is ``name`` over one dimension with keepdim (and no
    dtype for a sum), else None."""
    if op is None or op.name != name:
        return None
    operands = list(op.operands)
    dims = constant_int_list(operands[1]) if len(operands) > 2 else None
    if dims is None or len(dims) != 1 or constant(operands[2]) is not True:
        return None
    if name == "torch.aten.sum.dim_IntList" and (
        len(operands) != 4 or constant(operands[3]) is not None
    ):
        return None
    xt = TensorType.of(operands[0])
    if xt is None:
        return None
    return operands[0], dims[0] % len(xt.sizes)


def _reciprocal_form(op: Any) -> tuple[Any, int] | None:
    """``(x, dim)`` when ``op`` is ``e * reciprocal(sum(e, dim))`` (either order) with ``e =
    exp(x - amax(x, dim))``, all f32, ``x`` of a dynamic shape; else None."""
    if op.name != "torch.aten.mul.Tensor" or len(op.operands) != 2:
        return None
    for e, r in (tuple(op.operands), tuple(reversed(list(op.operands)))):
        rec = producer(r)
        if rec is None or rec.name != "torch.aten.reciprocal":
            continue
        summed = _reduction(producer(rec.operands[0]), "torch.aten.sum.dim_IntList")
        exp = producer(e)
        if summed is None or summed[0] != e or exp is None or exp.name != "torch.aten.exp":
            continue
        sub = producer(exp.operands[0])
        if sub is None or sub.name != "torch.aten.sub.Tensor" or constant(sub.operands[2]) != 1:
            continue
        x, peak = sub.operands[0], producer(sub.operands[1])
        top = _reduction(peak, "torch.aten.amax")
        if top is None or top[0] != x or top[1] != summed[1]:
            continue
        xt, out_t = TensorType.of(x), TensorType.of(op.result)
        if xt is None or out_t is None or xt.dtype != "f32" or out_t.dtype != "f32":
            continue
        if None not in xt.sizes or xt.sizes != out_t.sizes:
            continue
        return x, summed[1]
    return None


def reciprocal_forms(module_op: Any) -> list[Any]:
    """The multiplies of ``module_op`` that :func:`rewrite_reciprocal_forms` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if _reciprocal_form(o) is not None]


def rewrite_reciprocal_forms(module_op: Any) -> int:
    """Rewrites each of :func:`reciprocal_forms` in place as ``softmax(x, dim)``, which IREE
    3.13 computes right over dynamic shapes (module doc); returns how many."""
    done = 0
    for op in reciprocal_forms(module_op):
        found = _reciprocal_form(op)  # matched again: an earlier rewrite may have erased parts
        if found is None:
            continue
        x, dim = found
        xt = TensorType.of(x)
        assert xt is not None
        b = Builder(op, location=op.location)
        out = b.op("torch.aten.softmax.int", xt.asm(), [x, b.int(dim), b.none()])
        old = list(op.operands)
        op.result.replace_all_uses_with(out)
        op.erase()
        for v in old:
            erase_unused(v, _FORM_OPS)
        done += 1
    return done
