"""turbine_fx: import torch.export programs into turbine modules.

Public surface: the AOT decomposition table, program import into a ``ModuleBuilder``,
``FxPrograms``/``FxProgramsBuilder``, ``passes`` and ``jittable``. See ``docs/turbine-fx.md``.
"""

from __future__ import annotations

from . import passes
from ._decompositions import (
    DEFAULT_DECOMPOSITION_OPS,
    current_aot_decompositions,
    extend_aot_decompositions,
)
from ._errors import (
    DecompositionError,
    FxImportError,
    FxProgramsError,
    JittableError,
    TurbineFxError,
    UnsupportedOpError,
    UnsupportedQuantizationError,
)
from ._fx_programs import FxProgram, FxPrograms, FxProgramsBuilder, program_and_arg_device
from ._importer import CONSTANT_RESULTS_ATTR, import_exported_program
from ._jittable import jittable
from ._program_prep import PreparedProgram, prepare_program
from ._quantized import check_quantized_module
from ._verify import verify_lowering

__all__ = [
    "CONSTANT_RESULTS_ATTR",
    "DEFAULT_DECOMPOSITION_OPS",
    "DecompositionError",
    "FxImportError",
    "FxProgram",
    "FxPrograms",
    "FxProgramsBuilder",
    "FxProgramsError",
    "JittableError",
    "PreparedProgram",
    "TurbineFxError",
    "UnsupportedOpError",
    "UnsupportedQuantizationError",
    "check_quantized_module",
    "current_aot_decompositions",
    "extend_aot_decompositions",
    "import_exported_program",
    "jittable",
    "passes",
    "prepare_program",
    "program_and_arg_device",
    "verify_lowering",
]
__version__ = "0.1.0"
