"""``turbine_aot.compiled_module``: the reference path of :class:`CompiledModule` and
:class:`ImportPhase` (implementation in ``turbine_aot._compiled_module``)."""

from __future__ import annotations

from ._compiled_module.module import (
    CompiledModule,
    CompiledModuleClassInfo,
    CompiledModuleInstanceInfo,
    CompiledModuleMeta,
    ExportedProgramDef,
    ExportProcDef,
    ImportPhase,
)

__all__ = [
    "CompiledModule",
    "CompiledModuleClassInfo",
    "CompiledModuleInstanceInfo",
    "CompiledModuleMeta",
    "ExportProcDef",
    "ExportedProgramDef",
    "ImportPhase",
]
