"""Exceptions raised by turbine_fx."""

from __future__ import annotations

__all__ = [
    "DecompositionError",
    "FxImportError",
    "FxProgramsError",
    "JittableError",
    "TurbineFxError",
    "UnsupportedOpError",
    "UnsupportedQuantizationError",
]


class TurbineFxError(Exception):
    """Root of every error raised by turbine_fx."""


class FxImportError(TurbineFxError):
    """An ExportedProgram could not be imported into a module."""


class UnsupportedOpError(FxImportError):
    """An op or dtype in the program has no lowering.

    Attributes:
        op: The op (``aten.foo.default``) or dtype that is not supported.
        node: Name of the FX node that uses it (``None`` when unknown).
        source_line: The user's source line that created the node, from its stack trace.
        dump_dir: Directory holding the failing IR and FX graph, or ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        op: str | None = None,
        node: str | None = None,
        source_line: str | None = None,
        dump_dir: str | None = None,
    ):
        super().__init__(message)
        self.op = op
        self.node = node
        self.source_line = source_line
        self.dump_dir = dump_dir


class UnsupportedQuantizationError(FxImportError):
    """A quantized weight (a torchao tensor subclass) in a layout IREE cannot run.

    Attributes:
        name: The weight's state_dict name.
        tensor_class: The tensor subclass (``"Int4TilePackedTo4dTensor"``).
    """

    def __init__(self, message: str, *, name: str, tensor_class: str):
        super().__init__(message)
        self.name = name
        self.tensor_class = tensor_class


class DecompositionError(TurbineFxError):
    """A decomposition table request cannot be honoured (e.g. an op has no decomposition)."""


class FxProgramsError(TurbineFxError):
    """FxPrograms could not be built, saved or loaded."""


class JittableError(TurbineFxError):
    """A ``jittable`` function could not be exported or called from a trace."""
