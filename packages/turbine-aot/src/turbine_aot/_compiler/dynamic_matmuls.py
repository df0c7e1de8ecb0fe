"""fp32 products of two activations with a dynamic reduction or width rewritten as calls of
turbine's dynamic-size kernel (:mod:`.avx512_dynamic`; docs/performance.md, section 20).

These are what :mod:`.matmuls` leaves to IREE: its kernel packs ``B`` in panels of a static
width, so it takes only products whose ``K`` and ``N`` are static, and over static batch
dimensions. Over a dynamic sequence, attention's two products are the others (``q @ k^T``:
``N`` is the sequence; ``p @ v``: ``K`` is), and IREE 3.13's code for them is the slowest part
of such a model on CPUs (BERT with a dynamic sequence: 1.76 of 2.69 ms a call in ``q @ k^T``);
over a dynamic batch, both are IREE's ``batch_matmul`` with a dynamic batch. The compile copy
gets, for each fp32 ``torch.aten.matmul`` / ``bmm`` / ``mm`` with ``K`` or ``N`` or a batch
dimension dynamic, the same batch dimensions on both operands (static and equal, or dynamic on
both: torch-mlir's programs assume a dynamic dimension does not broadcast) and no
broadcasting, a call of a private function over builtin tensors (IREE inlines it)::

    a = x as [batch * M, K]
    b = w as [batch * K, N]
    c = flow.dispatch @kernel(a, b, M, batch, K, N)       # [batch * M, N]
    out = c as [*batch, M, N]

(reshapes only: the kernel reads and writes the tensors as they are, a partial last 16-column
panel masked). ``TURBINE_CPU_DYNAMIC_MATMUL=iree`` keeps IREE's code for them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from .avx512_dynamic import Avx512DynamicGemm
from .isa import kernel_features
from .matmuls import mark_cpu_requires
from .torch_ir import Builder, TensorType, TopLevel, builtin_tensor, walk

__all__ = [
    "DYNAMIC_MATMUL_ENV",
    "dynamic_matmul_enabled",
    "f32_product_types",
    "product_function",
    "rewritable_dynamic_matmuls",
    "rewrite_dynamic_matmuls",
    "takes_dynamic_matmul",
]

#: ``iree``: products with a dynamic reduction or width stay IREE's code (for measuring).
DYNAMIC_MATMUL_ENV = "TURBINE_CPU_DYNAMIC_MATMUL"
_OPS = frozenset({"torch.aten.mm", "torch.aten.matmul", "torch.aten.bmm"})


def dynamic_matmul_enabled() -> bool:
    """Whether the rewrite applies (unless ``TURBINE_CPU_DYNAMIC_MATMUL=iree``)."""
    return os.environ.get(DYNAMIC_MATMUL_ENV, "").strip().lower() != "iree"


@dataclass(frozen=True)
class _Product:
    """``x`` is ``[*batch, M, K]``, ``w`` is ``[*batch, K, N]``, ``out`` is ``[*batch, M, N]``."""

    x: TensorType
    w: TensorType
    out: TensorType
    batch: tuple[int | None, ...]  # None: dynamic (on both operands)
    k: int | None
    n: int | None


def f32_product_types(
    op: Any, ops: frozenset[str] = _OPS, min_rank: int = 2
) -> tuple[TensorType, TensorType, TensorType] | None:
    """The types of ``x``, ``w`` and the result of a product ``op`` (one of ``ops``, two
    operands), all f32 and of one rank of at least ``min_rank``; else ``None``."""
    if op.name not in ops or len(list(op.operands)) != 2:
        return None
    x, w = list(op.operands)
    xt, wt, ot = TensorType.of(x), TensorType.of(w), TensorType.of(op.results[0])
    if xt is None or wt is None or ot is None or not (xt.dtype == wt.dtype == ot.dtype == "f32"):
        return None
    rank = len(xt.sizes)
    if rank < min_rank or len(wt.sizes) != rank or len(ot.sizes) != rank:
        return None
    return xt, wt, ot


def _spec(op: Any) -> _Product | None:
    types = f32_product_types(op)
    if types is None:
        return None
    xt, wt, ot = types
    batch = tuple(xt.sizes[:-2])
    if tuple(wt.sizes[:-2]) != batch or tuple(ot.sizes[:-2]) != batch:
        return None  # a broadcast batch (or one static on one side only): left to IREE
    k_x, k_w = xt.sizes[-1], wt.sizes[-2]
    if k_x is not None and k_w is not None and k_x != k_w:
        return None
    k = k_x if k_x is not None else k_w
    n = wt.sizes[-1]
    if k is not None and n is not None and None not in batch:
        return None  # static K, N and batch: the static kernel's (matmuls.py)
    return _Product(xt, wt, ot, batch, k, n)


def takes_dynamic_matmul(op: Any) -> bool:
    """Whether :func:`rewrite_dynamic_matmuls` rewrites ``op``."""
    return _spec(op) is not None


def rewritable_dynamic_matmuls(module_op: Any) -> list[Any]:
    """The ops of ``module_op`` that :func:`rewrite_dynamic_matmuls` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name in _OPS and _spec(o) is not None]


def _tensor(sizes: Any) -> str:
    return builtin_tensor(sizes, "f32")


def _function(name: str, g: _Product, kernel: Avx512DynamicGemm) -> str:
    """The private function computing ``x @ w`` through ``kernel`` (builtin tensors)."""
    xs, ws, outs = list(g.x.sizes), list(g.w.sizes), list(g.out.sizes)
    x_t, w_t, out_t = _tensor(xs), _tensor(ws), _tensor(outs)
    rank = len(xs)
    lines = [f"func.func private @{name}(%x: {x_t}, %w: {w_t}) -> {out_t} {{"]
    e = lines.append

    def size(value: str, tensor: str, tensor_t: str, dim: int, static: int | None) -> str:
        if static is not None:
            e(f"  {value} = arith.constant {static} : index")
        else:
            e(f"  {value}_i = arith.constant {dim} : index")
            e(f"  {value} = tensor.dim {tensor}, {value}_i : {tensor_t}")
        return value

    m_static, n = xs[-2], g.n
    size("%m", "%x", x_t, rank - 2, m_static)
    size("%k", "%x", x_t, rank - 1, g.k)  # x's K is dynamic only where both are
    size("%n", "%w", w_t, rank - 1, n)
    # the batch entries: the static dimensions' product times each dynamic one's size
    dynamic_batch = [d for d, s in enumerate(g.batch) if s is None]
    static_count = math.prod(s for s in g.batch if s is not None)
    e(f"  %batch0 = arith.constant {static_count} : index")
    batch = "%batch0"
    for d in dynamic_batch:
        size(f"%bd{d}", "%x", x_t, d, None)
        e(f"  %batch{d + 1} = arith.muli {batch}, %bd{d} : index")
        batch = f"%batch{d + 1}"
    e("  %rows = arith.muli %m, " + batch + " : index")
    e("  %brows = arith.muli %k, " + batch + " : index")
    # x -> [batch * M, K]
    a, a_t = "%x", x_t
    rows_static = None if m_static is None or dynamic_batch else static_count * m_static
    if rank > 2:
        group = ", ".join(str(i) for i in range(rank - 1))
        a_t = _tensor([rows_static, xs[-1]])  # K as x has it (the cast below may fix it)
        e(f"  %x2 = tensor.collapse_shape %x [[{group}], [{rank - 1}]] : {x_t} into {a_t}")
        a = "%x2"
    kernel_a_t = kernel.a_type()
    if a_t != kernel_a_t:
        e(f"  %a = tensor.cast {a} : {a_t} to {kernel_a_t}")
        a = "%a"
    # w -> [batch * K, N]
    b, b_t = "%w", w_t
    brows_static = None if ws[-2] is None or dynamic_batch else static_count * ws[-2]
    if rank > 2:
        group = ", ".join(str(i) for i in range(rank - 1))
        b_t = _tensor([brows_static, n])
        e(f"  %w2 = tensor.collapse_shape %w [[{group}], [{rank - 1}]] : {w_t} into {b_t}")
        b = "%w2"
    if b_t != "tensor<?x?xf32>":
        e(f"  %bd = tensor.cast {b} : {b_t} to tensor<?x?xf32>")
        b = "%bd"
    e("  %c = " + kernel.dispatch(a, b, "%m", batch, "%k", "%n", "%rows", "%brows"))
    # [batch * M, N] -> [*batch, M, N]
    c, c_t = "%c", _tensor([None, n])
    n_dim = "%n" if n is None else str(n)
    if n is not None:
        e(f"  %cs = tensor.cast %c : tensor<?x?xf32> to {c_t}")
        c = "%cs"
    if rank > 2:
        group = ", ".join(str(i) for i in range(rank - 1))
        batch_dims = [f"%bd{d}" if s is None else str(s) for d, s in enumerate(g.batch)]
        shape = ", ".join([*batch_dims, "%m", n_dim])
        ex_t = _tensor([*g.batch, None, n])
        e(
            f"  %ce = tensor.expand_shape {c} [[{group}], [{rank - 1}]] output_shape [{shape}] "
            f": {c_t} into {ex_t}"
        )
        c, c_t = "%ce", ex_t
    if c_t != out_t:
        e(f"  %out = tensor.cast {c} : {c_t} to {out_t}")
        c = "%out"
    e(f"  return {c} : {out_t}")
    e("}")
    return "\n".join(lines)


def product_function(
    name: str,
    x: TensorType,
    w: TensorType,
    out: TensorType,
    batch: tuple[int | None, ...],
    k: int | None,
    n: int | None,
    kernel: Avx512DynamicGemm,
) -> str:
    """The private function ``@name(x, w) -> out`` computing ``x @ w`` (``[*batch, M, K] @
    [*batch, K, N]``, no broadcasting; sizes static or not) through ``kernel``, for other
    rewrites (:mod:`.few_row_products`)."""
    return _function(name, _Product(x, w, out, batch, k, n), kernel)


def rewrite_dynamic_matmuls(module_op: Any) -> int:
    """Rewrites, in place, each product :func:`rewritable_dynamic_matmuls` finds as a call of
    the dynamic-size kernel (blocked for :func:`.isa.kernel_isa`), and records the kernels'
    CPU features in the module's public functions (``turbine.cpu_requires``).

    Returns:
        How many products were rewritten.
    """
    op = getattr(module_op, "operation", module_op)
    top = TopLevel(op)
    found = [(o, _spec(o)) for o in rewritable_dynamic_matmuls(op)]
    for index, (mm, spec) in enumerate(found):
        assert spec is not None
        kernel = Avx512DynamicGemm.for_product(spec.k, spec.n)
        if kernel.name not in top:
            top.append(kernel.executable())
        name = top.unique(f"__turbine_dynamic_matmul_{index}")
        top.append(_function(name, spec, kernel))
        x, w = list(mm.operands)
        b = Builder(mm, location=mm.location)
        result = b.call_on_builtins(
            name,
            [(x, _tensor(spec.x.sizes)), (w, _tensor(spec.w.sizes))],
            _tensor(spec.out.sizes),
            mm.results[0].type,
        )
        mm.results[0].replace_all_uses_with(result)
        mm.erase()
    if found:
        mark_cpu_requires(op, kernel_features())
    return len(found)
