"""turbine_aot: export PyTorch programs ahead of time, compile them with IREE, run them.

The public API follows ``iree.turbine.aot``: ``from turbine_aot import *`` gives exactly its
top-level names (``export``, ``ExportOutput``, ``CompiledModule``, the globals exporters, the
abstract types, parameter archives and traits, ``FxPrograms``, decompositions, ``jittable``).
The reference's submodule paths exist too: ``turbine_aot.support.procedural``,
``turbine_aot.builtins``, ``turbine_aot.passes``, ``turbine_aot.decompositions``,
``turbine_aot.build_actions``. Beyond the reference: ``turbine_aot.custom_ops`` and the error
types ``ExportError``, ``CompileError`` (IREE diagnostics attached), ``CompiledModuleError``.

Names that live in lower layers (turbine_params, turbine_trace, turbine_fx) are re-exported
lazily, on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._compiled_module import CompiledModule
from ._compiled_module import ImportPhase as ImportPhase
from ._errors import CompiledModuleError as CompiledModuleError
from ._errors import CompileError as CompileError
from ._errors import ExportError as ExportError
from ._errors import TurbineAotError as TurbineAotError
from ._exporter import ExportOutput, export

__all__ = [
    "AbstractTensor",
    "CompiledModule",
    "DeviceAffinity",
    "DeviceTensorTrait",
    "ExportOutput",
    "ExternalTensorTrait",
    "FxPrograms",
    "FxProgramsBuilder",
    "ParameterArchive",
    "ParameterArchiveBuilder",
    "ParameterArchiveEntry",
    "abstractify",
    "current_aot_decompositions",
    "export",
    "export_buffers",
    "export_global",
    "export_global_tree",
    "export_parameters",
    "extend_aot_decompositions",
    "externalize_module_parameters",
    "jittable",
    "save_module_parameters",
]
__version__ = "0.1.0"

# Re-exported from lower layers: name -> module.
_LAZY: dict[str, str] = {
    "AbstractTensor": "turbine_trace",
    "abstractify": "turbine_trace",
    "export_buffers": "turbine_trace",
    "export_global": "turbine_trace",
    "export_global_tree": "turbine_trace",
    "export_parameters": "turbine_trace",
    "DeviceAffinity": "turbine_params",
    "DeviceTensorTrait": "turbine_params",
    "ExternalTensorTrait": "turbine_params",
    "ParameterArchive": "turbine_params",
    "ParameterArchiveBuilder": "turbine_params",
    "ParameterArchiveEntry": "turbine_params",
    "externalize_module_parameters": "turbine_params",
    "save_module_parameters": "turbine_params",
    "FxPrograms": "turbine_fx",
    "FxProgramsBuilder": "turbine_fx",
    "current_aot_decompositions": "turbine_fx",
    "extend_aot_decompositions": "turbine_fx",
    "jittable": "turbine_fx",
}
_SUBMODULES = (
    "builtins",
    "build_actions",
    "custom_ops",
    "decompositions",
    "passes",
    "runtime",
    "support",
)

# Not in __all__ (not reference names) but public.
_EXTRA = ["CompileError", "CompiledModuleError", "ExportError", "ImportPhase", "TurbineAotError"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'turbine_aot' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})
