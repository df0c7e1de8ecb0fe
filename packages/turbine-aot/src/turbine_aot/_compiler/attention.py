"""CPU-only rewrite of attention in the torch-dialect module handed to IREE.

The exported IR keeps ``torch.aten.scaled_dot_product_attention`` (target-neutral: GPU targets
want IREE's fused attention op, and in fp16 it is closer to eager). IREE 3.13's CPU code for that
op is ~50× slower than eager's attention, while the same computation written as matmul + mask +
softmax + matmul reaches IREE's data-tiled matmul path (docs/performance.md, section 9). IREE has
no flag for it: its torch input pipeline keeps the op legal on purpose, and torch-mlir's own
decomposition handles neither masks nor ``is_causal``. So ``rewrites.module_for_compile`` rewrites each
attention op of a copy of the module, for CPU targets only, into::

    scores = (q * scale) @ k.transpose(-2, -1)        # k, v repeated per group when enable_gqa
    scores = scores.masked_fill(~causal, -inf)        # is_causal: keep j <= i
    scores = scores.masked_fill(~mask, -inf) | scores + mask   # bool | float attn_mask
    out = softmax(scores, -1) @ v

the form turbine's export-time decomposition (``turbine_fx._turbine_decompositions``) produces,
which a user can still choose at export time with
``extend_aot_decompositions(add_ops=[torch.ops.aten.scaled_dot_product_attention])``.

Grouped-query attention (``Hq`` query heads sharing ``Hk`` key / value heads, ``rep = Hq /
Hk``) is computed without repeating the keys and values: ``enable_gqa=True``, or keys and
values that are ``x.repeat_interleave(rep, dim=-3)`` as Hugging Face's ``repeat_kv`` writes it
(unsqueeze, expand, clone, view), take the grouped form::

    qg = q.reshape(..., Hk, rep * L, E)               # query head h = kv head h // rep
    scores = (qg * scale) @ k.transpose(-2, -1)       # [..., Hk, rep * L, S], k un-repeated
    scores = scores.reshape(..., Hk, rep, L, S)       # masks broadcast as over [..., Hq, L, S]
    out = (softmax(scores, -1).reshape(..., Hk, rep * L, S) @ v).reshape(..., Hq, L, E)

The same products (each query row meets its own head's keys), without the ``rep``-fold copy of
the KV cache that the repeat makes at every step: in a 110M Llama's decode step (GQA 12 / 4)
two copies per layer; without them the step ran 1.14x the tokens/s (docs/performance.md).
``TURBINE_CPU_ATTENTION=keep`` in the environment hands CPU targets IREE's attention op instead
(for measuring it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .targets import flag_targets
from .torch_ir import (
    NOT_CONSTANT,
    VIEW_OPS,
    Builder,
    TensorType,
    TopLevel,
    builtin_tensor,
    constant,
    erase_unused,
    producer,
    walk,
)

__all__ = ["SDPA_OP", "decompose_attention", "has_attention", "targets_only_cpu"]

SDPA_OP = "torch.aten.scaled_dot_product_attention"
_CPU_BACKENDS = frozenset({"llvm-cpu", "vmvx"})


def targets_only_cpu(flags: Sequence[str]) -> bool:
    """Whether ``flags`` compile for CPU devices only (``llvm-cpu`` / ``vmvx``, local devices)."""
    targets = flag_targets(flags)
    return bool(targets) and targets <= _CPU_BACKENDS


def has_attention(module_op: Any) -> bool:
    return any(op.name == SDPA_OP for op in walk(module_op))


# ------------------------------------------------------------------------------------------
# The rewrite


def _broadcast(a: list[int | None], b: list[int | None]) -> list[int | None]:
    n = max(len(a), len(b))
    ones: list[int | None] = [1]
    a = ones * (n - len(a)) + a
    b = ones * (n - len(b)) + b
    out: list[int | None] = []
    for x, y in zip(a, b):
        if x == y:
            out.append(x)
        elif x == 1:
            out.append(y)
        elif y == 1:
            out.append(x)
        else:
            out.append(None)
    return out


def decompose_attention(module_op: Any) -> int:
    """Rewrites every ``scaled_dot_product_attention`` of ``module_op`` in place (see module doc).

    Ops the rewrite does not cover (non-constant flags or scale, ``dropout_p != 0``, unranked
    operands, a dynamic head dimension without an explicit scale) are left as they are.

    Returns:
        How many ops were rewritten.
    """
    top_op = getattr(module_op, "operation", module_op)
    ops = [op for op in walk(top_op) if op.name == SDPA_OP]
    masks = _Masks(TopLevel(top_op))
    done = 0
    for op in ops:
        if _rewrite_one(op, masks):
            done += 1
    return done


class _Masks:
    """The masks over dynamic sizes the rewrite has materialized, one each (:meth:`get`)."""

    def __init__(self, top: TopLevel) -> None:
        self._top = top
        self._done: dict[Any, Any] = {}
        self._functions: dict[str, str] = {}  # one function a mask type

    def get(self, b: Builder, mask: Any, mt: TensorType) -> Any:
        """``mask`` computed once, by a dispatch of its own, where it has a dynamic size (else
        ``mask`` as it is). A mask built from index arithmetic and gathers (Hugging Face's
        ``attention_mask`` expanded to ``[B, 1, L, S]``) is otherwise fused into every layer's
        masked scores and recomputed per element, with its indices delinearized by divisions
        by the dynamic sizes: 0.85 ms of BERT's 1.65 with a dynamic sequence, for 32 K
        elements (docs/performance.md, section 20); the causal mask this rewrite builds is
        one too (its ``j <= i``, per layer). ``util.optimization_barrier`` keeps IREE from
        fusing it."""
        if None not in mt.sizes:
            return mask
        key = (mask, b.ip.block)  # inserted before the first rewritten op using it
        if key not in self._done:
            t = builtin_tensor(mt.sizes, mt.dtype)
            if t not in self._functions:
                self._functions[t] = self._function(mt, t)
            name = self._functions[t]
            self._done[key] = b.call_on_builtins(name, [(mask, t)], t, mask.type)
        return self._done[key]

    def _function(self, mt: TensorType, t: str) -> str:
        """A private function returning its argument (builtin type ``t``) through the barrier."""
        name = self._top.unique("__turbine_materialized_mask")
        lines = [f"func.func private @{name}(%m: {t}) -> {t} {{"]
        dims = []
        for i, d in enumerate(mt.sizes):
            if d is None:
                lines.append(f"  %i{i} = arith.constant {i} : index")
                lines.append(f"  %d{i} = tensor.dim %m, %i{i} : {t}")
                dims.append(f"%d{i}")
        # the barrier's result has no sizes IREE can trace back: tie them to the mask's
        lines.append(f"  %r = util.optimization_barrier %m : {t}")
        lines.append(f"  %s = flow.tensor.tie_shape %r : {t}{{{', '.join(dims)}}}")
        lines.append(f"  return %s : {t}")
        lines.append("}")
        self._top.append("\n".join(lines))
        return name


def _rewrite_one(op: Any, masks: _Masks) -> bool:
    q, k, v, mask, dropout, causal, scale, gqa = list(op.operands)
    dropout_p, is_causal, scale_v, enable_gqa = (
        constant(dropout),
        constant(causal),
        constant(scale),
        constant(gqa),
    )
    if any(c is NOT_CONSTANT for c in (dropout_p, is_causal, scale_v, enable_gqa)):
        return False
    if dropout_p not in (None, 0.0):
        return False
    qt, kt, vt = TensorType.of(q), TensorType.of(k), TensorType.of(v)
    out_t = TensorType.of(op.result)
    if qt is None or kt is None or vt is None or out_t is None:
        return False
    if min(len(qt.sizes), len(kt.sizes), len(vt.sizes)) < 2:
        return False
    mt = None
    if constant(mask) is not None:
        mt = TensorType.of(mask)
        if mt is None:
            return False
    if scale_v is None:
        if qt.sizes[-1] is None:
            return False
        scale_v = 1.0 / math.sqrt(qt.sizes[-1])
    b = Builder(op)
    if mt is not None:
        mask = masks.get(b, mask, mt)

    grouped = _grouped_operands(q, k, v, qt, kt, vt, bool(enable_gqa), mt)
    if grouped is not None:
        _rewrite_grouped(op, b, grouped, scale_v, bool(is_causal), mask, mt, masks)
        return True

    if enable_gqa and len(kt.sizes) >= 3 and kt.sizes[-3] != qt.sizes[-3]:
        hq, hk = qt.sizes[-3], kt.sizes[-3]
        if hq is None or hk is None or hq % hk:
            return False
        k, kt = _repeat_heads(b, k, kt, hq // hk)
        v, vt = _repeat_heads(b, v, vt, hq // hk)

    batch = _broadcast(qt.sizes[:-2], kt.sizes[:-2])
    lq, s = qt.sizes[-2], kt.sizes[-2]
    q_scaled = b.op("torch.aten.mul.Scalar", qt.asm(), [q, b.float(scale_v)])
    k_t = kt.with_sizes([*kt.sizes[:-2], kt.sizes[-1], kt.sizes[-2]])
    k_transposed = b.op("torch.aten.transpose.int", k_t.asm(), [k, b.int(-2), b.int(-1)])
    scores_t = qt.with_sizes([*batch, lq, s])
    scores = b.op("torch.aten.matmul", scores_t.asm(), [q_scaled, k_transposed])
    causal = (q, k, lq, s, len(qt.sizes), len(kt.sizes)) if is_causal else None
    probs = _masked_softmax(b, scores, scores_t, causal, mask, mt, masks)
    out = b.op("torch.aten.matmul", out_t.asm(), [probs, v])
    op.result.replace_all_uses_with(out)
    op.erase()
    return True


def _masked_softmax(
    b: Builder,
    scores: Any,
    scores_t: TensorType,
    causal: tuple[Any, ...] | None,
    mask: Any,
    mt: TensorType | None,
    masks: _Masks,
) -> Any:
    """``softmax(scores, -1)`` after the causal mask (``causal``: :func:`_causal_keep`'s
    arguments after ``b``, or None; over dynamic sizes computed by a dispatch of its own,
    :meth:`_Masks.get`, not per score) and ``mask`` (bool: masked_fill, which broadcasts it to
    the scores' shape; float: added)."""
    neg_inf = b.float(float("-inf"))
    if causal is not None:
        lq, s = causal[2], causal[3]
        keep = masks.get(b, _causal_keep(b, *causal), TensorType([lq, s], "i1"))
        drop = b.op("torch.aten.logical_not", TensorType([lq, s], "i1").asm(), [keep])
        scores = b.op("torch.aten.masked_fill.Scalar", scores_t.asm(), [scores, drop, neg_inf])
    if mt is not None:
        if mt.dtype == "i1":
            drop = b.op("torch.aten.logical_not", mt.asm(), [mask])
            scores = b.op("torch.aten.masked_fill.Scalar", scores_t.asm(), [scores, drop, neg_inf])
        else:
            scores_t = scores_t.with_sizes(_broadcast(scores_t.sizes, mt.sizes))
            scores = b.op("torch.aten.add.Tensor", scores_t.asm(), [scores, mask, b.int(1)])
    return b.op("torch.aten.softmax.int", scores_t.asm(), [scores, b.int(-1), b.none()])


# ------------------------------------------------------------------------------------------
# Grouped-query attention without repeating the keys and values

#: The ops of a ``repeat_kv`` that the grouped form leaves unused (erased with it).
_REPEAT_OPS = frozenset(
    {*VIEW_OPS, "torch.aten.clone", "torch.aten.expand", "torch.aten.unsqueeze"}
)


def _unrepeated(value: Any) -> tuple[Any, int] | None:
    """``(x, rep)`` where ``value`` is ``x.repeat_interleave(rep, dim=-3)`` written as Hugging
    Face's ``repeat_kv``: ``x[..., :, None].expand(..., Hk, rep, S, E)`` (a ``clone`` or not),
    viewed as ``[..., Hk * rep, S, E]``; else ``None``."""
    view = producer(value)
    if view is None or view.name not in VIEW_OPS:
        return None
    src = view.operands[0]
    expand = producer(src)
    if expand is not None and expand.name == "torch.aten.clone":
        expand = producer(expand.operands[0])
    if expand is None or expand.name != "torch.aten.expand":
        return None
    unsq = producer(expand.operands[0])
    if unsq is None or unsq.name != "torch.aten.unsqueeze":
        return None
    x = unsq.operands[0]
    xt, et, vt = TensorType.of(x), TensorType.of(expand.result), TensorType.of(value)
    if xt is None or et is None or vt is None or len(xt.sizes) < 3:
        return None
    rank = len(xt.sizes)
    if constant(unsq.operands[1]) not in (rank - 2, -3):  # the new axis right after the heads
        return None
    hk, rep = xt.sizes[-3], et.sizes[-3]
    want = [*xt.sizes[:-2], rep, *xt.sizes[-2:]]
    if hk is None or rep is None or et.sizes != want:
        return None
    if vt.sizes != [*xt.sizes[:-3], hk * rep, *xt.sizes[-2:]] or vt.dtype != xt.dtype:
        return None
    return x, rep


def _grouped_operands(
    q: Any,
    k: Any,
    v: Any,
    qt: TensorType,
    kt: TensorType,
    vt: TensorType,
    enable_gqa: bool,
    mt: TensorType | None,
) -> tuple[Any, Any, TensorType, TensorType, int] | None:
    """``(k, v, kt, vt, rep)`` un-repeated where the grouped form applies, else ``None``."""
    if len(qt.sizes) < 3 or len(kt.sizes) != len(qt.sizes) or len(vt.sizes) != len(qt.sizes):
        return None
    hq = qt.sizes[-3]
    if enable_gqa and kt.sizes[-3] != hq:
        hk = kt.sizes[-3]
        if hq is None or hk is None or hk == 0 or hq % hk or vt.sizes[-3] != hk:
            return None
        rep = hq // hk
    else:
        ku, vu = _unrepeated(k), _unrepeated(v)
        if ku is None or vu is None or ku[1] != vu[1]:
            return None
        (k, rep), (v, _) = ku, vu
        kt, vt = TensorType.of(k), TensorType.of(v)  # type: ignore[assignment]
    if rep < 2 or any(d is None for d in qt.sizes[:-2]) or qt.sizes[-1] is None:
        return None
    if vt.sizes[-1] is None:
        return None
    if mt is not None and len(mt.sizes) >= 3 and mt.sizes[-3] not in (1,):
        return None  # a mask per query head: the repeated form
    return k, v, kt, vt, rep


def _rewrite_grouped(
    op: Any,
    b: Builder,
    grouped: tuple[Any, Any, TensorType, TensorType, int],
    scale: float,
    is_causal: bool,
    mask: Any,
    mt: TensorType | None,
    masks: _Masks,
) -> None:
    """Replaces ``op`` by the grouped form (module doc); the repeat, if any, is erased."""
    q = op.operands[0]
    k_old, v_old = op.operands[1], op.operands[2]
    k, v, kt, vt, rep = grouped
    qt = TensorType.of(q)
    out_t = TensorType.of(op.result)
    assert qt is not None and out_t is not None
    rank = len(qt.sizes)
    prefix = [d for d in qt.sizes[:-3] if d is not None]
    hq, lq, e = qt.sizes[-3], qt.sizes[-2], qt.sizes[-1]
    hk, s, ev = kt.sizes[-3], kt.sizes[-2], vt.sizes[-1]
    assert hq is not None and hk is not None and e is not None and ev is not None

    def size_of(value: Any, dim: int, static: int | None) -> Any:
        if static is not None:
            return b.int(static)
        return b.op("torch.aten.size.int", "!torch.int", [value, b.int(dim)])

    def reshape(x: Any, t: TensorType, sizes: list[Any]) -> Any:
        items = [b.int(v) if isinstance(v, int) else v for v in sizes]
        shape = b.op("torch.prim.ListConstruct", "!torch.list<int>", items)
        return b.op("torch.aten.reshape", t.asm(), [x, shape])

    rows = None if lq is None else rep * lq
    qg_t = qt.with_sizes([*prefix, hk, rows, e])
    qg = reshape(q, qg_t, [*prefix, hk, -1, e])
    q_scaled = b.op("torch.aten.mul.Scalar", qg_t.asm(), [qg, b.float(scale)])
    k_t = kt.with_sizes([*kt.sizes[:-2], e, s])
    k_transposed = b.op("torch.aten.transpose.int", k_t.asm(), [k, b.int(-2), b.int(-1)])
    flat_t = qt.with_sizes([*prefix, hk, rows, s])
    scores = b.op("torch.aten.matmul", flat_t.asm(), [q_scaled, k_transposed])
    l_v = size_of(q, rank - 2, lq)
    s_v = size_of(k, rank - 2, s)
    scores_t = qt.with_sizes([*prefix, hk, rep, lq, s])
    scores = reshape(scores, scores_t, [*prefix, hk, rep, l_v, s_v])
    if mt is not None and len(mt.sizes) >= 3:  # [..., 1, L, S] -> [..., 1, 1, L, S]: over rep too
        at = len(mt.sizes) - 2
        mt = mt.with_sizes([*mt.sizes[:at], 1, *mt.sizes[at:]])
        mask = b.op("torch.aten.unsqueeze", mt.asm(), [mask, b.int(at)])
    causal = (q, k, lq, s, rank, len(kt.sizes)) if is_causal else None
    probs = _masked_softmax(b, scores, scores_t, causal, mask, mt, masks)
    probs = reshape(probs, flat_t, [*prefix, hk, -1, s_v])
    out_g = b.op("torch.aten.matmul", qt.with_sizes([*prefix, hk, rows, ev]).asm(), [probs, v])
    out = reshape(out_g, out_t, [*prefix, hq, -1, ev])
    op.result.replace_all_uses_with(out)
    op.erase()
    for old in (k_old, v_old):
        erase_unused(old, _REPEAT_OPS)


def _repeat_heads(b: Builder, x: Any, xt: TensorType, rep: int) -> tuple[Any, TensorType]:
    """``x.repeat_interleave(rep, dim=-3)`` as unsqueeze + expand + flatten (no data copy)."""
    rank = len(xt.sizes)
    heads = xt.sizes[-3]
    assert heads is not None
    sizes_u = [*xt.sizes[:-2], 1, *xt.sizes[-2:]]  # [..., H, 1, S, E]
    u = b.op("torch.aten.unsqueeze", xt.with_sizes(sizes_u).asm(), [x, b.int(rank - 2)])
    sizes_e = [*xt.sizes[:-2], rep, *xt.sizes[-2:]]
    expand_to = [-1] * (rank + 1)
    expand_to[rank - 2] = rep
    e = b.op(
        "torch.aten.expand",
        xt.with_sizes(sizes_e).asm(),
        [u, b.int_list(expand_to), b.false()],
    )
    out_t = xt.with_sizes([*xt.sizes[:-3], heads * rep, *xt.sizes[-2:]])
    flat = b.op("torch.aten.flatten.using_ints", out_t.asm(), [e, b.int(rank - 3), b.int(rank - 2)])
    return flat, out_t


def _causal_keep(
    b: Builder, q: Any, k: Any, lq: int | None, s: int | None, q_rank: int, k_rank: int
) -> Any:
    """Bool ``[L, S]``: ``j <= i`` (``torch.ones(L, S).tril()``), from ``arange`` (no literal)."""

    def length(static: int | None, value: Any, rank: int) -> Any:
        if static is not None:
            return b.int(static)
        return b.op("torch.aten.size.int", "!torch.int", [value, b.int(rank - 2)])

    def arange(n: int | None, end: Any) -> Any:
        none = b.none()
        return b.op(
            "torch.aten.arange",
            TensorType([n], "si64").asm(),
            [end, b.int(4), none, none, none],  # dtype 4 = torch.int64
        )

    rows = arange(lq, length(lq, q, q_rank))
    cols = arange(s, length(s, k, k_rank))
    rows2 = b.op("torch.aten.unsqueeze", TensorType([lq, 1], "si64").asm(), [rows, b.int(1)])
    return b.op("torch.aten.ge.Tensor", TensorType([lq, s], "i1").asm(), [rows2, cols])
