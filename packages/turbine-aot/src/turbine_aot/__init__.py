"""turbine_aot: export PyTorch programs ahead of time, compile them with IREE, run them.

The public API follows ``iree.turbine.aot``: ``from turbine_aot import *`` binds exactly the
names the reference's star import binds (``export``, ``ExportOutput``, ``CompiledModule``, the
globals exporters, the abstract types, ``IREE``, parameter archives and traits, ``FxPrograms``,
decompositions, ``jittable`` and the submodules ``builtins``, ``compiled_module``,
``decompositions``, ``exporter``, ``fx_programs``, ``params``, ``passes``, ``support``,
``tensor_traits``). The reference's submodule paths import too (also
``turbine_aot.support.procedural`` and ``turbine_aot.build_actions``). Beyond the reference: ``turbine_aot.custom_ops`` and the error
types ``ExportError``, ``CompileError`` (IREE diagnostics attached), ``CompiledModuleError``,
and ``default_compile_flags(target, ...)`` (turbine's measured ``iree-compile`` defaults).

Names that live in lower layers (turbine_params, turbine_trace, turbine_fx) are re-exported
lazily, on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._compiled_module.module import CompiledModule
from ._compiled_module.module import ImportPhase as ImportPhase
from ._compiler.flags import default_compile_flags as default_compile_flags
from ._errors import CompiledModuleError as CompiledModuleError
from ._errors import CompileError as CompileError
from ._errors import ExportError as ExportError
from ._errors import TurbineAotError as TurbineAotError
from ._export.exporter import export
from ._export.output import ExportOutput
from ._version import __version__ as __version__

# Exactly the names ``from iree.turbine.aot import *`` binds (38), submodules included.
__all__ = [
    "IREE",
    "AbstractBool",
    "AbstractF32",
    "AbstractF64",
    "AbstractI32",
    "AbstractI64",
    "AbstractIndex",
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
    "builtins",
    "compiled_module",
    "current_aot_decompositions",
    "decompositions",
    "export",
    "export_buffers",
    "export_global",
    "export_global_tree",
    "export_parameters",
    "exporter",
    "extend_aot_decompositions",
    "externalize_module_parameters",
    "fx_programs",
    "jittable",
    "params",
    "passes",
    "save_module_parameters",
    "support",
    "tensor_traits",
]

# Re-exported from lower layers: name -> module.
_LAZY: dict[str, str] = {
    "IREE": "turbine_trace",
    "AbstractBool": "turbine_trace",
    "AbstractF32": "turbine_trace",
    "AbstractF64": "turbine_trace",
    "AbstractI32": "turbine_trace",
    "AbstractI64": "turbine_trace",
    "AbstractIndex": "turbine_trace",
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
    "compiled_module",
    "custom_ops",
    "decompositions",
    "exporter",
    "fx_programs",
    "llm",
    "params",
    "passes",
    "runtime",
    "support",
    "tensor_traits",
)

# Not in __all__ (not reference names) but public.
_EXTRA = [
    "CompileError",
    "CompiledModuleError",
    "ExportError",
    "ImportPhase",
    "TurbineAotError",
    "default_compile_flags",
]


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
