"""Abstract types: declarations of procedure arguments and globals without concrete values."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from turbine_ir.ir import (
    F32Type,
    F64Type,
    IndexType,
    IntegerType,
    Location,
    RankedTensorType,
    ShapedType,
    Type,
    Value,
)

from ._errors import TraceError
from ._primitives import IrImmediateScalar, IrImmediateTensor
from ._tree import tree_map

if TYPE_CHECKING:
    from turbine_ir import ModuleBuilder

    from ._base import Intrinsic

__all__ = [
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
    "TreeAbstractifiable",
    "abstractify",
    "abstractify_single_value",
]


class AbstractifyError(TraceError, TypeError):
    """A value has no abstract type (it cannot be a procedure argument or a global)."""


class AbstractTypedef:
    """Base class for instances which declare some form of public arg/result type definition."""

    __slots__ = ()

    def get_ir_type(self, builder: ModuleBuilder) -> Type:
        """Gets the corresponding IR type."""
        raise NotImplementedError


class AbstractIntrinsic:
    """Base class for descriptor types that can be converted to Python proxies."""

    __slots__ = ()

    def create_intrinsic(self, value: Value) -> Intrinsic:
        """Creates a proxy object that can flow through a procedural trace."""
        raise NotImplementedError

    def get_ir_type(self, builder: ModuleBuilder) -> Type:
        """Gets the corresponding IR type."""
        raise NotImplementedError


class Abstractifiable:
    """Indicates that a type knows how to abstractify itself."""

    __slots__ = ()

    def abstractify(self) -> AbstractTypedef:
        raise NotImplementedError


class TreeAbstractifiable:
    """Indicates that a type decomposes into a tree that can be abstractified."""

    __slots__ = ()

    def abstractify_tree(self) -> Any:
        raise NotImplementedError


class AbstractTensor(AbstractIntrinsic, AbstractTypedef):
    """Represents a tensor of known rank and dtype.

    Args:
        *size: The size of each dimension; ``None`` marks a dynamic dimension.
        dtype: The torch element type.

    Example:
        >>> AbstractTensor(None, 4, dtype=torch.float16)
        AbstractTensor(None, 4, dtype=torch.float16)
    """

    __slots__ = ["dtype", "size"]

    def __init__(self, *size: int | None, dtype: torch.dtype = torch.float32):
        for i, d in enumerate(size):
            if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 0):
                raise AbstractifyError(
                    f"AbstractTensor dimension {i} is {d!r}; use a non-negative int, or None "
                    "for a dynamic dimension"
                )
        if not isinstance(dtype, torch.dtype):
            raise AbstractifyError(
                f"AbstractTensor dtype must be a torch.dtype (e.g. torch.float32), got {dtype!r}"
            )
        self.size = tuple(size)
        self.dtype = dtype

    def __repr__(self) -> str:
        dims = ", ".join(repr(d) for d in self.size)
        sep = ", " if dims else ""
        return f"AbstractTensor({dims}{sep}dtype={self.dtype})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, AbstractTensor)
            and self.size == other.size
            and self.dtype == other.dtype
        )

    def __hash__(self) -> int:
        return hash((AbstractTensor, self.size, self.dtype))

    def create_intrinsic(self, ir_value: Value) -> Intrinsic:
        """Creates an ``IrImmediateTensor`` for a function argument of this type."""
        return IrImmediateTensor(ir_value, self.dtype)

    def get_ir_type(self, builder: ModuleBuilder) -> Type:
        """The builtin ``tensor<…>`` type, with ``?`` for dynamic dimensions."""
        element_type = builder.torch_dtype_to_iree_type(self.dtype)
        with builder.context:
            dims = [ShapedType.get_dynamic_size() if d is None else d for d in self.size]
            # IREE 3.13's RankedTensorType.get needs a Location: a user's bare Context() has
            # none on the stack.
            return RankedTensorType.get(dims, element_type, loc=Location.unknown(builder.context))


class AbstractScalar(AbstractIntrinsic, AbstractTypedef):
    """Represents a scalar value of some type.

    Args:
        label: A short name for messages and ``repr`` (e.g. ``"i32"``).
        type_producer: Returns the MLIR type; called with the module's context active.
    """

    __slots__ = ["label", "type_producer"]

    def __init__(self, label: str, type_producer: Callable[[], Type]):
        self.label = label
        self.type_producer = type_producer

    def __repr__(self) -> str:
        return f"AbstractScalar({self.label})"

    def create_intrinsic(self, ir_value: Value) -> Intrinsic:
        """Creates an ``IrImmediateScalar`` for a function argument of this type."""
        return IrImmediateScalar(ir_value)

    def get_ir_type(self, builder: ModuleBuilder) -> Type:
        with builder.context:
            return self.type_producer()


AbstractI32 = AbstractScalar("i32", lambda: IntegerType.get_signless(32))
AbstractI64 = AbstractScalar("i64", lambda: IntegerType.get_signless(64))
AbstractF32 = AbstractScalar("f32", lambda: F32Type.get())
AbstractF64 = AbstractScalar("f64", lambda: F64Type.get())
AbstractBool = AbstractScalar("bool", lambda: IntegerType.get_signless(1))
AbstractIndex = AbstractScalar("index", lambda: IndexType.get())


def abstractify_single_value(value: Any) -> AbstractTypedef:
    """The abstract type of one value.

    Abstract types are returned unchanged; ``Abstractifiable`` objects abstractify themselves; a
    ``torch.Tensor`` becomes an ``AbstractTensor`` of its shape and dtype; Python ``bool``,
    ``int`` and ``float`` become ``AbstractBool``, ``AbstractI64`` and ``AbstractF64``.

    Raises:
        AbstractifyError: for anything else.
    """
    if isinstance(value, AbstractTypedef):
        return value
    if isinstance(value, Abstractifiable):
        return value.abstractify()
    if isinstance(value, torch.Tensor):
        return AbstractTensor(*value.shape, dtype=value.dtype)
    if isinstance(value, bool):
        return AbstractBool
    if isinstance(value, int):
        return AbstractI64
    if isinstance(value, float):
        return AbstractF64
    raise AbstractifyError(
        f"cannot abstractify a value of type {type(value).__name__} ({value!r:.60}); supported: "
        "abstract types, torch.Tensor, bool/int/float and Abstractifiable objects"
    )


def abstractify(tree: Any) -> Any:
    """Abstractifies every leaf of a tree (``TreeAbstractifiable`` objects do it themselves)."""
    if isinstance(tree, TreeAbstractifiable):
        return tree.abstractify_tree()
    return tree_map(abstractify_single_value, tree)
