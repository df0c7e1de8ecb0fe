"""ModuleBuilder, GlobalAttributes, FunctionBuilder, affinities: golden IR and unit tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from turbine_ir import (
    FunctionBuilder,
    GlobalAttributes,
    IrBuildError,
    ModuleBuilder,
    ModuleBuilderOptions,
    RefTracker,
    UnsupportedDtypeError,
    attributes_from_argument_device_affinities,
    build_tensor_dim_value,
    device_promise_asm,
    ir,
    tensor_storage_key,
)
from turbine_ir.dialects import arith, util
from turbine_params import DeviceAffinity, DeviceTensorTrait, ExternalTensorTrait

# --- globals: one golden check per kind ---------------------------------------------------


def test_inline_global(mb, check_ir):
    sym, op, gtype = mb.create_tensor_global(
        "__auto.w", torch.zeros(2, 3, dtype=torch.int16), attrs=GlobalAttributes()
    )
    assert (sym, str(gtype)) == ("__auto.w", "tensor<2x3xi16>")
    assert mb.last_global_op == op
    check_ir(
        str(mb.module_op),
        r"^  util\.global private @__auto\.w = dense_resource<torch_tensor_2_3_torch.int16> : "
        r"tensor<2x3xi16>$",
        r"torch_tensor_2_3_torch.int16: \"0x02000000(0000){6}\"",  # int16: declared alignment 2
    )


def test_inline_bf16_and_fp8_globals_are_dense(mb, check_ir):
    # IREE 3.13 miscompiles dense_resource of these types; dense<...> compiles at every size.
    mb.create_tensor_global(
        "__auto.h", torch.tensor([1.5, -2.0], dtype=torch.bfloat16), attrs=GlobalAttributes()
    )
    mb.create_tensor_global(
        "__auto.q",
        torch.tensor([0.5, 448.0]).to(torch.float8_e4m3fn),
        attrs=GlobalAttributes(),
    )
    mb.create_tensor_global("__auto.e", torch.empty(0, 2), attrs=GlobalAttributes())
    check_ir(
        str(mb.module_op),
        r"@__auto\.h <inlining_policy = #util\.inline\.never> = "
        r"dense<\[1\.500000e\+00, -2\.000000e\+00\]> : tensor<2xbf16>$",
        r"@__auto\.q = dense<\[5\.000000e-01, 4\.480000e\+02\]> : tensor<2xf8E4M3FN>$",
        r"@__auto\.e = dense<> : tensor<0x2xf32>$",
    )


def test_bf16_noinline_workaround_can_be_turned_off(ctx, check_ir):
    mb = ModuleBuilder(ir.Module.create(), options=ModuleBuilderOptions(bf16_noinline=False))
    mb.create_tensor_global(
        "__auto.h", torch.ones(3, dtype=torch.bfloat16), attrs=GlobalAttributes()
    )
    check_ir(str(mb.module_op), r"@__auto\.h = dense<1\.000000e\+00> : tensor<3xbf16>$")


def test_external_global_from_trait_empty_scope_is_model(mb, check_ir):
    t = torch.empty(4, 4, device="meta")  # data never needed for an external global
    ExternalTensorTrait("", "fc.weight").set(t)
    mb.create_tensor_global("__auto.fc.weight", t, attrs=GlobalAttributes())
    check_ir(
        str(mb.module_op),
        r'^  util\.global private @__auto\.fc\.weight = #flow\.parameter\.named<"model"::"fc\.weight"> '
        r": tensor<4x4xf32>$",
    )


def test_external_global_forced_with_scope_and_name_mapper(mb, check_ir):
    attrs = GlobalAttributes(
        external=True, external_scope="weights", name_mapper=lambda n: f"layer0.{n}"
    )
    mb.create_tensor_global("__auto.b", torch.ones(3), attrs=attrs, logical_name="bias")
    check_ir(
        str(mb.module_op),
        r'@__auto\.b = #flow\.parameter\.named<"weights"::"layer0\.bias"> : tensor<3xf32>$',
    )


def test_external_global_with_a_storage_dtype(mb, check_ir):
    """torchao int4 data: int8 values in the tensor, i4 in the archive and the global."""
    t = torch.zeros(4, 8, dtype=torch.int8)
    ExternalTensorTrait("", "w.qdata").set(t)
    _, _, gtype = mb.create_tensor_global(
        "__auto.w.qdata", t, attrs=GlobalAttributes(), storage_dtype=torch.int4
    )
    assert str(gtype) == "tensor<4x8xi4>"
    check_ir(
        str(mb.module_op),
        r'@__auto\.w\.qdata = #flow\.parameter\.named<"model"::"w\.qdata"> : tensor<4x8xi4>$',
    )
    with pytest.raises(IrBuildError, match=r"storage dtype .* needs an external global"):
        mb.create_tensor_global(
            "__auto.inline",
            torch.zeros(4, 8, dtype=torch.int8),
            attrs=GlobalAttributes(),
            storage_dtype=torch.int4,
        )


def test_external_trait_ignored_when_external_false(mb, check_ir):
    t = torch.ones(2)
    ExternalTensorTrait("model", "x").set(t)
    mb.create_tensor_global("__auto.x", t, attrs=GlobalAttributes(external=False))
    check_ir(str(mb.module_op), r"@__auto\.x = dense_resource<")


def test_mutable_noinline_global(mb, check_ir):
    mb.create_tensor_global(
        "__auto.state",
        torch.arange(4, dtype=torch.int64),
        attrs=GlobalAttributes(mutable=True, noinline=True),
    )
    check_ir(
        str(mb.module_op),
        r"^  util\.global private mutable @__auto\.state <inlining_policy = #util\.inline\.never> "
        r"= dense_resource<torch_tensor_4_torch\.int64> : tensor<4xi64>$",
    )


def test_uninitialized_globals(mb, check_ir):
    mb.create_tensor_global(
        "__auto.u",
        torch.empty(2, 2, device="meta"),
        attrs=GlobalAttributes(mutable=True, uninitialized=True),
    )
    with mb.context:
        dyn = ir.ShapedType.get_dynamic_size()
        mb.create_typed_global(
            "__auto.dyn",
            ir.RankedTensorType.get([dyn, 8], ir.F16Type.get()),
            attrs=GlobalAttributes(mutable=True, uninitialized=True),
        )
        mb.create_typed_global(
            "__auto.plain", ir.IndexType.get(), attrs=GlobalAttributes(mutable=True)
        )
    check_ir(
        str(mb.module_op),
        r"^  util\.global private mutable @__auto\.u = #util\.uninitialized : tensor<2x2xf32>$",
        r"^  util\.global private mutable @__auto\.dyn : tensor<\?x8xf16>$",  # IREE cannot size it
        # An initialized typed global starts at zero (as in the reference).
        r"^  util\.global private mutable @__auto\.plain = 0 : index$",
    )


def test_typed_global_external_scalar(mb, check_ir):
    with mb.context:
        sym, _op = mb.create_typed_global(
            "__auto.scale",
            ir.F32Type.get(),
            attrs=GlobalAttributes(external=True),
            logical_name="scale",
        )
    assert sym == "__auto.scale"
    check_ir(
        str(mb.module_op), r'@__auto\.scale = #flow\.parameter\.named<"model"::"scale"> : f32$'
    )


def test_device_trait_gives_stream_affinity(mb, check_ir):
    t = torch.ones(2)
    DeviceTensorTrait(1, queues=["0", "2"]).set(t)
    mb.create_tensor_global("__auto.d", t, attrs=GlobalAttributes())
    check_ir(
        str(mb.module_op),
        r"@__auto\.d \{stream\.affinity = #hal\.device\.promise<@__device_1, \[0, 2\]>\} = ",
    )


def test_globals_stay_before_functions_in_creation_order(mb, check_ir):
    _, fop = mb.create_func_op("f", [])
    fb = FunctionBuilder(module_builder=mb, func_op=fop)
    with fb.loc:
        fb.emit_return()
    mb.create_tensor_global("__auto.a", torch.ones(2), attrs=GlobalAttributes())
    mb.create_tensor_global("__auto.b", torch.ones(3), attrs=GlobalAttributes())
    check_ir(str(mb.module_op), r"@__auto\.a", r"@__auto\.b", r"func\.func @f")


def test_meta_tensor_inline_is_a_clear_error(mb):
    with pytest.raises(UnsupportedDtypeError, match=r"shape \(2,\) has no data"):
        mb.create_tensor_global("__auto.m", torch.empty(2, device="meta"), attrs=GlobalAttributes())


def test_global_attributes_contradiction():
    with pytest.raises(ValueError, match=r"external=True and uninitialized=True"):
        GlobalAttributes(external=True, uninitialized=True)
    # The external check comes first, as in the reference (this one is not mutable either).
    with pytest.raises(ValueError, match=r"external=True"):
        GlobalAttributes(external=True, uninitialized=True, mutable=False)
    with pytest.raises(
        ValueError, match=r"Globals with uninitialized=True must also be mutable=True"
    ):
        GlobalAttributes(uninitialized=True)
    assert GlobalAttributes(uninitialized=True, mutable=True).uninitialized


def test_zero_initial_values_of_typed_globals(mb, check_ir):
    with mb.context:
        types = {
            "index": ir.IndexType.get(),
            "f32": ir.F32Type.get(),
            "f64": ir.F64Type.get(),
            "i32": ir.IntegerType.get_signless(32),
            "i64": ir.IntegerType.get_signless(64),
            "i1": ir.IntegerType.get_signless(1),
            "t_i32": ir.RankedTensorType.get([1], ir.IntegerType.get_signless(32)),
            "t_f64": ir.RankedTensorType.get([2], ir.F64Type.get()),
        }
        for name, typ in types.items():
            mb.create_typed_global(f"__auto.{name}", typ, attrs=GlobalAttributes())
        dyn = ir.RankedTensorType.get([ir.ShapedType.get_dynamic_size()], ir.F32Type.get())
    check_ir(
        str(mb.module_op),
        r"^  util\.global private @__auto\.index = 0 : index$",
        r"^  util\.global private @__auto\.f32 = 0\.000000e\+00 : f32$",
        r"^  util\.global private @__auto\.f64 = 0\.000000e\+00 : f64$",
        r"^  util\.global private @__auto\.i32 = 0 : i32$",
        r"^  util\.global private @__auto\.i64 = 0 : i64$",
        r"^  util\.global private @__auto\.i1 = false$",
        r"^  util\.global private @__auto\.t_i32 = dense<0> : tensor<1xi32>$",
        r"^  util\.global private @__auto\.t_f64 = dense<0\.000000e\+00> : tensor<2xf64>$",
    )
    with pytest.raises(
        ValueError, match=r"Cannot create initialization value for dynamic shaped tensor"
    ):
        mb.create_typed_global("__auto.dyn", dyn, attrs=GlobalAttributes())


def test_map_name_and_infer_external():
    attrs = GlobalAttributes(name_mapper=lambda n: None if n == "keep" else n.upper())
    assert attrs.map_name("keep") == "keep"
    assert attrs.map_name("w") == "W"
    t = torch.ones(1)
    assert attrs.infer_external_from_tensor(t) == (False, None, None)
    ExternalTensorTrait("s", "k").set(t)
    assert attrs.infer_external_from_tensor(t) == (True, "s", "k")
    assert GlobalAttributes(external_scope="o").infer_external_from_tensor(t) == (True, "o", "k")
    assert GlobalAttributes(external=True, external_scope="x").infer_external_from_tensor(
        torch.ones(1)
    ) == (True, "x", None)
    assert GlobalAttributes(external=False).infer_external_from_tensor(t) == (False, None, None)
    assert GlobalAttributes() == GlobalAttributes()
    assert "mutable=True" in repr(GlobalAttributes(mutable=True))


# --- symbols and tracking ---------------------------------------------------------------


def test_symbol_collisions_are_renamed(mb):
    a, _, _ = mb.create_tensor_global("__auto.x", torch.ones(1), attrs=GlobalAttributes())
    b, _, _ = mb.create_tensor_global("__auto.x", torch.ones(1), attrs=GlobalAttributes())
    f1, _ = mb.create_func_op("main", [])
    f2, _ = mb.create_func_op("main", [])
    assert a == "__auto.x" and b != a and b.startswith("__auto.x")
    assert f1 == "main" and f2 != "main"


def test_unique_auto_symbol(mb):
    assert mb.unique_auto_symbol("__auto.p") == "__auto.p"
    assert mb.unique_auto_symbol("__auto.p") == "__auto.p_1"
    mb.create_tensor_global("__auto.q", torch.ones(1), attrs=GlobalAttributes())
    assert mb.unique_auto_symbol("__auto.q") == "__auto.q_1"
    assert mb.unique_auto_symbol("__auto.p_1") == "__auto.p_1_1"


def test_same_tensor_twice_is_one_global(mb):
    w = torch.randn(4)
    first = mb.get_or_create_tensor_global("__auto.a", w, attrs=GlobalAttributes())
    again = mb.get_or_create_tensor_global("__auto.b", w, attrs=GlobalAttributes())
    tied = mb.get_or_create_tensor_global("__auto.c", w.detach(), attrs=GlobalAttributes())
    other = mb.get_or_create_tensor_global("__auto.d", w[1:], attrs=GlobalAttributes())
    assert first[0] == again[0] == tied[0] == "__auto.a"
    assert other[0] == "__auto.d"
    assert str(mb.module_op).count("util.global") == 2


def test_conjugate_view_is_not_tied(mb):
    # t.conj() shares t's storage, offset and strides but holds other values.
    w = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    first = mb.get_or_create_tensor_global("__auto.w", w, attrs=GlobalAttributes())
    conj = mb.get_or_create_tensor_global("__auto.wc", w.conj(), attrs=GlobalAttributes())
    assert first[0] == "__auto.w" and conj[0] == "__auto.wc"
    assert tensor_storage_key(w) != tensor_storage_key(w.conj())
    assert tensor_storage_key(w) == tensor_storage_key(w.detach())


def test_ref_tracker_keys():
    tr = RefTracker()
    p = torch.nn.Parameter(torch.ones(3))
    m = tr.track(p)
    assert m.is_empty
    m.value = "g"
    assert tr.track(p.data).value == "g"  # tied: same storage view
    assert tr.lookup(p.view(3)) is m
    assert tr.lookup(p.reshape(1, 3)) is None  # different shape: a different view
    assert tr.track(torch.ones(3)).is_empty
    assert tr.track("some attribute").is_empty
    assert tensor_storage_key(torch.empty(0)) is None
    assert tensor_storage_key(torch.empty(2, device="meta")) is None


def test_ref_tracker_works_with_fx_importer_protocol():
    # The FX importer uses track(x).is_empty / .value; two meta tensors must not alias.
    tr = RefTracker()
    a, b = torch.empty(2, device="meta"), torch.empty(2, device="meta")
    tr.track(a).value = 1
    assert tr.track(b).is_empty


# --- functions ----------------------------------------------------------------------------


def test_function_builder_and_dim_values(mb, check_ir):
    with mb.context:
        dyn = ir.ShapedType.get_dynamic_size()
        t = ir.RankedTensorType.get([dyn, 4], ir.F32Type.get())
        attrs = attributes_from_argument_device_affinities({1: DeviceAffinity(0)}, 2, mb.context)
        _name, fop = mb.create_func_op("dims", [t, t], argument_attributes=attrs)
        fb = FunctionBuilder(module_builder=mb, func_op=fop)
        assert fb.return_types is None
        with fb.ip, fb.loc:
            cache: dict = {}
            d0 = build_tensor_dim_value(fop.arguments[0], 0, cache)
            d1 = build_tensor_dim_value(fop.arguments[0], 1, cache)
            again = build_tensor_dim_value(fop.arguments[1], -1, cache)
            assert again == d1  # the cached constant 4
            total = arith.AddIOp(d0, d1).result
            fb.emit_return(total, d1)
        assert [str(t) for t in fb.return_types] == ["index", "index"]
    mb.finalize_construct()
    check_ir(
        str(mb.module_op),
        r"func\.func @dims\(%arg0: tensor<\?x4xf32>, %arg1: tensor<\?x4xf32> "
        r"\{iree\.abi\.affinity = #hal\.device\.promise<@__device_0>\}\) -> \(index, index\)",
        r"%c0 = arith\.constant 0 : index",
        r"%dim = tensor\.dim %arg0, %c0 : tensor<\?x4xf32>",
        r"%c4 = arith\.constant 4 : index",
        r"arith\.addi %dim, %c4 : index",
        r"return .* : index, index",
    )


def test_emit_return_type_mismatch(mb):
    with mb.context:
        _, fop = mb.create_func_op("f", [ir.IndexType.get(), ir.F32Type.get()])
        fb = FunctionBuilder(module_builder=mb, func_op=fop)
        with fb.loc:
            fb.emit_return(fop.arguments[0])
            with pytest.raises(IrBuildError, match=r"@f returns \(f32\) here but \(index\)"):
                fb.emit_return(fop.arguments[1])


def test_private_func_and_attribute_count_check(mb, check_ir):
    mb.create_func_op("helper", [], is_public=False, add_entry_block=False)
    check_ir(str(mb.module_op), r"func\.func private @helper\(\)")
    with pytest.raises(ValueError, match=r"1 argument attribute dicts for 2 arguments"), mb.context:
        mb.create_func_op("g", [ir.IndexType.get()] * 2, argument_attributes=[{}])


def test_dim_value_errors(mb):
    with mb.context:
        _, fop = mb.create_func_op(
            "f", [ir.IndexType.get(), ir.RankedTensorType.get([2], ir.F32Type.get())]
        )
        with ir.InsertionPoint(fop.entry_block), fop.location:
            with pytest.raises(ValueError, match=r"expected a ranked tensor value, got index"):
                build_tensor_dim_value(fop.arguments[0], 0)
            with pytest.raises(ValueError, match=r"dim 1 is out of range for tensor<2xf32>"):
                build_tensor_dim_value(fop.arguments[1], 1)


def test_affinity_attribute_errors(ctx):
    with pytest.raises(ValueError, match=r"argument 3, but the function has 2 argument"):
        attributes_from_argument_device_affinities({3: DeviceAffinity(0)}, 2, ctx)
    with pytest.raises(ValueError, match=r"queue 'fast' is not a queue ordinal"):
        device_promise_asm(0, ["fast"])
    assert attributes_from_argument_device_affinities(None, 2, ctx) == [{}, {}]


# --- types and errors ---------------------------------------------------------------------


def test_native_type_converter(mb):
    conv = mb.native_type_converter
    with mb.context:
        assert str(conv.torch_type_to_native(ir.Type.parse("!torch.vtensor<[2,?],ui8>"))) == (
            "tensor<2x?xi8>"
        )
        assert (
            str(conv.torch_type_to_native(ir.Type.parse("!torch.vtensor<[],si64>"), signless=False))
            == "tensor<si64>"
        )
        assert str(conv.torch_type_to_native(ir.Type.parse("!torch.int"))) == "i64"
        assert str(conv.torch_type_to_native(ir.Type.parse("!torch.bool"))) == "i1"
        assert str(conv.native_type_to_torch(ir.Type.parse("tensor<?x3xbf16>"))) == (
            "!torch.vtensor<[?,3],bf16>"
        )
        assert str(conv.native_type_to_torch(ir.Type.parse("f64"))) == "!torch.float"
    assert str(mb.torch_dtype_to_iree_type(torch.uint16)) == "i16"


def test_builder_accepts_module_and_rejects_other_ops(ctx):
    m = ir.Module.create()
    assert ModuleBuilder(m).module_op == m.operation
    with pytest.raises(TypeError, match=r"needs a builtin.module operation, got func.func"):
        mb = ModuleBuilder(m)
        _, f = mb.create_func_op("f", [])
        ModuleBuilder(f.operation)


def test_verification_failure_dumps_to_per_run_dir(tmp_path, ctx):
    mb = ModuleBuilder(ir.Module.create(), options=ModuleBuilderOptions(dump_dir=tmp_path))
    _, fop = mb.create_func_op("broken", [ir.IndexType.get()])
    fb = FunctionBuilder(module_builder=mb, func_op=fop)
    with fb.ip, fb.loc:
        # util.global.load of an undefined symbol: verification fails.
        util.GlobalLoadOp(ir.IndexType.get(), "__missing")
        fb.emit_return(fop.arguments[0])
    with pytest.raises(IrBuildError, match=r"module failed to verify") as info:
        mb.finalize_construct()
    dump = info.value.dump_dir
    assert dump is not None and os.path.dirname(dump) == str(tmp_path)
    assert os.path.basename(dump).startswith("turbine-dump-")
    assert str(info.value).count(dump) >= 1
    assert 'sym_name = "broken"' in Path(dump, "module.mlir").read_text()  # generic form
    assert "__missing" in Path(dump, "diagnostics.txt").read_text()
    assert not Path(dump, "op.mlir").exists()  # the failing op was the module
    # A second failure gets a fresh directory.
    with pytest.raises(IrBuildError) as info2:
        mb.finalize_construct()
    assert info2.value.dump_dir != dump


def test_dump_dir_from_environment(tmp_path, ctx, monkeypatch):
    monkeypatch.setenv("TURBINE_DUMP_DIR", str(tmp_path / "dumps"))
    mb = ModuleBuilder(ir.Module.create())
    with pytest.raises(IrBuildError) as info:
        mb.handle_mlir_error(mb.module_op, ir.MLIRError("boom", []), "custom failure")
    assert info.value.dump_dir.startswith(str(tmp_path / "dumps"))
    assert str(info.value).startswith("custom failure")


def test_unwritable_dump_dir_still_raises_the_build_error(tmp_path, ctx):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    mb = ModuleBuilder(ir.Module.create(), options=ModuleBuilderOptions(dump_dir=blocker))
    with pytest.raises(IrBuildError, match=r"(?s)custom failure: .*boom.*could not be dumped") as i:
        mb.handle_mlir_error(mb.module_op, ir.MLIRError("boom", []), "custom failure")
    assert i.value.dump_dir is None


def test_failing_op_dumped_beside_module(tmp_path, ctx):
    mb = ModuleBuilder(ir.Module.create(), options=ModuleBuilderOptions(dump_dir=tmp_path))
    _, fop = mb.create_func_op("f", [ir.IndexType.get()])
    with pytest.raises(IrBuildError, match=r"function f failed") as info:
        mb.handle_mlir_error(fop.operation, ir.MLIRError("bad", []), "function f failed")
    dump = Path(info.value.dump_dir)
    assert '"func.func"' in (dump / "op.mlir").read_text()  # unverified: generic form
    assert "builtin.module" in (dump / "module.mlir").read_text()


def test_parameter_keys_round_trip_and_unprintable_ones_are_rejected(mb):
    mb.create_tensor_global(
        "__auto.k",
        torch.ones(2),
        attrs=GlobalAttributes(external=True, external_scope="scope/ü"),
        logical_name="layers.0:w-ü",
    )
    mb.finalize_construct()
    text = str(mb.module_op)
    with ir.Context():
        assert str(ir.Module.parse(text)) == text
    assert '#flow.parameter.named<"scope/ü"::"layers.0:w-ü">' in text
    for scope, key in (("model", 'a"b'), ("model", "a\\b"), ("s\n", "k")):
        with pytest.raises(
            IrBuildError, match=r"IREE prints #flow.parameter.named strings unescaped"
        ):
            mb.create_tensor_global(
                "__auto.bad",
                torch.ones(1),
                attrs=GlobalAttributes(external=True, external_scope=scope),
                logical_name=key,
            )


def test_rejected_argument_attributes_leave_no_function(mb):
    # The count check runs before the op is created: the module stays valid and the name free.
    with pytest.raises(ValueError, match=r"1 argument attribute dicts"), mb.context:
        mb.create_func_op("g", [ir.IndexType.get()] * 2, argument_attributes=[{}])
    assert "@g" not in str(mb.module_op)
    with mb.context:
        name, _ = mb.create_func_op("g", [], add_entry_block=False, is_public=False)
    assert name == "g"
    mb.module_op.verify()
