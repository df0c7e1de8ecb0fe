"""Every public import path of turbine_aot keeps its names and objects.

The table below was recorded from the tree before the package was reorganized into
subpackages (issue 24): per public module, each name of its ``__all__`` (and the top level's
public extras), what it is, and, for a name re-exported from a lower package, the lower
package's public module that names the same object. ``SAME_OBJECT`` lists the public names that
are one object. Moving an implementation between private modules must leave all of it true.
"""

from __future__ import annotations

import importlib
import inspect
import types

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from pathlib import Path

# (module, name, what it is, the lower package's public module naming the same object)
PUBLIC_NAMES = [
    ("turbine_aot", "IREE", "value IREEEmitter", "turbine_trace"),
    ("turbine_aot", "AbstractBool", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot", "AbstractF32", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot", "AbstractF64", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot", "AbstractI32", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot", "AbstractI64", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot", "AbstractIndex", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot", "AbstractTensor", "class AbstractTensor", "turbine_trace"),
    ("turbine_aot", "CompiledModule", "class CompiledModule", None),
    ("turbine_aot", "DeviceAffinity", "class DeviceAffinity", "turbine_params"),
    ("turbine_aot", "DeviceTensorTrait", "class DeviceTensorTrait", "turbine_params"),
    ("turbine_aot", "ExportOutput", "class ExportOutput", None),
    ("turbine_aot", "ExternalTensorTrait", "class ExternalTensorTrait", "turbine_params"),
    ("turbine_aot", "FxPrograms", "class FxPrograms", "turbine_fx"),
    ("turbine_aot", "FxProgramsBuilder", "class FxProgramsBuilder", "turbine_fx"),
    ("turbine_aot", "ParameterArchive", "class ParameterArchive", "turbine_params"),
    ("turbine_aot", "ParameterArchiveBuilder", "class ParameterArchiveBuilder", "turbine_params"),
    ("turbine_aot", "ParameterArchiveEntry", "class ParameterArchiveEntry", "turbine_params"),
    ("turbine_aot", "abstractify", "function abstractify", "turbine_trace"),
    ("turbine_aot", "builtins", "module turbine_aot.builtins", None),
    ("turbine_aot", "compiled_module", "module turbine_aot.compiled_module", None),
    (
        "turbine_aot",
        "current_aot_decompositions",
        "function current_aot_decompositions",
        "turbine_fx",
    ),
    ("turbine_aot", "decompositions", "module turbine_aot.decompositions", None),
    ("turbine_aot", "export", "function export", None),
    ("turbine_aot", "export_buffers", "class export_buffers", "turbine_trace"),
    ("turbine_aot", "export_global", "class export_global", "turbine_trace"),
    ("turbine_aot", "export_global_tree", "class export_global_tree", "turbine_trace"),
    ("turbine_aot", "export_parameters", "class export_parameters", "turbine_trace"),
    ("turbine_aot", "exporter", "module turbine_aot.exporter", None),
    (
        "turbine_aot",
        "extend_aot_decompositions",
        "function extend_aot_decompositions",
        "turbine_fx",
    ),
    (
        "turbine_aot",
        "externalize_module_parameters",
        "function externalize_module_parameters",
        "turbine_params",
    ),
    ("turbine_aot", "fx_programs", "module turbine_aot.fx_programs", None),
    ("turbine_aot", "jittable", "class jittable", "turbine_fx"),
    ("turbine_aot", "params", "module turbine_aot.params", None),
    ("turbine_aot", "passes", "module turbine_aot.passes", None),
    ("turbine_aot", "save_module_parameters", "function save_module_parameters", "turbine_params"),
    ("turbine_aot", "support", "module turbine_aot.support", None),
    ("turbine_aot", "tensor_traits", "module turbine_aot.tensor_traits", None),
    ("turbine_aot", "CompileError", "class CompileError", None),
    ("turbine_aot", "CompiledModuleError", "class CompiledModuleError", None),
    ("turbine_aot", "ExportError", "class ExportError", None),
    ("turbine_aot", "ImportPhase", "class ImportPhase", None),
    ("turbine_aot", "TurbineAotError", "class TurbineAotError", None),
    ("turbine_aot", "default_compile_flags", "function default_compile_flags", None),
    ("turbine_aot.exporter", "ExportOutput", "class ExportOutput", None),
    ("turbine_aot.exporter", "export", "function export", None),
    ("turbine_aot.compiled_module", "CompiledModule", "class CompiledModule", None),
    (
        "turbine_aot.compiled_module",
        "CompiledModuleClassInfo",
        "class CompiledModuleClassInfo",
        None,
    ),
    (
        "turbine_aot.compiled_module",
        "CompiledModuleInstanceInfo",
        "class CompiledModuleInstanceInfo",
        None,
    ),
    ("turbine_aot.compiled_module", "CompiledModuleMeta", "class CompiledModuleMeta", None),
    ("turbine_aot.compiled_module", "ExportProcDef", "class ExportProcDef", None),
    ("turbine_aot.compiled_module", "ExportedProgramDef", "class ExportedProgramDef", None),
    ("turbine_aot.compiled_module", "ImportPhase", "class ImportPhase", None),
    ("turbine_aot.runtime", "DEFAULT_PARAMETER_SCOPE", "value 'model'", None),
    ("turbine_aot.runtime", "Bundle", "class Bundle", None),
    ("turbine_aot.runtime", "BundleError", "class BundleError", None),
    ("turbine_aot.runtime", "CacheStats", "class CacheStats", None),
    ("turbine_aot.runtime", "CallArgumentTypeError", "class CallArgumentTypeError", None),
    ("turbine_aot.runtime", "CallArgumentValueError", "class CallArgumentValueError", None),
    ("turbine_aot.runtime", "CallSignature", "class CallSignature", None),
    ("turbine_aot.runtime", "CompileCache", "class CompileCache", None),
    ("turbine_aot.runtime", "CompileError", "class CompileError", None),
    # Named for what it holds since (the flat ABI, beside CallSignature): the old name is the
    # same class.
    ("turbine_aot.runtime", "FunctionSignature", "class FlatSignature", None),
    ("turbine_aot.runtime", "FlatSignature", "class FlatSignature", None),
    ("turbine_aot.runtime", "LoadedFunction", "class LoadedFunction", None),
    ("turbine_aot.runtime", "LoadedModule", "class LoadedModule", None),
    ("turbine_aot.runtime", "NumericsError", "class NumericsError", None),
    ("turbine_aot.runtime", "NumericsReport", "class NumericsReport", None),
    ("turbine_aot.runtime", "OutputComparison", "class OutputComparison", None),
    ("turbine_aot.runtime", "TensorSpec", "class TensorSpec", None),
    ("turbine_aot.runtime", "TurbineRuntimeError", "class TurbineRuntimeError", None),
    ("turbine_aot.runtime", "check_numerics", "function check_numerics", None),
    ("turbine_aot.runtime", "compile_export_output", "function compile_export_output", None),
    ("turbine_aot.runtime", "compile_mlir", "function compile_mlir", None),
    ("turbine_aot.runtime", "compiler_version", "function compiler_version", None),
    ("turbine_aot.runtime", "default_compile_cache", "function default_compile_cache", None),
    ("turbine_aot.runtime", "default_runtime_flags", "function default_runtime_flags", None),
    ("turbine_aot.runtime", "default_tolerance", "function default_tolerance", None),
    ("turbine_aot.runtime", "device_compile_flags", "function device_compile_flags", None),
    ("turbine_aot.runtime", "load_bundle", "function load_bundle", None),
    ("turbine_aot.runtime", "load_module", "function load_module", None),
    ("turbine_aot.runtime", "parse_abi_declaration", "function parse_abi_declaration", None),
    ("turbine_aot.runtime", "read_bundle", "function read_bundle", None),
    ("turbine_aot.runtime", "save_bundle", "function save_bundle", None),
    ("turbine_aot.runtime", "signatures_from_mlir", "function signatures_from_mlir", None),
    ("turbine_aot.build_actions", "BuildActionError", "class BuildActionError", None),
    ("turbine_aot.build_actions", "ExportOutputMarshaller", "class ExportOutputMarshaller", None),
    ("turbine_aot.build_actions", "GenerationError", "class GenerationError", None),
    (
        "turbine_aot.build_actions",
        "GeneratorNotRemotableError",
        "class GeneratorNotRemotableError",
        None,
    ),
    ("turbine_aot.build_actions", "GeneratorSignatureError", "class GeneratorSignatureError", None),
    ("turbine_aot.build_actions", "RemoteGenerator", "class RemoteGenerator", None),
    ("turbine_aot.build_actions", "ReturnMarshaller", "class ReturnMarshaller", None),
    ("turbine_aot.build_actions", "TurbineBuilderAction", "class TurbineBuilderAction", None),
    ("turbine_aot.build_actions", "turbine_generate", "function turbine_generate", None),
    (
        "turbine_aot.build_actions",
        "shutdown_generator_pools",
        "function shutdown_generator_pools",
        None,
    ),
    ("turbine_aot.support", "procedural", "module turbine_aot.support.procedural", None),
    ("turbine_aot.support.procedural", "AbstractBool", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot.support.procedural", "AbstractF32", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot.support.procedural", "AbstractF64", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot.support.procedural", "AbstractI32", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot.support.procedural", "AbstractI64", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot.support.procedural", "AbstractIndex", "value AbstractScalar", "turbine_trace"),
    (
        "turbine_aot.support.procedural",
        "AbstractIntrinsic",
        "class AbstractIntrinsic",
        "turbine_trace",
    ),
    ("turbine_aot.support.procedural", "AbstractScalar", "class AbstractScalar", "turbine_trace"),
    ("turbine_aot.support.procedural", "AbstractTensor", "class AbstractTensor", "turbine_trace"),
    ("turbine_aot.support.procedural", "AbstractTypedef", "class AbstractTypedef", "turbine_trace"),
    ("turbine_aot.support.procedural", "Abstractifiable", "class Abstractifiable", "turbine_trace"),
    ("turbine_aot.support.procedural", "Any", "class Any", "typing"),
    (
        "turbine_aot.support.procedural",
        "CallableIntrinsic",
        "class CallableIntrinsic",
        "turbine_trace",
    ),
    ("turbine_aot.support.procedural", "DeviceAffinity", "class DeviceAffinity", "turbine_params"),
    ("turbine_aot.support.procedural", "DictAttr", "class DictAttr", "turbine_ir.ir"),
    ("turbine_aot.support.procedural", "Empty", "value EmptyType", "turbine_ir"),
    ("turbine_aot.support.procedural", "EmptyType", "class EmptyType", "turbine_ir"),
    ("turbine_aot.support.procedural", "F32Type", "class F32Type", "turbine_ir.ir"),
    ("turbine_aot.support.procedural", "F64Type", "class F64Type", "turbine_ir.ir"),
    ("turbine_aot.support.procedural", "FunctionBuilder", "class FunctionBuilder", "turbine_ir"),
    ("turbine_aot.support.procedural", "GlobalAttributes", "class GlobalAttributes", "turbine_ir"),
    ("turbine_aot.support.procedural", "GlobalsDef", "class GlobalsDef", "turbine_trace"),
    ("turbine_aot.support.procedural", "IREEEmitter", "class IREEEmitter", "turbine_trace"),
    ("turbine_aot.support.procedural", "IndexType", "class IndexType", "turbine_ir.ir"),
    ("turbine_aot.support.procedural", "IntegerType", "class IntegerType", "turbine_ir.ir"),
    ("turbine_aot.support.procedural", "Intrinsic", "class Intrinsic", "turbine_trace"),
    ("turbine_aot.support.procedural", "IrGlobalScalar", "class IrGlobalScalar", "turbine_trace"),
    ("turbine_aot.support.procedural", "IrGlobalTensor", "class IrGlobalTensor", "turbine_trace"),
    (
        "turbine_aot.support.procedural",
        "IrImmediateScalar",
        "class IrImmediateScalar",
        "turbine_trace",
    ),
    (
        "turbine_aot.support.procedural",
        "IrImmediateTensor",
        "class IrImmediateTensor",
        "turbine_trace",
    ),
    ("turbine_aot.support.procedural", "IrScalar", "class IrScalar", "turbine_trace"),
    ("turbine_aot.support.procedural", "IrTensor", "class IrTensor", "turbine_trace"),
    ("turbine_aot.support.procedural", "IrTrace", "class IrTrace", "turbine_trace"),
    ("turbine_aot.support.procedural", "IrType", "class Type", "turbine_trace"),
    (
        "turbine_aot.support.procedural",
        "LiveGlobalCollectionProxy",
        "class LiveGlobalCollectionProxy",
        "turbine_trace",
    ),
    ("turbine_aot.support.procedural", "Location", "class Location", "turbine_ir.ir"),
    (
        "turbine_aot.support.procedural",
        "MaterializedGlobal",
        "class MaterializedGlobal",
        "turbine_trace",
    ),
    ("turbine_aot.support.procedural", "ModuleBuilder", "class ModuleBuilder", "turbine_ir"),
    ("turbine_aot.support.procedural", "Operation", "class Operation", "turbine_ir.ir"),
    ("turbine_aot.support.procedural", "ProcedureTrace", "class ProcedureTrace", "turbine_trace"),
    (
        "turbine_aot.support.procedural",
        "ProcedureTraceError",
        "class ProcedureTraceError",
        "turbine_trace",
    ),
    (
        "turbine_aot.support.procedural",
        "RankedTensorType",
        "class RankedTensorType",
        "turbine_ir.ir",
    ),
    ("turbine_aot.support.procedural", "ShapedType", "class ShapedType", "turbine_ir.ir"),
    (
        "turbine_aot.support.procedural",
        "ShapedTypeDynamicSizeSentinel",
        "value -9223372036854775808",
        None,
    ),
    ("turbine_aot.support.procedural", "StringAttr", "class StringAttr", "turbine_ir.ir"),
    (
        "turbine_aot.support.procedural",
        "TreeAbstractifiable",
        "class TreeAbstractifiable",
        "turbine_trace",
    ),
    ("turbine_aot.support.procedural", "TreeSpec", "class TreeSpec", "turbine_trace"),
    ("turbine_aot.support.procedural", "Value", "class Value", "turbine_ir.ir"),
    ("turbine_aot.support.procedural", "abstractify", "function abstractify", "turbine_trace"),
    (
        "turbine_aot.support.procedural",
        "abstractify_single_value",
        "function abstractify_single_value",
        "turbine_trace",
    ),
    (
        "turbine_aot.support.procedural",
        "attributes_from_argument_device_affinities",
        "function attributes_from_argument_device_affinities",
        "turbine_ir",
    ),
    (
        "turbine_aot.support.procedural",
        "build_tensor_dim_value",
        "function build_tensor_dim_value",
        "turbine_ir",
    ),
    ("turbine_aot.support.procedural", "cast", "function cast", "typing"),
    (
        "turbine_aot.support.procedural",
        "contextmanager",
        "function contextmanager",
        "turbine_ir.ir",
    ),
    (
        "turbine_aot.support.procedural",
        "convert_py_value_to_ir",
        "function convert_py_value_to_ir",
        "turbine_trace",
    ),
    (
        "turbine_aot.support.procedural",
        "current_ir_trace",
        "function current_ir_trace",
        "turbine_trace",
    ),
    ("turbine_aot.support.procedural", "export_buffers", "class export_buffers", "turbine_trace"),
    ("turbine_aot.support.procedural", "export_global", "class export_global", "turbine_trace"),
    (
        "turbine_aot.support.procedural",
        "export_global_tree",
        "class export_global_tree",
        "turbine_trace",
    ),
    (
        "turbine_aot.support.procedural",
        "export_parameters",
        "class export_parameters",
        "turbine_trace",
    ),
    (
        "turbine_aot.support.procedural",
        "new_ir_trace_scope",
        "function new_ir_trace_scope",
        "turbine_trace",
    ),
    ("turbine_aot.support.procedural", "tree_flatten", "function tree_flatten", "turbine_trace"),
    ("turbine_aot.support.procedural", "tree_map", "function tree_map", "turbine_trace"),
    (
        "turbine_aot.support.procedural",
        "tree_unflatten",
        "function tree_unflatten",
        "turbine_trace",
    ),
    (
        "turbine_aot.support.procedural",
        "treespec_dumps",
        "function treespec_dumps",
        "turbine_trace",
    ),
    ("turbine_aot.builtins", "IREE", "value IREEEmitter", "turbine_trace"),
    ("turbine_aot.builtins", "AbstractBool", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot.builtins", "AbstractF32", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot.builtins", "AbstractF64", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot.builtins", "AbstractI32", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot.builtins", "AbstractI64", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot.builtins", "AbstractIndex", "value AbstractScalar", "turbine_trace"),
    ("turbine_aot.builtins", "AbstractScalar", "class AbstractScalar", "turbine_trace"),
    ("turbine_aot.builtins", "AbstractTensor", "class AbstractTensor", "turbine_trace"),
    ("turbine_aot.builtins", "abstractify", "function abstractify", "turbine_trace"),
    ("turbine_aot.builtins", "export_buffers", "class export_buffers", "turbine_trace"),
    ("turbine_aot.builtins", "export_global", "class export_global", "turbine_trace"),
    ("turbine_aot.builtins", "export_global_tree", "class export_global_tree", "turbine_trace"),
    ("turbine_aot.builtins", "export_parameters", "class export_parameters", "turbine_trace"),
    ("turbine_aot.builtins", "jittable", "class jittable", "turbine_fx"),
    ("turbine_aot.custom_ops", "CustomOpExpansionError", "class CustomOpExpansionError", None),
    ("turbine_aot.custom_ops", "CustomOpSignature", "class CustomOpSignature", None),
    ("turbine_aot.custom_ops", "custom_op_expansion", "function custom_op_expansion", None),
    (
        "turbine_aot.custom_ops",
        "register_custom_op_expansion",
        "function register_custom_op_expansion",
        None,
    ),
    ("turbine_aot.custom_ops", "registered_custom_ops", "function registered_custom_ops", None),
    (
        "turbine_aot.custom_ops",
        "unregister_custom_op_expansion",
        "function unregister_custom_op_expansion",
        None,
    ),
    ("turbine_aot.decompositions", "DEFAULT_DECOMPOSITION_OPS", "value tuple", "turbine_fx"),
    (
        "turbine_aot.decompositions",
        "current_aot_decompositions",
        "function current_aot_decompositions",
        "turbine_fx",
    ),
    (
        "turbine_aot.decompositions",
        "extend_aot_decompositions",
        "function extend_aot_decompositions",
        "turbine_fx",
    ),
    ("turbine_aot.fx_programs", "FxPrograms", "class FxPrograms", "turbine_fx"),
    ("turbine_aot.fx_programs", "FxProgramsBuilder", "class FxProgramsBuilder", "turbine_fx"),
    ("turbine_aot.params", "ParameterArchive", "class ParameterArchive", "turbine_params"),
    (
        "turbine_aot.params",
        "ParameterArchiveBuilder",
        "class ParameterArchiveBuilder",
        "turbine_params",
    ),
    (
        "turbine_aot.params",
        "ParameterArchiveEntry",
        "class ParameterArchiveEntry",
        "turbine_params",
    ),
    (
        "turbine_aot.params",
        "externalize_module_parameters",
        "function externalize_module_parameters",
        "turbine_params",
    ),
    (
        "turbine_aot.params",
        "save_module_parameters",
        "function save_module_parameters",
        "turbine_params",
    ),
    ("turbine_aot.passes", "functorch_functionalize", "function functorch_functionalize", None),
    ("turbine_aot.tensor_traits", "DeviceAffinity", "class DeviceAffinity", "turbine_params"),
    ("turbine_aot.tensor_traits", "DeviceTensorTrait", "class DeviceTensorTrait", "turbine_params"),
    (
        "turbine_aot.tensor_traits",
        "ExternalTensorTrait",
        "class ExternalTensorTrait",
        "turbine_params",
    ),
    ("turbine_aot.llm", "QUANTIZATIONS", "value tuple", None),
    ("turbine_aot.llm", "ArgumentKVCache", "class ArgumentKVCache", None),
    ("turbine_aot.llm", "CausalLM", "class CausalLM", None),
    ("turbine_aot.llm", "CausalLMInfo", "class CausalLMInfo", None),
    ("turbine_aot.llm", "GenerationTimings", "class GenerationTimings", None),
    ("turbine_aot.llm", "GlobalKVCache", "class GlobalKVCache", None),
    ("turbine_aot.llm", "KVCacheLayout", "class KVCacheLayout", None),
    ("turbine_aot.llm", "LLMError", "class LLMError", None),
    ("turbine_aot.llm", "LLMExportError", "class LLMExportError", None),
    ("turbine_aot.llm", "export_causal_lm", "function export_causal_lm", None),
    ("turbine_aot.llm", "load", "function load", None),
    ("turbine_aot.llm", "quantized_copy", "function quantized_copy", None),
]
SAME_OBJECT = [
    [
        "turbine_aot.builtins:AbstractBool",
        "turbine_aot.support.procedural:AbstractBool",
        "turbine_aot:AbstractBool",
    ],
    [
        "turbine_aot.builtins:AbstractF32",
        "turbine_aot.support.procedural:AbstractF32",
        "turbine_aot:AbstractF32",
    ],
    [
        "turbine_aot.builtins:AbstractF64",
        "turbine_aot.support.procedural:AbstractF64",
        "turbine_aot:AbstractF64",
    ],
    [
        "turbine_aot.builtins:AbstractI32",
        "turbine_aot.support.procedural:AbstractI32",
        "turbine_aot:AbstractI32",
    ],
    [
        "turbine_aot.builtins:AbstractI64",
        "turbine_aot.support.procedural:AbstractI64",
        "turbine_aot:AbstractI64",
    ],
    [
        "turbine_aot.builtins:AbstractIndex",
        "turbine_aot.support.procedural:AbstractIndex",
        "turbine_aot:AbstractIndex",
    ],
    ["turbine_aot.builtins:AbstractScalar", "turbine_aot.support.procedural:AbstractScalar"],
    [
        "turbine_aot.builtins:AbstractTensor",
        "turbine_aot.support.procedural:AbstractTensor",
        "turbine_aot:AbstractTensor",
    ],
    ["turbine_aot.builtins:IREE", "turbine_aot:IREE"],
    [
        "turbine_aot.builtins:abstractify",
        "turbine_aot.support.procedural:abstractify",
        "turbine_aot:abstractify",
    ],
    [
        "turbine_aot.builtins:export_buffers",
        "turbine_aot.support.procedural:export_buffers",
        "turbine_aot:export_buffers",
    ],
    [
        "turbine_aot.builtins:export_global",
        "turbine_aot.support.procedural:export_global",
        "turbine_aot:export_global",
    ],
    [
        "turbine_aot.builtins:export_global_tree",
        "turbine_aot.support.procedural:export_global_tree",
        "turbine_aot:export_global_tree",
    ],
    [
        "turbine_aot.builtins:export_parameters",
        "turbine_aot.support.procedural:export_parameters",
        "turbine_aot:export_parameters",
    ],
    ["turbine_aot.builtins:jittable", "turbine_aot:jittable"],
    ["turbine_aot.compiled_module:CompiledModule", "turbine_aot:CompiledModule"],
    ["turbine_aot.compiled_module:ImportPhase", "turbine_aot:ImportPhase"],
    [
        "turbine_aot.decompositions:current_aot_decompositions",
        "turbine_aot:current_aot_decompositions",
    ],
    [
        "turbine_aot.decompositions:extend_aot_decompositions",
        "turbine_aot:extend_aot_decompositions",
    ],
    ["turbine_aot.exporter:ExportOutput", "turbine_aot:ExportOutput"],
    ["turbine_aot.exporter:export", "turbine_aot:export"],
    ["turbine_aot.fx_programs:FxPrograms", "turbine_aot:FxPrograms"],
    ["turbine_aot.fx_programs:FxProgramsBuilder", "turbine_aot:FxProgramsBuilder"],
    ["turbine_aot.params:ParameterArchive", "turbine_aot:ParameterArchive"],
    ["turbine_aot.params:ParameterArchiveBuilder", "turbine_aot:ParameterArchiveBuilder"],
    ["turbine_aot.params:ParameterArchiveEntry", "turbine_aot:ParameterArchiveEntry"],
    [
        "turbine_aot.params:externalize_module_parameters",
        "turbine_aot:externalize_module_parameters",
    ],
    ["turbine_aot.params:save_module_parameters", "turbine_aot:save_module_parameters"],
    ["turbine_aot.runtime:CompileError", "turbine_aot:CompileError"],
    ["turbine_aot.runtime:FunctionSignature", "turbine_aot.runtime:FlatSignature"],
    [
        "turbine_aot.support.procedural:DeviceAffinity",
        "turbine_aot.tensor_traits:DeviceAffinity",
        "turbine_aot:DeviceAffinity",
    ],
    ["turbine_aot.tensor_traits:DeviceTensorTrait", "turbine_aot:DeviceTensorTrait"],
    ["turbine_aot.tensor_traits:ExternalTensorTrait", "turbine_aot:ExternalTensorTrait"],
]


def _what(obj: object) -> str:
    if isinstance(obj, types.ModuleType):
        return "module " + obj.__name__
    if inspect.isclass(obj):
        return "class " + obj.__qualname__
    if callable(obj):
        return "function " + getattr(obj, "__qualname__", type(obj).__qualname__)
    if isinstance(obj, (str, int, float, bool)):
        return f"value {obj!r}"
    return "value " + type(obj).__name__


def _public(module: types.ModuleType) -> list[str]:
    return [*module.__all__, *getattr(module, "_EXTRA", ())]


@pytest.mark.parametrize(
    "module, name, what, lower", PUBLIC_NAMES, ids=[f"{m}:{n}" for m, n, _, _ in PUBLIC_NAMES]
)
def test_public_name_still_imports(module, name, what, lower):
    mod = importlib.import_module(module)
    assert name in _public(mod), f"{name} left {module}.__all__"
    obj = getattr(mod, name)
    assert _what(obj) == what
    if lower is not None:
        assert getattr(importlib.import_module(lower), name) is obj, f"not {lower}.{name}"


@pytest.mark.parametrize("group", SAME_OBJECT, ids=[g[0] for g in SAME_OBJECT])
def test_public_names_of_one_object_stay_one_object(group):
    objects = []
    for path in group:
        module, name = path.split(":")
        objects.append(getattr(importlib.import_module(module), name))
    assert all(o is objects[0] for o in objects), group


def test_no_public_module_lost_a_name():
    recorded: dict[str, set[str]] = {}
    for module, name, _, _ in PUBLIC_NAMES:
        recorded.setdefault(module, set()).add(name)
    for module, names in recorded.items():
        missing = names - set(_public(importlib.import_module(module)))
        assert not missing, f"{module} lost {sorted(missing)}"


def test_console_script_entry_point_imports():
    meta = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    module, _, attr = meta["project"]["scripts"]["turbine-aot"].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
