"""Checks of built IR that the MLIR verifiers of IREE 3.13 do not make."""

from __future__ import annotations

from typing import Any

from . import ir

__all__ = ["reshape_element_count_errors"]


def reshape_element_count_errors(root: Any) -> list[str]:
    """One message per ``flow.tensor.reshape`` under ``root`` whose static source and result
    shapes hold different numbers of elements.

    IREE 3.13's verifier accepts ``flow.tensor.reshape %x : tensor<2x3xf32> -> tensor<5xf32>``
    (and the compiler then fails far from the cause or reads out of bounds), so builders check
    it themselves. Reshapes with a dynamic dimension are not checked (sizes are only known at
    run time).
    """
    errors: list[str] = []
    for op in _walk(root.operation if hasattr(root, "operation") else root):
        if op.name != "flow.tensor.reshape":
            continue
        src = ir.RankedTensorType(op.operands[0].type)
        dst = ir.RankedTensorType(op.results[0].type)
        if not (src.has_static_shape and dst.has_static_shape):
            continue
        n_src, n_dst = _numel(src.shape), _numel(dst.shape)
        if n_src != n_dst:
            errors.append(
                f"{op.location}: flow.tensor.reshape of {src} ({n_src} elements) to {dst} "
                f"({n_dst} elements): a reshape keeps the number of elements; fix the result "
                "dimensions (IREE.tensor_reshape(source, *result_dims))"
            )
    return errors


def _walk(op: Any) -> Any:
    yield op
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield from _walk(child.operation)


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
