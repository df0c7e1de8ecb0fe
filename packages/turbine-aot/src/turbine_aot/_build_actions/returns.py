"""Return marshalling: a generator's declared returns, as files of the build."""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from iree.build.executor import (
    BuildContext,
    BuildFile,
    FileNamespace,
)
from iree.build.metadata import CompileSourceMeta

from turbine_params import atomic_output_file

from .._export.output import ExportOutput
from .errors import GenerationError, GeneratorSignatureError

__all__ = [
    "ExportOutputMarshaller",
    "MarshalledAction",
    "ReturnMarshaller",
    "declared_return_marshallers",
]


# -- return marshalling -----------------------------------------------------------------------


class MarshalledAction(Protocol):
    """What a marshaller needs of the action that produces a generator's outputs (a
    ``TurbineBuilderAction``): the (marshaller, output file) pairs it writes, in order."""

    return_marshallers: list[tuple[ReturnMarshaller, BuildFile]]


class ReturnMarshaller:
    """Turns one declared return value of a generator into a file of the build.

    Subclasses say which file an output becomes (:meth:`prepare_action`, at graph-definition time,
    in the build process) and how a returned value is written to it (:meth:`save_remote_result`,
    in whichever process ran the generator). Instances must be picklable.
    """

    #: File name suffix of the output, including the dot.
    suffix = ""

    def prepare_action(
        self, context: BuildContext, stem: str, action: MarshalledAction
    ) -> BuildFile:
        """Allocates the output file ``{stem}{suffix}`` and makes ``action`` produce it."""
        output = context.allocate_file(f"{stem}{self.suffix}", namespace=FileNamespace.GEN)
        output.deps.add(action)
        action.return_marshallers.append((self, output))
        return output

    def save_remote_result(self, result: Any, path: Path) -> None:
        """Writes ``result`` to ``path`` (atomically)."""
        raise NotImplementedError


class ExportOutputMarshaller(ReturnMarshaller):
    """Saves an ``ExportOutput`` (anything with ``save_mlir(path)``) as ``.mlir`` source.

    The file is marked as torch-dialect input for ``iree.build``'s ``compile`` action.
    """

    suffix = ".mlir"

    def prepare_action(
        self, context: BuildContext, stem: str, action: MarshalledAction
    ) -> BuildFile:
        output = super().prepare_action(context, stem, action)
        CompileSourceMeta.get(output).input_type = "torch"
        return output

    def save_remote_result(self, result: Any, path: Path) -> None:
        save_mlir = getattr(result, "save_mlir", None)
        if not callable(save_mlir):
            raise GeneratorSignatureError(
                f"the generator returned {type(result).__module__}.{type(result).__qualname__} "
                f"where an ExportOutput (the result of turbine_aot.export(...)) was declared for "
                f"{path.name}; return what the annotation says"
            )
        # A temp file beside ``path``, renamed over it on success: never a half-written ``path``.
        with atomic_output_file(path, parents=True) as tmp:
            save_mlir(tmp)
            if not tmp.exists() or tmp.stat().st_size == 0:
                raise GenerationError(f"saving {path.name} wrote nothing (expected data in {tmp})")


def _annotated_callable(generator: Callable) -> Callable:
    target: Any = generator
    while isinstance(target, functools.partial):
        target = target.func
    if isinstance(target, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return target
    if isinstance(target, type):
        raise GeneratorSignatureError(
            f"turbine_generate got the class {target.__qualname__}; pass an instance of it "
            f"(its __call__ returns the ExportOutput), e.g. {target.__qualname__}()"
        )
    if not callable(target):
        raise GeneratorSignatureError(f"generator {target!r} is not callable")
    return type(target).__call__


def declared_return_marshallers(generator: Callable) -> list[ReturnMarshaller]:
    """Reads the generator's return annotation into one marshaller per declared output."""
    target = _annotated_callable(generator)
    where = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', target)}"
    try:
        hints = typing.get_type_hints(target)
    except Exception as e:
        raise GeneratorSignatureError(
            f"cannot resolve the type annotations of generator {where}: {e}. Import the types "
            "it names (e.g. ExportOutput) at module level, not under TYPE_CHECKING"
        ) from e
    if "return" not in hints:
        raise GeneratorSignatureError(
            f"generator {where} has no return annotation; declare what it returns so the build "
            "knows its outputs up front: '-> ExportOutput' for one, "
            "'-> tuple[ExportOutput, ExportOutput]' for two (files {name}_0.mlir, {name}_1.mlir)"
        )
    declared = hints["return"]
    if typing.get_origin(declared) is tuple:
        items = typing.get_args(declared)
        if not items or Ellipsis in items:
            raise GeneratorSignatureError(
                f"generator {where} returns {declared}; the number of outputs must be fixed: "
                "write tuple[ExportOutput, ExportOutput] rather than tuple[ExportOutput, ...]"
            )
    else:
        items = (declared,)
    marshallers: list[ReturnMarshaller] = []
    for item in items:
        if isinstance(item, type) and (
            issubclass(item, ExportOutput) or callable(getattr(item, "save_mlir", None))
        ):
            marshallers.append(ExportOutputMarshaller())
        else:
            raise GeneratorSignatureError(
                f"generator {where} declares a return of {item!r}, which turbine_generate cannot "
                "save; supported: ExportOutput (or a type with save_mlir(path)), or a tuple of them"
            )
    return marshallers
