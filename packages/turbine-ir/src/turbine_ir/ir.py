"""Everything from ``iree.compiler.ir`` (the MLIR Python bindings IREE ships).

Other turbine packages import MLIR through this module, never from ``iree.compiler`` directly::

    from turbine_ir.ir import Context, Location, InsertionPoint, Module, RankedTensorType
"""

from __future__ import annotations

from iree.compiler.ir import *  # noqa: F403
from iree.compiler.ir import (  # noqa: F401  (names used by turbine and not always in `*`)
    Attribute,
    BF16Type,
    Block,
    ComplexType,
    Context,
    DenseElementsAttr,
    DenseResourceElementsAttr,
    DictAttr,
    F16Type,
    F32Type,
    F64Type,
    FlatSymbolRefAttr,
    FloatAttr,
    FunctionType,
    IndexType,
    InsertionPoint,
    IntegerAttr,
    IntegerType,
    Location,
    MLIRError,
    Module,
    Operation,
    RankedTensorType,
    ShapedType,
    StringAttr,
    SymbolTable,
    Type,
    TypeAttr,
    UnitAttr,
    Value,
)
