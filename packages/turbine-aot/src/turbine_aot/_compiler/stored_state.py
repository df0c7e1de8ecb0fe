"""Compile-time fix: a call returns only after the module state it stored is written.

IREE's synchronous calling convention waits for a function's *results* before the call returns,
not for the work that writes the module's mutable globals. ``util.global.store %arg, @g`` of an
argument compiles to a queue copy from the argument's buffer into the global's storage whose
completion only the global's own timepoint records; a dispatch whose output only reaches a
global (a KV cache written at a position argument) is awaited the same way. The call returns
while that work may still read the argument. A caller that writes the argument's memory again
right away -- :class:`turbine_aot.runtime.PreparedCall` writes its input buffers in place,
``load_module(..., zero_copy_inputs=True)`` hands IREE the caller's own memory -- then changes
what the module stores: measured on IREE 3.13's ``local-task``, a function storing its
argument kept the *next* call's values in 123 of 200 tries (docs/running.md, "Module state and
argument buffers").

:func:`wait_for_stored_state` ends every public function that stores a mutable tensor global
(itself or through the functions it calls) with a call of a private function that waits on those
globals::

    util.func private @__turbine_wait_state_0() attributes {inlining_policy = #util.inline.never} {
      %c0 = arith.constant 0 : index
      %device = hal.devices.get %c0 : !hal.device
      %fence = hal.fence.create device(%device : !hal.device) flags("None") : !hal.fence
      %g = util.global.load @g : tensor<4xf32>
      %ready = hal.tensor.barrier join(%g : tensor<4xf32>) => %fence : !hal.fence
      %forever = arith.constant -1 : i32
      %status = hal.fence.await until([%fence]) timeout_millis(%forever) flags("None") : i32
      util.return
    }

It compiles to one queue barrier on the globals' timepoints and one host wait. It must stay out of
line: inside the storing function IREE forwards the stored value to a later load, and a wait
there covers the argument, not the copy made of it. Applied to the copy handed to IREE for CPU
targets (``rewrites.module_for_compile``), where the runtime hands IREE host memory; the exported
IR stays the reference's.
"""

from __future__ import annotations

from typing import Any

from .torch_ir import TopLevel, public_functions, top_level_ops, walk

__all__ = ["WAIT_STATE_PREFIX", "functions_storing_state", "wait_for_stored_state"]

#: ``WAIT_STATE_PREFIX + name``: the exported function waiting on what function ``name`` stores
#: (the runtime's loaded modules do not list functions whose names start with ``__``)
WAIT_STATE_PREFIX = "__turbine_wait_state."

_FUNCTIONS = ("func.func", "util.func")
_CALLS = ("func.call", "util.call")
_RETURNS = ("func.return", "util.return")


def functions_storing_state(module_op: Any) -> dict[str, list[str]]:
    """The public functions of ``module_op`` that store mutable tensor globals of static shape,
    themselves or through the functions they call: function name -> the globals' names, in
    module order."""
    op = getattr(module_op, "operation", module_op)
    tensor_globals = _mutable_tensor_globals(op)
    if not tensor_globals:
        return {}
    stores: dict[str, set[str]] = {}
    calls: dict[str, set[str]] = {}
    for f in top_level_ops(op):
        if f.name not in _FUNCTIONS:
            continue
        name = _symbol(f, "sym_name")
        stores[name], calls[name] = set(), set()
        for inner in walk(f):
            if inner.name == "util.global.store":
                target = _symbol(inner, "global")
                if target in tensor_globals:
                    stores[name].add(target)
            elif inner.name in _CALLS:
                calls[name].add(_symbol(inner, "callee"))
    order = {name: i for i, name in enumerate(tensor_globals)}
    out = {}
    for f in public_functions(op):
        name = _symbol(f, "sym_name")
        seen, todo, stored = {name}, [name], set()
        while todo:
            current = todo.pop()
            stored |= stores.get(current, set())
            for callee in calls.get(current, ()):
                if callee not in seen:
                    seen.add(callee)
                    todo.append(callee)
        if stored:
            out[name] = sorted(stored, key=order.__getitem__)
    return out


def wait_for_stored_state(module_op: Any) -> int:
    """Adds, for each function of :func:`functions_storing_state`, the exported function
    ``__turbine_wait_state.<function>`` that waits on the globals it stores (see the module
    doc), in place.

    Returns:
        How many such functions were added.
    """
    op = getattr(module_op, "operation", module_op)
    storing = functions_storing_state(op)
    if not storing:
        return 0
    types = _mutable_tensor_globals(op)
    top = TopLevel(op)
    for function, stored in storing.items():
        name = WAIT_STATE_PREFIX + function
        if name in top:
            continue  # already added (a module compiled from this rewrite's output)
        top.append(
            _wait_function(top.unique(name), [(g, types[g]) for g in stored]),
            declarations=[f'util.global private mutable @"{g}" : {types[g]}' for g in stored],
        )
    return len(storing)


def _wait_function(name: str, stored: list[tuple[str, str]]) -> str:
    loads = "\n".join(f'  %g{i} = util.global.load @"{g}" : {t}' for i, (g, t) in enumerate(stored))
    joined = ", ".join(f"%g{i}" for i in range(len(stored)))
    types = ", ".join(t for _, t in stored)
    return f"""
util.func public @"{name}"() {{
  %c0 = arith.constant 0 : index
  %device = hal.devices.get %c0 : !hal.device
  %fence = hal.fence.create device(%device : !hal.device) flags("None") : !hal.fence
{loads}
  %ready:{len(stored)} = hal.tensor.barrier join({joined} : {types}) => %fence : !hal.fence
  %forever = arith.constant -1 : i32
  %status = hal.fence.await until([%fence]) timeout_millis(%forever) flags("None") : i32
  util.return
}}"""


def _mutable_tensor_globals(op: Any) -> dict[str, str]:
    """name -> type (as MLIR text) of the mutable global tensors of static shape."""
    from turbine_ir.ir import RankedTensorType, TypeAttr

    out = {}
    for g in top_level_ops(op):
        if g.name != "util.global" or "is_mutable" not in g.attributes:
            continue
        try:
            t = RankedTensorType(TypeAttr(g.attributes["type"]).value)
        except ValueError:
            continue  # scalars live on the host: nothing to wait for
        if t.has_static_shape:
            out[_symbol(g, "sym_name")] = str(t)
    return out


def _symbol(op: Any, attr: str) -> str:
    return str(op.attributes[attr]).strip('"').lstrip("@").strip('"')
