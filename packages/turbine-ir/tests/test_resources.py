"""Tensor -> dense resource attributes through raw bytes: round trips for every element type."""

from __future__ import annotations

import re

import pytest
import torch

from turbine_ir import (
    GlobalAttributes,
    ModuleBuilder,
    UnsupportedDtypeError,
    ir,
    tensor_to_bytes,
    tensor_to_dense_attr,
    tensor_to_dense_resource_attr,
)
from turbine_ir._resources import declared_resource_alignment
from turbine_ir.dialects import util


def _sample(dtype: torch.dtype, shape=(3, 5)) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash(str(dtype)) % 1000)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        real = torch.randn(*shape, 2, generator=g)
        return torch.view_as_complex(
            real.to(torch.float64 if dtype == torch.complex128 else torch.float32)
        ).to(dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 4).to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


ROUND_TRIP = [
    torch.bool,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.complex32,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
]


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", ROUND_TRIP, ids=str)
def test_dense_resource_round_trip(dtype, resource_blobs):
    """Print the module, parse it back in a fresh context, print again: bytes are the tensor's."""
    t = _sample(dtype)
    expected = t.contiguous().view(torch.uint8).reshape(-1).tolist()
    with ir.Context(), ir.Location.unknown():
        m = ir.Module.create()
        attr = tensor_to_dense_resource_attr(t, name="blob")
        with ir.InsertionPoint(m.body):
            util.GlobalOp("g", attr.type, sym_visibility="private", initial_value=attr)
        assert m.operation.verify()
        text = str(m)
    with ir.Context():
        text2 = str(ir.Module.parse(text))
    assert "util.global private @g = dense_resource<blob> : tensor<3x5x" in text2
    blobs = resource_blobs(text2)
    assert list(blobs["blob"]) == expected
    # The printed alignment header is ours.
    header = text2.split('"0x', 1)[1][:8]
    assert int.from_bytes(bytes.fromhex(header), "little") == declared_resource_alignment(
        t.element_size()
    )


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", ROUND_TRIP, ids=str)
def test_global_data_round_trip(dtype, resource_blobs):
    """create_tensor_global's attribute (resource or dense) parses back to the same bits."""
    t = _sample(dtype)
    with ir.Context(), ir.Location.unknown():
        mb = ModuleBuilder(ir.Module.create().operation)
        mb.create_tensor_global("__auto.t", t, attrs=GlobalAttributes())
        mb.finalize_construct()
        text = str(mb.module_op)
    with ir.Context():
        text2 = str(ir.Module.parse(text))
    line = next(x for x in text2.splitlines() if "@__auto.t" in x)
    if "dense_resource<" in line:
        assert (
            list(next(iter(resource_blobs(text2).values())))
            == t.view(torch.uint8).reshape(-1).tolist()
        )
        return
    # dense<[[...]]>: decimal text; parsing it back into the dtype must give identical bits.
    assert t.dtype in (torch.bfloat16,) or "float8" in str(t.dtype), line
    body = line.split("dense<", 1)[1].rsplit(">", 1)[0]
    values = [float(v) for v in re.findall(r"[-+]?(?:\d+\.\d*(?:e[-+]?\d+)?|inf|nan)", body)]
    back = torch.tensor(values, dtype=torch.float64).to(t.dtype).reshape(t.shape)
    assert torch.equal(back.view(torch.uint8), t.view(torch.uint8))


def test_bool_is_one_byte_per_element():
    t = torch.tensor([True, False, True, True])
    assert tensor_to_bytes(t) == bytes([1, 0, 1, 1])


def test_noncontiguous_conj_and_neg_views_are_resolved(ctx):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert tensor_to_bytes(base.t()) == base.t().contiguous().numpy().tobytes()
    c = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    assert tensor_to_bytes(c.conj()) == torch.tensor([1 - 2j, 3 + 4j]).numpy().tobytes()
    attr = tensor_to_dense_resource_attr(c.conj(), name="cj")
    assert str(attr.type) == "tensor<2xcomplex<f32>>"


def test_later_mutation_does_not_change_attribute(ctx, resource_blobs):
    t = torch.ones(8)
    m = ir.Module.create()
    attr = tensor_to_dense_resource_attr(t, name="snap")
    with ir.InsertionPoint(m.body):
        util.GlobalOp("g", attr.type, sym_visibility="private", initial_value=attr)
    t.fill_(7.0)
    assert resource_blobs(str(m))["snap"] == torch.ones(8).numpy().tobytes()


def test_single_element_becomes_splat(ctx):
    assert str(tensor_to_dense_attr(torch.tensor(2.0, dtype=torch.bfloat16))) == (
        "dense<2.000000e+00> : tensor<bf16>"
    )
    assert str(tensor_to_dense_attr(torch.tensor([[True]]))) == "dense<true> : tensor<1x1xi1>"
    assert str(tensor_to_dense_attr(torch.tensor([-3], dtype=torch.uint8))) == (
        "dense<-3> : tensor<1xi8>"  # signless i8: the bits of uint8 253
    )
    # complex splats cannot be wrapped by the Python bindings: stays a resource.
    assert "dense_resource" in str(tensor_to_dense_attr(torch.tensor(1 + 1j)))


def test_meta_tensor_has_no_data(ctx):
    with pytest.raises(UnsupportedDtypeError, match=r"meta or fake tensor.*external"):
        tensor_to_dense_resource_attr(torch.empty(3, device="meta"))


def test_fake_tensor_has_no_data(ctx):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(4)
    with pytest.raises(UnsupportedDtypeError, match=r"meta or fake tensor"):
        tensor_to_dense_attr(fake)


def test_sub_byte_dtype_has_no_storage_layout():
    with pytest.raises(UnsupportedDtypeError, match=r"sub-byte dtype torch.uint4"):
        tensor_to_bytes(torch.empty(3, dtype=torch.uint4))


def test_not_a_tensor():
    with pytest.raises(TypeError, match=r"expected a torch.Tensor, got list"):
        tensor_to_bytes([1, 2])  # type: ignore[arg-type]


def test_sparse_layout_rejected(ctx):
    with pytest.raises(UnsupportedDtypeError, match=r"to_dense"):
        tensor_to_dense_attr(torch.eye(3).to_sparse())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.complex128, torch.int8])
def test_small_resources_in_bytecode_readable_by_iree_tools(tmp_path, dtype):
    """iree-opt reads small .mlirbc files into 16-byte-aligned buffers: the alignment a resource
    declares must not exceed that (64 made these files unreadable)."""
    import subprocess

    from iree.compiler.tools import binaries

    from turbine_ir import GlobalAttributes, ModuleBuilder, ir

    t = torch.ones(3, dtype=dtype)
    with ir.Context(), ir.Location.unknown():
        mb = ModuleBuilder(ir.Module.create().operation)
        mb.create_tensor_global("__auto.w", t, attrs=GlobalAttributes())
        path = tmp_path / "m.mlirbc"
        with open(path, "wb") as f:
            mb.module_op.write_bytecode(f)
    proc = subprocess.run(
        [binaries.find_tool("iree-opt"), str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "util.global private @__auto.w" in proc.stdout
