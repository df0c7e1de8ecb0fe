"""torch dtype <-> MLIR element types, builtin and !torch.vtensor."""

from __future__ import annotations

import pytest
import torch

from turbine_ir import (
    IREE_TYPE_ASM_TO_TORCH_DTYPE,
    TORCH_DTYPE_TO_IREE_TYPE_ASM,
    TORCH_DTYPE_TO_SIGNED_MLIR_TYPE_ASM,
    UnsupportedDtypeError,
    element_type_to_torch_dtype,
    ir,
    tensor_type_asm,
    torch_dtype_to_element_asm,
    torch_dtype_to_element_type,
    torch_dtype_to_vtensor_element_asm,
    torch_tensor_type,
    torch_vtensor_type,
    vtensor_type_asm,
)

EXPECTED = [
    # dtype, builtin, vtensor
    (torch.bool, "i1", "i1"),
    (torch.float16, "f16", "f16"),
    (torch.bfloat16, "bf16", "bf16"),
    (torch.float32, "f32", "f32"),
    (torch.float64, "f64", "f64"),
    (torch.int8, "i8", "si8"),
    (torch.int16, "i16", "si16"),
    (torch.int32, "i32", "si32"),
    (torch.int64, "i64", "si64"),
    (torch.uint8, "i8", "ui8"),
    (torch.uint16, "i16", "ui16"),
    (torch.uint32, "i32", "ui32"),
    (torch.uint64, "i64", "ui64"),
    (torch.complex32, "complex<f16>", "complex<f16>"),
    (torch.complex64, "complex<f32>", "complex<f32>"),
    (torch.complex128, "complex<f64>", "complex<f64>"),
    (torch.float8_e4m3fn, "f8E4M3FN", "f8E4M3FN"),
    (torch.float8_e4m3fnuz, "f8E4M3FNUZ", "f8E4M3FNUZ"),
    (torch.float8_e5m2, "f8E5M2", "f8E5M2"),
    (torch.float8_e5m2fnuz, "f8E5M2FNUZ", "f8E5M2FNUZ"),
    (torch.float8_e8m0fnu, "f8E8M0FNU", "f8E8M0FNU"),
    (torch.int4, "i4", "si4"),
    (torch.uint4, "i4", "ui4"),
]


@pytest.mark.parametrize(("dtype", "builtin", "vtensor"), EXPECTED, ids=lambda v: str(v))
def test_dtype_tables(ctx, dtype, builtin, vtensor):
    assert torch_dtype_to_element_asm(dtype) == builtin
    assert torch_dtype_to_vtensor_element_asm(dtype) == vtensor
    t = torch_dtype_to_element_type(dtype)
    assert str(t) == builtin
    # Both spellings parse in an IREE context (vtensor needs the torch dialect).
    assert str(ir.Type.parse(f"tensor<2x{builtin}>")) == f"tensor<2x{builtin}>"
    vt = ir.Type.parse(vtensor_type_asm([2, None], dtype))
    assert str(vt) == f"!torch.vtensor<[2,?],{vtensor}>"
    # The vtensor spelling names the dtype unambiguously.
    assert element_type_to_torch_dtype(vtensor) in (dtype,) or builtin == "i1"


def test_every_float8_dtype_of_torch_is_mapped():
    f8 = [
        v for k, v in vars(torch).items() if isinstance(v, torch.dtype) and k.startswith("float8")
    ]
    assert f8, "torch has float8 dtypes"
    assert all(d in TORCH_DTYPE_TO_IREE_TYPE_ASM for d in f8)


def test_every_numeric_dtype_of_torch_is_mapped_or_explained():
    for _name, d in vars(torch).items():
        if not isinstance(d, torch.dtype):
            continue
        if d in TORCH_DTYPE_TO_IREE_TYPE_ASM:
            continue
        with pytest.raises(UnsupportedDtypeError, match=r"has no MLIR builtin element type: .+"):
            torch_dtype_to_element_asm(d)


def test_reverse_maps_signless_to_signed_and_i1_to_bool():
    assert element_type_to_torch_dtype("i8") is torch.int8
    assert element_type_to_torch_dtype("ui8") is torch.uint8
    assert element_type_to_torch_dtype("si64") is torch.int64
    assert element_type_to_torch_dtype("i1") is torch.bool
    assert element_type_to_torch_dtype("bf16") is torch.bfloat16
    assert IREE_TYPE_ASM_TO_TORCH_DTYPE["complex<f32>"] is torch.complex64


def test_reverse_of_element_type_object(ctx):
    assert element_type_to_torch_dtype(ir.BF16Type.get()) is torch.bfloat16


def test_unknown_element_type_lists_known():
    with pytest.raises(UnsupportedDtypeError, match=r"f4E2M1FN has no torch dtype; known"):
        element_type_to_torch_dtype("f4E2M1FN")


def test_packed_fp4_explains_workaround():
    with pytest.raises(UnsupportedDtypeError, match=r"view the tensor as torch.uint8"):
        torch_dtype_to_element_asm(torch.float4_e2m1fn_x2)


def test_quantized_only_in_vtensor_world():
    assert TORCH_DTYPE_TO_SIGNED_MLIR_TYPE_ASM[torch.qint8] == "!torch.qint8"
    with pytest.raises(UnsupportedDtypeError, match=r"int_repr"):
        torch_dtype_to_element_asm(torch.qint8)


def test_tensor_types_with_dynamic_dims(ctx):
    assert tensor_type_asm([2, None, 3], torch.float16) == "tensor<2x?x3xf16>"
    assert tensor_type_asm([], torch.int64) == "tensor<i64>"
    assert vtensor_type_asm([None], torch.bool) == "!torch.vtensor<[?],i1>"
    tt = torch_tensor_type([-1, 4], torch.uint8)
    assert str(tt) == "tensor<?x4xi8>"
    assert tt.is_dynamic_dim(0) and not tt.is_dynamic_dim(1)
    assert str(torch_tensor_type(torch.Size([3]), torch.complex64)) == "tensor<3xcomplex<f32>>"


def test_vtensor_type_object(ctx):
    t = torch_vtensor_type([None, 2], torch.uint8)
    assert str(t) == "!torch.vtensor<[?,2],ui8>"
    assert str(torch_vtensor_type([], torch.complex64)) == "!torch.vtensor<[],complex<f32>>"


def test_symbolic_dims_stay_dynamic_without_guards(ctx):
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    s = env.create_symintnode(env.create_symbol(5, ConstantSource("batch")), hint=5)
    with FakeTensorMode(shape_env=env):
        t = torch.empty(s, 3)
    assert tensor_type_asm(t.shape, torch.float32) == "tensor<?x3xf32>"
    assert vtensor_type_asm(t.shape, torch.int64) == "!torch.vtensor<[?,3],si64>"
    assert str(torch_tensor_type(list(t.shape), torch.float16)) == "tensor<?x3xf16>"
    assert not env.guards  # converting a type must not specialize the dim to its hint
