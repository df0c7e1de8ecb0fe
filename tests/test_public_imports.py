"""Every public import path of the four lower packages, as of issue 24's start, still imports and
names the same objects (module splits and renames keep users' imports working).

``PUBLIC`` was recorded from main at commit 86bbb59 (before issue 24's reorganization) by
importing each package, its ``__all__`` and each public submodule (no ``_`` in its path; a module
without ``__all__`` by the names it imports explicitly); each name is described by kind and name
(class / function ``__qualname__``, the value of a plain constant, the type of an instance), so a
moved definition still matches and a replaced one does not. New names may be added; none of
these may go or change. turbine_aot's surface has its own test.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import types

import pytest

PUBLIC: dict[str, dict[str, str]] = {
    "turbine_fx": {
        "CONSTANT_RESULTS_ATTR": "value 'turbine.constant_results'",
        "DEFAULT_DECOMPOSITION_OPS": "instance tuple",
        "DecompositionError": "class DecompositionError",
        "FxImportError": "class FxImportError",
        "FxProgram": "class FxProgram",
        "FxPrograms": "class FxPrograms",
        "FxProgramsBuilder": "class FxProgramsBuilder",
        "FxProgramsError": "class FxProgramsError",
        "JittableError": "class JittableError",
        "PreparedProgram": "class PreparedProgram",
        "TurbineFxError": "class TurbineFxError",
        "UnsupportedOpError": "class UnsupportedOpError",
        "UnsupportedQuantizationError": "class UnsupportedQuantizationError",
        "check_quantized_module": "function check_quantized_module",
        "current_aot_decompositions": "function current_aot_decompositions",
        "extend_aot_decompositions": "function extend_aot_decompositions",
        "import_exported_program": "function import_exported_program",
        "jittable": "class jittable",
        "passes": "module turbine_fx.passes",
        "prepare_program": "function prepare_program",
        "program_and_arg_device": "function program_and_arg_device",
        "verify_lowering": "function verify_lowering",
    },
    "turbine_fx.passes": {
        "functorch_functionalize": "function functorch_functionalize",
    },
    "turbine_ir": {
        "AFFINITY_ARG_ATTR": "value 'iree.abi.affinity'",
        "DEFAULT_PARAMETER_SCOPE": "value 'model'",
        "Empty": "instance EmptyType",
        "EmptyType": "class EmptyType",
        "FunctionBuilder": "class FunctionBuilder",
        "GLOBAL_AFFINITY_ATTR": "value 'stream.affinity'",
        "GlobalAttributes": "class GlobalAttributes",
        "IREE_TYPE_ASM_TO_TORCH_DTYPE": "instance dict",
        "IrBuildError": "class IrBuildError",
        "ModuleBuilder": "class ModuleBuilder",
        "ModuleBuilderOptions": "class ModuleBuilderOptions",
        "NativeTypeConverter": "class NativeTypeConverter",
        "RESOURCE_ALIGNMENT": "value 64",
        "RefMapping": "class RefMapping",
        "RefTracker": "class RefTracker",
        "SIGNED_MLIR_TYPE_ASM_TO_TORCH_DTYPE": "instance dict",
        "TORCH_DTYPE_TO_IREE_TYPE_ASM": "instance dict",
        "TORCH_DTYPE_TO_SIGNED_MLIR_TYPE_ASM": "instance dict",
        "TurbineIrError": "class TurbineIrError",
        "TypeCache": "class TypeCache",
        "UnsupportedDtypeError": "class UnsupportedDtypeError",
        "attributes_from_argument_device_affinities": "function attributes_from_argument_device_affinities",
        "build_index_constant": "function build_index_constant",
        "build_tensor_dim_value": "function build_tensor_dim_value",
        "device_promise_asm": "function device_promise_asm",
        "device_promise_attr": "function device_promise_attr",
        "dialects": "module turbine_ir.dialects",
        "element_type_to_torch_dtype": "function element_type_to_torch_dtype",
        "ir": "module turbine_ir.ir",
        "passmanager": "module turbine_ir.passmanager",
        "reshape_element_count_errors": "function reshape_element_count_errors",
        "tensor_storage_key": "function tensor_storage_key",
        "tensor_to_bytes": "function tensor_to_bytes",
        "tensor_to_dense_attr": "function tensor_to_dense_attr",
        "tensor_to_dense_resource_attr": "function tensor_to_dense_resource_attr",
        "tensor_type_asm": "function tensor_type_asm",
        "torch_dtype_to_element_asm": "function torch_dtype_to_element_asm",
        "torch_dtype_to_element_type": "function torch_dtype_to_element_type",
        "torch_dtype_to_vtensor_element_asm": "function torch_dtype_to_vtensor_element_asm",
        "torch_tensor_type": "function torch_tensor_type",
        "torch_vtensor_type": "function torch_vtensor_type",
        "vtensor_type_asm": "function vtensor_type_asm",
    },
    "turbine_ir.dialects": {
        "arith": "module iree.compiler.dialects.arith",
        "available_dialects": "function available_dialects",
        "builtin": "module iree.compiler.dialects.builtin",
        "cf": "module iree.compiler.dialects.cf",
        "complex": "module iree.compiler.dialects.complex",
        "flow": "module iree.compiler.dialects.flow",
        "func": "module iree.compiler.dialects.func",
        "hal": "module iree.compiler.dialects.hal",
        "iree_codegen": "module iree.compiler.dialects.iree_codegen",
        "iree_gpu": "module iree.compiler.dialects.iree_gpu",
        "iree_tensor_ext": "module iree.compiler.dialects.iree_tensor_ext",
        "linalg": "module iree.compiler.dialects.linalg",
        "math": "module iree.compiler.dialects.math",
        "memref": "module iree.compiler.dialects.memref",
        "scf": "module iree.compiler.dialects.scf",
        "stream": "module iree.compiler.dialects.stream",
        "tensor": "module iree.compiler.dialects.tensor",
        "util": "module iree.compiler.dialects.util",
        "vector": "module iree.compiler.dialects.vector",
    },
    "turbine_ir.ir": {
        "Attribute": "class Attribute",
        "BF16Type": "class BF16Type",
        "Block": "class Block",
        "ComplexType": "class ComplexType",
        "Context": "class _site_initialize.<locals>.Context",
        "DenseElementsAttr": "class DenseElementsAttr",
        "DenseResourceElementsAttr": "class DenseResourceElementsAttr",
        "DictAttr": "class DictAttr",
        "F16Type": "class F16Type",
        "F32Type": "class F32Type",
        "F64Type": "class F64Type",
        "FlatSymbolRefAttr": "class FlatSymbolRefAttr",
        "FloatAttr": "class FloatAttr",
        "FunctionType": "class FunctionType",
        "IndexType": "class IndexType",
        "InsertionPoint": "class InsertionPoint",
        "IntegerAttr": "class IntegerAttr",
        "IntegerType": "class IntegerType",
        "Location": "class Location",
        "MLIRError": "class MLIRError",
        "Module": "class Module",
        "Operation": "class Operation",
        "RankedTensorType": "class RankedTensorType",
        "ShapedType": "class ShapedType",
        "StringAttr": "class StringAttr",
        "SymbolTable": "class SymbolTable",
        "Type": "class Type",
        "TypeAttr": "class TypeAttr",
        "UnitAttr": "class UnitAttr",
        "Value": "class Value",
    },
    "turbine_ir.passmanager": {
        "PassManager": "class PassManager",
    },
    "turbine_params": {
        "DTypeInfo": "class DTypeInfo",
        "DeviceAffinity": "class DeviceAffinity",
        "DeviceTensorTrait": "class DeviceTensorTrait",
        "EntryType": "class EntryType",
        "ExternalTensorTrait": "class ExternalTensorTrait",
        "ParameterArchive": "class ParameterArchive",
        "ParameterArchiveBuilder": "class ParameterArchiveBuilder",
        "ParameterArchiveEntry": "class ParameterArchiveEntry",
        "ParameterArchiveError": "class ParameterArchiveError",
        "ParameterIndex": "class ParameterIndex",
        "ParameterIndexEntry": "class ParameterIndexEntry",
        "TensorMetadata": "class TensorMetadata",
        "archive_tensors": "function archive_tensors",
        "atomic_output_file": "function atomic_output_file",
        "atomic_write_bytes": "function atomic_write_bytes",
        "convert_parameters": "function convert_parameters",
        "describe_archive": "function describe_archive",
        "dtype_info": "function dtype_info",
        "externalize_module_parameters": "function externalize_module_parameters",
        "int4_values": "function int4_values",
        "irpa_to_safetensors": "function irpa_to_safetensors",
        "is_wrapper_subclass": "function is_wrapper_subclass",
        "known_dtype_names": "function known_dtype_names",
        "make_owned_temp": "function make_owned_temp",
        "mark_int4": "function mark_int4",
        "max_splat_bytes": "function max_splat_bytes",
        "pack_int4": "function pack_int4",
        "remove_stale_temps": "function remove_stale_temps",
        "safetensors_to_irpa": "function safetensors_to_irpa",
        "save_module_parameters": "function save_module_parameters",
        "strip_archive": "function strip_archive",
        "subclass_inner_tensors": "function subclass_inner_tensors",
        "torch_checkpoint_to_irpa": "function torch_checkpoint_to_irpa",
        "unpack_int4": "function unpack_int4",
        "verify_archive": "function verify_archive",
        "versions_text": "function versions_text",
        "write_safetensors": "function write_safetensors",
    },
    "turbine_trace": {
        "AbstractBool": "instance AbstractScalar",
        "AbstractF32": "instance AbstractScalar",
        "AbstractF64": "instance AbstractScalar",
        "AbstractI32": "instance AbstractScalar",
        "AbstractI64": "instance AbstractScalar",
        "AbstractIndex": "instance AbstractScalar",
        "AbstractIntrinsic": "class AbstractIntrinsic",
        "AbstractScalar": "class AbstractScalar",
        "AbstractTensor": "class AbstractTensor",
        "AbstractTypedef": "class AbstractTypedef",
        "Abstractifiable": "class Abstractifiable",
        "AbstractifyError": "class AbstractifyError",
        "CallableIntrinsic": "class CallableIntrinsic",
        "GlobalsDef": "class GlobalsDef",
        "GlobalsDefError": "class GlobalsDefError",
        "IREE": "instance IREEEmitter",
        "IREEEmitter": "class IREEEmitter",
        "Intrinsic": "class Intrinsic",
        "IrGlobalScalar": "class IrGlobalScalar",
        "IrGlobalTensor": "class IrGlobalTensor",
        "IrImmediateScalar": "class IrImmediateScalar",
        "IrImmediateTensor": "class IrImmediateTensor",
        "IrScalar": "class IrScalar",
        "IrTensor": "class IrTensor",
        "IrTrace": "class IrTrace",
        "IrType": "class Type",
        "LiveGlobalCollectionProxy": "class LiveGlobalCollectionProxy",
        "MaterializedGlobal": "class MaterializedGlobal",
        "ProcedureTrace": "class ProcedureTrace",
        "ProcedureTraceError": "class ProcedureTraceError",
        "TraceError": "class TraceError",
        "TreeAbstractifiable": "class TreeAbstractifiable",
        "TreeSpec": "class TreeSpec",
        "abstractify": "function abstractify",
        "abstractify_single_value": "function abstractify_single_value",
        "convert_py_value_to_ir": "function convert_py_value_to_ir",
        "current_ir_trace": "function current_ir_trace",
        "export_buffers": "class export_buffers",
        "export_global": "class export_global",
        "export_global_tree": "class export_global_tree",
        "export_parameters": "class export_parameters",
        "new_ir_trace_scope": "function new_ir_trace_scope",
        "tree_flatten": "function tree_flatten",
        "tree_map": "function tree_map",
        "tree_unflatten": "function tree_unflatten",
        "treespec_dumps": "function treespec_dumps",
    },
}

#: Names that were one object under several paths.
ALIASES = [
    ("turbine_ir.ir:Type", "turbine_trace:IrType"),
]

#: Re-exports of IREE's bindings: the same objects as IREE's own modules.
IREE_REEXPORTS = {
    "turbine_ir.ir": "iree.compiler.ir",
    "turbine_ir.dialects": "iree.compiler.dialects",
    "turbine_ir.passmanager": "iree.compiler.passmanager",
}


def _describe(obj: object) -> str:
    if isinstance(obj, types.ModuleType):
        return "module " + obj.__name__
    if inspect.isclass(obj):
        return "class " + obj.__qualname__
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "function " + obj.__qualname__
    if isinstance(obj, (str, int, float, bool, type(None))):
        return "value " + repr(obj)
    return "instance " + type(obj).__qualname__


def _resolve(ref: str) -> object:
    path, name = ref.split(":")
    return getattr(importlib.import_module(path), name)


@pytest.mark.parametrize("path", sorted(PUBLIC))
def test_public_path_names_the_same_objects(path):
    module = importlib.import_module(path)
    missing = [name for name in PUBLIC[path] if not hasattr(module, name)]
    assert not missing, f"{path} no longer has {missing}"
    changed = {
        name: (recorded, _describe(getattr(module, name)))
        for name, recorded in PUBLIC[path].items()
        if _describe(getattr(module, name)) != recorded
    }
    assert not changed, f"{path}: (recorded, now) differ: {changed}"
    if hasattr(module, "__all__"):
        dropped = sorted(set(PUBLIC[path]) - set(module.__all__))
        assert not dropped, f"{path}.__all__ no longer lists {dropped}"


@pytest.mark.parametrize("refs", ALIASES)
def test_aliases_are_one_object(refs):
    first, *others = (_resolve(ref) for ref in refs)
    assert all(other is first for other in others), refs


@pytest.mark.parametrize("path", sorted(IREE_REEXPORTS))
def test_iree_reexports_are_iree_objects(path):
    ours, theirs = importlib.import_module(path), importlib.import_module(IREE_REEXPORTS[path])
    for name in PUBLIC[path]:
        obj = getattr(ours, name)
        if isinstance(obj, types.ModuleType):  # a dialect: iree.compiler.dialects.<name>
            assert obj is importlib.import_module(f"{IREE_REEXPORTS[path]}.{name}"), name
        elif hasattr(theirs, name):
            assert obj is getattr(theirs, name), f"{path}.{name}"
        else:  # turbine's own helper beside the bindings (dialects.available_dialects)
            assert getattr(obj, "__module__", "").startswith("turbine_ir"), f"{path}.{name}"


def test_package_objects_are_their_definitions():
    """A package's name and the module defining it hold one object (no stale copy on a split)."""
    for path, names in PUBLIC.items():
        module = importlib.import_module(path)
        for name in names:
            obj = getattr(module, name)
            home = getattr(obj, "__module__", None)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)) or not home:
                continue
            if home.split(".")[0] != path.split(".")[0]:
                continue  # defined by torch / IREE, re-exported
            assert getattr(importlib.import_module(home), obj.__name__) is obj, (
                f"{path}.{name} is not {home}.{obj.__name__}"
            )


def test_turbine_params_command_line_entry_points():
    scripts = {ep.name: ep for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts["turbine-params"].value == "turbine_params._cli:main"
    assert callable(scripts["turbine-params"].load())
    assert importlib.util.find_spec("turbine_params.__main__") is not None
