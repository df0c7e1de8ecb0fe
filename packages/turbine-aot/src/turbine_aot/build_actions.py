"""Build actions: export model variants as actions of an ``iree.build`` graph.

``turbine_generate(generator, *args, name=..., out_of_process=True, **kwargs)`` runs a generator
(a module-level function returning ``ExportOutput``) as a build action whose outputs are
``{name}.mlir`` files, ready for ``iree.build``'s ``compile``. See ``docs/build-actions.md``.
"""

from __future__ import annotations

from ._build_actions import (
    BuildActionError,
    ExportOutputMarshaller,
    GenerationError,
    GeneratorNotRemotableError,
    GeneratorSignatureError,
    RemoteGenerator,
    ReturnMarshaller,
    TurbineBuilderAction,
    turbine_generate,
)
from ._build_actions_pool import shutdown_generator_pools

__all__ = [
    "BuildActionError",
    "ExportOutputMarshaller",
    "GenerationError",
    "GeneratorNotRemotableError",
    "GeneratorSignatureError",
    "RemoteGenerator",
    "ReturnMarshaller",
    "TurbineBuilderAction",
    "shutdown_generator_pools",
    "turbine_generate",
]
