"""Building a module: ModuleBuilder (symbols, functions, globals, checks, IR dumps), FunctionBuilder.

Lifetimes follow the torch-mlir importer: one :class:`ModuleBuilder` per module being built
(symbol table, globals, trackers, a per-context :class:`TypeCache`), one :class:`FunctionBuilder`
per function body.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from iree.compiler import ir
from iree.compiler.dialects import func, util

from ._affinity import GLOBAL_AFFINITY_ATTR, device_promise_attr
from ._checks import reshape_element_count_errors
from ._errors import IrBuildError
from ._global_attrs import DEFAULT_PARAMETER_SCOPE, GlobalAttributes, device_trait
from ._ir_helpers import as_ranked_tensor, current_loc, zero_initial_value
from ._ref_tracker import RefTracker
from ._resources import tensor_to_dense_attr
from ._type_conversion import NativeTypeConverter, TypeCache

__all__ = ["DUMP_DIR_ENV", "FunctionBuilder", "ModuleBuilder", "ModuleBuilderOptions"]

logger = logging.getLogger("turbine.ir")

#: Environment variable naming a directory under which per-run IR dump directories are made.
DUMP_DIR_ENV = "TURBINE_DUMP_DIR"


@dataclass
class ModuleBuilderOptions:
    """Options of a :class:`ModuleBuilder`.

    Args:
        import_symbolic_shape_expressions: Import torch symbolic shape guards as
            ``torch.bind_symbolic_shape`` ops (used by the FX importer).
        dump_dir: Parent directory for per-run IR dumps on errors (default: ``$TURBINE_DUMP_DIR``
            or the system temp directory).
        bf16_noinline: Mark inline bf16 globals ``#util.inline.never`` (works around IREE 3.13
            miscompiling small bf16 constants inlined into SPIR-V dispatches).
    """

    import_symbolic_shape_expressions: bool = False
    dump_dir: str | os.PathLike | None = None
    bf16_noinline: bool = True


class ModuleBuilder:
    """Wrapper around module and IR accounting for a module being built.

    Args:
        module_op: The ``builtin.module`` operation (an ``ir.Module`` is accepted too).
        options: :class:`ModuleBuilderOptions`.

    Example:
        >>> from turbine_ir import ir, ModuleBuilder, GlobalAttributes
        >>> import torch
        >>> with ir.Context(), ir.Location.unknown():
        ...     mb = ModuleBuilder(ir.Module.create().operation)
        ...     name, op, typ = mb.create_tensor_global("__auto.w", torch.ones(2),
        ...                                             attrs=GlobalAttributes())
        >>> name, str(typ)
        ('__auto.w', 'tensor<2xf32>')
    """

    def __init__(
        self, module_op: ir.Operation | ir.Module, *, options: ModuleBuilderOptions | None = None
    ):
        if isinstance(module_op, ir.Module):
            module_op = module_op.operation
        module_op = module_op.operation
        if module_op.name != "builtin.module":
            raise TypeError(f"ModuleBuilder needs a builtin.module operation, got {module_op.name}")
        self.module_op: ir.Operation = module_op
        self.options = options or ModuleBuilderOptions()
        self.context: ir.Context = module_op.context
        # A compiler Session's context has IREE's dialects registered but not loaded; creating
        # util/flow ops in it then crashes the bindings. Loading is idempotent and cheap.
        self.context.load_all_available_dialects()
        self.body: ir.Block = module_op.regions[0].blocks[0]
        self.symbol_table = ir.SymbolTable(module_op)
        self.ip = ir.InsertionPoint(self.body)
        self.cache = TypeCache(self.context)
        self.native_type_converter = NativeTypeConverter(self.context)
        #: Tensors → their MaterializedGlobal / (symbol, op, type): one global per tensor.
        self.global_ref_tracker = RefTracker()
        #: Python attribute values → literal IR (shared with the FX importer).
        self.fx_py_attr_tracker = RefTracker()
        self.last_global_op: ir.Operation | None = None
        self._auto_symbol_counts: dict[str, int] = {}

    # Symbols -----------------------------------------------------------------------------

    def _symbol_exists(self, name: str) -> bool:
        try:
            self.symbol_table[name]
        except KeyError:
            return False
        return True

    def unique_auto_symbol(self, requested_name: str) -> str:
        """A symbol name not yet used in the module: ``requested_name``, else ``requested_name_N``.

        Names handed out are reserved even before an op with that name is created.
        """
        count = self._auto_symbol_counts.get(requested_name)
        if count is None and not self._symbol_exists(requested_name):
            self._auto_symbol_counts[requested_name] = 0
            return requested_name
        count = count or 0
        while True:
            count += 1
            candidate = f"{requested_name}_{count}"
            if candidate not in self._auto_symbol_counts and not self._symbol_exists(candidate):
                break
        self._auto_symbol_counts[requested_name] = count
        self._auto_symbol_counts[candidate] = 0
        return candidate

    def torch_dtype_to_iree_type(self, dtype: torch.dtype) -> ir.Type:
        """The builtin (signless) element type for a torch dtype (cached per context)."""
        return self.cache.torch_dtype_to_iree_type(dtype)

    # Functions ---------------------------------------------------------------------------

    def create_func_op(
        self,
        symbol_name: str,
        argument_types: Sequence[ir.Type],
        is_public: bool = True,
        add_entry_block: bool = True,
        argument_attributes: ir.ArrayAttr | list[ir.DictAttr] | list[dict] | None = None,
    ) -> tuple[str, func.FuncOp]:
        """Appends ``func.func @symbol_name(argument_types) -> ()`` to the module.

        Result types are set later (:meth:`FunctionBuilder.emit_return`). A taken name gets a
        unique suffix; the actual name is returned.
        """
        with self.context, current_loc(self.context) as loc:
            ftype = ir.FunctionType.get(list(argument_types), [])
            # Check the attributes before creating the op: a failure must not leave a
            # half-built, unregistered func.func (a duplicate symbol) in the module.
            arg_attrs = None
            if argument_attributes is not None:
                if isinstance(argument_attributes, ir.ArrayAttr):
                    arg_attrs = argument_attributes
                else:
                    arg_attrs = ir.ArrayAttr.get(
                        [
                            a if isinstance(a, ir.Attribute) else ir.DictAttr.get(dict(a))
                            for a in argument_attributes
                        ]
                    )
                if len(arg_attrs) != len(argument_types):
                    raise ValueError(
                        f"create_func_op({symbol_name!r}): {len(arg_attrs)} argument attribute "
                        f"dicts for {len(argument_types)} arguments"
                    )
            with self.ip:
                func_op = func.FuncOp(
                    symbol_name, ftype, visibility=None if is_public else "private", loc=loc
                )
            if arg_attrs is not None:
                func_op.arg_attrs = arg_attrs
            if add_entry_block:
                func_op.add_entry_block()
            actual = ir.StringAttr(self.symbol_table.insert(func_op)).value
        return actual, func_op

    # Globals -----------------------------------------------------------------------------

    def _global_ip(self) -> ir.InsertionPoint:
        if self.last_global_op is not None:
            return ir.InsertionPoint.after(self.last_global_op)
        ops = list(self.body.operations)
        return ir.InsertionPoint(ops[0]) if ops else ir.InsertionPoint(self.body)

    def _create_global(
        self,
        symbol_name: str,
        global_type: ir.Type,
        *,
        attrs: GlobalAttributes,
        initial_value: ir.Attribute | None,
        affinity: Any = None,
        noinline: bool = False,
    ) -> tuple[str, ir.Operation]:
        with self.context, current_loc(self.context) as loc:
            with self._global_ip():
                op = util.GlobalOp(
                    symbol_name,
                    global_type,
                    sym_visibility="private",
                    is_mutable=bool(attrs.mutable),
                    initial_value=initial_value,
                    inlining_policy=ir.Attribute.parse("#util.inline.never")
                    if attrs.noinline or noinline
                    else None,
                    loc=loc,
                )
            if affinity is not None:
                op.operation.attributes[GLOBAL_AFFINITY_ATTR] = device_promise_attr(affinity)
            actual = ir.StringAttr(self.symbol_table.insert(op)).value
        self.last_global_op = op.operation
        return actual, op.operation

    def _external_initializer(self, scope: str | None, key: str, typ: ir.Type) -> ir.Attribute:
        scope = scope or DEFAULT_PARAMETER_SCOPE
        for what, value in (("scope", scope), ("key", key)):
            bad = sorted({c for c in value if c in '"\\' or ord(c) < 0x20 or ord(c) == 0x7F})
            if bad:
                raise IrBuildError(
                    f"parameter {what} {value!r} contains {', '.join(map(repr, bad))}: IREE prints "
                    "#flow.parameter.named strings unescaped, so the module would not parse back; "
                    "rename it (GlobalAttributes(name_mapper=...) or the ExternalTensorTrait name)"
                )
        return ir.Attribute.parse(
            f"#flow.parameter.named<{_mlir_string(scope)}::{_mlir_string(key)}> : {typ}",
            self.context,
        )

    def _uninitialized(self, typ: ir.Type) -> ir.Attribute | None:
        rtt = as_ranked_tensor(typ)
        if rtt is not None and not rtt.has_static_shape:
            # IREE 3.13 cannot size `#util.uninitialized` for a dynamically shaped tensor
            # ("stream.tensor.sizeof ... 0 dimension values"); no initial value means the same.
            return None
        return ir.Attribute.parse(f"#util.uninitialized : {typ}", self.context)

    def create_typed_global(
        self,
        symbol_name: str,
        global_type: ir.Type,
        *,
        attrs: GlobalAttributes,
        logical_name: str | None = None,
    ) -> tuple[str, ir.Operation]:
        """Declares a global of ``global_type`` without data (scalars, state, parameters).

        ``attrs.external=True`` → initialized from ``#flow.parameter.named<scope::key>`` where
        key = ``attrs.map_name(logical_name or symbol_name)``; ``uninitialized`` →
        ``#util.uninitialized`` (no initial value for dynamically shaped tensors, which IREE
        cannot size); otherwise zero (:func:`zero_initial_value`: ``0 : index``,
        ``0.000000e+00 : f32``, ``false``, ``dense<0> : tensor<1xi32>``, ...), as the reference
        does.

        Returns:
            ``(actual_symbol_name, global_op)``.

        Raises:
            ValueError: an initialized global of a dynamically shaped tensor type (there is no
                zero value of unknown size); declare it ``uninitialized=True`` or external.
        """
        initial: ir.Attribute | None = None
        if attrs.external:
            initial = self._external_initializer(
                attrs.external_scope, attrs.map_name(logical_name or symbol_name), global_type
            )
        elif attrs.uninitialized:
            initial = self._uninitialized(global_type)
        else:
            initial = zero_initial_value(global_type, what=f"global {symbol_name!r}")
        return self._create_global(symbol_name, global_type, attrs=attrs, initial_value=initial)

    def create_tensor_global(
        self,
        symbol_name: str,
        t: torch.Tensor,
        *,
        attrs: GlobalAttributes,
        logical_name: str | None = None,
        blob_name: str | None = None,
        storage_dtype: torch.dtype | None = None,
    ) -> tuple[str, ir.Operation, ir.Type]:
        """Creates a ``util.global`` for a tensor (builtin tensor type, not ``!torch.vtensor``).

        External (per ``attrs`` or the tensor's ``ExternalTensorTrait``):
        ``= #flow.parameter.named<"scope"::"key">``; uninitialized: ``#util.uninitialized``;
        otherwise the data inline (:func:`tensor_to_dense_attr`: ``dense_resource``; ``dense``
        for bf16/float8 and one-element tensors). Inline bf16 data also gets
        ``inlining_policy = #util.inline.never`` unless ``options.bf16_noinline`` is off (IREE
        3.13's SPIR-V backend miscomputes bf16 constants inlined into dispatches).
        A tensor with a ``DeviceTensorTrait`` gets ``stream.affinity``. ``blob_name`` names the
        inline data's resource (default ``torch_tensor_<dims joined by _>_<str(dtype)>``).

        ``storage_dtype`` declares an external global with another element type than the
        tensor's, for data the archive stores in that type: ``torch.int4`` for torchao's int4
        values, which the tensor holds one per byte and the archive two per byte.

        Does not consult :attr:`global_ref_tracker`; :meth:`get_or_create_tensor_global` does.

        Returns:
            ``(actual_symbol_name, global_op, global_type)``.

        Raises:
            UnsupportedDtypeError: An unmappable dtype, or data needed from a meta/fake tensor.
            IrBuildError: ``storage_dtype`` for a global that is not external.
        """
        with self.context:
            global_type = self.cache.tensor_type(list(t.shape), storage_dtype or t.dtype)
            external, scope, ext_name = attrs.infer_external_from_tensor(t)
            if storage_dtype is not None and storage_dtype != t.dtype and not external:
                raise IrBuildError(
                    f"global {symbol_name!r}: a storage dtype ({storage_dtype}) other than the "
                    f"tensor's ({t.dtype}) needs an external global (the data is in the archive)"
                )
            initial: ir.Attribute | None
            if external:
                key = (
                    ext_name
                    if ext_name is not None
                    else attrs.map_name(logical_name or symbol_name)
                )
                initial = self._external_initializer(scope, key, global_type)
            elif attrs.uninitialized:
                initial = self._uninitialized(global_type)
            else:
                initial = tensor_to_dense_attr(t, self.context, blob_name=blob_name)
        # IREE 3.13 inlines small constant globals into dispatches, and its SPIR-V backend then
        # computes wrong values from bf16 constants: keep inline bf16 data out of dispatches.
        bf16_noinline = (
            self.options.bf16_noinline
            and t.dtype == torch.bfloat16
            and not external
            and not attrs.uninitialized
            and t.numel() > 1
        )
        actual, op = self._create_global(
            symbol_name,
            global_type,
            attrs=attrs,
            initial_value=initial,
            affinity=device_trait(t),
            noinline=bf16_noinline,
        )
        return actual, op, global_type

    def get_or_create_tensor_global(
        self,
        symbol_name: str,
        t: torch.Tensor,
        *,
        attrs: GlobalAttributes,
        logical_name: str | None = None,
        blob_name: str | None = None,
        storage_dtype: torch.dtype | None = None,
    ) -> tuple[str, ir.Operation, ir.Type]:
        """Like :meth:`create_tensor_global`, but one global per tensor (and per tied storage).

        The second call for the same tensor (or a tensor viewing the same storage) returns the
        first call's ``(symbol, op, type)`` from :attr:`global_ref_tracker`.
        """
        mapping = self.global_ref_tracker.track(t)
        if mapping.is_empty:
            mapping.value = self.create_tensor_global(
                symbol_name,
                t,
                attrs=attrs,
                logical_name=logical_name,
                blob_name=blob_name,
                storage_dtype=storage_dtype,
            )
        value = mapping.value
        if isinstance(value, tuple) and len(value) == 3:
            return value
        # A MaterializedGlobal-like object stored by a higher layer.
        return value.symbol_name, value.global_op, value.global_type

    # Finishing ---------------------------------------------------------------------------

    def finalize_construct(self) -> None:
        """Verifies the module (MLIR's verifiers, then :func:`reshape_element_count_errors`);
        on failure dumps it and raises :class:`IrBuildError`."""
        try:
            self.module_op.verify()
        except ir.MLIRError as e:
            self.handle_mlir_error(self.module_op, e, "module failed to verify")
        errors = reshape_element_count_errors(self.module_op)
        if errors:
            raise IrBuildError("module failed to verify:\n" + "\n".join(errors))

    def make_dump_dir(self) -> Path:
        """A fresh per-run directory for IR dumps (under ``options.dump_dir`` /
        ``$TURBINE_DUMP_DIR`` / the system temp dir)."""
        parent = self.options.dump_dir or os.environ.get(DUMP_DIR_ENV) or None
        if parent is not None:
            Path(parent).mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="turbine-dump-", dir=parent))

    def handle_mlir_error(self, op: ir.Operation, e: ir.MLIRError, message: str):
        """Writes the failing IR and diagnostics to a per-run dump dir and raises.

        The directory holds ``module.mlir`` (the whole module), ``op.mlir`` (the failing
        operation, when it is not the module) and ``diagnostics.txt``. Invalid IR is printed in
        the generic form, which always round-trips through ``iree-opt``.

        Raises:
            IrBuildError: Always; its message names the dump directory.
        """
        diag = str(e)
        try:
            dump_dir = self.make_dump_dir()
            ir_path = dump_dir / "module.mlir"
            ir_path.write_text(_print_for_dump(self.module_op))
            op = op.operation
            if op != self.module_op:
                (dump_dir / "op.mlir").write_text(_print_for_dump(op))
            (dump_dir / "diagnostics.txt").write_text(diag + "\n")
        except OSError as dump_error:
            # The build error is what matters: an unwritable dump dir must not replace it.
            logger.error("%s; could not write the IR dump: %s", message, dump_error)
            raise IrBuildError(
                f"{message}: {diag}\n(The failing IR could not be dumped: {dump_error}; set "
                f"{DUMP_DIR_ENV} or ModuleBuilderOptions(dump_dir=...) to a writable directory.)"
            ) from e
        logger.error("%s; IR written to %s", message, ir_path)
        raise IrBuildError(
            f"{message}: {diag}\nThe failing IR was written to {ir_path} (diagnostics in "
            f"{dump_dir / 'diagnostics.txt'}); inspect it with iree-opt, and report it with the "
            "code that built it if this looks like a turbine bug.",
            dump_dir=str(dump_dir),
        ) from e


def _print_for_dump(op: ir.Operation) -> str:
    try:
        # Not assume_verified: MLIR verifies first and falls back to the generic form.
        return op.get_asm(enable_debug_info=True)
    except Exception as print_error:  # pragma: no cover - printing can fail on broken IR
        return f"// could not print the operation: {print_error}\n"


def _mlir_string(s: str) -> str:
    out: list[str] = []
    for ch in s:
        if ch in ('"', "\\") or not (0x20 <= ord(ch) < 0x7F):
            out.extend(f"\\{b:02X}" for b in ch.encode("utf-8"))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


class FunctionBuilder:
    """Helpers for building function bodies.

    Args:
        module_builder: The module the function belongs to.
        func_op: A ``func.func`` with an entry block.
    """

    def __init__(self, *, module_builder: ModuleBuilder, func_op: func.FuncOp):
        self.module_builder = module_builder
        self.func_op = func_op
        self.context = func_op.context
        self.ip = ir.InsertionPoint(func_op.entry_block)
        self.return_types: Sequence[ir.Type] | None = None
        self.loc = func_op.location

    def emit_return(self, *ir_values: ir.Value) -> None:
        """Emits ``func.return`` and sets the function's result types from the values.

        Raises:
            IrBuildError: The function already returns different types.
        """
        types = [v.type for v in ir_values]
        if self.return_types is not None and [str(t) for t in self.return_types] != [
            str(t) for t in types
        ]:
            raise IrBuildError(
                f"function @{ir.StringAttr(self.func_op.sym_name).value} returns "
                f"({', '.join(map(str, types))}) here but ({', '.join(map(str, self.return_types))}) "
                "elsewhere; every return must have the same types"
            )
        with self.context, self.loc, self.ip:
            func.ReturnOp(list(ir_values))
            ftype = ir.FunctionType(ir.TypeAttr(self.func_op.attributes["function_type"]).value)
            self.func_op.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get(ftype.inputs, types)
            )
        self.return_types = types
