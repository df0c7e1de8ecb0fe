"""CPU targets: gathers whose indices are ``arange``\\ s over whole dimensions, over a dynamic
shape, written in the compile copy as the views they are.

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
"""

from __future__ import annotations

from typing import Any

from .torch_ir import Builder, TensorType, constant, erase_unused, producer, walk

__all__ = ["arange_gathers", "rewrite_arange_gathers"]

_INDEX = "torch.aten.index.Tensor"
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


def _spec(op: Any) -> list[tuple[Any, int]] | None:
    """``[(n_k, p_k)]`` of a gather this rewrite takes (module doc), else None."""
    if op.name != _INDEX or len(list(op.operands)) != 2:
        return None
    x, indices = op.operands
    xt, out_t = TensorType.of(x), TensorType.of(op.results[0])
    lst = producer(indices)
    if xt is None or out_t is None or lst is None or lst.name != "torch.prim.ListConstruct":
        return None
    if None not in out_t.sizes or len(list(lst.operands)) != len(xt.sizes):
        return None
    found = [_arange_index(i) for i in lst.operands]
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
