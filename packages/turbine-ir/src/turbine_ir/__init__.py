"""turbine_ir: the MLIR layer of turbine.

The only package that imports ``iree.compiler.ir``, its dialects and the pass manager; others use
:mod:`turbine_ir.ir`, :mod:`turbine_ir.dialects` and :mod:`turbine_ir.passmanager`. Provides the
torch dtype ↔ MLIR element type mapping, tensor → dense resource attributes, and the builders
every export path uses (:class:`ModuleBuilder`, :class:`GlobalAttributes`,
:class:`FunctionBuilder`), and the one parser of torch-dialect tensor type strings
(:class:`VtensorType`).
"""

from __future__ import annotations

from . import dialects, ir, passmanager
from ._affinity import (
    AFFINITY_ARG_ATTR,
    GLOBAL_AFFINITY_ATTR,
    attributes_from_argument_device_affinities,
    device_promise_asm,
    device_promise_attr,
)
from ._checks import reshape_element_count_errors
from ._dtypes import (
    IREE_TYPE_ASM_TO_TORCH_DTYPE,
    SIGNED_MLIR_TYPE_ASM_TO_TORCH_DTYPE,
    TORCH_DTYPE_TO_IREE_TYPE_ASM,
    TORCH_DTYPE_TO_SIGNED_MLIR_TYPE_ASM,
    element_type_to_torch_dtype,
    tensor_type_asm,
    torch_dtype_to_element_asm,
    torch_dtype_to_element_type,
    torch_dtype_to_vtensor_element_asm,
    torch_tensor_type,
    torch_vtensor_type,
    vtensor_type_asm,
)
from ._errors import IrBuildError, TurbineIrError, UnsupportedDtypeError
from ._global_attrs import DEFAULT_PARAMETER_SCOPE, GlobalAttributes
from ._ir_helpers import build_index_constant, build_tensor_dim_value
from ._module_builder import FunctionBuilder, ModuleBuilder, ModuleBuilderOptions
from ._ref_tracker import Empty, EmptyType, RefMapping, RefTracker, tensor_storage_key
from ._resources import (
    RESOURCE_ALIGNMENT,
    tensor_to_bytes,
    tensor_to_dense_attr,
    tensor_to_dense_resource_attr,
)
from ._type_conversion import NativeTypeConverter, TypeCache
from ._vtensor import VtensorType

__all__ = [
    "AFFINITY_ARG_ATTR",
    "DEFAULT_PARAMETER_SCOPE",
    "GLOBAL_AFFINITY_ATTR",
    "IREE_TYPE_ASM_TO_TORCH_DTYPE",
    "RESOURCE_ALIGNMENT",
    "SIGNED_MLIR_TYPE_ASM_TO_TORCH_DTYPE",
    "TORCH_DTYPE_TO_IREE_TYPE_ASM",
    "TORCH_DTYPE_TO_SIGNED_MLIR_TYPE_ASM",
    "Empty",
    "EmptyType",
    "FunctionBuilder",
    "GlobalAttributes",
    "IrBuildError",
    "ModuleBuilder",
    "ModuleBuilderOptions",
    "NativeTypeConverter",
    "RefMapping",
    "RefTracker",
    "TurbineIrError",
    "TypeCache",
    "UnsupportedDtypeError",
    "VtensorType",
    "attributes_from_argument_device_affinities",
    "build_index_constant",
    "build_tensor_dim_value",
    "device_promise_asm",
    "device_promise_attr",
    "dialects",
    "element_type_to_torch_dtype",
    "ir",
    "passmanager",
    "reshape_element_count_errors",
    "tensor_storage_key",
    "tensor_to_bytes",
    "tensor_to_dense_attr",
    "tensor_to_dense_resource_attr",
    "tensor_type_asm",
    "torch_dtype_to_element_asm",
    "torch_dtype_to_element_type",
    "torch_dtype_to_vtensor_element_asm",
    "torch_tensor_type",
    "torch_vtensor_type",
    "vtensor_type_asm",
]
__version__ = "0.1.0"
