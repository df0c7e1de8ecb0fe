"""The tracing protocol: intrinsics, the trace stack and the ``IrTrace`` base class.

An *intrinsic* is a Python object that stands for IR (a value, a global, a callable) while a Python
function is traced into a ``func.func``. Operations on intrinsics ask the *current trace* (the
innermost ``IrTrace`` on a thread-local stack) where to emit IR.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from turbine_ir import FunctionBuilder
from turbine_ir.ir import StringAttr

from ._errors import ProcedureTraceError

if TYPE_CHECKING:
    from turbine_ir import ModuleBuilder
    from turbine_ir.ir import Value

__all__ = [
    "CallableIntrinsic",
    "Intrinsic",
    "IrTrace",
    "current_ir_trace",
    "new_ir_trace_scope",
]

_thread_state = threading.local()


def _trace_stack() -> list[IrTrace]:
    try:
        return _thread_state.stack
    except AttributeError:
        stack: list[IrTrace] = []
        _thread_state.stack = stack
        return stack


def current_ir_trace() -> IrTrace:
    """Returns the innermost active trace of this thread.

    Raises:
        ProcedureTraceError: if no trace is active (an intrinsic was used outside of a
            procedure being traced).
    """
    stack = _trace_stack()
    if not stack:
        raise ProcedureTraceError(
            "no procedural trace is active: IR intrinsics (IREE.*, Ir* values, globals) can only "
            "be used while a procedure is being traced (ProcedureTrace.trace_py_func or a "
            "CompiledModule export)"
        )
    return stack[-1]


@contextmanager
def new_ir_trace_scope(ir_trace: IrTrace) -> Iterator[IrTrace]:
    """Makes ``ir_trace`` the current trace for the ``with`` block.

    On exit the trace is popped and its ``finalize()`` is called (also when the block raised, so
    that no trace is left dangling on the stack).
    """
    stack = _trace_stack()
    stack.append(ir_trace)
    try:
        yield ir_trace
    finally:
        popped = stack.pop()
        assert popped is ir_trace, "trace stack corrupted"
        ir_trace.finalize()


class Intrinsic:
    """Objects which interact natively with the tracing system implement this.

    Subclasses override ``resolve_ir_values`` (materialize as IR values), and optionally
    ``resolve_call`` (for ``CallableIntrinsic``) and ``resolve_assignment`` (assignable
    intrinsics such as mutable globals).
    """

    __slots__ = ()

    def resolve_ir_values(self, proc_trace: IrTrace) -> Sequence[Value]:
        """Emits (if needed) and returns the IR values this intrinsic stands for."""
        raise ProcedureTraceError(
            f"procedure {_trace_name(proc_trace)}: {self!r} cannot be used as an IR value"
        )

    def resolve_call(self, proc_trace: IrTrace, *args: Any, **kwargs: Any) -> Any:
        """Emits a call of this intrinsic; only ``CallableIntrinsic`` supports it."""
        raise ProcedureTraceError(f"procedure {_trace_name(proc_trace)}: {self!r} is not callable")

    def resolve_assignment(self, proc_trace: IrTrace, ir_values: Sequence[Value]) -> None:
        """Emits an assignment of ``ir_values`` to this intrinsic (e.g. a global store)."""
        raise ProcedureTraceError(
            f"procedure {_trace_name(proc_trace)}: {self!r} cannot be assigned to"
        )

    @property
    def ir_values(self) -> Sequence[Value]:
        """The IR values, materialized at the current trace's insertion point."""
        trace = current_ir_trace()
        with trace.loc, trace.ip:
            return self.resolve_ir_values(trace)

    @property
    def ir_value(self) -> Value:
        """The single IR value of this intrinsic (an error if it has zero or several)."""
        values = self.ir_values
        if len(values) != 1:
            raise ProcedureTraceError(
                f"procedure {_trace_name(current_ir_trace())}: {self!r} stands for "
                f"{len(values)} IR values where exactly one is needed"
            )
        return values[0]


class CallableIntrinsic(Intrinsic):
    """Intrinsic subclass that supports calls.

    Calling it inside a trace delegates to ``current_ir_trace().handle_call(self, args, kwargs)``,
    which for a ``ProcedureTrace`` calls ``self.resolve_call(trace, *args, **kwargs)``
    (this is how ``jittable`` functions are called from procedures).
    """

    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return current_ir_trace().handle_call(self, args, kwargs)


class IrTrace(FunctionBuilder):
    """Gets callbacks for tracing events.

    An ``IrTrace`` is a ``FunctionBuilder`` (``ip``, ``loc``, ``context``, ``emit_return``) that is
    pushed on the trace stack while its function body is built.

    Args:
        module_builder: The module under construction.
        func_op: The ``func.func`` whose entry block receives the traced IR.
    """

    def __init__(self, *, module_builder: ModuleBuilder, func_op: Any):
        super().__init__(module_builder=module_builder, func_op=func_op)

    @property
    def name(self) -> str:
        """The symbol name of the function being traced (for messages)."""
        try:
            return StringAttr(self.func_op.attributes["sym_name"]).value
        except Exception:
            return "<unknown>"

    def finalize(self) -> None:
        """Called when the trace is finished (popped off the stack)."""

    def handle_call(self, target: Intrinsic, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Called for ``target(*args, **kwargs)`` on a ``CallableIntrinsic``."""
        raise ProcedureTraceError(
            f"procedure {self.name!r}: calls of {target!r} are not supported by "
            f"{type(self).__name__}"
        )

    def handle_assignment(self, scope: Any, target: Any, updated_value: Any) -> None:
        """Called when ``updated_value`` is assigned to an intrinsic ``target``."""
        raise ProcedureTraceError(
            f"procedure {self.name!r}: assignment to {target!r} is not supported by "
            f"{type(self).__name__}"
        )


def _trace_name(trace: Any) -> str:
    name = getattr(trace, "name", None)
    return repr(name) if name else "<unknown>"
