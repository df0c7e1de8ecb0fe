"""Running what turbine compiles: load ``.vmfb`` modules with their parameter archives on one or
more IREE devices and call them with torch tensors; compare with eager PyTorch; cache compiles.

Example:
    >>> from turbine_aot import runtime
    >>> m = runtime.load_module("model.vmfb", device="local-task", parameters="model.irpa")
    >>> y = m.main(torch.randn(2, 8))  # doctest: +SKIP

See ``docs/running.md``.
"""

from __future__ import annotations

from turbine_aot._bundle.bundle import Bundle, BundleError
from turbine_aot._bundle.load import load_bundle
from turbine_aot._bundle.read import read_bundle
from turbine_aot._bundle.write import save_bundle
from turbine_aot._compiler.cache import (
    CacheStats,
    CompileCache,
    CompileError,
    compile_mlir,
    compiler_version,
    default_compile_cache,
)
from turbine_aot._compiler.flags import default_runtime_flags, device_compile_flags
from turbine_aot._errors import TurbineRuntimeError
from turbine_aot._export.cached_compile import compile_export_output
from turbine_aot._runtime.cpu_devices import release_cached_memory
from turbine_aot._runtime.loaded_module import LoadedFunction, LoadedModule
from turbine_aot._runtime.loading import load_module
from turbine_aot._runtime.numerics import (
    NumericsError,
    NumericsReport,
    OutputComparison,
    check_numerics,
    default_tolerance,
)
from turbine_aot._runtime.parameters import DEFAULT_PARAMETER_SCOPE
from turbine_aot._runtime.prepared_calls import PreparedCall
from turbine_aot._signatures.abi import (
    FlatSignature,
    FunctionSignature,
    TensorSpec,
    parse_abi_declaration,
    signatures_from_mlir,
)
from turbine_aot._signatures.call import CallSignature
from turbine_aot._signatures.errors import CallArgumentTypeError, CallArgumentValueError

__all__ = [
    "DEFAULT_PARAMETER_SCOPE",
    "Bundle",
    "BundleError",
    "CacheStats",
    "CallArgumentTypeError",
    "CallArgumentValueError",
    "CallSignature",
    "CompileCache",
    "CompileError",
    "FlatSignature",
    "FunctionSignature",
    "LoadedFunction",
    "LoadedModule",
    "NumericsError",
    "NumericsReport",
    "OutputComparison",
    "PreparedCall",
    "TensorSpec",
    "TurbineRuntimeError",
    "check_numerics",
    "compile_export_output",
    "compile_mlir",
    "compiler_version",
    "default_compile_cache",
    "default_runtime_flags",
    "default_tolerance",
    "device_compile_flags",
    "load_bundle",
    "load_module",
    "parse_abi_declaration",
    "read_bundle",
    "release_cached_memory",
    "save_bundle",
    "signatures_from_mlir",
]
