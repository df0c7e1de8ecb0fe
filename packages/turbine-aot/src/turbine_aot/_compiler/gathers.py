"""CPU targets: gathers whose indices are ``arange``\\ s over whole dimensions, over a dynamic
shape, written in the compile copy as the views they are; and gathers over the last two
dimensions by an outer product of indices (bilinear and nearest upsampling as ``torch.export``
decomposes them) as two gathers of one dimension each.

Hugging Face builds an attention's padding mask from ``attention_mask`` ``[B, S]`` as
``attention_mask[batch_idx, kv_idx]`` with ``batch_idx = arange(B)[:, None, None, None]`` and
``kv_idx = arange(S)[None, None, None, :]``: an ``aten.index.Tensor`` whose result is
``attention_mask`` itself viewed as ``[B, 1, 1, S]``. IREE 3.13 compiles such a gather over a
dynamic sequence element by element, delinearizing each output index with divisions by the
dynamic sizes, and fuses it into whatever reads the mask: on BERT with a dynamic sequence
(sequence 256, one Zen 3 core) the mask's dispatch took 6.4 of 14.8 ms a call
(docs/performance.md, section 20). Written as ``x[:n0, :n1, ...]`` (a slice where the
``arange``'s length is not ``x``'s size) with size-1 dimensions inserted where the indices
broadcast, it is a view IREE reads in place.

Rewritten: ``torch.aten.index.Tensor(x, [i_0, ..., i_{r-1}])`` indexing every dimension of ``x``
(no ``None``), each ``i_k`` an ``arange(n_k)`` (plus 0) of integers unsqueezed to the indices'
common rank, one non-1 dimension ``p_k`` each, ``p_0 < p_1 < ...``, and the result of a dynamic
shape. The values are the gather's (the same elements; ``arange`` indices within bounds, as
eager requires).

**Outer-product gathers** (:func:`rewrite_outer_gathers`): ``F.interpolate(x, mode="bilinear")``
reaches the compile copy as four ``x[:, :, h[:, None], w]`` (``h`` ``[OH, 1]``, ``w`` ``[OW]``
integer tensors) and the lerps between them. IREE 3.13 fuses the four gathers into the lerps
and computes every output element with four scalar loads at indices it computes in i64 (on the
Zen 3, 234 us for LR-ASPP's 5 x 128 x 128 output from 16 x 16, 2.9 ns an element; its 128 x 16 x
16 one 102 us; docs/performance.md, section 24). Written as ``index_select(index_select(x, -1,
w), -2, h.view(OH))`` (the same elements), the first gather is a small one over ``H x OW``,
and the second copies whole rows, which IREE vectorizes along ``OW``. Taken: a static ``x`` of
rank 3 or more, indexed ``[None, ..., None, h, w]`` with ``h`` ``[P, 1]`` and ``w`` ``[Q]``
integers (taken modulo the sizes, so negative ones count from the end as they do in the gather).
"""

from __future__ import annotations

from typing import Any

from .torch_ir import Builder, TensorType, constant, erase_unused, producer, walk

__all__ = [
    "OUTER_GATHERS_ENV",
    "arange_gathers",
    "outer_gathers",
    "rewrite_arange_gathers",
    "rewrite_outer_gathers",
]

_INDEX = "torch.aten.index.Tensor"
#: ``keep`` leaves the outer-product gathers as they are (for A/B measurements).
OUTER_GATHERS_ENV = "TURBINE_CPU_OUTER_GATHERS"
#: What a rewritten gather leaves unused (erased with it).
_INDEX_OPS = frozenset(
    {
        "torch.prim.ListConstruct",
        "torch.aten.unsqueeze",
        "torch.aten.add.Scalar",
        "torch.aten.arange",
    }
)


def _arange_index(value: Any) -> tuple[Any, int, int] | None:
    """``(n, rank, p)`` when ``value`` is ``arange(n)`` (``n`` a torch int value) plus 0,
    unsqueezed to rank ``rank`` with its one non-1 dimension at ``p``; else None."""
    vt = TensorType.of(value)
    if vt is None or not vt.dtype.startswith(("si", "ui", "i")):
        return None
    rank = len(vt.sizes)
    op = producer(value)
    while op is not None and op.name == "torch.aten.unsqueeze":
        op = producer(op.operands[0])
    if op is not None and op.name == "torch.aten.add.Scalar":
        if constant(op.operands[1]) != 0 or constant(op.operands[2]) != 1:
            return None
        op = producer(op.operands[0])
    if op is None or op.name != "torch.aten.arange" or len(list(op.operands)) != 5:
        return None
    at = TensorType.of(op.results[0])
    if at is None or len(at.sizes) != 1:
        return None
    others = [i for i, s in enumerate(vt.sizes) if s != 1]
    if len(others) > 1 or (not others and at.sizes[0] != 1):
        return None
    p = others[0] if others else rank - 1  # an arange of one: any position of the broadcast
    return op.operands[0], rank, p


def _gather(op: Any) -> tuple[Any, TensorType, TensorType, list[Any]] | None:
    """``(x, x's type, the result's type, the index list's items)`` of an
    ``aten.index.Tensor`` whose index list is a ``ListConstruct``, else None."""
    if op.name != _INDEX or len(list(op.operands)) != 2:
        return None
    x, indices = op.operands
    xt, out_t = TensorType.of(x), TensorType.of(op.results[0])
    lst = producer(indices)
    if xt is None or out_t is None or lst is None or lst.name != "torch.prim.ListConstruct":
        return None
    return x, xt, out_t, list(lst.operands)


def _spec(op: Any) -> list[tuple[Any, int]] | None:
    """``[(n_k, p_k)]`` of a gather this rewrite takes (module doc), else None."""
    gather = _gather(op)
    if gather is None:
        return None
    _, xt, out_t, items = gather
    if None not in out_t.sizes or len(items) != len(xt.sizes):
        return None
    found = [_arange_index(i) for i in items]
    if any(f is None for f in found):
        return None
    ranks = {f[1] for f in found}  # type: ignore[index]
    positions = [f[2] for f in found]  # type: ignore[index]
    if ranks != {len(out_t.sizes)} or positions != sorted(set(positions)):
        return None
    return [(f[0], f[2]) for f in found]  # type: ignore[index]


def arange_gathers(module_op: Any) -> list[Any]:
    """The gathers of ``module_op`` that :func:`rewrite_arange_gathers` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name == _INDEX and _spec(o) is not None]


def rewrite_arange_gathers(module_op: Any) -> int:
    """Rewrites each of :func:`arange_gathers` in place as slices and unsqueezes of its input;
    returns how many."""
    done = 0
    for op in arange_gathers(module_op):
        spec = _spec(op)
        assert spec is not None
        x, indices = op.operands
        xt, out_t = TensorType.of(x), TensorType.of(op.results[0])
        assert xt is not None and out_t is not None
        b = Builder(op, location=op.location)
        sizes = list(xt.sizes)
        value = x
        for k, (n, _) in enumerate(spec):
            n_static = constant(n)
            if isinstance(n_static, int) and n_static == sizes[k]:
                continue  # the whole dimension
            sizes[k] = n_static if isinstance(n_static, int) else None
            value = b.op(
                "torch.aten.slice.Tensor",
                xt.with_sizes(sizes).asm(),
                [value, b.int(k), b.int(0), n, b.int(1)],
            )
        placed = {p: k for k, (_, p) in enumerate(spec)}
        shape: list[int | None] = []
        for pos in range(len(out_t.sizes)):
            if pos in placed:
                shape.append(sizes[placed[pos]])
                continue
            shape.append(1)
            rest = [sizes[placed[q]] for q in range(pos + 1, len(out_t.sizes)) if q in placed]
            t = xt.with_sizes([*shape, *rest])
            value = b.op("torch.aten.unsqueeze", t.asm(), [value, b.int(pos)])
        if str(value.type) != str(op.results[0].type):  # sizes it knows that the gather's not
            value = b.op("torch.tensor_static_info_cast", out_t.asm(), [value])
        op.results[0].replace_all_uses_with(value)
        op.erase()
        erase_unused(indices, _INDEX_OPS)
        done += 1
    return done


def _outer_spec(op: Any) -> tuple[Any, Any, Any] | None:
    """``(x, h, w)`` of an outer-product gather (module doc), else None."""
    gather = _gather(op)
    if gather is None:
        return None
    x, xt, out_t, items = gather
    rank = len(xt.sizes)
    if rank < 3 or len(items) != rank or None in xt.sizes or None in out_t.sizes:
        return None
    if any(constant(v) is not None or "none" not in str(v.type) for v in items[:-2]):
        return None
    h, w = items[-2:]
    ht, wt = TensorType.of(h), TensorType.of(w)
    if ht is None or wt is None or len(ht.sizes) != 2 or ht.sizes[1] != 1 or len(wt.sizes) != 1:
        return None
    if not all(t.dtype.startswith(("si", "ui", "i")) for t in (ht, wt)):
        return None
    if out_t.sizes != [*xt.sizes[:-2], ht.sizes[0], wt.sizes[0]]:
        return None
    return x, h, w


def _wrapped(b: Builder, i: Any, size: Any) -> Any:
    """``i mod size``: a negative index counts from the end, as in the gather (which IREE
    wraps; its ``index_select`` would not)."""
    return b.op("torch.aten.remainder.Scalar", str(i.type), [i, b.int(size)])


def outer_gathers(module_op: Any) -> list[Any]:
    """The gathers of ``module_op`` that :func:`rewrite_outer_gathers` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name == _INDEX and _outer_spec(o) is not None]


def rewrite_outer_gathers(module_op: Any) -> int:
    """Rewrites each of :func:`outer_gathers` in place as two ``index_select``\\ s (module
    doc); returns how many."""
    done = 0
    for op in outer_gathers(module_op):
        spec = _outer_spec(op)
        assert spec is not None
        x, h, w = spec
        xt, ht, out_t = TensorType.of(x), TensorType.of(h), TensorType.of(op.results[0])
        assert xt is not None and ht is not None and out_t is not None
        rank = len(xt.sizes)
        b = Builder(op, location=op.location)
        cols = b.op(
            "torch.aten.index_select",
            xt.with_sizes([*xt.sizes[:-1], out_t.sizes[-1]]).asm(),
            [x, b.int(rank - 1), _wrapped(b, w, xt.sizes[-1])],
        )
        rows = b.op(
            "torch.aten.view",
            ht.with_sizes([ht.sizes[0]]).asm(),
            [h, b.int_list([ht.sizes[0]])],  # type: ignore[list-item]
        )
        rows = _wrapped(b, rows, xt.sizes[-2])
        value = b.op("torch.aten.index_select", out_t.asm(), [cols, b.int(rank - 2), rows])
        indices = op.operands[1]
        op.results[0].replace_all_uses_with(value)
        op.erase()
        erase_unused(indices, frozenset({"torch.prim.ListConstruct"}))
        done += 1
    return done
