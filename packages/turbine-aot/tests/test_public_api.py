"""The public surface matches the ``iree.turbine.aot`` reference (names, submodule paths and the
signatures of the export API)."""

from __future__ import annotations

import importlib
import inspect

import pytest

import turbine_aot

# The names `from iree.turbine.aot import *` binds on the reference (38, measured): the
# documented top-level API, the scalar abstract types, IREE and nine submodules.
REFERENCE_SUBMODULES = {
    "builtins",
    "compiled_module",
    "decompositions",
    "exporter",
    "fx_programs",
    "params",
    "passes",
    "support",
    "tensor_traits",
}
REFERENCE_TOP_LEVEL = REFERENCE_SUBMODULES | {
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
}

REFERENCE_PROCEDURAL = {
    "AbstractBool",
    "AbstractF32",
    "AbstractF64",
    "AbstractI32",
    "AbstractI64",
    "AbstractIndex",
    "AbstractIntrinsic",
    "AbstractScalar",
    "AbstractTensor",
    "AbstractTypedef",
    "Abstractifiable",
    "Any",
    "CallableIntrinsic",
    "DeviceAffinity",
    "DictAttr",
    "Empty",
    "EmptyType",
    "F32Type",
    "F64Type",
    "FunctionBuilder",
    "GlobalAttributes",
    "GlobalsDef",
    "IREEEmitter",
    "IndexType",
    "IntegerType",
    "Intrinsic",
    "IrGlobalScalar",
    "IrGlobalTensor",
    "IrImmediateScalar",
    "IrImmediateTensor",
    "IrScalar",
    "IrTensor",
    "IrTrace",
    "IrType",
    "LiveGlobalCollectionProxy",
    "Location",
    "MaterializedGlobal",
    "ModuleBuilder",
    "Operation",
    "ProcedureTrace",
    "ProcedureTraceError",
    "RankedTensorType",
    "ShapedType",
    "ShapedTypeDynamicSizeSentinel",
    "StringAttr",
    "TreeAbstractifiable",
    "TreeSpec",
    "Value",
    "abstractify",
    "abstractify_single_value",
    "attributes_from_argument_device_affinities",
    "build_tensor_dim_value",
    "cast",
    "contextmanager",
    "convert_py_value_to_ir",
    "current_ir_trace",
    "new_ir_trace_scope",
    "tree_flatten",
    "tree_map",
    "tree_unflatten",
    "treespec_dumps",
}

REFERENCE_BUILTINS = {
    "IREE",
    "AbstractBool",
    "AbstractF32",
    "AbstractF64",
    "AbstractI32",
    "AbstractI64",
    "AbstractIndex",
    "AbstractTensor",
    "abstractify",
    "export_buffers",
    "export_global",
    "export_global_tree",
    "export_parameters",
    "jittable",
}


def test_star_import_gives_exactly_the_reference_names():
    namespace: dict = {}
    exec("from turbine_aot import *", namespace)
    names = {k for k in namespace if not k.startswith("__")}
    assert len(REFERENCE_TOP_LEVEL) == 38
    assert names == REFERENCE_TOP_LEVEL
    assert set(turbine_aot.__all__) == REFERENCE_TOP_LEVEL
    for sub in REFERENCE_SUBMODULES:
        assert namespace[sub].__name__ == f"turbine_aot.{sub}", sub
    assert namespace["IREE"] is turbine_aot.IREE
    assert type(turbine_aot.IREE).__name__ == "IREEEmitter"


def test_reference_submodules_hold_their_names():
    from turbine_aot import compiled_module, exporter, fx_programs, params, tensor_traits

    assert compiled_module.CompiledModule is turbine_aot.CompiledModule
    assert compiled_module.ImportPhase is turbine_aot.ImportPhase
    assert exporter.export is turbine_aot.export
    assert exporter.ExportOutput is turbine_aot.ExportOutput
    assert fx_programs.FxPrograms is turbine_aot.FxPrograms
    assert fx_programs.FxProgramsBuilder is turbine_aot.FxProgramsBuilder
    for name in (
        "ParameterArchive",
        "ParameterArchiveBuilder",
        "ParameterArchiveEntry",
        "externalize_module_parameters",
        "save_module_parameters",
    ):
        assert getattr(params, name) is getattr(turbine_aot, name), name
    for name in ("DeviceAffinity", "DeviceTensorTrait", "ExternalTensorTrait"):
        assert getattr(tensor_traits, name) is getattr(turbine_aot, name), name


def test_support_procedural_star_import():
    namespace: dict = {}
    exec("from turbine_aot.support.procedural import *", namespace)
    for name in (
        "AbstractBool",
        "AbstractF32",
        "AbstractF64",
        "AbstractI32",
        "AbstractI64",
        "AbstractIndex",
        "Empty",
        "ShapedTypeDynamicSizeSentinel",
        "tree_unflatten",
        "treespec_dumps",
    ):
        assert name in namespace, name
    from turbine_ir.ir import ShapedType

    assert namespace["ShapedTypeDynamicSizeSentinel"] == ShapedType.get_dynamic_size()
    spec = namespace["tree_flatten"](([1, 2], {"a": 3}))[1]
    assert namespace["tree_unflatten"]([4, 5, 6], spec) == ([4, 5], {"a": 6})
    assert '"builtins.tuple"' in namespace["treespec_dumps"](spec)


def test_support_procedural_names():
    from turbine_aot.support import procedural

    missing = sorted(n for n in REFERENCE_PROCEDURAL if not hasattr(procedural, n))
    assert missing == []
    assert procedural.IrType.__name__ == "Type"


def test_builtins_passes_decompositions():
    from turbine_aot import builtins, decompositions, passes

    assert sorted(n for n in REFERENCE_BUILTINS if not hasattr(builtins, n)) == []
    assert builtins.abstractify is turbine_aot.abstractify
    assert builtins.IREE.__class__.__name__ == "IREEEmitter"
    assert callable(passes.functorch_functionalize)
    assert decompositions.current_aot_decompositions is turbine_aot.current_aot_decompositions
    with decompositions.extend_aot_decompositions(add_ops=[]):
        assert isinstance(decompositions.current_aot_decompositions(), dict)


def test_functorch_functionalize_removes_inplace_ops():
    import torch

    from turbine_aot.passes import functorch_functionalize

    def f(x):
        y = x.clone()
        y.add_(1)
        return y

    gm = functorch_functionalize(f, torch.zeros(3))
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any(t.endswith("add_.Tensor") or "add_" in t for t in targets)
    torch.testing.assert_close(gm(torch.zeros(3)), torch.ones(3))


@pytest.mark.parametrize(
    "path",
    [
        "turbine_aot.support.procedural",
        "turbine_aot.passes",
        "turbine_aot.decompositions",
        "turbine_aot.builtins",
        "turbine_aot.build_actions",
        "turbine_aot.custom_ops",
        "turbine_aot.compiled_module",
        "turbine_aot.exporter",
        "turbine_aot.fx_programs",
        "turbine_aot.params",
        "turbine_aot.tensor_traits",
    ],
)
def test_submodule_paths_import(path):
    assert importlib.import_module(path) is not None


def _params(f) -> list[tuple[str, str, object]]:
    return [
        (p.name, p.kind.name, p.default if p.default is not inspect.Parameter.empty else "<req>")
        for p in inspect.signature(f).parameters.values()
    ]


def test_export_api_signatures():
    from turbine_aot import CompiledModule, ExportOutput, export

    export_params = [p[0] for p in _params(export)]
    assert export_params[:8] == [
        "mdl",
        "example_args",
        "args",
        "kwargs",
        "dynamic_shapes",
        "module_name",
        "function_name",
        "strict_export",
    ]
    assert {"import_symbolic_shape_expressions", "arg_device"} <= set(export_params)
    assert _params(CompiledModule.__init__)[1:] == [
        ("context", "KEYWORD_ONLY", None),
        ("module_op", "KEYWORD_ONLY", None),
        ("import_to", "KEYWORD_ONLY", "import"),
    ]
    assert [p[0] for p in _params(ExportOutput.__init__)] == [
        "self",
        "session",
        "compiled_module",
        "importer_uses_session",
    ]
    compile_params = {p[0]: p for p in _params(ExportOutput.compile)}
    assert compile_params["save_to"][2] is None
    assert compile_params["target_backends"][2] == ("llvm-cpu",)
    assert _params(ExportOutput.print_readable)[1] == (
        "large_elements_limit",
        "POSITIONAL_OR_KEYWORD",
        50,
    )
    assert [p[0] for p in _params(CompiledModule.run_import)] == ["inst", "import_to"]
    assert _params(CompiledModule.run_pass_pipeline)[2] == (
        "enable_ir_printing",
        "POSITIONAL_OR_KEYWORD",
        False,
    )
    assert [p[0] for p in _params(CompiledModule.create_from_dict)] == [
        "name",
        "dct",
        "export_name",
        "options",
    ]
    for static in (
        "get_class_info",
        "get_info",
        "get_mlir_module",
        "get_module_builder",
        "run_import",
        "run_pass_pipeline",
        "save_mlir",
        "expand_custom_ops",
        "signature_info",
    ):
        assert isinstance(inspect.getattr_static(CompiledModule, static), staticmethod), static
    for member in ("mlir_module", "verify", "print_readable", "save_mlir", "import_to", "compile"):
        assert hasattr(ExportOutput, member), member
