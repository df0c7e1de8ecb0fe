"""Property tests: any tensor's data survives the trip to an MLIR attribute and back."""

from __future__ import annotations

import re

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turbine_ir import (
    GlobalAttributes,
    ModuleBuilder,
    element_type_to_torch_dtype,
    ir,
    tensor_to_dense_resource_attr,
    torch_dtype_to_element_asm,
    torch_dtype_to_vtensor_element_asm,
)
from turbine_ir.dialects import util

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.uint16,
    torch.int32,
    torch.uint32,
    torch.int64,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
]


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * dtype.itemsize
    raw = draw(st.binary(min_size=nbytes, max_size=nbytes))
    t = (
        torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if nbytes
        else torch.empty(0, dtype=torch.uint8)
    )
    if dtype == torch.bool:
        t = t % 2
    return t.view(dtype).reshape(shape)


@settings(max_examples=40, deadline=None)
@given(tensors())
def test_resource_bytes_round_trip(t):
    with ir.Context():
        attr = tensor_to_dense_resource_attr(t, name="blob")
        m = ir.Module.parse("module {}")
        with ir.InsertionPoint(m.body), ir.Location.unknown():
            util.GlobalOp("g", attr.type, sym_visibility="private", initial_value=attr)
        text = str(m)
    with ir.Context():
        text2 = str(ir.Module.parse(text))
    found = re.search(r'blob: "0x([0-9A-F]*)"', text2)
    assert found, text2
    assert (
        bytes.fromhex(found.group(1))[4:]
        == t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    )


@settings(max_examples=40, deadline=None)
@given(tensors())
def test_global_type_matches_tensor(t):
    with ir.Context(), ir.Location.unknown():
        mb = ModuleBuilder(ir.Module.create())
        _, _, gtype = mb.create_tensor_global("__auto.t", t, attrs=GlobalAttributes())
        mb.finalize_construct()
        rtt = ir.RankedTensorType(gtype)
        assert list(rtt.shape) == list(t.shape)
        assert str(rtt.element_type) == torch_dtype_to_element_asm(t.dtype)


@given(st.sampled_from(DTYPES))
def test_vtensor_asm_names_dtype(dtype):
    assert element_type_to_torch_dtype(torch_dtype_to_vtensor_element_asm(dtype)) is dtype
