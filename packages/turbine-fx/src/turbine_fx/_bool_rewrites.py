"""FX-graph rewrites of boolean ops and small constants that IREE 3.13's torch frontend rejects.

Measured with iree-base-compiler 3.13 (each case compiled and run by
``tests/test_bool_rewrites.py``):

* ``torch.aten.__and__.Tensor`` (and ``__or__``/``__xor__``, ``bitwise_*``, ``bitwise_not``) on
  ``i1`` tensors does not legalize at all, constant operands or not: ``(x > 0) & (x < 1)`` fails
  with "failed to legalize operation 'torch.aten.__and__.Tensor'". When an operand is a constant
  (``x.new_ones((), dtype=torch.bool)``, which Hugging Face transformers 5.x puts in every
  attention mask), IREE first folds it into an ``i1`` ``torch.vtensor.literal`` and reports that
  literal instead. The ``logical_*`` ops compute the same on booleans and do legalize, with
  constant operands too. On integers ``__and__.Tensor`` fails the same way and
  ``bitwise_and.Tensor`` legalizes.
* Lifted constant tensors of dtype ``bool`` or ``uint8`` (``torch.tensor([True, False])`` in a
  ``forward``) are inlined as ``ui8`` literals, which fail to verify ("inferred type(s)
  '!torch.vtensor<[8],si8>' are incompatible with return type(s) ... ui8"). Held as ``int16``
  and converted in the graph, they import and compile.

So, before import, on the FX graph:

1. boolean algebra with a uniform constant operand is simplified (``x & ones`` → ``x``,
   ``x | zeros`` → ``x``, ``x & zeros`` → ``zeros``, ``x ^ ones`` → ``~x``, ``where(ones, a, b)``
   → ``a``), which removes the constant;
2. what remains of bitwise ops on booleans becomes the matching ``logical_*`` op, and
   ``__and__.Tensor`` on integers (which does not legalize either, while ``__or__``/``__xor__``
   do) becomes ``bitwise_and.Tensor``;
3. small lifted ``bool``/``uint8`` constants are stored as ``int16`` and converted back by a
   ``prims.convert_element_type`` node.

:func:`rewrite_for_iree` applies all three to a :class:`~turbine_fx.PreparedProgram` (a private
copy of the user's graph); ``prepare_program`` calls it for every export path.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx as fx

__all__ = ["needs_rewrite", "rewrite_for_iree"]

logger = logging.getLogger("turbine.fx")

aten = torch.ops.aten
prims = torch.ops.prims

# Ops whose result is a tensor filled with one value (the value's position in args).
_FILL_ARG: dict[Any, int | None] = {
    aten.new_ones.default: None,
    aten.ones.default: None,
    aten.ones_like.default: None,
    aten.new_zeros.default: None,
    aten.zeros.default: None,
    aten.zeros_like.default: None,
    aten.new_full.default: 2,
    aten.full.default: 1,
    aten.full_like.default: 1,
    aten.scalar_tensor.default: 0,
    aten.fill.Scalar: 1,
}
_ONES = {aten.new_ones.default, aten.ones.default, aten.ones_like.default}

# Ops that keep a uniform tensor uniform (views, copies, dtype conversions): the value of their
# first argument passes through (converted to the result's dtype).
_PASS_THROUGH = {
    aten.expand.default,
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.unsqueeze.default,
    aten.squeeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.permute.default,
    aten.transpose.int,
    aten.t.default,
    aten.slice.Tensor,
    aten.select.int,
    aten.clone.default,
    aten.alias.default,
    aten.detach.default,
    aten.contiguous.default,
    aten.lift_fresh_copy.default,
    aten._to_copy.default,
    aten.to.dtype,
    aten.to.dtype_layout,
    aten.to.device,
    aten.to.other,
    prims.convert_element_type.default,
}

_AND = {aten.__and__.Tensor, aten.bitwise_and.Tensor, aten.logical_and.default}
_OR = {aten.__or__.Tensor, aten.bitwise_or.Tensor, aten.logical_or.default}
_XOR = {aten.__xor__.Tensor, aten.bitwise_xor.Tensor, aten.logical_xor.default}
_AND_SCALAR = {aten.__and__.Scalar, aten.bitwise_and.Scalar}
_OR_SCALAR = {aten.__or__.Scalar, aten.bitwise_or.Scalar}
_XOR_SCALAR = {aten.__xor__.Scalar, aten.bitwise_xor.Scalar}
_NOT = {aten.bitwise_not.default, aten.logical_not.default}
_WHERE = {aten.where.self}

# Bitwise ops IREE cannot lower on i1 -> the logical op computing the same on booleans.
_TO_LOGICAL = {
    aten.__and__.Tensor: aten.logical_and.default,
    aten.bitwise_and.Tensor: aten.logical_and.default,
    aten.__or__.Tensor: aten.logical_or.default,
    aten.bitwise_or.Tensor: aten.logical_or.default,
    aten.__xor__.Tensor: aten.logical_xor.default,
    aten.bitwise_xor.Tensor: aten.logical_xor.default,
    aten.bitwise_not.default: aten.logical_not.default,
}
_BOOL_OPS = (
    _AND | _OR | _XOR | _AND_SCALAR | _OR_SCALAR | _XOR_SCALAR | _NOT | _WHERE | set(_TO_LOGICAL)
)

#: Lifted constants of these dtypes are re-encoded (IREE 3.13 rejects their literals).
_REENCODED_CONSTANT_DTYPES = (torch.bool, torch.uint8)
#: Only constants small enough to be inlined as literals are re-encoded; larger ones become
#: globals (see ``_importer.inline_constant_limit``), which IREE takes in any dtype.
_REENCODE_LIMIT = 1024


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _is_bool_tensor(node: Any) -> bool:
    v = _val(node)
    return isinstance(v, torch.Tensor) and v.dtype == torch.bool


def _static_shape(v: Any) -> list[int] | None:
    if not isinstance(v, torch.Tensor):
        return None
    shape = list(v.shape)
    return shape if all(type(d) is int for d in shape) else None


def _same_type(a: Any, b: Any) -> bool:
    """Whether two FX values have the same dtype and (printed) shape."""
    va, vb = _val(a), _val(b)
    if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)):
        return False
    return va.dtype == vb.dtype and [str(d) for d in va.shape] == [str(d) for d in vb.shape]


class _Rewriter:
    """One pass over a graph: constant values are tracked in program order."""

    def __init__(self, gm: fx.GraphModule, constant_values: dict[str, torch.Tensor]):
        self.gm = gm
        self.graph = gm.graph
        self.constant_values = constant_values  # placeholder name -> lifted constant
        self.uniform: dict[fx.Node, Any] = {}  # node -> the one value it holds
        self.changed = 0
        #: Output node names replaced by other nodes (the graph signature names outputs).
        self.renames: dict[str, str] = {}

    # -- constant analysis -------------------------------------------------------------------

    def _uniform_value(self, node: fx.Node) -> Any:
        """The single value a node's tensor holds everywhere, or ``None``."""
        if node in self.uniform:
            return self.uniform[node]
        value: Any = None
        v = _val(node)
        if node.op == "placeholder" and node.name in self.constant_values:
            t = self.constant_values[node.name]
            if isinstance(t, torch.Tensor) and 0 < t.numel() <= _REENCODE_LIMIT:
                flat = t.detach().reshape(-1)
                if bool((flat == flat[0]).all()):
                    value = flat[0].item()
        elif node.op == "call_function" and node.target in _FILL_ARG:
            pos = _FILL_ARG[node.target]
            if pos is None:
                value = 1 if node.target in _ONES else 0
            elif pos < len(node.args) and isinstance(node.args[pos], (bool, int, float)):
                value = node.args[pos]
        elif node.op == "call_function" and node.target in _PASS_THROUGH and node.args:
            src = node.args[0]
            if isinstance(src, fx.Node):
                value = self.uniform.get(src)
        if value is not None and isinstance(v, torch.Tensor) and v.dtype == torch.bool:
            value = bool(value)
        if value is not None:
            self.uniform[node] = value
        return value

    def _bool_const(self, arg: Any) -> bool | None:
        """``True``/``False`` when ``arg`` is a boolean tensor holding one value everywhere."""
        if not isinstance(arg, fx.Node) or not _is_bool_tensor(arg):
            return None
        value = self.uniform.get(arg)
        return None if value is None else bool(value)

    # -- replacements ------------------------------------------------------------------------

    def _as_result(self, node: fx.Node, src: fx.Node) -> fx.Node | None:
        """``src`` broadcast to ``node``'s shape (it is a broadcast operand), or ``None``."""
        if _same_type(node, src):
            return src
        out, sv = _val(node), _val(src)
        shape = _static_shape(out)
        if shape is None or _static_shape(sv) is None or out.dtype != sv.dtype:
            return None
        with self.graph.inserting_before(node):
            new = self.graph.call_function(aten.expand.default, (src, shape))
        new.meta = dict(node.meta)
        new.meta["val"] = out
        return new

    def _filled(self, node: fx.Node, value: bool) -> fx.Node | None:
        """A ``full`` of ``node``'s static shape holding ``value``, or ``None``."""
        out = _val(node)
        shape = _static_shape(out)
        if shape is None:
            return None
        with self.graph.inserting_before(node):
            new = self.graph.call_function(
                aten.full.default,
                (shape, value),
                {"dtype": torch.bool, "device": out.device, "pin_memory": False},
            )
        new.meta = dict(node.meta)
        new.meta["val"] = out
        self.uniform[new] = value
        return new

    def _not(self, node: fx.Node, src: fx.Node) -> fx.Node | None:
        if not _same_type(node, src):
            return None
        with self.graph.inserting_before(node):
            new = self.graph.call_function(aten.logical_not.default, (src,))
        new.meta = dict(node.meta)
        return new

    def _simplify(self, node: fx.Node) -> fx.Node | None:
        """The node that replaces a boolean op with a constant operand, or ``None``."""
        t = node.target
        if not _is_bool_tensor(node):
            return None
        if t in _WHERE:
            cond, a, b = node.args[:3]
            c = self._bool_const(cond)
            if c is None:
                return None
            pick = a if c else b
            return self._as_result(node, pick) if isinstance(pick, fx.Node) else None
        if t in _NOT:
            c = self._bool_const(node.args[0])
            return None if c is None else self._filled(node, not c)
        if t in _AND_SCALAR | _OR_SCALAR | _XOR_SCALAR:
            x, s = node.args[:2]
            if not isinstance(s, bool) or not _is_bool_tensor(x):
                return None
            pair: tuple[Any, bool | None] = (x, s)
            candidates = [pair]
        elif t in _AND | _OR | _XOR:
            a, b = node.args[:2]
            if not (_is_bool_tensor(a) and _is_bool_tensor(b)):
                return None
            candidates = [(a, self._bool_const(b)), (b, self._bool_const(a))]
        else:
            return None
        for x, c in candidates:
            if c is None:
                continue
            if t in _AND | _AND_SCALAR:
                return self._as_result(node, x) if c else self._filled(node, False)
            if t in _OR | _OR_SCALAR:
                return self._filled(node, True) if c else self._as_result(node, x)
            # xor
            return self._not(node, x) if c else self._as_result(node, x)
        return None

    def run(self) -> int:
        for node in list(self.graph.nodes):
            if node.op not in ("placeholder", "call_function"):
                continue
            if node.op == "call_function" and node.target in _BOOL_OPS:
                new = self._simplify(node)
                if new is not None:
                    self.renames[node.name] = new.name
                    node.replace_all_uses_with(new)
                    self.graph.erase_node(node)
                    self.changed += 1
                    continue
                if node.target in _TO_LOGICAL and _is_bool_tensor(node):
                    args = node.args
                    if all(_is_bool_tensor(a) for a in args if isinstance(a, fx.Node)):
                        node.target = _TO_LOGICAL[node.target]
                        self.changed += 1
                elif node.target is aten.__and__.Tensor:  # integers
                    node.target = aten.bitwise_and.Tensor
                    self.changed += 1
            self._uniform_value(node)
        if self.changed:
            self.graph.eliminate_dead_code()
            self._drop_dead_asserts()
            self.graph.eliminate_dead_code()
        return self.changed

    def _drop_dead_asserts(self) -> None:
        """Removes metadata asserts whose tensor nothing else uses (a removed constant's)."""
        for node in list(self.graph.nodes):
            if node.op == "call_function" and node.target is aten._assert_tensor_metadata.default:
                src = node.args[0] if node.args else None
                if isinstance(src, fx.Node) and len(src.users) == 1:
                    self.graph.erase_node(node)


def _constant_placeholders(prepared: Any) -> dict[str, str]:
    """Placeholder name -> constants key, for the program's lifted tensor constants."""
    from torch.export.graph_signature import InputKind

    out = {}
    for spec in prepared.graph_signature.input_specs:
        if spec.kind == InputKind.CONSTANT_TENSOR and spec.target in prepared.constants:
            out[spec.arg.name] = spec.target
    return out


def _reencode_constants(prepared: Any, names: dict[str, str], renames: dict[str, str]) -> int:
    """Small bool/uint8 lifted constants -> int16 constant + ``convert_element_type``.

    A constant returned as an output is renamed in ``renames`` (to its conversion).
    """
    graph = prepared.graph
    count = 0
    for node in list(graph.nodes):
        if node.op != "placeholder" or node.name not in names:
            continue
        key = names[node.name]
        t = prepared.constants[key]
        if not isinstance(t, torch.Tensor) or t.dtype not in _REENCODED_CONSTANT_DTYPES:
            continue
        if t.numel() > _REENCODE_LIMIT or not node.users:
            continue
        v = _val(node)
        if not isinstance(v, torch.Tensor):
            continue
        if count == 0:
            prepared.constants = dict(prepared.constants)  # never the user's program's dict
        prepared.constants[key] = t.detach().to(torch.int16)
        fake_mode = getattr(v, "fake_mode", None)
        if fake_mode is not None:
            with fake_mode:
                new_val = torch.empty_strided(
                    v.shape, v.stride(), dtype=torch.int16, device=v.device
                )
        else:
            new_val = v.to(torch.int16)
        users = list(node.users)
        first = next(n for n in graph.nodes if n.op != "placeholder")
        with graph.inserting_before(first):
            conv = graph.call_function(prims.convert_element_type.default, (node, t.dtype))
        conv.meta = {"val": v}
        for key_meta in ("stack_trace", "nn_module_stack"):
            if key_meta in users[0].meta:
                conv.meta[key_meta] = users[0].meta[key_meta]
        node.meta["val"] = new_val
        for u in users:
            u.replace_input_with(node, conv)
            if u.op == "output":
                renames[node.name] = conv.name
        count += 1
    return count


def needs_rewrite(gm: fx.GraphModule, constants: dict[str, Any] | None = None) -> bool:
    """Whether :func:`rewrite_for_iree` would change this graph (a cheap scan)."""
    if any(
        isinstance(t, torch.Tensor)
        and t.dtype in _REENCODED_CONSTANT_DTYPES
        and t.numel() <= _REENCODE_LIMIT
        for t in (constants or {}).values()
    ):
        return True
    return any(
        n.op == "call_function"
        and ((n.target in _BOOL_OPS and _is_bool_tensor(n)) or n.target is aten.__and__.Tensor)
        for n in gm.graph.nodes
    )


def rewrite_for_iree(prepared: Any) -> tuple[int, dict[str, str]]:
    """Applies the rewrites of this module to a prepared program's (private) graph.

    Args:
        prepared: a :class:`~turbine_fx.PreparedProgram` whose graph is a copy.

    Returns:
        How many nodes were rewritten (0: the graph is unchanged), and the graph outputs it
        renamed (old name -> final name), for the caller to apply to the graph signature.
    """
    names = _constant_placeholders(prepared)
    values = {p: prepared.constants[k] for p, k in names.items()}
    rewriter = _Rewriter(prepared.graph_module, values)
    count = rewriter.run()
    renames = dict(rewriter.renames)
    count += _reencode_constants(prepared, names, renames)
    for old in list(renames):  # chains: a -> b -> c
        while renames[old] in renames:
            renames[old] = renames[renames[old]]
    if count:
        prepared.graph_module.recompile()
        logger.debug("rewrote %d boolean/constant nodes IREE cannot lower", count)
    return count, renames
