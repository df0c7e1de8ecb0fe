"""Import of a torch.export ExportedProgram into a turbine ModuleBuilder.

Built on ``iree.compiler.extras.fx_importer.FxImporter`` (the FX → torch dialect importer that
iree-base-compiler ships), customized only through its extension points:

* :class:`_GlobalsHooks` (an ``FxImporterHooks``) turns lifted parameters, buffers and constants
  into ``util.global``s created by the ModuleBuilder (one per tensor, across programs), loads them
  with ``util.global.load`` and stores mutated buffers back with ``util.global.store``;
* :class:`_NodeImporter` (a ``GraphNodeImporter``) loads mutated buffers at function entry (so a
  read of the old value never follows the store of the new one) and turns import failures into
  :class:`UnsupportedOpError` naming the FX node and the user's source line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from iree.compiler.extras import fx_importer as _fxi
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from turbine_ir import GlobalAttributes, ModuleBuilder, attributes_from_argument_device_affinities
from turbine_ir import ir as _ir
from turbine_ir.ir import (
    Attribute,
    DictAttr,
    FlatSymbolRefAttr,
    Operation,
    StringAttr,
    UnitAttr,
    Value,
)
from turbine_params import ExternalTensorTrait

from ._decompositions import current_aot_decompositions, resolve_decomposition_ops
from ._errors import FxImportError, UnsupportedOpError
from ._program_prep import PreparedProgram, prepare_program
from ._program_results import CONSTANT_RESULTS_ATTR, record_constant_results
from ._quantized import quantized_op_decompositions, storage_dtype, widen_loaded

__all__ = ["CONSTANT_RESULTS_ATTR", "import_exported_program", "inline_constant_limit"]

logger = logging.getLogger("turbine.fx")

#: Lifted constants with at most this many elements are inlined as literals; larger ones become
#: globals (docs/design.md, "Globals and their names").
inline_constant_limit = 1024

_fx_importer = _fxi


def import_exported_program(
    module_builder: ModuleBuilder,
    program: ExportedProgram,
    *,
    symbol_name: str = "main",
    symbol_visibility: str | None = None,
    arg_device: Mapping[int, Any] | None = None,
    import_symbolic_shape_expressions: bool = False,
    decomposition_table: dict[Any, Callable] | None = None,
    constants_as_globals: bool = False,
    inline_constants: bool = False,
) -> Operation:
    """Imports ``program`` as a function of ``module_builder``'s module.

    Lifted parameters, buffers and constants become ``util.global``s named
    ``__auto.<state_dict name>``: external (``#flow.parameter.named``) when the tensor carries an
    ``ExternalTensorTrait``, inline otherwise, placed per ``DeviceTensorTrait``, and mutable
    (written back with ``util.global.store``) when the program mutates them. The same tensor,
    imported by several programs or used twice, is one global.

    Args:
        module_builder: The module to import into.
        program: The exported program. It is not modified.
        symbol_name: Name of the created ``func.func`` (made unique if taken).
        symbol_visibility: ``None`` (public) or ``"private"``.
        arg_device: Flat user-argument index → ``DeviceAffinity``; sets ``iree.abi.affinity``.
        import_symbolic_shape_expressions: Emit ``torch.symbolic_int`` and
            ``torch.bind_symbolic_shape`` ops for dynamic dimensions.
        decomposition_table: Decompositions to apply first; ``None`` uses
            :func:`current_aot_decompositions`.
        constants_as_globals: Make every lifted tensor constant a global (deduplicated across
            programs by identity); by default constants of at most ``inline_constant_limit``
            elements are inlined as literals.
        inline_constants: Inline every lifted tensor constant that is not already a global (and
            carries no ``ExternalTensorTrait``) as a ``torch.vtensor.literal``, whatever its
            size: a ``torch_tensor_<dims>_<dtype>`` blob, one per tensor across the module
            (what ``jittable`` does with the tensors a function captures, as the reference).

    Returns:
        The ``func.func`` operation.

    Raises:
        UnsupportedOpError: An op or dtype of the program cannot be imported / has no lowering.
        FxImportError: Any other import failure (e.g. non-externalized meta-device weights).
    """
    if not isinstance(program, ExportedProgram):
        raise FxImportError(
            f"import_exported_program expects a torch.export.ExportedProgram, got "
            f"{type(program).__name__}; export the module first with torch.export.export"
        )
    table = dict(
        current_aot_decompositions() if decomposition_table is None else decomposition_table
    )
    table.update(quantized_op_decompositions(program))  # torchao's ops, into ATen
    context = module_builder.context
    with context:
        prepared = _prepare_with_auto_decompositions(program, table, context)
        constant_results = _drop_constant_outputs(prepared)
        unknown = _unregistered_op_nodes(prepared, context)
        _check_dtypes(module_builder, prepared)
        hooks = _GlobalsHooks(
            module_builder,
            prepared,
            constants_as_globals=constants_as_globals,
            inline_constants=inline_constants,
        )
        importer = _fxi.FxImporter(
            module=_ModuleView(module_builder),
            config_check=False,
            py_attr_tracker=module_builder.fx_py_attr_tracker,
            hooks=hooks,
            graph_node_importer_cls=_NodeImporter,
        )
        # Insert functions through the builder's symbol table so names stay unique module-wide.
        importer.symbol_table = module_builder.symbol_table
        func_name = module_builder.unique_auto_symbol(symbol_name)
        try:
            func_op = importer.import_program(
                prepared,  # type: ignore[arg-type]  # a duck-typed ExportedProgram
                func_name=func_name,
                func_visibility=symbol_visibility,
                import_symbolic_shape_expressions=import_symbolic_shape_expressions,
            )
        except FxImportError:
            _erase_partial_function(module_builder, func_name)
            raise
        except Exception as e:
            error = _import_failure(module_builder, prepared, e)
            _erase_partial_function(module_builder, func_name)
            raise error from e
        if unknown:
            raise _unsupported_op_error(module_builder, prepared, unknown, func_op)
        if arg_device:
            _set_arg_affinities(func_op, arg_device, context)
        record_constant_results(func_op, constant_results)
    return func_op


def _drop_constant_outputs(prepared: PreparedProgram) -> dict[int, Any]:
    """Removes constant user outputs (``None``, numbers) from the signature; returns them.

    IREE functions cannot return ``!torch.none``, and constants need no computing.
    """
    from torch.export.graph_signature import ConstantArgument, ExportGraphSignature, OutputKind

    sig = prepared.graph_signature
    constants: dict[int, Any] = {}
    kept = []
    user_index = 0
    for spec in sig.output_specs:
        if spec.kind == OutputKind.USER_OUTPUT:
            if isinstance(spec.arg, ConstantArgument):
                constants[user_index] = spec.arg.value
                user_index += 1
                continue
            user_index += 1
        kept.append(spec)
    if constants:
        prepared.graph_signature = ExportGraphSignature(
            input_specs=list(sig.input_specs), output_specs=kept
        )
    return constants


class _ModuleView:
    """What FxImporter reads from its ``module`` argument, over the builder's module op."""

    def __init__(self, module_builder: ModuleBuilder):
        self.operation = module_builder.module_op
        self.context = module_builder.context
        self.body = module_builder.body


# ------------------------------------------------------------------------------------------
# Preparation and op checks


def _mlir_op_name(target: Any) -> str | None:
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    return _fxi._get_mlir_op_name_for_schema(schema)


def _unregistered_op_nodes(prepared: PreparedProgram, context) -> list[torch.fx.Node]:
    """Nodes calling an ATen/prims op that IREE's torch dialect does not know."""
    found = []
    for node in prepared.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target in _fxi.NODE_CANONICALIZE or node.target in _fxi.SYMBOLIC_TORCH_OPS:
            continue
        if _fxi.is_symbolic(node.meta.get("val")):
            continue  # imported as a symbolic (shape arithmetic) op
        name = _mlir_op_name(node.target)
        if name is None or not name.startswith(("torch.aten.", "torch.prims.")):
            continue  # custom ops are imported as torch.operator on purpose
        if name in _fxi.TENSOR_SCALAR_OP_CONVERTER:
            continue
        if not context.is_registered_operation(name):
            found.append(node)
    return found


def _decomposable(op: Any) -> bool:
    try:
        resolve_decomposition_ops([op])
    except Exception:
        return False
    return True


def _prepare_with_auto_decompositions(
    program: ExportedProgram, table: dict[Any, Callable], context
) -> PreparedProgram:
    """Prepares the program; ops unknown to IREE that torch can decompose are decomposed too."""
    prepared = prepare_program(program, table)
    for _ in range(4):
        unknown = {n.target for n in _unregistered_op_nodes(prepared, context)}
        new_ops = [op for op in unknown if op not in table and _decomposable(op)]
        if not new_ops:
            break
        logger.info("decomposing ops IREE does not know: %s", ", ".join(map(str, new_ops)))
        table.update(resolve_decomposition_ops(new_ops))
        prepared = prepare_program(program, table)
    return prepared


def _check_dtypes(module_builder: ModuleBuilder, prepared: PreparedProgram) -> None:
    """Raises UnsupportedOpError for the first node whose value has a dtype IREE cannot type."""
    supported = _fxi.TORCH_DTYPE_TO_MLIR_TYPE_ASM
    for node in prepared.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        for v in vals:
            dtype = getattr(v, "dtype", None)
            if isinstance(v, torch.Tensor) and dtype not in supported:
                source = _source_line(node)
                dump_dir = _dump(module_builder, prepared)
                what = "input" if node.op == "placeholder" else f"result of {node.target}"
                raise UnsupportedOpError(
                    f"unsupported dtype {dtype} for the {what} at FX node '{node.name}'"
                    + (f" (from {source})" if source else "")
                    + ": IREE's torch frontend has no element type for it. Convert the tensor to "
                    "a supported dtype before export (supported: "
                    + ", ".join(sorted(str(d).removeprefix("torch.") for d in supported))
                    + f"). The FX graph is in {dump_dir}.",
                    op=str(dtype),
                    node=node.name,
                    source_line=source,
                    dump_dir=str(dump_dir),
                )


# ------------------------------------------------------------------------------------------
# Errors


def _source_line(node: torch.fx.Node) -> str | None:
    """The user's source line that created ``node`` (last frame of its stack trace)."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    if not frames:
        return None
    # The innermost frame of the user's own code: not generated (<eval_with_key>), not torch.
    torch_dir = str(Path(torch.__file__).resolve().parent)
    user = [f for f in frames if not f[0].startswith("<") and not f[0].startswith(torch_dir)]
    path, line, fn, code = (user or frames)[-1]
    return f"{path}:{line} in {fn}: {code.strip()}" if code.strip() else f"{path}:{line} in {fn}"


def _make_dump_dir(module_builder: ModuleBuilder) -> Path:
    maker = getattr(module_builder, "make_dump_dir", None)
    if maker is not None:
        return Path(maker())
    import tempfile

    return Path(tempfile.mkdtemp(prefix="turbine-dump-"))


def _dump(module_builder: ModuleBuilder, prepared: PreparedProgram) -> Path:
    dump_dir = _make_dump_dir(module_builder)
    try:
        asm = module_builder.module_op.get_asm(enable_debug_info=True, assume_verified=True)
    except Exception as e:  # pragma: no cover - printing broken IR can fail
        asm = f"// could not print the module: {e}\n"
    (dump_dir / "module.mlir").write_text(asm)
    (dump_dir / "fx_graph.txt").write_text(str(prepared.graph) + "\n")
    return dump_dir


def _unsupported_op_error(
    module_builder: ModuleBuilder,
    prepared: PreparedProgram,
    nodes: list[torch.fx.Node],
    func_op: Operation,
) -> UnsupportedOpError:
    dump_dir = _dump(module_builder, prepared)
    try:
        module_builder.symbol_table.erase(func_op.operation)
    except Exception:
        func_op.operation.erase()
    node = nodes[0]
    op = str(node.target)
    source = _source_line(node)
    others = sorted({str(n.target) for n in nodes[1:]} - {op})
    lines = [
        f"unsupported op {op} at FX node '{node.name}'"
        + (f" (from {source})" if source else "")
        + ": IREE's torch frontend has no lowering for it and torch registers no "
        "decomposition for it.",
    ]
    if others:
        lines.append(f"Also unsupported in this program: {', '.join(others)}.")
    lines += [
        "What to try:",
        f"  - register a decomposition for it (torch._decomp.register_decomposition) and "
        f"export inside `with extend_aot_decompositions(add_ops=[torch.ops.{op}]):`",
        "  - export with strict_export=False (torch.export strict=False), which can trace "
        "the code differently",
        "  - rewrite the model code at the source line above with ops IREE supports",
        f"The FX graph and the IR (with the op as torch.operator) are in {dump_dir}.",
    ]
    return UnsupportedOpError(
        "\n".join(lines), op=op, node=node.name, source_line=source, dump_dir=str(dump_dir)
    )


def _erase_partial_function(module_builder: ModuleBuilder, func_name: str) -> None:
    """Removes the function a failed import left in the module (not yet in the symbol table)."""
    for op in list(module_builder.body.operations):
        op = op.operation
        if op.name == "func.func" and StringAttr(op.attributes["sym_name"]).value == func_name:
            op.erase()


def _import_failure(
    module_builder: ModuleBuilder, prepared: PreparedProgram, e: Exception
) -> FxImportError:
    dump_dir = _dump(module_builder, prepared)
    node = getattr(e, "_turbine_fx_node", None)
    if node is not None:
        source = _source_line(node)
        return UnsupportedOpError(
            f"cannot import FX node '{node.name}' ({node.target})"
            + (f" from {source}" if source else "")
            + f": {e}\nIf the op or dtype is the problem, try "
            f"`extend_aot_decompositions(add_ops=[torch.ops.{node.target}])` or converting "
            f"the tensor's dtype before export. The FX graph and partial IR are in {dump_dir}.",
            op=str(node.target),
            node=node.name,
            source_line=source,
            dump_dir=str(dump_dir),
        )
    return FxImportError(
        f"importing the program failed: {type(e).__name__}: {e}\n"
        f"The FX graph and partial IR are in {dump_dir}."
    )


# ------------------------------------------------------------------------------------------
# Node importer


class _NodeImporter(_fxi.GraphNodeImporter):
    def lazy_import_buffer(self, loc, node, buffer_value, info):
        super().lazy_import_buffer(loc, node, buffer_value, info)
        if info.store_producer_node is not None:
            # Load the old value at function entry, before the new value is stored.
            self.resolve_node_value(node)

    def _import_torch_op_overload(self, loc, node, concrete_target=None):
        try:
            return super()._import_torch_op_overload(loc, node, concrete_target)
        except Exception as e:
            _tag(e, node)
            raise

    def _import_hop(self, loc, node, hop):
        try:
            return super()._import_hop(loc, node, hop)
        except Exception as e:
            _tag(e, node)
            raise

    def _import_symbolic_torch_op(self, loc, node, target):
        try:
            return super()._import_symbolic_torch_op(loc, node, target)
        except Exception as e:
            _tag(e, node)
            raise


def _tag(e: Exception, node: torch.fx.Node) -> None:
    """Remembers the innermost FX node an import error came from."""
    if getattr(e, "_turbine_fx_node", None) is None:
        e._turbine_fx_node = node  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------
# Globals


class _GlobalsHooks(_fxi.FxImporterHooks):
    """Resolves lifted tensors to ModuleBuilder globals."""

    def __init__(
        self,
        module_builder: ModuleBuilder,
        prepared: PreparedProgram,
        *,
        constants_as_globals: bool = False,
        inline_constants: bool = False,
    ):
        self.mb = module_builder
        self.constants_as_globals = constants_as_globals
        self.inline_constants = inline_constants
        self.prepared = prepared
        # Buffers the program writes (by state name).
        sig = prepared.graph_signature
        self.mutated = set(sig.buffers_to_mutate.values())
        # Constant tensors reach resolve_literal without their name: find it by identity.
        self.constant_names = {
            id(v): k for k, v in prepared.constants.items() if isinstance(v, torch.Tensor)
        }

    # Creating / finding globals ------------------------------------------------------------

    def _global_for(
        self,
        name: str,
        tensor: torch.Tensor,
        *,
        mutable: bool,
        symbol: str | None = None,
        blob_name: str | None = None,
    ):
        """The global for ``tensor`` (created on first use; one per tensor and tied storage).

        ``name`` is the logical name (state_dict name, or the constant's); the symbol is
        ``symbol`` if given, else ``__auto.<external_name>`` for a tensor with an
        ``ExternalTensorTrait`` and ``__auto.<name>`` otherwise.
        """
        trait = ExternalTensorTrait.get(tensor)
        if symbol is None:
            symbol = f"__auto.{trait.external_name if trait is not None else name}"
        # State on the meta device (a KV cache of a model built on "meta") has no data; as a
        # mutable global it starts as zeros (a splat: nothing is materialized).
        zero_state = mutable and tensor.is_meta and trait is None
        try:
            symbol, op, gtype = self.mb.get_or_create_tensor_global(
                symbol,
                tensor,
                attrs=GlobalAttributes(mutable=mutable, uninitialized=True if zero_state else None),
                logical_name=name,
                blob_name=blob_name,
                storage_dtype=storage_dtype(tensor),  # i4 for external torchao int4 data
            )
        except Exception as e:
            raise FxImportError(
                f"cannot create a global for '{name}' (shape {tuple(tensor.shape)}, "
                f"{tensor.dtype}, device {tensor.device}): {e}\n"
                + (
                    "Its data is not available (meta device): externalize it with "
                    "turbine_params.externalize_module_parameters(module) so that it becomes a "
                    "#flow.parameter.named reference instead of inline data."
                    if tensor.is_meta
                    else "Convert the tensor to a supported dtype or externalize it."
                )
            ) from e
        if zero_state and "#util.uninitialized" in str(op.attributes["initial_value"]):
            zero = (
                "false"
                if tensor.dtype == torch.bool
                else ("0.0" if tensor.dtype.is_floating_point or tensor.dtype.is_complex else "0")
            )
            op.attributes["initial_value"] = Attribute.parse(f"dense<{zero}> : {gtype}")
        if tensor.dtype == torch.bfloat16:
            _bf16_dense_initializer(op, tensor)
        if mutable and "is_mutable" not in op.attributes:
            # First imported by a program that only read it: now another program writes it.
            op.attributes["is_mutable"] = UnitAttr.get()
        return symbol, gtype

    def _load(self, symbol: str, gtype, vtensor_type) -> Value:
        loaded = Operation.create(
            "util.global.load",
            results=[gtype],
            attributes={"global": FlatSymbolRefAttr.get(symbol)},
        ).result
        loaded = widen_loaded(loaded, gtype)
        return Operation.create(
            "torch_c.from_builtin_tensor", results=[vtensor_type], operands=[loaded]
        ).result

    # FxImporterHooks -----------------------------------------------------------------------

    def resolve_input(self, gni, value, info) -> Value | None:
        spec = info.input_spec
        if not isinstance(value, torch.Tensor):
            return None
        name = spec.target
        mutable = spec.kind == InputKind.BUFFER and name in self.mutated
        symbol, gtype = self._global_for(name, value, mutable=mutable)
        return self._load(symbol, gtype, info.ir_type)

    def store_produced_value(self, gni, py_value, produced_ir_value, info):
        name = info.input_spec.target
        symbol, gtype = self._global_for(name, py_value, mutable=True)
        builtin = Operation.create(
            "torch_c.to_builtin_tensor", results=[gtype], operands=[produced_ir_value]
        ).result
        Operation.create(
            "util.global.store",
            operands=[builtin],
            attributes={"global": FlatSymbolRefAttr.get(symbol)},
        )

    def resolve_literal(self, gni, literal, info) -> Value | None:
        if not isinstance(literal, torch.Tensor):
            return None
        known = self.mb.global_ref_tracker.lookup(literal)
        if known is not None and not known.is_empty:
            # Already a global (another program, or an earlier use): load it.
            symbol, gtype = self._global_for("", literal, mutable=False)
            return self._load(symbol, gtype, gni._cc.tensor_to_vtensor_type(literal))
        if ExternalTensorTrait.get(literal) is not None:
            # A weight the user tagged: always an external parameter, whatever its size
            # (inlining it would bake the weight into the module).
            name = self.constant_names.get(id(literal), "constant")
            symbol, gtype = self._global_for(name, literal, mutable=False)
            return self._load(symbol, gtype, gni._cc.tensor_to_vtensor_type(literal))
        small = (
            literal.numel() <= inline_constant_limit or self.inline_constants
        ) and not self.constants_as_globals
        if small or literal.is_meta or literal.numel() == 0:
            if literal.numel() >= 1 and not literal.is_meta:
                return _inline_literal(self.mb, literal, gni)
            return None  # the importer's own path (empty tensors; meta fails there clearly)
        # A lifted constant: `__auto.constant_<dims>_<dtype>` (repeats `$1`, `$2`, ...), its
        # data blob named as the global (the reference's scheme).
        symbol = _unique_constant_symbol(self.mb, literal)
        symbol, gtype = self._global_for(
            self.constant_names.get(id(literal), symbol),
            literal,
            mutable=False,
            symbol=symbol,
            blob_name=symbol,
        )
        return self._load(symbol, gtype, gni._cc.tensor_to_vtensor_type(literal))


def _unique_constant_symbol(mb: ModuleBuilder, tensor: torch.Tensor) -> str:
    """``__auto.constant_<dims joined by _>_<str(dtype)>``, then ``…$1``, ``…$2`` if taken."""
    base = f"__auto.constant_{'_'.join(str(d) for d in tensor.shape)}_{tensor.dtype}"
    candidate, n = base, 0
    while True:
        try:
            mb.symbol_table[candidate]
        except KeyError:
            return candidate
        n += 1
        candidate = f"{base}${n}"


def _bf16_dense_initializer(op: Operation, tensor: torch.Tensor) -> None:
    """Rewrites an inline bf16 global's ``dense_resource`` initializer as ``dense<"0x...">``.

    iree-base-compiler 3.13 fails to compile a dispatch that reads a small inline bf16
    ``dense_resource`` constant ("'arith.constant' op failed to verify that all of {value,
    result} have same type"); the same bytes as a hex ``dense`` attribute compile and run.
    """
    if "initial_value" not in op.attributes:
        return
    init = op.attributes["initial_value"]
    if not str(init).startswith("dense_resource<"):
        return
    data = tensor.detach().contiguous().view(torch.int16).numpy().tobytes()
    shape = "x".join(str(d) for d in tensor.shape)
    type_asm = f"tensor<{shape + 'x' if shape else ''}bf16>"
    op.attributes["initial_value"] = Attribute.parse(
        f'dense<"0x{data.hex().upper()}"> : {type_asm}'
    )


def _inline_literal(mb: ModuleBuilder, tensor: torch.Tensor, gni) -> Value:
    """``torch.vtensor.literal`` from raw bytes (bf16/fp8 work; no numpy dtype needed)."""
    from turbine_ir import tensor_to_dense_attr

    mapping = mb.fx_py_attr_tracker.track(tensor)
    if mapping.is_empty:
        mapping.value = tensor_to_dense_attr(tensor, mb.context)
    vtype = gni._cc.tensor_to_vtensor_type(tensor)
    return Operation.create(
        "torch.vtensor.literal", results=[vtype], attributes={"value": mapping.value}
    ).result


def _set_arg_affinities(func_op: Operation, arg_device: Mapping[int, Any], context) -> None:
    ftype = func_op.type
    count = len(ftype.inputs)
    dicts = attributes_from_argument_device_affinities(dict(arg_device), count, context)
    array_attr = getattr(_ir, "ArrayAttr")  # noqa: B009  (mypy: only via `import *`)
    func_op.arg_attrs = array_attr.get([DictAttr.get(d) for d in dicts])
