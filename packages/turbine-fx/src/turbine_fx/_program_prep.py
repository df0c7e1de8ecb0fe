"""Preparing an ExportedProgram for import: copy, functionalize when needed, decompose locally.

``torch.export.export`` returns programs in the "training IR": ops are not decomposed and may be
in-place (``copy_`` into a buffer). ``ExportedProgram.run_decompositions`` fixes both but re-traces
the whole graph, which for a 32-layer decoder costs several times the export itself. So:

* a program that mutates nothing and holds no op of the table is imported as it is;
* a program that mutates nothing but holds a few ops of the table gets those nodes decomposed in
  place: each one is traced alone (``make_fx`` on its fake inputs) and the resulting subgraph is
  spliced in, keeping the node's stack trace for error messages;
* only a program with in-place ops (which must be functionalized) goes through
  ``run_decompositions`` — that is what functionalization needs.

The user's program is never modified: the graph is copied first (the FX importer rewrites nodes).
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature

from ._bool_rewrites import needs_rewrite, rewrite_for_iree
from ._export_guards import drop_proven_guards, has_guards
from ._quantized import flatten_subclass_state, has_subclass_state

__all__ = [
    "PreparedProgram",
    "prepare_program",
    "prepared_to_exported_program",
    "program_needs_functionalization",
]

logger = logging.getLogger("turbine.fx")


@dataclasses.dataclass
class PreparedProgram:
    """What the FX importer reads from an ExportedProgram, over a private copy of the graph.

    It has the attributes ``FxImporter.import_program`` uses (``graph``, ``graph_module``,
    ``graph_signature``, ``state_dict``, ``constants``, ``range_constraints``), so it can be
    imported in place of the original program without mutating it.
    """

    graph_module: fx.GraphModule
    graph_signature: ExportGraphSignature
    state_dict: dict[str, Any]
    constants: dict[str, Any]
    range_constraints: dict[Any, Any]
    original: ExportedProgram
    #: How the program was prepared: "as-is", "local" (nodes decomposed in place) or "retraced".
    strategy: str = "as-is"
    decomposed_nodes: int = 0
    #: Nodes rewritten into ops IREE lowers (``_bool_rewrites``); 0 when none were.
    rewritten_nodes: int = 0

    @property
    def graph(self) -> fx.Graph:
        return self.graph_module.graph


def _call_function_nodes(gm: fx.GraphModule):
    for node in gm.graph.nodes:
        if node.op == "call_function":
            yield node
    for child in gm.children():
        if isinstance(child, fx.GraphModule):
            yield from _call_function_nodes(child)


def _importer_rewrites(gm: fx.GraphModule) -> bool:
    """Whether ``FxImporter`` would rewrite nodes of this graph in place while importing it.

    It canonicalizes a few ops (``NODE_CANONICALIZE``: ``lift_fresh_copy`` → ``clone``, ...) and
    rewrites ``as_strided`` and int/float symbolic arithmetic; a graph without them is only read.
    """
    from iree.compiler.extras.fx_importer import NODE_CANONICALIZE

    rewritten = set(NODE_CANONICALIZE) | {torch.ops.aten.as_strided.default}
    for n in _call_function_nodes(gm):
        if n.target in rewritten:
            return True
        if not isinstance(n.target, torch._ops.OpOverload) and n.target is not operator.getitem:
            # Python arithmetic on symbols mixing int and float gets its args rewritten.
            vals = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in n.args]
            if any(isinstance(v, (float, torch.SymFloat)) for v in vals):
                return True
    return False


def _is_mutating(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def program_needs_functionalization(program: ExportedProgram) -> bool:
    """Whether the program's graph holds in-place ops (``copy_``, ``index_put_``, ...)."""
    return any(_is_mutating(n.target) for n in _call_function_nodes(program.graph_module))


def _copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A new GraphModule over a copy of the graph (tensors and submodules are shared)."""
    new_graph = fx.Graph(owning_module=None, tracer_cls=gm.graph._tracer_cls)
    out = new_graph.graph_copy(gm.graph, {}, return_output_node=True)
    if isinstance(out, tuple):  # (value, output_node)
        value, output_node = out
        new_graph.output(value, type_expr=getattr(output_node, "type", None))
        new_graph._codegen = gm.graph._codegen
        # Keep output metadata, the importer does not need it but passes may.
        list(new_graph.nodes)[-1].meta = dict(output_node.meta)
    # FX renames nodes whose names shadow builtins ("input" -> "input_1") when copying; the
    # graph signature refers to the original names, so keep them.
    for old, new in zip(gm.graph.nodes, new_graph.nodes):
        if new.name != old.name:
            new.name = old.name
    new_gm = fx.GraphModule(gm, new_graph, class_name=type(gm).__name__)
    new_gm.meta.update(getattr(gm, "meta", {}))
    return new_gm


def _from_program(program: ExportedProgram, strategy: str) -> PreparedProgram:
    return PreparedProgram(
        graph_module=_copy_graph_module(program.graph_module),
        graph_signature=program.graph_signature,
        state_dict=program.state_dict,
        constants=program.constants,
        range_constraints=program.range_constraints,
        original=program,
        strategy=strategy,
    )


def prepare_program(
    program: ExportedProgram, decomposition_table: dict[Any, Callable] | None
) -> PreparedProgram:
    """Copies ``program`` and applies ``decomposition_table`` as cheaply as correctness allows.

    Then removes the shape assertions (``aten._assert_scalar``) that hold at every point of the
    program's ranges (``_export_guards``), and rewrites what IREE's torch frontend cannot lower
    (boolean ops, bool/uint8 constants: ``_bool_rewrites``), on a copy of the graph.

    Args:
        program: The program to import (not modified).
        decomposition_table: OpOverload → decomposition; ``None`` or empty decomposes nothing.

    Returns:
        A :class:`PreparedProgram` ready for ``FxImporter.import_program``.
    """
    prepared = _prepare(program, decomposition_table)
    if has_guards(prepared.graph):
        if prepared.graph_module is program.graph_module:  # never edit the user's graph
            prepared = _from_program(program, "as-is")
        dropped = drop_proven_guards(prepared.graph, prepared.range_constraints)
        if dropped:
            prepared.graph_module.recompile()
            logger.debug("removed %d shape assertion(s) true over the ranges", len(dropped))
    if not needs_rewrite(prepared.graph_module, prepared.constants):
        return prepared
    if prepared.graph_module is program.graph_module:  # never rewrite the user's graph
        prepared = _from_program(program, "as-is")
    prepared.rewritten_nodes, renames = rewrite_for_iree(prepared)
    if renames:
        prepared.graph_signature = _rename_outputs(prepared.graph_signature, renames)
    return prepared


def _prepare(
    program: ExportedProgram, decomposition_table: dict[Any, Callable] | None
) -> PreparedProgram:
    table = decomposition_table or {}
    if has_subclass_state(program):  # torchao quantized weights: their inner tensors
        program = flatten_subclass_state(program, _copy_graph_module(program.graph_module))
    if program_needs_functionalization(program):
        logger.debug("program mutates state in place: functionalizing with run_decompositions")
        return _from_program(program.run_decompositions(dict(table)), "retraced")

    targets = [n for n in program.graph.nodes if n.op == "call_function" and n.target in table]
    nested = any(
        n.target in table
        for child in program.graph_module.children()
        if isinstance(child, fx.GraphModule)
        for n in child.graph.nodes
    )
    if not targets and not nested:
        if not _importer_rewrites(program.graph_module):
            # Nothing to change, and the FX importer will not rewrite any node: import the
            # program's own graph (copying a large graph costs as much as importing it).
            return PreparedProgram(
                graph_module=program.graph_module,
                graph_signature=program.graph_signature,
                state_dict=program.state_dict,
                constants=program.constants,
                range_constraints=program.range_constraints,
                original=program,
            )
        return _from_program(program, "as-is")
    prepared = _from_program(program, "as-is")
    targets = [n for n in prepared.graph.nodes if n.op == "call_function" and n.target in table]
    if nested:
        return _from_program(program.run_decompositions(dict(table)), "retraced")
    try:
        renames = _decompose_nodes_locally(prepared, targets, table)
    except Exception as e:  # any tracing trouble: fall back to the general path
        logger.debug("local decomposition failed (%s); re-tracing the whole program", e)
        return _from_program(program.run_decompositions(dict(table)), "retraced")
    if renames:
        prepared.graph_signature = _rename_outputs(prepared.graph_signature, renames)
    prepared.graph_module.recompile()
    prepared.strategy = "local"
    prepared.decomposed_nodes = len(targets)
    return prepared


class _LocalDecompositionUnsupported(Exception):
    pass


def _decompose_nodes_locally(
    prepared: PreparedProgram, targets: list[fx.Node], table: dict[Any, Callable]
) -> dict[str, str]:
    """Replaces each target node by the traced subgraph of its decomposition.

    Returns a map from old to new node names for nodes that the graph's outputs referred to.
    """
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils import _pytree as pytree

    graph = prepared.graph
    output_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    output_names = {a.name for a in pytree.tree_leaves(output_node.args) if isinstance(a, fx.Node)}
    renames: dict[str, str] = {}
    traced: dict[Any, fx.GraphModule] = {}

    for node in targets:
        flat_args, spec = pytree.tree_flatten((node.args, node.kwargs))
        input_positions = [i for i, a in enumerate(flat_args) if isinstance(a, fx.Node)]
        input_nodes = [flat_args[i] for i in input_positions]
        fake_inputs = [n.meta.get("val") for n in input_nodes]
        if not all(isinstance(v, torch.Tensor) for v in fake_inputs):
            raise _LocalDecompositionUnsupported(f"{node.name}: non-tensor node inputs")
        fake_mode = detect_fake_mode(fake_inputs)
        if fake_mode is None:
            raise _LocalDecompositionUnsupported(f"{node.name}: no fake mode")
        target = node.target

        def run(*tensors, _flat=flat_args, _pos=input_positions, _spec=spec, _target=target):
            flat = list(_flat)
            for p, t in zip(_pos, tensors):
                flat[p] = t
            args, kwargs = pytree.tree_unflatten(flat, _spec)
            # Call the decomposition itself: a CompositeImplicitAutograd op (SDPA, linear) would
            # otherwise decompose through its own kernel before make_fx consults the table.
            result = table[_target](*args, **kwargs)
            if result is NotImplemented:
                raise _LocalDecompositionUnsupported(f"{_target}: decomposition declined")
            return result

        # Layers of a model repeat the same op on the same shapes: trace each signature once.
        key = _signature_key(target, spec, flat_args)
        sub = traced.get(key)
        if sub is None:
            with fake_mode:
                sub = make_fx(run, decomposition_table=table)(*fake_inputs)
            traced[key] = sub

        env: dict[fx.Node, Any] = {}
        lookup = env.__getitem__
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        env.update(zip(placeholders, input_nodes))
        result: Any = None
        with graph.inserting_before(node):
            for sn in sub.graph.nodes:
                if sn.op == "placeholder":
                    continue
                if sn.op == "output":
                    result = fx.node.map_arg(sn.args[0], lookup)
                    continue
                if sn.op != "call_function":
                    raise _LocalDecompositionUnsupported(f"{node.name}: {sn.op} in decomposition")
                new = graph.node_copy(sn, lookup)
                new.meta = dict(sn.meta)
                for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
                    if key in node.meta:
                        new.meta[key] = node.meta[key]
                env[sn] = new

        single = not isinstance(node.meta.get("val"), (list, tuple))
        if isinstance(result, (list, tuple)) and len(result) == 1 and single:
            result = result[0]
        if isinstance(result, (list, tuple)):
            for user in list(node.users):
                if user.target is not operator.getitem:
                    raise _LocalDecompositionUnsupported(f"{node.name}: tuple result used whole")
                replacement = result[int(user.args[1])]  # type: ignore[arg-type]
                if user.name in output_names:
                    renames[user.name] = replacement.name
                user.replace_all_uses_with(replacement)
                graph.erase_node(user)
        else:
            if node.name in output_names and isinstance(result, fx.Node):
                renames[node.name] = result.name
            node.replace_all_uses_with(result)
        graph.erase_node(node)
    return renames


def _signature_key(target: Any, spec: Any, flat_args: list[Any]) -> Any:
    """What a decomposition's trace depends on: the op, constants, and inputs' metadata."""
    parts: list[Any] = [target, str(spec)]
    for a in flat_args:
        if isinstance(a, fx.Node):
            v = a.meta.get("val")
            parts.append(
                ("T", str(tuple(v.shape)), v.dtype, str(tuple(v.stride())), str(v.device))
                if isinstance(v, torch.Tensor)
                else ("N", repr(v))
            )
        else:
            parts.append(("C", repr(a)))
    return tuple(parts)


def _rename_outputs(sig: ExportGraphSignature, renames: dict[str, str]) -> ExportGraphSignature:
    def fix(spec):
        arg = spec.arg
        name = getattr(arg, "name", None)
        if name in renames:
            spec = dataclasses.replace(spec, arg=dataclasses.replace(arg, name=renames[name]))
        return spec

    return ExportGraphSignature(
        input_specs=list(sig.input_specs), output_specs=[fix(s) for s in sig.output_specs]
    )


def prepared_to_exported_program(prepared: PreparedProgram) -> ExportedProgram:
    """An ExportedProgram over the prepared graph (the original when nothing changed)."""
    if prepared.strategy == "as-is" and not prepared.rewritten_nodes:
        return prepared.original
    source = prepared.original
    return ExportedProgram(
        root=prepared.graph_module,
        graph=prepared.graph,
        graph_signature=prepared.graph_signature,
        state_dict=prepared.state_dict,
        range_constraints=prepared.range_constraints,
        module_call_graph=source.module_call_graph,
        example_inputs=source.example_inputs,
        constants=prepared.constants,
        verifiers=source.verifiers,
    )
