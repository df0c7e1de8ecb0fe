"""jittable: call a PyTorch function from a procedural trace.

Inside a procedure (``turbine_trace.ProcedureTrace``), calling a ``jittable`` function exports it
with ``torch.export`` on stand-in tensors of the arguments' shapes and dtypes (dynamic IR
dimensions become dynamic export dimensions), imports the program once per distinct signature as
a private function of the module, and emits a ``func.call`` to it. Tensors the function captures
are inlined as ``torch.vtensor.literal`` ops of one ``torch_tensor_<dims>_<dtype>`` blob per tensor
(shared by every function that captures it), as the reference does; a captured tensor that is
already a global of the module (``export_parameters``) is loaded from it.
"""

from __future__ import annotations

import inspect
import logging
import re
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from turbine_ir.ir import FlatSymbolRefAttr, Operation, StringAttr
from turbine_trace import (
    CallableIntrinsic,
    IrScalar,
    IrTensor,
    current_ir_trace,
)

from ._decompositions import current_aot_decompositions, resolve_decomposition_ops
from ._errors import JittableError
from ._export_guards import is_constraint_violation, unproven_guards
from ._importer import import_exported_program
from ._program_results import (
    builtin_results,
    constant_results,
    user_output_dtypes,
    with_constant_results,
)

__all__ = ["jittable"]

_KNOWN_PASSES = ("functorch_functionalize",)

logger = logging.getLogger("turbine.fx")


class _FlatModule(torch.nn.Module):
    """``forward(*tensors)`` rebuilds the original call (constants baked in) and calls ``f``."""

    def __init__(self, f: Callable, flat: list[Any], tensor_positions: list[int], spec: Any):
        super().__init__()
        self._f = f
        self._flat = flat
        self._positions = tensor_positions
        self._spec = spec

    def forward(self, *tensors):
        flat = list(self._flat)
        for p, t in zip(self._positions, tensors):
            flat[p] = t
        args, kwargs = pytree.tree_unflatten(flat, self._spec)
        return self._f(*args, **kwargs)


class jittable(CallableIntrinsic):
    """Decorator which takes a PyTorch function and makes it callable from tracing.

    It will be internally exported (``torch.export``) and imported into the module as needed:
    once per distinct argument signature (shapes with dynamic dimensions, dtypes, structure and
    constant arguments) per module.

    Outside a trace, calling it calls the function eagerly.

    Args:
        wrapped_f: The torch function.
        decompose_ops: Extra ops to decompose (added to the current AOT table; an op torch has
            no decomposition for is skipped, as with ``extend_aot_decompositions``).
        decomposition_table: A table to use instead of the current AOT table.
        dynamic_shapes: ``torch.export`` dynamic shapes by argument name (a tuple of them for
            a ``*args`` parameter), or by torch's graph-placeholder name ``arg<N>_1``: the N-th
            tensor argument in flattened order. Added to the dynamic dimensions the traced
            arguments already have.
        function_name: Name of the private function(s) (default: ``wrapped_f.__name__``).
        passes: Pass names to apply; ``"functorch_functionalize"`` is what the import always does
            for programs that mutate (``torch.export`` + functionalization), so it is accepted.

    Example:
        >>> @jittable
        ... def scale_add(x, y):
        ...     return x * 2 + y
    """

    def __init__(
        self,
        wrapped_f: Callable,
        *,
        decompose_ops: list[Any] | None = None,
        decomposition_table: dict[Any, Callable] | None = None,
        dynamic_shapes: dict[str, Any] | None = None,
        function_name: str | None = None,
        passes: Sequence[str] = ("functorch_functionalize",),
    ):
        if not callable(wrapped_f):
            raise JittableError(f"jittable needs a callable, got {type(wrapped_f).__name__}")
        unknown = [p for p in passes if p not in _KNOWN_PASSES]
        if unknown:
            raise JittableError(
                f"jittable({getattr(wrapped_f, '__name__', wrapped_f)!r}): unknown passes "
                f"{unknown}; valid: {list(_KNOWN_PASSES)}"
            )
        self.wrapped_f = wrapped_f
        self.decompose_ops = list(decompose_ops or [])
        self.decomposition_table = decomposition_table
        self.dynamic_shapes = dict(dynamic_shapes or {})
        self.function_name: str = function_name or str(getattr(wrapped_f, "__name__", "jittable"))
        self.passes = tuple(passes)
        # module builder -> signature key -> (symbol, arg types, result info, out spec). Keyed
        # weakly by the builder itself: an id() key outlives the builder (its MLIR types keep
        # the context alive) and a new builder at the same address would reuse a stale symbol.
        self._imported: weakref.WeakKeyDictionary[Any, dict[tuple, tuple]] = (
            weakref.WeakKeyDictionary()
        )
        self.__doc__ = getattr(wrapped_f, "__doc__", None)

    def __repr__(self) -> str:
        return f"jittable({self.function_name})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            trace = current_ir_trace()
        except Exception:
            return self.wrapped_f(*args, **kwargs)
        return trace.handle_call(self, args, kwargs)

    # ---------------------------------------------------------------------------------------

    def _table(self) -> dict[Any, Callable]:
        table = (
            dict(self.decomposition_table)
            if self.decomposition_table is not None
            else current_aot_decompositions()
        )
        if self.decompose_ops:
            table.update(resolve_decomposition_ops(self.decompose_ops, skip_missing=True))
        return table

    def resolve_call(
        self,
        proc_trace: Any,
        *py_args: Any,
        dynamic_shapes: dict[str, Any] | None = None,
        **py_kwargs: Any,
    ) -> Any:
        """Exports (once per signature), imports and calls the function from ``proc_trace``.

        Returns:
            The function's result tree with ``IrImmediateTensor``/``IrImmediateScalar`` leaves.
        """
        mb = proc_trace.module_builder
        flat, spec = pytree.tree_flatten((list(py_args), dict(py_kwargs)))
        positions: list[int] = []
        examples: list[torch.Tensor] = []
        dyn_specs: list[dict[int, Any] | None] = []
        ir_leaves: list[IrTensor] = []
        named_dims = self._named_dynamic_dims(py_args, py_kwargs, dynamic_shapes)
        for i, leaf in enumerate(flat):
            if isinstance(leaf, IrTensor):
                if leaf.dtype is None:
                    raise JittableError(
                        f"{self!r}: argument {i} has element type {leaf.element_type}, which has "
                        "no torch dtype"
                    )
                dims = {d: torch.export.Dim.DYNAMIC for d in leaf.dynamic_dim_indices}
                dims.update(named_dims.get(id(leaf), {}))
                shape = [7 + d if s is None else s for d, s in enumerate(leaf.shape)]
                examples.append(torch.empty(shape, dtype=leaf.dtype))
                dyn_specs.append(dims or None)
                positions.append(i)
                ir_leaves.append(leaf)
            elif isinstance(leaf, IrScalar):
                raise JittableError(
                    f"{self!r}: argument {i} is an IR scalar ({leaf!r}); pass scalars to a "
                    "jittable as Python constants or 0-d tensors"
                )
            elif isinstance(leaf, torch.Tensor):
                raise JittableError(
                    f"{self!r}: argument {i} is a concrete torch.Tensor; capture it in the "
                    "function (it becomes a global) or pass an IR tensor"
                )
        constants = [None if i in positions else leaf for i, leaf in enumerate(flat)]
        key = (
            str(spec),
            tuple((tuple(t.shape), str(t.dtype), tuple(t.dynamic_dim_indices)) for t in ir_leaves),
            repr(constants),
            repr(sorted((k, repr(v)) for k, v in named_dims.items())),
        )
        imported = self._imported.setdefault(mb, {})
        cached = imported.get(key)
        if cached is None:
            cached = self._export_and_import(
                mb, flat, positions, spec, examples, dyn_specs, constants
            )
            imported[key] = cached
        symbol, arg_types, result_info, out_spec = cached
        return self._emit_call(proc_trace, symbol, arg_types, ir_leaves, result_info, out_spec)

    def _named_dynamic_dims(self, py_args, py_kwargs, extra) -> dict[int, dict[int, Any]]:
        """Maps id(IR tensor argument) → {dim: Dim} from ``dynamic_shapes``.

        A key is a parameter name of the function (its value: the dims of that tensor, or a
        matching tuple/list of them for a ``*args`` or sequence parameter), or torch's
        graph-placeholder name ``arg<N>_1``: the N-th *tensor* argument after flattening (so
        ``forward(token, *state)`` called with 1 + 4 tensors has ``arg0_1`` .. ``arg4_1``), as
        the reference's jittable names them.
        """
        shapes = {**self.dynamic_shapes, **(extra or {})}
        if not shapes:
            return {}
        try:
            bound = inspect.signature(self.wrapped_f).bind(*py_args, **py_kwargs)
        except TypeError as e:
            raise JittableError(f"{self!r}: {e}") from None
        flat, _ = pytree.tree_flatten((list(py_args), dict(py_kwargs)))
        tensors = [leaf for leaf in flat if isinstance(leaf, IrTensor)]
        out: dict[int, dict[int, Any]] = {}
        for name, dims in shapes.items():
            placeholder = re.fullmatch(r"arg(\d+)_1", name)
            if name in bound.arguments:
                self._match_named_dims(name, bound.arguments[name], dims, out)
            elif placeholder is not None and int(placeholder.group(1)) < len(tensors):
                if dims:
                    out[id(tensors[int(placeholder.group(1))])] = self._tensor_dims(name, dims)
            else:
                positions = (
                    f"arg0_1 .. arg{len(tensors) - 1}_1 for its {len(tensors)} tensor "
                    "arguments in flattened order"
                    if tensors
                    else "it has no tensor arguments"
                )
                raise JittableError(
                    f"{self!r}: dynamic_shapes names argument {name!r}, but the function's "
                    f"arguments are {list(bound.arguments)} ({positions})"
                )
        return out

    def _match_named_dims(
        self, name: str, value: Any, dims: Any, out: dict[int, dict[int, Any]]
    ) -> None:
        """Records ``dims`` for the IR tensor(s) of the argument ``name``."""
        if not dims:
            return
        if isinstance(value, IrTensor):
            out[id(value)] = self._tensor_dims(name, dims)
            return
        if isinstance(value, (tuple, list)) and isinstance(dims, (tuple, list)):
            if len(dims) != len(value):
                raise JittableError(
                    f"{self!r}: dynamic_shapes[{name!r}] has {len(dims)} entries, but the "
                    f"argument holds {len(value)} values; give one entry (a dict or None) "
                    "per value"
                )
            for i, (v, d) in enumerate(zip(value, dims, strict=True)):
                self._match_named_dims(f"{name}[{i}]", v, d, out)

    def _tensor_dims(self, name: str, dims: Any) -> dict[int, Any]:
        """One tensor's dynamic dims as torch takes them: ``{dim: Dim}`` or one entry per dim."""
        if isinstance(dims, dict):
            return dict(dims)
        if isinstance(dims, (tuple, list)):
            return {i: d for i, d in enumerate(dims) if d is not None}
        raise JittableError(
            f"{self!r}: dynamic_shapes[{name!r}] is {dims!r}; give a tensor's dynamic dimensions "
            "as {dim: Dim} or as one entry (a Dim or None) per dimension"
        )

    def _export_and_import(self, mb, flat, positions, spec, examples, dyn_specs, constants):
        module = _FlatModule(self.wrapped_f, constants, positions, spec)
        program = self._export(module, examples, (tuple(dyn_specs),) if any(dyn_specs) else None)
        with mb.context:
            func_op = import_exported_program(
                mb,
                program,
                symbol_name=self.function_name,
                symbol_visibility="private",
                decomposition_table=self._table(),
                inline_constants=True,
            )
            symbol = StringAttr(func_op.attributes["sym_name"]).value
            ftype = func_op.type
            arg_types = list(ftype.inputs)
            result_types = list(ftype.results)
            constants = constant_results(func_op)
        dtypes = user_output_dtypes(program)
        result_info = {"types": result_types, "dtypes": dtypes, "constants": constants}
        return symbol, arg_types, result_info, program.call_spec.out_spec

    def _export(self, module, examples, dynamic_shapes):
        """``torch.export.export(strict=False)``; on a "Constraints violated" refusal, the
        re-export with the unproven guards as assertions, kept when each holds over the declared
        ranges (``_export_guards``: what the reference's dynamo-based export accepts)."""
        shapes = [tuple(t.shape) for t in examples]
        try:
            return torch.export.export(
                module, tuple(examples), dynamic_shapes=dynamic_shapes, strict=False
            )
        except Exception as e:
            if dynamic_shapes is None or not is_constraint_violation(e):
                raise JittableError(
                    f"{self!r}: torch.export failed for argument shapes {shapes}: "
                    f"{type(e).__name__}: {e}"
                ) from e
            refusal = e
        try:
            program = torch.export.export(
                module,
                tuple(examples),
                dynamic_shapes=dynamic_shapes,
                strict=False,
                prefer_deferred_runtime_asserts_over_guards=True,
            )
        except Exception:
            program = None
        unproven = []
        if program is not None:
            unproven = unproven_guards(program.graph, program.range_constraints)
            if not unproven:
                logger.info(
                    "%r: torch.export could not prove some shape guards over the declared "
                    "ranges; each holds at every point of them (checked), exported with them as "
                    "assertions that import removes",
                    self,
                )
                return program
        checked = (
            "; turbine checked the guards over the declared ranges: "
            + "; ".join(str(u) for u in unproven)
            if unproven
            else ""
        )
        raise JittableError(
            f"{self!r}: torch.export failed for argument shapes {shapes}: "
            f"{type(refusal).__name__}: {refusal}{checked}"
        ) from refusal

    def _emit_call(self, proc_trace, symbol, arg_types, ir_leaves, result_info, out_spec):
        mb = proc_trace.module_builder
        conv = mb.native_type_converter
        with proc_trace.context, proc_trace.loc, proc_trace.ip:
            operands = []
            for leaf, arg_type in zip(ir_leaves, arg_types):
                value = leaf.ir_value
                builtin_type = conv.torch_type_to_native(arg_type)
                if str(value.type) != str(builtin_type):
                    value = Operation.create(
                        "tensor.cast", results=[builtin_type], operands=[value]
                    ).result
                operands.append(
                    Operation.create(
                        "torch_c.from_builtin_tensor", results=[arg_type], operands=[value]
                    ).result
                )
            call = Operation.create(
                "func.call",
                results=result_info["types"],
                operands=operands,
                attributes={"callee": FlatSymbolRefAttr.get(symbol)},
            )
            results = builtin_results(
                call.results,
                result_info["dtypes"],
                conv,
                unsupported=lambda _, asm: JittableError(
                    f"{self!r}: cannot return a value of type {asm}"
                ),
            )
        flat = with_constant_results(results, result_info["constants"])
        if out_spec is None:
            return flat[0] if len(flat) == 1 else tuple(flat)
        return pytree.tree_unflatten(flat, out_spec)
