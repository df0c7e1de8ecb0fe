"""``turbine_aot.support.procedural``: the procedural tracing toolkit under its reference path.

Everything here is re-exported from ``turbine_trace`` (tracing, abstract types, globals,
``IREEEmitter``), ``turbine_ir`` (``ModuleBuilder``, ``GlobalAttributes``, MLIR types) and
``turbine_params`` (``DeviceAffinity``), so that code written against
``iree.turbine.aot.support.procedural`` works unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, cast

from turbine_ir import (
    Empty,
    FunctionBuilder,
    GlobalAttributes,
    ModuleBuilder,
    attributes_from_argument_device_affinities,
    build_tensor_dim_value,
)
from turbine_ir.ir import (
    DictAttr,
    F32Type,
    F64Type,
    IndexType,
    IntegerType,
    Location,
    Operation,
    RankedTensorType,
    ShapedType,
    StringAttr,
    Type,
    Value,
)
from turbine_params import DeviceAffinity
from turbine_trace import (
    Abstractifiable,
    AbstractIntrinsic,
    AbstractScalar,
    AbstractTensor,
    AbstractTypedef,
    CallableIntrinsic,
    GlobalsDef,
    Intrinsic,
    IREEEmitter,
    IrGlobalScalar,
    IrGlobalTensor,
    IrImmediateScalar,
    IrImmediateTensor,
    IrScalar,
    IrTensor,
    IrTrace,
    LiveGlobalCollectionProxy,
    MaterializedGlobal,
    ProcedureTrace,
    ProcedureTraceError,
    TreeAbstractifiable,
    TreeSpec,
    abstractify,
    abstractify_single_value,
    convert_py_value_to_ir,
    current_ir_trace,
    export_buffers,
    export_global,
    export_global_tree,
    export_parameters,
    new_ir_trace_scope,
    tree_flatten,
    tree_map,
)

#: Alias of the MLIR ``Type`` class.
IrType = Type
#: The type of the ``Empty`` sentinel.
EmptyType = type(Empty)

__all__ = [
    "AbstractIntrinsic",
    "AbstractScalar",
    "AbstractTensor",
    "AbstractTypedef",
    "Abstractifiable",
    "Any",
    "CallableIntrinsic",
    "DeviceAffinity",
    "DictAttr",
    "EmptyType",
    "F32Type",
    "F64Type",
    "FunctionBuilder",
    "GlobalAttributes",
    "GlobalsDef",
    "IREEEmitter",
    "IndexType",
    "IntegerType",
    "Intrinsic",
    "IrGlobalScalar",
    "IrGlobalTensor",
    "IrImmediateScalar",
    "IrImmediateTensor",
    "IrScalar",
    "IrTensor",
    "IrTrace",
    "IrType",
    "LiveGlobalCollectionProxy",
    "Location",
    "MaterializedGlobal",
    "ModuleBuilder",
    "Operation",
    "ProcedureTrace",
    "ProcedureTraceError",
    "RankedTensorType",
    "ShapedType",
    "StringAttr",
    "TreeAbstractifiable",
    "TreeSpec",
    "Value",
    "abstractify",
    "abstractify_single_value",
    "attributes_from_argument_device_affinities",
    "build_tensor_dim_value",
    "cast",
    "contextmanager",
    "convert_py_value_to_ir",
    "current_ir_trace",
    "export_buffers",
    "export_global",
    "export_global_tree",
    "export_parameters",
    "new_ir_trace_scope",
    "tree_flatten",
    "tree_map",
]
