"""Torch dtypes and torch-dialect types as builtin MLIR types, and back.

:class:`TypeCache` holds a context's common types (one per module builder);
:class:`NativeTypeConverter` maps ``!torch.vtensor<[2,?],si64>`` ↔ ``tensor<2x?xi64>`` and the
torch scalar types, reading type strings with :class:`~turbine_ir.VtensorType`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from iree.compiler import ir

from ._dtypes import (
    element_type_to_torch_dtype,
    torch_dtype_to_element_type,
    torch_tensor_type,
    vtensor_type_asm,
)
from ._ir_helpers import as_ranked_tensor
from ._vtensor import VtensorType

__all__ = ["NativeTypeConverter", "TypeCache"]


class TypeCache:
    """Per-context cache of common types (torch dtype → element type, index, i1/i64 …)."""

    __slots__ = ("_dtype_types", "context", "f32", "f64", "i1", "i32", "i64", "index")

    def __init__(self, context: ir.Context):
        self.context = context
        self._dtype_types: dict[torch.dtype, ir.Type] = {}
        with context:
            self.index = ir.IndexType.get()
            self.i1 = ir.IntegerType.get_signless(1)
            self.i32 = ir.IntegerType.get_signless(32)
            self.i64 = ir.IntegerType.get_signless(64)
            self.f32 = ir.F32Type.get()
            self.f64 = ir.F64Type.get()

    def torch_dtype_to_iree_type(self, dtype: torch.dtype) -> ir.Type:
        t = self._dtype_types.get(dtype)
        if t is None:
            t = self._dtype_types[dtype] = torch_dtype_to_element_type(dtype, self.context)
        return t

    def tensor_type(self, shape: Sequence[int | None], dtype: torch.dtype) -> ir.RankedTensorType:
        return torch_tensor_type(shape, dtype, self.context)


_TORCH_SCALARS = {"!torch.int": "i64", "!torch.float": "f64", "!torch.bool": "i1"}


class NativeTypeConverter:
    """Converts torch-dialect types to builtin ("native") types and back.

    ``!torch.vtensor<[2,?],si64>`` ↔ ``tensor<2x?xi64>``; ``!torch.int`` → ``i64``,
    ``!torch.float`` → ``f64``, ``!torch.bool`` → ``i1``. Builtin types pass through.
    """

    def __init__(self, context: ir.Context):
        self._context = context

    def torch_type_to_native(self, torch_type: ir.Type, *, signless: bool = True) -> ir.Type:
        asm = str(torch_type)
        if asm in _TORCH_SCALARS:
            return ir.Type.parse(_TORCH_SCALARS[asm], self._context)
        if asm.startswith("!torch.tensor<"):
            # A non-value tensor converts like its value-semantics twin.
            asm = "!torch.vtensor<" + asm[len("!torch.tensor<") :]
        vt = VtensorType.parse(asm)
        if vt is None:
            return torch_type
        dims, elt = list(vt.sizes), vt.dtype
        dtype = element_type_to_torch_dtype(elt)
        if signless:
            return torch_tensor_type(dims, dtype, self._context)
        ttype = torch_tensor_type(dims, dtype, self._context)
        return ir.RankedTensorType.get(
            ttype.shape, ir.Type.parse(elt, self._context), loc=ir.Location.unknown(self._context)
        )

    def native_type_to_torch(self, native_type: ir.Type) -> ir.Type:
        """``tensor<2x?xi64>`` → ``!torch.vtensor<[2,?],si64>`` (signless ints read as signed)."""
        rt = as_ranked_tensor(native_type)
        if rt is not None:
            dtype = element_type_to_torch_dtype(rt.element_type)
            dims = [None if rt.is_dynamic_dim(i) else rt.shape[i] for i in range(rt.rank)]
            return ir.Type.parse(vtensor_type_asm(dims, dtype), self._context)
        for torch_asm, native_asm in _TORCH_SCALARS.items():
            if str(native_type) == native_asm:
                return ir.Type.parse(torch_asm, self._context)
        return native_type
