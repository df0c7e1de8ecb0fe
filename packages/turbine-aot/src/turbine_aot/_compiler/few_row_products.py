"""Products of two activations with few rows per batch entry, read where they lie: a decode
step's attention (docs/performance.md, section 22).

:mod:`.matmuls` packs ``B`` into panels before its kernel reads it. For a weight the pack is
hoisted and done once; for attention's ``q @ k^T`` and ``p @ v`` it runs on every call, as a
transpose dispatch of IREE's, and in a decode step (one query row a head, three with grouped
keys) the packs cost several times the products: per layer of the 110M Llama's step on a Zen 3
core, 9-11 us to pack ``k^T`` and 10-20 us to pack ``v`` against 1.2-1.8 us for each product.
With so few rows there is nothing for a pack to amortize, so the compile copy gets, for each fp32
``torch.aten.matmul`` / ``bmm`` with static sizes, equal static batch dimensions on both
operands, at most :data:`MAX_ROWS` rows per batch entry and a right operand computed from the
function's arguments (a weight keeps the hoisted pack):

- ``x @ t.transpose(-2, -1)`` (``q @ k^T``), ``K`` and ``N`` multiples of 8: a call of
  :class:`F32DotGemm`, which reads ``t`` (``k``, ``[*batch, N, K]`` row-major) as it is: each
  output a dot product of two contiguous rows;
- any other right operand (``p @ v``): a call of the dynamic-size kernel
  (:mod:`.avx512_dynamic`, its sizes static here), which reads ``B`` row-major as it is.

``TURBINE_CPU_FEW_ROW_PRODUCTS=packed`` keeps :mod:`.matmuls`' packed path for them (for
measuring).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from .avx512_dynamic import Avx512DynamicGemm
from .dynamic_matmuls import f32_product_types, product_function
from .isa import kernel_features
from .kernel_text import close_executable, open_executable
from .matmuls import mark_cpu_requires
from .torch_ir import Builder, TensorType, TopLevel, builtin_tensor, constant, producer, walk

__all__ = [
    "FEW_ROW_PRODUCTS_ENV",
    "MAX_ROWS",
    "F32DotGemm",
    "few_row_products_enabled",
    "rewritable_few_row_products",
    "rewrite_few_row_products",
]

#: ``packed``: these products keep :mod:`.matmuls`' packed right operand (for measuring).
FEW_ROW_PRODUCTS_ENV = "TURBINE_CPU_FEW_ROW_PRODUCTS"
#: The most rows of one batch entry taken here: a decode step's query rows (grouped: the
#: query heads sharing a key head); longer ones (prefill) keep the packed path, whose pack
#: their rows amortize.
MAX_ROWS = 16
_OPS = frozenset({"torch.aten.matmul", "torch.aten.bmm"})
#: Columns a step of :class:`F32DotGemm` computes (8 dot products, one vector of results).
_COLS = 8


def few_row_products_enabled() -> bool:
    """Whether the rewrite applies (unless ``TURBINE_CPU_FEW_ROW_PRODUCTS=packed``)."""
    return os.environ.get(FEW_ROW_PRODUCTS_ENV, "").strip().lower() != "packed"


@dataclass(frozen=True)
class F32DotGemm:
    """``C[z] = A[z] @ T[z]^T`` (f32) for static sizes: ``A`` is ``[batch * m, k]``, ``T``
    ``[batch * n, k]`` and ``C`` ``[batch * m, n]``, all row-major as the program has them.

    A workgroup computes one batch entry: for each block of 8 columns (8 rows of ``T``, in L1
    across the entry's ``m`` rows) and row of ``A``, 8 accumulators over ``k`` (8 lanes a
    step, one FMA per row of ``T``), then their 8 lane sums as one vector (a shuffle tree:
    14 shuffles and 7 additions), stored as ``C``'s 8 columns. ``k`` and ``n`` are multiples
    of 8. The same MLIR on every x86 CPU with AVX2 and FMA (an AVX-512 CPU runs it too).
    """

    m: int
    k: int
    n: int
    batch: int

    def __post_init__(self) -> None:
        if min(self.m, self.k, self.n, self.batch) <= 0 or self.k % 8 or self.n % _COLS:
            raise ValueError(f"dot-product kernel: bad sizes: {self}")

    @property
    def name(self) -> str:
        return f"__turbine_f32_dot_gemm_{self.batch}x{self.m}x{self.n}x{self.k}"

    def types(self) -> tuple[str, str, str]:
        """The builtin tensor types of ``A``, ``T`` and ``C``."""
        b, m, k, n = self.batch, self.m, self.k, self.n
        return (
            f"tensor<{b * m}x{k}xf32>",
            f"tensor<{b * n}x{k}xf32>",
            f"tensor<{b * m}x{n}xf32>",
        )

    def dispatch(self, a: str, t: str) -> str:
        """The ``flow.dispatch`` of this kernel on ``a`` and ``t`` (:meth:`types`)."""
        a_t, t_t, c_t = self.types()
        name = self.name
        return (
            f"flow.dispatch @{name}::@{name}[%m, %batch]({a}, {t}, %m, %batch) : "
            f"({a_t}, {t_t}, index, index) -> {c_t}"
        )

    def executable(self) -> str:
        """The ``stream.executable`` (MLIR text) for a module's top level."""
        b, m, k, n = self.batch, self.m, self.k, self.n
        a_t = f"memref<{b * m}x{k}xf32>"
        t_t = f"memref<{b * n}x{k}xf32>"
        c_t = f"memref<{b * m}x{n}xf32>"
        vt = "vector<8xf32>"
        out: list[str] = []
        e = out.append
        open_executable(
            e,
            self.name,
            column_blocks=1,
            rows_per_workgroup=m,
            bindings=["%a", "%t", "%c"],
            batch=True,
            constants={0, 1, 8, m, k, n, *range(_COLS)},
        )
        p = "      "
        e(f"{p}%ma = stream.binding.subspan %a[%c0] : !stream.binding -> {a_t}")
        e(f"{p}%mt = stream.binding.subspan %t[%c0] : !stream.binding -> {t_t}")
        e(f"{p}%mc = stream.binding.subspan %c[%c0] : !stream.binding -> {c_t}")
        e(f"{p}%zero = arith.constant dense<0.0> : {vt}")
        e(f"{p}%wgz = stream.dispatch.workgroup.id[2] : index")
        e(f"{p}%zrow = affine.apply affine_map<()[s0] -> (s0 * {m})>()[%wgz]")
        e(f"{p}%ztrow = affine.apply affine_map<()[s0] -> (s0 * {n})>()[%wgz]")
        e(f"{p}scf.for %nb = %c0 to %c{n} step %c8 {{")
        q = p + "  "
        e(f"{q}%tn = arith.addi %ztrow, %nb : index")
        for j in range(_COLS):
            e(f"{q}%tn{j} = arith.addi %tn, %c{j} : index")
        e(f"{q}scf.for %mi = %c0 to %c{m} step %c1 {{")
        r = q + "  "
        e(f"{r}%row = arith.addi %zrow, %mi : index")
        accs = [f"%acc{j}" for j in range(_COLS)]
        tys = ", ".join([vt] * _COLS)
        iters = ", ".join(f"{a} = %zero" for a in accs)
        e(f"{r}%res:{_COLS} = scf.for %kk = %c0 to %c{k} step %c8 iter_args({iters}) -> ({tys}) {{")
        s = r + "  "
        e(f"{s}%av = vector.load %ma[%row, %kk] : {a_t}, {vt}")
        for j in range(_COLS):
            e(f"{s}%tv{j} = vector.load %mt[%tn{j}, %kk] : {t_t}, {vt}")
            e(f"{s}%f{j} = vector.fma %av, %tv{j}, %acc{j} : {vt}")
        e(f"{s}scf.yield " + ", ".join(f"%f{j}" for j in range(_COLS)) + f" : {tys}")
        e(f"{r}}}")
        total = _lane_sums(e, r, [f"%res#{j}" for j in range(_COLS)])
        e(f"{r}vector.store {total}, %mc[%row, %nb] : {c_t}, {vt}")
        e(f"{q}}}")
        e(f"{p}}}")
        close_executable(e)
        return "\n".join(out)


def _lane_sums(e: Any, p: str, vectors: list[str]) -> str:
    """Emits the vector whose lane ``j`` is the sum of ``vectors[j]``'s 8 lanes (8 vectors):
    pairs of lanes, then of pairs, then of halves, each level one shuffle of the even parts,
    one of the odd and an addition per pair of inputs. Returns its name."""
    vt = "vector<8xf32>"
    # level 1: (a0, a1) -> [a0 01, a1 01, a0 23, a1 23, a0 45, a1 45, a0 67, a1 67]
    # level 2: (t0, t1) -> [a0..a3 over lanes 0-3, a0..a3 over lanes 4-7]
    # level 3: (u0, u1) -> [a0..a7]
    levels = [
        ([0, 8, 2, 10, 4, 12, 6, 14], [1, 9, 3, 11, 5, 13, 7, 15]),
        ([0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]),
        ([0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]),
    ]
    for level, (even, odd) in enumerate(levels):
        nxt = []
        for i in range(0, len(vectors), 2):
            x, y, o = vectors[i], vectors[i + 1], f"%ls{level}_{i // 2}"
            e(f"{p}{o}e = vector.shuffle {x}, {y} {even} : {vt}, {vt}")
            e(f"{p}{o}o = vector.shuffle {x}, {y} {odd} : {vt}, {vt}")
            e(f"{p}{o} = arith.addf {o}e, {o}o : {vt}")
            nxt.append(o)
        vectors = nxt
    return vectors[0]


@dataclass(frozen=True)
class _Product:
    """``x`` is ``[*batch, M, K]``, the right operand ``w`` ``[*batch, K, N]``: where ``w`` is
    ``t.transpose(-2, -1)`` (``q @ k^T``) the dot-product kernel reads ``t`` (``[*batch, N,
    K]``); where ``t`` is None the dynamic-size kernel reads ``w`` row-major."""

    x: TensorType
    w: TensorType  # the product's right operand as the op has it ([*batch, K, N])
    out: TensorType
    batch: tuple[int, ...]
    m: int
    k: int
    n: int
    t: Any  # the transpose's input (torch value) where transposed, else None
    t_type: TensorType | None


def _depends_on_arguments(value: Any, limit: int = 20000) -> bool:
    """Whether ``value`` is computed from a block argument (a function's input: not hoisted
    into an initializer as a weight's pack is)."""
    seen: set[Any] = set()  # the operations (hashable: equal where the same op)
    stack = [value]
    while stack and len(seen) < limit:
        v = stack.pop()
        op = producer(v)
        if op is None:
            return True
        if op in seen:
            continue
        seen.add(op)
        stack.extend(op.operands)
    return len(seen) >= limit  # too far to tell: not a weight's short chain


def _last_two_swapped(op: Any, rank: int) -> bool:
    if getattr(op, "name", None) != "torch.aten.transpose.int" or len(list(op.operands)) != 3:
        return False
    d0, d1 = constant(op.operands[1]), constant(op.operands[2])
    if not isinstance(d0, int) or not isinstance(d1, int):
        return False
    return sorted(d % rank for d in (d0, d1)) == [rank - 2, rank - 1]


def _spec(op: Any) -> _Product | None:
    types = f32_product_types(op, _OPS, min_rank=3)
    if types is None:
        return None
    xt, wt, ot = types
    w, rank = op.operands[1], len(xt.sizes)
    if None in xt.sizes or None in wt.sizes or None in ot.sizes:
        return None
    batch = tuple(int(s) for s in xt.sizes[:-2])  # type: ignore[arg-type]
    m, k = int(xt.sizes[-2]), int(xt.sizes[-1])  # type: ignore[arg-type]
    k_w, n = int(wt.sizes[-2]), int(wt.sizes[-1])  # type: ignore[arg-type]
    if tuple(wt.sizes[:-2]) != batch or list(ot.sizes) != [*batch, m, n] or k_w != k:
        return None
    if m > MAX_ROWS or not _depends_on_arguments(w):
        return None
    t_op = producer(w)
    if t_op is not None and _last_two_swapped(t_op, rank) and k % 8 == 0 and n % _COLS == 0:
        t = t_op.operands[0]
        tt = TensorType.of(t)
        if tt is not None and list(tt.sizes) == [*batch, n, k] and tt.dtype == "f32":
            return _Product(xt, wt, ot, batch, m, k, n, t, tt)
    return _Product(xt, wt, ot, batch, m, k, n, None, None)


def rewritable_few_row_products(module_op: Any) -> list[Any]:
    """The ops of ``module_op`` that :func:`rewrite_few_row_products` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name in _OPS and _spec(o) is not None]


def _dot_function(name: str, g: _Product, kernel: F32DotGemm) -> str:
    """``@name(x: [*batch, M, K], t: [*batch, N, K]) -> [*batch, M, N]`` through ``kernel``."""
    assert g.t_type is not None
    x_t, t_t, out_t = (builtin_tensor(s, "f32") for s in (g.x.sizes, g.t_type.sizes, g.out.sizes))
    a_t, tk_t, c_t = kernel.types()
    rank = len(g.x.sizes)
    group = ", ".join(str(i) for i in range(rank - 1))
    shape = ", ".join(str(s) for s in g.out.sizes)
    return "\n".join(
        [
            f"func.func private @{name}(%x: {x_t}, %t: {t_t}) -> {out_t} {{",
            f"  %m = arith.constant {g.m} : index",
            f"  %batch = arith.constant {kernel.batch} : index",
            f"  %a = tensor.collapse_shape %x [[{group}], [{rank - 1}]] : {x_t} into {a_t}",
            f"  %tk = tensor.collapse_shape %t [[{group}], [{rank - 1}]] : {t_t} into {tk_t}",
            "  %c = " + kernel.dispatch("%a", "%tk"),
            f"  %out = tensor.expand_shape %c [[{group}], [{rank - 1}]] output_shape [{shape}] "
            f": {c_t} into {out_t}",
            f"  return %out : {out_t}",
            "}",
        ]
    )


def rewrite_few_row_products(module_op: Any) -> int:
    """Rewrites, in place, each product :func:`rewritable_few_row_products` finds (see the
    module doc), and records the kernels' CPU features in the module's public functions.

    Returns:
        How many products were rewritten.
    """
    op = getattr(module_op, "operation", module_op)
    top = TopLevel(op)
    specs = [(o, _spec(o)) for o in walk(op) if o.name in _OPS]
    found = [(o, spec) for o, spec in specs if spec is not None]
    for index, (mm, spec) in enumerate(found):
        name = top.unique(f"__turbine_few_row_product_{index}")
        b = Builder(mm, location=mm.location)
        out_b = builtin_tensor(spec.out.sizes, "f32")
        if spec.t is not None:
            assert spec.t_type is not None
            kernel = F32DotGemm(spec.m, spec.k, spec.n, math.prod(spec.batch))
            if kernel.name not in top:
                top.append(kernel.executable())
            top.append(_dot_function(name, spec, kernel))
            x = mm.operands[0]
            operands = [
                (x, builtin_tensor(spec.x.sizes, "f32")),
                (spec.t, builtin_tensor(spec.t_type.sizes, "f32")),
            ]
        else:
            dyn = Avx512DynamicGemm.for_product(spec.k, spec.n)
            if dyn.name not in top:
                top.append(dyn.executable())
            top.append(
                product_function(name, spec.x, spec.w, spec.out, spec.batch, spec.k, spec.n, dyn)
            )
            x, w = list(mm.operands)
            operands = [
                (x, builtin_tensor(spec.x.sizes, "f32")),
                (w, builtin_tensor(spec.w.sizes, "f32")),
            ]
        result = b.call_on_builtins(name, operands, out_b, mm.results[0].type)
        t_op = producer(mm.operands[1]) if spec.t is not None else None
        mm.results[0].replace_all_uses_with(result)
        mm.erase()
        if t_op is not None and not list(t_op.results[0].uses):
            t_op.erase()
    if found:
        mark_cpu_requires(op, kernel_features())
    return len(found)
