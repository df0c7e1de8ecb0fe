"""turbine_trace: procedural tracing of Python functions into IREE IR.

A *procedure* is a Python function over intrinsics (``IrTensor``, ``IrScalar``, globals) that is
traced once into a ``func.func``: ``ProcedureTrace.define_func`` declares it from abstract
argument types (``AbstractTensor``, ``AbstractI64``, …), ``trace_py_func`` runs the Python
function and emits its return. ``IREE`` (an ``IREEEmitter``) provides IREE tensor operations that
work with static and dynamic shapes; ``export_global`` and friends describe globals.
"""

from __future__ import annotations

from turbine_ir.ir import Type

from ._abstract import (
    AbstractBool,
    AbstractF32,
    AbstractF64,
    AbstractI32,
    AbstractI64,
    Abstractifiable,
    AbstractifyError,
    AbstractIndex,
    AbstractIntrinsic,
    AbstractScalar,
    AbstractTensor,
    AbstractTypedef,
    TreeAbstractifiable,
    abstractify,
    abstractify_single_value,
)
from ._base import CallableIntrinsic, Intrinsic, IrTrace, current_ir_trace, new_ir_trace_scope
from ._emitter import IREE, IREEEmitter
from ._errors import ProcedureTraceError, TraceError
from ._global_intrinsics import IrGlobalScalar, IrGlobalTensor
from ._globals import (
    GlobalsDef,
    GlobalsDefError,
    export_buffers,
    export_global,
    export_global_tree,
    export_parameters,
)
from ._live_globals import LiveGlobalCollectionProxy
from ._primitives import (
    IrImmediateScalar,
    IrImmediateTensor,
    IrScalar,
    IrTensor,
    MaterializedGlobal,
    convert_py_value_to_ir,
)
from ._procedure import ProcedureTrace
from ._tree import TreeSpec, tree_flatten, tree_map, tree_unflatten, treespec_dumps

IrType = Type

__all__ = [
    "IREE",
    "AbstractBool",
    "AbstractF32",
    "AbstractF64",
    "AbstractI32",
    "AbstractI64",
    "AbstractIndex",
    "AbstractIntrinsic",
    "AbstractScalar",
    "AbstractTensor",
    "AbstractTypedef",
    "Abstractifiable",
    "AbstractifyError",
    "CallableIntrinsic",
    "GlobalsDef",
    "GlobalsDefError",
    "IREEEmitter",
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
    "MaterializedGlobal",
    "ProcedureTrace",
    "ProcedureTraceError",
    "TraceError",
    "TreeAbstractifiable",
    "TreeSpec",
    "abstractify",
    "abstractify_single_value",
    "convert_py_value_to_ir",
    "current_ir_trace",
    "export_buffers",
    "export_global",
    "export_global_tree",
    "export_parameters",
    "new_ir_trace_scope",
    "tree_flatten",
    "tree_map",
    "tree_unflatten",
    "treespec_dumps",
]
__version__ = "0.1.0"
