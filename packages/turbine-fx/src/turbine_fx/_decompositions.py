"""The AOT decomposition table: which torch ops are decomposed before import.

IREE's torch frontend lowers most ATen ops directly (and decomposes many itself), so the default
table is deliberately small: it holds the ops that typical models (MLPs, CNNs, transformer decoders
with SDPA) produce and that IREE 3.13 cannot lower as they are (measured by compiling each op; see
``docs/turbine-fx.md``). A small table is also what keeps export fast: a program whose graph holds
none of these ops is imported without re-tracing (see ``_program_prep``).

The current table is thread-local and scoped with :func:`extend_aot_decompositions`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch._decomp import get_decompositions

from ._errors import DecompositionError
from ._turbine_decompositions import TURBINE_DECOMPOSITIONS

__all__ = [
    "DEFAULT_DECOMPOSITION_OPS",
    "current_aot_decompositions",
    "extend_aot_decompositions",
    "resolve_decomposition_ops",
]

_aten = torch.ops.aten
logger = logging.getLogger("turbine.fx")

#: Ops decomposed by default. Each entry was found to fail ``iree-compile --iree-input-type=torch``
#: (iree-base-compiler 3.13) when imported as is, and to compile once decomposed.
DEFAULT_DECOMPOSITION_OPS: tuple[Any, ...] = (
    # batch_norm becomes this op whenever a program is functionalized (mutating programs).
    _aten._native_batch_norm_legit_no_training.default,
    _aten._native_batch_norm_legit.default,
    _aten._native_batch_norm_legit.no_stats,
    _aten._native_batch_norm_legit_functional.default,
    _aten.instance_norm.default,
    _aten.upsample_bilinear2d.vec,
    _aten.upsample_bilinear2d.default,
    _aten._unsafe_index.Tensor,
    _aten.logsumexp.default,
    # Not registered in IREE's torch dialect (imported as torch.operator); several
    # decompositions (logsumexp, ...) produce it.
    _aten.squeeze.dims,
    # torch.nn.utils.parametrizations.weight_norm (audio models' Conv1d) calls _weight_norm,
    # which torch decomposes to this op; IREE 3.13 lowers it, for dim != 0, to a norm of dynamic
    # shape ("'tensor.cast' op operand type 'tensor<1x1x?xf32>' and result type
    # 'tensor<128x32x16xf32>' are cast incompatible"). torch's decomposition (v * g / ||v||
    # over the other dims, via linalg_vector_norm) stays static.
    _aten._weight_norm_interface.default,
    # Performance, not correctness (turbine's own form, _turbine_decompositions.py): N-d
    # linear compiles to batched matmuls; as a 2-d mm it is faster on every target measured.
    # scaled_dot_product_attention is *not* here: the exported IR keeps it (GPU targets want
    # IREE's fused attention op); turbine_aot rewrites it as matmul + softmax when compiling
    # for a CPU (IREE 3.13's CPU attention is ~50x slower than eager). Add it with
    # extend_aot_decompositions(add_ops=[aten.scaled_dot_product_attention]) to decompose it
    # at export time for every target.
    _aten.linear.default,
)

_DEFAULT_TABLE: dict[Any, Callable] | None = None
_tls = threading.local()


def _default_table() -> dict[Any, Callable]:
    global _DEFAULT_TABLE
    if _DEFAULT_TABLE is None:
        _DEFAULT_TABLE = resolve_decomposition_ops(DEFAULT_DECOMPOSITION_OPS)
    return _DEFAULT_TABLE


def _stack() -> list[dict[Any, Callable]]:
    stack = getattr(_tls, "stack", None)
    if stack is None:
        stack = _tls.stack = []
    return stack


def _overloads(op: Any) -> list[Any]:
    """The OpOverloads an op names (a packet names all of its overloads)."""
    if isinstance(op, torch._ops.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


def _has_composite_implicit_kernel(op: Any) -> bool:
    try:
        return bool(op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd))
    except Exception:
        return False


def resolve_decomposition_ops(
    ops: Sequence[Any], *, skip_missing: bool = False
) -> dict[Any, Callable]:
    """Builds a decomposition table for ``ops`` from torch's registered decompositions.

    turbine's own decompositions (``TURBINE_DECOMPOSITIONS``: SDPA as matmul + softmax, N-d
    ``linear`` as 2-d ``mm``, measured faster on IREE's CPU backend) take precedence.

    Args:
        ops: ``OpOverload`` or ``OpOverloadPacket`` objects (``torch.ops.aten.gelu``).
        skip_missing: Leave out an op torch has no decomposition for (logged at debug level),
            as the reference's ``extend_aot_decompositions(add_ops=...)`` and ``jittable``'s
            ``decompose_ops`` do, instead of raising.

    Returns:
        A dict from OpOverload to its decomposition function.

    Raises:
        DecompositionError: An op is not a torch op, or (unless ``skip_missing``) torch
            registers no decomposition for it.
    """
    table: dict[Any, Callable] = {}
    for op in ops:
        if not isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            raise DecompositionError(
                f"{op!r} is not a torch op: pass torch.ops.<namespace>.<op>[.<overload>] "
                f"(e.g. torch.ops.aten.gelu or torch.ops.aten.gelu.default)"
            )
        found = get_decompositions([op])
        for overload in _overloads(op):
            if overload in TURBINE_DECOMPOSITIONS:
                found[overload] = TURBINE_DECOMPOSITIONS[overload]
        for overload in _overloads(op):
            if overload not in found and _has_composite_implicit_kernel(overload):
                # CompositeImplicitAutograd ops decompose through their own kernel.
                found[overload] = overload.decompose
        if not found and skip_missing:
            logger.debug("no decomposition registered for %s: not added to the table", op)
            continue
        if not found:
            raise DecompositionError(
                f"torch has no registered decomposition for {op}; register one with "
                f"torch._decomp.register_decomposition, or pass an explicit decomposition_table"
            )
        table.update(found)
    return table


def current_aot_decompositions() -> dict[Any, Callable]:
    """Gets the current decomposition table for AOT export (a copy; edits do not leak).

    Returns:
        The table of the innermost active :func:`extend_aot_decompositions` scope on this thread,
        or the default table.
    """
    stack = _stack()
    return dict(stack[-1] if stack else _default_table())


@contextmanager
def extend_aot_decompositions(
    *,
    from_current: bool = True,
    add_ops: Sequence[Any] | None = None,
    remove_ops: Sequence[Any] | None = None,
) -> Iterator[dict[Any, Callable]]:
    """Context manager which extends the list of decompositions used for AOT.

    Scopes nest and are per thread. Every export path (nn.Module, ExportedProgram,
    FxProgramsBuilder, jittable) reads the table that is current when it runs.

    Args:
        from_current: Start from the current table (``True``) or from an empty one.
        add_ops: Ops (overloads or packets) to decompose in addition. An op torch has no
            decomposition for is skipped (a debug log line names it), as in the reference: the
            table gets the ops that have one.
        remove_ops: Ops (overloads or packets) to stop decomposing.

    Yields:
        The table in effect inside the scope.

    Example:
        >>> import torch
        >>> with extend_aot_decompositions(add_ops=[torch.ops.aten.gelu]):
        ...     torch.ops.aten.gelu.default in current_aot_decompositions()
        True
    """
    table = current_aot_decompositions() if from_current else {}
    if add_ops:
        table.update(resolve_decomposition_ops(add_ops, skip_missing=True))
    for op in remove_ops or ():
        for overload in _overloads(op):
            table.pop(overload, None)
    stack = _stack()
    stack.append(table)
    try:
        yield dict(table)
    finally:
        stack.pop()
