"""turbine_fx: import torch.export programs into turbine modules.

Public surface: the AOT decomposition table, program import into a ``ModuleBuilder``,
``FxPrograms``/``FxProgramsBuilder``, ``passes``, ``jittable``, and how an imported program's
function returns its outputs (``user_output_dtypes``, ``constant_results``,
``with_constant_results``, ``builtin_results``). See ``docs/turbine-fx.md``.
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
from ._program_results import (
    builtin_results,
    constant_results,
    user_output_dtypes,
    with_constant_results,
)
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
    "builtin_results",
    "check_quantized_module",
    "constant_results",
    "current_aot_decompositions",
    "extend_aot_decompositions",
    "import_exported_program",
    "jittable",
    "passes",
    "prepare_program",
    "program_and_arg_device",
    "user_output_dtypes",
    "verify_lowering",
    "with_constant_results",
]
__version__ = "0.1.0"
