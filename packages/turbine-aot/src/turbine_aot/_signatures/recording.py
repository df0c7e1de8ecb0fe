"""The export side of call signatures: computing each public function's records from the
``ExportedProgram`` (or a procedure's schemas) it was imported from, and writing them, the
parameters the module reads and (while compiling) the compile flags into ``iree.reflection``."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from turbine_aot._compiler.torch_ir import public_functions

from .abi import parse_value, signatures_from_mlir
from .call import CallSignature
from .element_types import element_bits
from .keys import (
    ARGS_SCHEMA,
    COMPILE_KEY,
    PARAMETERS_KEY,
    REFLECTION_ATTR,
    RETURN_SCHEMA,
)
from .leaf import Dim, Leaf
from .trees import arg_label, leaf_paths, load_spec, result_label, spec_children

__all__ = [
    "compile_record",
    "eager_defaults",
    "module_parameters",
    "record_module_signatures",
    "reflection_of",
]

logger = logging.getLogger("turbine.aot.runtime")


def _dim_text(d: Any) -> Dim:
    if isinstance(d, int):
        return d
    expr = d.node.expr if hasattr(d, "node") else d
    if getattr(expr, "is_number", False):
        return int(expr)  # a SymInt specialized to a constant
    return str(expr)


def _jsonable(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


def signature_of_program(
    program: Any,
    flat_inputs: Sequence[Any],
    flat_outputs: Sequence[Any],
    constant_results: Mapping[int, Any],
    defaults: Mapping[str, Any] | None = None,
) -> CallSignature | None:
    """The call signature of an ``ExportedProgram`` imported as a function whose flat
    arguments/results are ``flat_inputs``/``flat_outputs`` (``TensorSpec``s); None when they do
    not line up with the program's user inputs/outputs (nothing is recorded then)."""
    from torch.export.graph_signature import (
        ConstantArgument,
        InputKind,
        OutputKind,
        SymIntArgument,
        TensorArgument,
    )
    from torch.utils._pytree import treespec_dumps

    call_sig = program.module_call_graph[0].signature if program.module_call_graph else None
    in_spec = call_sig.in_spec if call_sig is not None else program.call_spec.in_spec
    out_spec = call_sig.out_spec if call_sig is not None else program.call_spec.out_spec
    if in_spec is None:
        return None
    names = list(getattr(call_sig, "forward_arg_names", None) or [])
    pos_spec = spec_children(in_spec)[0]
    pos_names = names[: pos_spec.num_children]
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    user_inputs = [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    paths = leaf_paths(in_spec)
    if len(paths) != len(user_inputs):
        return None
    args: list[Leaf] = []
    index = 0
    symbols: set[str] = set()
    for path, spec in zip(paths, user_inputs):
        label = arg_label(path, pos_names)
        arg = spec.arg
        if isinstance(arg, ConstantArgument):
            args.append(Leaf(label, "constant", value=_jsonable(arg.value)))
            continue
        if index >= len(flat_inputs):
            return None
        flat = flat_inputs[index]
        if isinstance(arg, TensorArgument):
            val = nodes[arg.name].meta.get("val") if arg.name in nodes else None
            if val is None or not hasattr(val, "shape"):
                shape: tuple[Dim, ...] = tuple(flat.shape)
            else:
                shape = tuple(_dim_text(d) for d in val.shape)
            if len(shape) != len(flat.shape):
                return None
            for d in shape:
                if isinstance(d, str):
                    symbols.add(d)
            args.append(Leaf(label, "tensor", index, flat.dtype, shape, device=flat.device))
        elif isinstance(arg, SymIntArgument):
            args.append(Leaf(label, "scalar", index, flat.dtype, device=flat.device))
        else:
            return None  # tokens, custom objects: not callable from Python here
        index += 1
    if index != len(flat_inputs):
        return None
    dims: dict[str, tuple[int, int | None]] = {}
    for sym, vr in program.range_constraints.items():
        name = str(sym)
        if name not in symbols:
            continue
        lo = int(vr.lower) if vr.lower.is_finite else 0
        hi = int(vr.upper) if vr.upper.is_finite else None
        dims[name] = (max(lo, 0), hi)

    results: list[Leaf] = []
    return_schema: str | None = None
    if out_spec is not None:
        out_paths = leaf_paths(out_spec)
        user_outputs = [
            s for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT
        ]
        ok = len(out_paths) == len(user_outputs)
        r_index = 0
        for i, (path, spec) in enumerate(zip(out_paths, user_outputs) if ok else ()):
            label = result_label(path)
            if i in constant_results or isinstance(spec.arg, ConstantArgument):
                value = constant_results.get(i, getattr(spec.arg, "value", None))
                results.append(Leaf(label, "constant", value=_jsonable(value)))
                continue
            if r_index >= len(flat_outputs):
                ok = False
                break
            flat = flat_outputs[r_index]
            kind = "tensor" if flat.is_tensor else "scalar"
            results.append(Leaf(label, kind, r_index, flat.dtype, tuple(flat.shape)))
            r_index += 1
        if ok and r_index == len(flat_outputs):
            try:
                return_schema = treespec_dumps(out_spec)
            except Exception as e:  # a custom node without a serialized name
                logger.info("result tree of the program is not serializable (%s)", e)
        else:
            results = []
    try:
        args_schema = treespec_dumps(in_spec)
    except Exception as e:
        logger.info("argument tree of the program is not serializable (%s)", e)
        return None
    return CallSignature(
        args_schema=args_schema,
        return_schema=return_schema,
        arg_names=tuple(names),
        args=tuple(args),
        results=tuple(results),
        dims=dims,
        defaults=dict(defaults or {}),
    )


def signature_of_procedure(
    args_schema: str,
    return_schema: str | None,
    flat_inputs: Sequence[Any],
    flat_outputs: Sequence[Any],
    arg_names: Sequence[str] = (),
) -> CallSignature | None:
    """The call signature of a procedural ``CompiledModule`` function from its
    ``torch.args_schema`` / ``torch.return_schema`` attributes (every leaf is one argument)."""
    spec = load_spec(args_schema)
    paths = leaf_paths(spec)
    if len(paths) != len(flat_inputs):
        return None
    pos_names = list(arg_names)[: spec_children(spec)[0].num_children]
    args = []
    for i, (path, flat) in enumerate(zip(paths, flat_inputs)):
        kind = "tensor" if flat.is_tensor else "scalar"
        args.append(
            Leaf(
                arg_label(path, pos_names),
                kind,
                i,
                flat.dtype,
                tuple(flat.shape),
                device=flat.device,
            )
        )
    results: list[Leaf] = []
    if return_schema is not None:
        out_paths = leaf_paths(load_spec(return_schema))
        if len(out_paths) == len(flat_outputs):
            results = [
                Leaf(
                    result_label(p),
                    "tensor" if f.is_tensor else "scalar",
                    i,
                    f.dtype,
                    tuple(f.shape),
                )
                for i, (p, f) in enumerate(zip(out_paths, flat_outputs))
            ]
        else:
            return_schema = None
    kw_names = [str(k) for k in (spec_children(spec)[1].context or [])]
    names = list(arg_names)[: len(pos_names)]
    if len(names) < len(pos_names):
        names = [f"arg{i}" for i in range(len(pos_names))]
    return CallSignature(
        args_schema=args_schema,
        return_schema=return_schema,
        arg_names=tuple(names + kw_names),
        args=tuple(args),
        results=tuple(results),
    )


def record_module_signatures(
    module_op: Any,
    programs: Mapping[str, Any] | None = None,
    *,
    arg_names: Mapping[str, Sequence[str]] | None = None,
    defaults: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, CallSignature]:
    """Records the call signatures of a module's public functions in their ``iree.reflection``.

    Args:
        module_op: the MLIR module (``Operation``).
        programs: function name -> the ``ExportedProgram`` it was imported from.
        arg_names: function name -> argument names, for procedural functions.
        defaults: function name -> parameters not passed at export -> their default.

    Returns:
        The recorded signatures by function name (functions without records are left as they
        are: programs whose trees torch cannot serialize, functions without schemas).
    """
    from turbine_fx import constant_results
    from turbine_ir import ir

    flat = signatures_from_mlir(module_op)
    recorded: dict[str, CallSignature] = {}
    for f in public_functions(module_op, kinds=("func.func",)):
        attrs = f.attributes
        name = str(attrs["sym_name"]).strip('"')
        fsig = flat.get(name)
        if fsig is None:
            continue
        sig: CallSignature | None = None
        program = (programs or {}).get(name)
        if program is not None:
            sig = signature_of_program(
                program,
                fsig.inputs,
                fsig.outputs,
                constant_results(f),
                (defaults or {}).get(name),
            )
        elif ARGS_SCHEMA in attrs:
            ret = ir.StringAttr(attrs[RETURN_SCHEMA]).value if RETURN_SCHEMA in attrs else None
            sig = signature_of_procedure(
                ir.StringAttr(attrs[ARGS_SCHEMA]).value,
                ret,
                fsig.inputs,
                fsig.outputs,
                (arg_names or {}).get(name, ()),
            )
        if sig is None:
            continue
        _set_reflection(f, sig.to_reflection())
        recorded[name] = sig
    _record_parameters(module_op)
    return recorded


_PARAMETER_RE = re.compile(r'#flow\.parameter\.named<"((?:[^"\\]|\\.)*)"::"((?:[^"\\]|\\.)*)">')


def module_parameters(module_op: Any) -> list[dict[str, Any]]:
    """The external parameters a module reads (``#flow.parameter.named`` globals): per global
    its scope, key, type and size in bytes (None when the type has no fixed size)."""
    op = getattr(module_op, "mlir_module", module_op)
    op = getattr(op, "operation", op)
    out: list[dict[str, Any]] = []
    for child in op.regions[0].blocks[0].operations:
        child = getattr(child, "operation", child)
        if child.name != "util.global" or "initial_value" not in child.attributes:
            continue
        m = _PARAMETER_RE.search(str(child.attributes["initial_value"]))
        if not m:
            continue
        spec = parse_value(str(child.attributes["type"]))
        bits = element_bits(spec.dtype) if spec.is_tensor else None
        size: int | None = None
        if bits is not None and None not in spec.shape:
            n = 1
            for d in spec.shape:
                n *= d or 0
            size = n * bits // 8
        out.append({"scope": m.group(1), "key": m.group(2), "type": str(spec), "bytes": size})
    return out


def _record_parameters(module_op: Any) -> None:
    """Records :func:`module_parameters` on the module's first public function (a ``.vmfb``
    has no module-level reflection), so that ``turbine-aot inspect`` can list them."""

    params = module_parameters(module_op)
    functions = public_functions(module_op, kinds=("func.func",))
    if not params or not functions:
        return
    _set_reflection(functions[0], {PARAMETERS_KEY: json.dumps(params)})


def _set_reflection(func_op: Any, values: Mapping[str, str]) -> None:
    from turbine_ir import ir

    attrs = func_op.attributes
    with func_op.context:
        entries: dict[str, Any] = {}
        if REFLECTION_ATTR in attrs:
            old = ir.DictAttr(attrs[REFLECTION_ATTR])
            entries = {old[i].name: old[i].attr for i in range(len(old))}
        for k, v in values.items():
            entries[k] = ir.StringAttr.get(v)
        attrs[REFLECTION_ATTR] = ir.DictAttr.get(entries)


@contextlib.contextmanager
def compile_record(module_op: Any, flags: Sequence[str]) -> Iterator[None]:
    """While active, the module's first public function records the compile ``flags`` and the
    compiler version in its ``iree.reflection`` (serialize the module for compiling inside);
    afterwards the function's reflection is restored, so the exported IR (and the compile
    cache keys computed from it) stay as they were."""
    from iree.compiler import version as compiler_version

    functions = public_functions(module_op, kinds=("func.func",))
    if not functions:
        yield
        return
    f = functions[0]
    before = f.attributes[REFLECTION_ATTR] if REFLECTION_ATTR in f.attributes else None  # noqa: SIM401
    record = {"flags": list(flags), "compiler": getattr(compiler_version, "VERSION", None)}
    _set_reflection(f, {COMPILE_KEY: json.dumps(record)})
    try:
        yield
    finally:
        with f.context:
            if before is None:
                del f.attributes[REFLECTION_ATTR]
            else:
                f.attributes[REFLECTION_ATTR] = before


def reflection_of(func_op: Any) -> dict[str, str]:
    """A ``func.func``'s ``iree.reflection`` entries as strings (what the ``.vmfb`` will carry)."""
    from turbine_ir import ir

    attrs = func_op.attributes
    if REFLECTION_ATTR not in attrs:
        return {}
    d = ir.DictAttr(attrs[REFLECTION_ATTR])
    out = {}
    for i in range(len(d)):
        a = d[i].attr
        out[d[i].name] = a.value if isinstance(a, ir.StringAttr) else str(a)
    return out


def eager_defaults(module: Any, program: Any) -> dict[str, Any]:
    """``module.forward``'s parameters with JSON-able defaults that the export of ``program``
    did not pass (a call may pass them at that default)."""
    import inspect

    graph = getattr(program, "module_call_graph", None)
    passed = list(getattr(graph[0].signature, "forward_arg_names", None) or []) if graph else []
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return {}
    out = {}
    for p in params:
        if p.name in passed or p.default is inspect.Parameter.empty:
            continue
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if p.default is None or isinstance(p.default, (bool, int, float, str)):
            out[p.name] = p.default
    return out
