"""Custom ops: an op defined with ``torch.library`` (its eager implementation is used for tracing
and testing) plus an MLIR expansion of its body.

``torch.export`` keeps such an op opaque and the FX importer emits it as
``torch.operator "torch.<namespace>.<name>"``. The ``custom_op_expansion`` import phase
(:meth:`CompiledModule.expand_custom_ops`) replaces each one by a call of a private function whose
body the registered expansion writes, specialized per operand types (one function per distinct
signature, dynamic dims included). The expansion works on builtin types (``tensor<?x4xf32>``,
``i64``, ``f64``, ``i1``): operands are converted with ``torch_c.to_builtin_tensor`` (and
``to_i64``/``to_f64``/``to_i1``), results back with ``torch_c.from_builtin_tensor``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._errors import TurbineAotError

__all__ = [
    "CustomOpExpansionError",
    "CustomOpSignature",
    "custom_op_expansion",
    "register_custom_op_expansion",
    "registered_custom_ops",
    "unregister_custom_op_expansion",
]


class CustomOpExpansionError(TurbineAotError):
    """A custom op expansion is missing, malformed, or does not match its op's signature."""


@dataclass(frozen=True)
class CustomOpSignature:
    """What an expansion is specialized for.

    Attributes:
        op_name: the torch op name, ``"namespace::name"`` (``.overload`` appended if not default).
        func_name: the symbol the expansion must define: ``func.func private @<func_name>``.
        arg_types: the builtin MLIR types of the operands, e.g. ``"tensor<?x4xf32>"``, ``"i64"``.
        result_types: the builtin MLIR types the function must return.
        torch_arg_types: the operands' torch types (``!torch.vtensor<[?,4],f32>``, ...).
        torch_result_types: the results' torch types.
    """

    op_name: str
    func_name: str
    arg_types: tuple[str, ...]
    result_types: tuple[str, ...]
    torch_arg_types: tuple[str, ...]
    torch_result_types: tuple[str, ...]

    @property
    def function_type(self) -> str:
        """``(arg types) -> (result types)`` as written in a ``func.func`` signature."""
        return f"({', '.join(self.arg_types)}) -> ({', '.join(self.result_types)})"

    def element_type(self, index: int) -> str:
        """Element type of tensor operand ``index`` (``"f32"``), or the scalar type itself."""
        t = self.arg_types[index]
        m = re.fullmatch(r"tensor<(?:[0-9?]+x)*([^>]+)>", t)
        return m.group(1) if m else t

    def rank(self, index: int) -> int:
        """Rank of tensor operand ``index`` (0 for scalars)."""
        t = self.arg_types[index]
        m = re.fullmatch(r"tensor<((?:[0-9?]+x)*)[^>]+>", t)
        return m.group(1).count("x") if m else 0


Expansion = Callable[[CustomOpSignature], str]

_lock = threading.Lock()
_registry: dict[str, tuple[str, Expansion]] = {}


def _mlir_op_name(op: Any) -> tuple[str, str]:
    """(``torch.<ns>.<name>[.<overload>]``, ``ns::name[.overload]``) for an op designator."""
    qualname: str
    overload = ""
    if isinstance(op, str):
        text = op.strip()
        if text.startswith("torch.") and "::" not in text:
            text = text[len("torch.") :]
        if "::" in text:
            ns, _, rest = text.partition("::")
        else:
            ns, _, rest = text.partition(".")
        name, _, overload = rest.partition(".")
        if not ns or not name:
            raise CustomOpExpansionError(
                f"cannot read a custom op name from {op!r}; write 'namespace::name' "
                "(as given to torch.library.custom_op)"
            )
        qualname = f"{ns}::{name}"
    else:
        schema_name = None
        overload_name = ""
        schema = getattr(op, "_schema", None)
        if schema is not None and hasattr(schema, "overload_name"):  # OpOverload
            schema_name, overload_name = schema.name, schema.overload_name
        elif isinstance(getattr(op, "_qualified_op_name", None), str):  # OpOverloadPacket
            schema_name = op._qualified_op_name
        elif isinstance(getattr(op, "_qualname", None), str):  # torch.library.custom_op result
            schema_name = op._qualname
        if schema_name is None:
            raise CustomOpExpansionError(
                f"{op!r} is not a torch op; pass the op (torch.ops.ns.name, the object "
                "torch.library.custom_op returned) or its name 'ns::name'"
            )
        qualname, overload = schema_name, overload_name
    if overload == "default":
        overload = ""
    ns, _, name = qualname.partition("::")
    mlir = f"torch.{ns}.{name}" + (f".{overload}" if overload else "")
    return mlir, qualname + (f".{overload}" if overload else "")


def register_custom_op_expansion(op: Any, expansion: Expansion) -> None:
    """Registers ``expansion`` for the custom op ``op``.

    Args:
        op: the op: what ``torch.library.custom_op`` returned, ``torch.ops.ns.name``, or
            ``"ns::name"``.
        expansion: ``(CustomOpSignature) -> str``: returns MLIR text defining
            ``func.func private @<sig.func_name><sig.function_type>`` (and any helpers, whose
            names should start with ``sig.func_name``).
    """
    mlir, display = _mlir_op_name(op)
    with _lock:
        _registry[mlir] = (display, expansion)


def unregister_custom_op_expansion(op: Any) -> None:
    """Removes the expansion registered for ``op`` (no error if there is none)."""
    mlir, _ = _mlir_op_name(op)
    with _lock:
        _registry.pop(mlir, None)


def custom_op_expansion(op: Any) -> Callable[[Expansion], Expansion]:
    """Decorator form of :func:`register_custom_op_expansion`.

    Example::

        @torch.library.custom_op("demo::silu_mul", mutates_args=())
        def silu_mul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.silu(x) * y

        @silu_mul.register_fake
        def _(x, y):
            return torch.empty_like(x)

        @custom_op_expansion(silu_mul)
        def _(sig):
            t = sig.arg_types[0]
            return f'''func.func private @{sig.func_name}(%x: {t}, %y: {t}) -> {t} {{ ... }}'''
    """

    def decorator(expansion: Expansion) -> Expansion:
        register_custom_op_expansion(op, expansion)
        return expansion

    return decorator


def registered_custom_ops() -> list[str]:
    """Names (``ns::name``) of the custom ops with a registered expansion."""
    with _lock:
        return sorted(display for display, _ in _registry.values())


# ---------------------------------------------------------------------------------------------
# Expansion of a module
# ---------------------------------------------------------------------------------------------
_SCALARS = {
    "!torch.int": ("i64", "torch_c.to_i64", "torch_c.from_i64"),
    "!torch.float": ("f64", "torch_c.to_f64", "torch_c.from_f64"),
    "!torch.bool": ("i1", "torch_c.to_i1", "torch_c.from_i1"),
}


def _builtin_type(torch_type: str, where: str) -> str:
    if torch_type in _SCALARS:
        return _SCALARS[torch_type][0]
    from turbine_ir import VtensorType

    t = VtensorType.parse(torch_type)
    if t is None:
        raise CustomOpExpansionError(
            f"{where}: operand/result type {torch_type} is not supported by custom op expansion "
            "(tensors with known rank and int/float/bool scalars are)"
        )
    elem = re.sub(r"^[su]i(\d+)$", r"i\1", t.dtype)  # torch_c makes integers signless
    shape = "".join(("?" if d is None else str(d)) + "x" for d in t.sizes)
    return f"tensor<{shape}{elem}>"


def _walk_operators(op: Any, found: list[Any]) -> None:
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                if child.operation.name == "torch.operator":
                    found.append(child.operation)
                _walk_operators(child.operation, found)


def expand_custom_ops_in_module(module_builder: Any) -> int:
    """Expands every registered custom op in the builder's module; returns how many."""
    from turbine_ir.dialects import func as func_d
    from turbine_ir.ir import (
        FlatSymbolRefAttr,
        InsertionPoint,
        MLIRError,
        Module,
        Operation,
        StringAttr,
        Type,
    )

    module_op = module_builder.module_op
    with _lock:
        registry = dict(_registry)
    if not registry:
        return 0
    operators: list[Any] = []
    _walk_operators(module_op, operators)
    specializations: dict[tuple, str] = {}
    body = module_op.regions[0].blocks[0]
    existing = {
        str(op.attributes["sym_name"]).strip('"')
        for op in body.operations
        if "sym_name" in op.attributes
    }
    count = 0
    with module_op.context:
        for op in operators:
            name = str(op.attributes["name"]).strip('"')
            if name not in registry:
                continue
            display, expansion = registry[name]
            where = f"custom op {display} at {op.location}"
            torch_args = tuple(str(v.type) for v in op.operands)
            torch_results = tuple(str(r.type) for r in op.results)
            key = (name, torch_args, torch_results)
            func_name = specializations.get(key)
            arg_types = tuple(_builtin_type(t, where) for t in torch_args)
            result_types = tuple(_builtin_type(t, where) for t in torch_results)
            if func_name is None:
                base = "__custom_op." + display.replace("::", ".")
                func_name, n = base, 0
                while func_name in existing:
                    n += 1
                    func_name = f"{base}.{n}"
                sig = CustomOpSignature(
                    display, func_name, arg_types, result_types, torch_args, torch_results
                )
                _insert_expansion(
                    sig, expansion(sig), body, existing, where, Module, MLIRError, StringAttr
                )
                specializations[key] = func_name
            # Replace the torch.operator by conversions + func.call.
            with InsertionPoint(op), op.location:
                operands = []
                for v, tt, bt in zip(op.operands, torch_args, arg_types, strict=True):
                    conv = _SCALARS[tt][1] if tt in _SCALARS else "torch_c.to_builtin_tensor"
                    operands.append(
                        Operation.create(conv, results=[Type.parse(bt)], operands=[v]).result
                    )
                call = func_d.CallOp(
                    [Type.parse(t) for t in result_types],
                    FlatSymbolRefAttr.get(func_name),
                    operands,
                )
                for old, new, tt in zip(op.results, call.results, torch_results, strict=True):
                    conv = _SCALARS[tt][2] if tt in _SCALARS else "torch_c.from_builtin_tensor"
                    back = Operation.create(conv, results=[old.type], operands=[new]).result
                    old.replace_all_uses_with(back)
            op.erase()
            count += 1
    return count


def _insert_expansion(
    sig: CustomOpSignature,
    text: str,
    body: Any,
    existing: set[str],
    where: str,
    module_type: Any,
    mlir_error: Any,
    string_attr: Any,
) -> None:
    if not isinstance(text, str):
        raise CustomOpExpansionError(
            f"{where}: the expansion returned {type(text).__name__}, expected MLIR text"
        )
    try:
        parsed = module_type.parse(text)
    except mlir_error as e:
        details = "\n".join(str(d) for d in e.error_diagnostics) or str(e)
        raise CustomOpExpansionError(
            f"{where}: the expansion's MLIR does not parse:\n{details}"
        ) from None
    funcs = {
        str(op.attributes["sym_name"]).strip('"'): op
        for op in parsed.body.operations
        if "sym_name" in op.attributes
    }
    main = funcs.get(sig.func_name)
    if main is None:
        raise CustomOpExpansionError(
            f"{where}: the expansion must define func.func @{sig.func_name}; it defines "
            f"{sorted(funcs) or 'nothing'}"
        )
    got = str(main.attributes["function_type"]).replace(" ", "")
    want = f"({','.join(sig.arg_types)})->" + (
        sig.result_types[0] if len(sig.result_types) == 1 else f"({','.join(sig.result_types)})"
    )
    if got != want.replace(" ", ""):
        raise CustomOpExpansionError(f"{where}: @{sig.func_name} has type {got}, expected {want}")
    clash = sorted(set(funcs) & existing)
    if clash:
        raise CustomOpExpansionError(
            f"{where}: the expansion defines symbols that already exist in the module: {clash}; "
            f"prefix helper names with {sig.func_name!r}"
        )
    for op in list(parsed.body.operations):
        if "sym_name" in op.attributes:
            op.attributes["sym_visibility"] = string_attr.get("private")
        body.append(op)
    existing.update(funcs)
