"""``ProcedureTrace``: traces a Python function over intrinsics into a ``func.func``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import keystr, tree_flatten_with_path

from turbine_ir.ir import StringAttr, Value

from . import _scalars
from ._abstract import AbstractIntrinsic, abstractify_single_value
from ._base import Intrinsic, IrTrace, new_ir_trace_scope
from ._errors import ProcedureTraceError
from ._live_globals import LiveGlobalCollectionProxy
from ._primitives import IrScalar, IrTensor, convert_py_value_to_ir
from ._tree import tree_flatten, tree_unflatten, treespec_dumps

if TYPE_CHECKING:
    from turbine_ir import ModuleBuilder
    from turbine_ir.ir import Location
    from turbine_params import DeviceAffinity

__all__ = ["ProcedureTrace"]


class ProcedureTrace(IrTrace):
    """Captures execution of a Python func into IR.

    Build one with ``define_func`` (declares the ``func.func`` from abstract argument types),
    then ``trace_py_func`` (runs the Python function on proxies of the arguments and emits the
    return).

    Example:
        >>> trace = ProcedureTrace.define_func(
        ...     mb, symbol_name="double", posargs=(AbstractTensor(None, dtype=torch.float32),),
        ...     kwargs={}, loc=loc)
        >>> trace.trace_py_func(lambda x: IREE.tensor_update(x, x, 0))

    Args:
        module_builder: The module under construction.
        func_op: The function whose entry block receives the IR.
        proxy_posargs: Positional argument intrinsics passed to the traced function.
        proxy_kwargs: Keyword argument intrinsics passed to the traced function.
    """

    def __init__(
        self,
        *,
        module_builder: ModuleBuilder,
        func_op: Any,
        proxy_posargs: Sequence[Any],
        proxy_kwargs: dict[str, Any],
    ):
        super().__init__(module_builder=module_builder, func_op=func_op)
        self.proxy_posargs = proxy_posargs
        self.proxy_kwargs = proxy_kwargs

    @staticmethod
    def define_func(
        module_builder: ModuleBuilder,
        *,
        symbol_name: str,
        posargs: Sequence[Any],
        kwargs: dict[str, Any],
        loc: Location,
        arg_device: dict[int, DeviceAffinity] | None = None,
    ) -> ProcedureTrace:
        """Declares a public ``func.func`` whose arguments are the flattened abstract args.

        Args:
            module_builder: Where to create the function.
            symbol_name: The requested function name.
            posargs: Abstract positional arguments (``AbstractTensor``, ``AbstractScalar``,
                trees of them; a ``torch.Tensor`` is taken as its ``AbstractTensor``).
            kwargs: Abstract keyword arguments.
            loc: The location of the function.
            arg_device: Device affinity per flattened argument index
                (``iree.abi.affinity`` argument attributes).

        Returns:
            A trace whose ``proxy_posargs``/``proxy_kwargs`` mirror the given trees with
            ``IrImmediateTensor``/``IrImmediateScalar`` leaves.

        Raises:
            ProcedureTraceError: an argument leaf is not an abstract type.
        """
        from turbine_ir import attributes_from_argument_device_affinities

        arguments_flat, arguments_tree_def = tree_flatten((list(posargs), dict(kwargs)))
        paths = [p for p, _ in tree_flatten_with_path((list(posargs), dict(kwargs)))[0]]
        abstract_flat = []
        for path, arg in zip(paths, arguments_flat):
            if isinstance(arg, torch.Tensor):
                arg = abstractify_single_value(arg)
            if not isinstance(arg, AbstractIntrinsic):
                raise ProcedureTraceError(
                    f"procedure {symbol_name!r}: argument {_arg_label(path)} is "
                    f"{type(arg).__name__} ({arg!r:.60}); procedure arguments must be abstract "
                    "types (AbstractTensor(...), AbstractI64, AbstractF32, ...) or trees of them"
                )
            abstract_flat.append(arg)
        argument_ir_types = [a.get_ir_type(module_builder) for a in abstract_flat]
        with loc:
            argument_attributes = None
            if arg_device:
                try:
                    argument_attributes = attributes_from_argument_device_affinities(
                        arg_device, len(argument_ir_types), module_builder.context
                    )
                except ValueError as e:
                    raise ProcedureTraceError(
                        f"procedure {symbol_name!r}: arg_device: {e} (indices count flattened "
                        "arguments)"
                    ) from None
            _, func_op = module_builder.create_func_op(
                symbol_name,
                argument_ir_types,
                argument_attributes=argument_attributes,
            )
        try:
            entry_block = func_op.regions[0].blocks[0]
            proxies = [
                abstract.create_intrinsic(ir_value)
                for ir_value, abstract in zip(entry_block.arguments, abstract_flat)
            ]
            proxy_posargs, proxy_kwargs = tree_unflatten(proxies, arguments_tree_def)
            if arguments_flat:
                _set_schema_attr(func_op, "torch.args_schema", arguments_tree_def)
        except BaseException:
            _erase_func(module_builder, func_op)
            raise
        return ProcedureTrace(
            module_builder=module_builder,
            func_op=func_op,
            proxy_posargs=proxy_posargs,
            proxy_kwargs=proxy_kwargs,
        )

    def trace_py_func(self, py_f: Callable[..., Any]) -> None:
        """Runs ``py_f(*proxy_posargs, **proxy_kwargs)`` and emits its result as the return.

        The result may be ``None`` (no results), an intrinsic, an MLIR ``Value``, a Python
        scalar or a tree (tuple/list/dict) of those.

        If ``py_f`` raises (or its result cannot be converted), the partly built ``func.func`` is
        erased from the module, freeing its name, and the exception propagates: the module is left
        as it was before :meth:`define_func`, so it still verifies and compiles.

        Raises:
            ProcedureTraceError: a returned leaf cannot be converted to IR (the message names the
                procedure and the position of the leaf in the result).
        """
        try:
            self._trace_py_func(py_f)
        except BaseException:
            _erase_func(self.module_builder, self.func_op)
            raise

    def _trace_py_func(self, py_f: Callable[..., Any]) -> None:
        with new_ir_trace_scope(self):
            result = LiveGlobalCollectionProxy.unwrap(
                py_f(*self.proxy_posargs, **self.proxy_kwargs)
            )
            if result is None:
                self.emit_return()
                return
            leaves_with_paths, schema = tree_flatten_with_path(result)
            flat_ir_values: list[Value] = []
            for path, leaf in leaves_with_paths:
                try:
                    flat_ir_values.extend(convert_py_value_to_ir(self, leaf))
                except ProcedureTraceError as e:
                    where = f"return value{keystr(path)}" if path else "the return value"
                    raise ProcedureTraceError(
                        f"procedure {self.name!r}: {where}: {_strip_prefix(e.message, self.name)}"
                    ) from None
            _set_schema_attr(self.func_op, "torch.return_schema", schema)
            self.emit_return(*flat_ir_values)

    def handle_call(self, target: Intrinsic, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Implements calls to jittable functions (``target.resolve_call(self, *args, **kwargs)``)."""
        with self.loc, self.ip:
            return target.resolve_call(self, *args, **kwargs)

    def handle_assignment(self, scope: Any, target: Any, updated_value: Any) -> None:
        """Assigns ``updated_value`` to ``target`` (a global intrinsic, or a tree of them).

        Python numbers are converted to the scalar global's type; a tree target takes a tree
        value of the same structure, leaf by leaf.

        Raises:
            ProcedureTraceError: the target is not assignable (e.g. an immutable global), or the
                value does not fit it.
        """
        updated_value = LiveGlobalCollectionProxy.unwrap(updated_value)
        target = LiveGlobalCollectionProxy.unwrap(target)
        if isinstance(target, Intrinsic):
            self._assign_leaf(target, updated_value)
            return
        targets, target_spec = tree_flatten(target)
        if not targets or not all(isinstance(t, Intrinsic) for t in targets):
            raise ProcedureTraceError(
                f"procedure {self.name!r}: cannot assign to {target!r:.80}: only globals "
                "(export_global(..., mutable=True) and friends) can be assigned in a procedure"
            )
        values, value_spec = tree_flatten(updated_value)
        if value_spec != target_spec:
            raise ProcedureTraceError(
                f"procedure {self.name!r}: the assigned value's structure {value_spec} does not "
                f"match the globals' structure {target_spec}"
            )
        for t, v in zip(targets, values):
            self._assign_leaf(t, v)

    def _assign_leaf(self, target: Intrinsic, value: Any) -> None:
        with self.loc, self.ip:
            if isinstance(target, IrScalar) and isinstance(value, (bool, int, float)):
                ir_values: Sequence[Value] = (_scalars.constant(target.ir_type, value),)
            elif isinstance(target, IrTensor) and not isinstance(value, (Intrinsic, Value)):
                raise ProcedureTraceError(
                    f"procedure {self.name!r}: cannot assign {type(value).__name__} "
                    f"({value!r:.60}) to tensor global {target!r}; assign an IR tensor"
                )
            else:
                ir_values = convert_py_value_to_ir(self, value)
            target.resolve_assignment(self, ir_values)


def _erase_func(module_builder: ModuleBuilder, func_op: Any) -> None:
    """Removes a function whose construction failed (its symbol and its IR) from the module."""
    module_builder.symbol_table.erase(func_op.operation)


def _set_schema_attr(func_op: Any, name: str, spec: Any) -> None:
    """Records a pytree schema on the function (skipped for trees torch cannot serialize)."""
    try:
        text = treespec_dumps(spec)
    except Exception:  # e.g. an unregistered namedtuple or custom node in the tree
        return
    with func_op.context:
        func_op.attributes[name] = StringAttr.get(text)


def _arg_label(path: tuple[Any, ...]) -> str:
    """Names an argument from its pytree path within ``(posargs, kwargs)``."""
    if len(path) < 2:
        return keystr(path)
    head = path[1]
    rest = keystr(path[2:])
    if getattr(path[0], "idx", None) == 0:
        return f"#{head.idx}{rest}"
    return f"{getattr(head, 'key', head)!r}{rest}"


def _strip_prefix(message: str, name: str) -> str:
    prefix = f"procedure {name!r}: "
    return message[len(prefix) :] if message.startswith(prefix) else message
