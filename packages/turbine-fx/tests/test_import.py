"""import_exported_program: golden IR and end-to-end runs on IREE compared with eager."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from fx_helpers import Built, run_module

from turbine_fx import (
    CONSTANT_RESULTS_ATTR,
    FxImportError,
    UnsupportedOpError,
    constant_results,
    import_exported_program,
    with_constant_results,
)
from turbine_ir.ir import StringAttr
from turbine_params import externalize_module_parameters, save_module_parameters


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def _import(module, args, **kw):
    ep = torch.export.export(module, args, dynamic_shapes=kw.pop("dynamic_shapes", None))
    b = Built()
    with b:
        import_exported_program(b.mb, ep, **kw)
    return b, ep


def test_inline_weights_golden_ir():
    torch.manual_seed(0)
    b, _ = _import(MLP(), (torch.randn(2, 8),))
    asm = b.asm()
    assert re.search(
        r"util.global private @__auto.fc1.weight = dense_resource<.*> : tensor<16x8xf32>", asm
    )
    assert "util.global private @__auto.fc2.bias" in asm
    assert "func.func @main(%arg0: !torch.vtensor<[2,8],f32>) -> !torch.vtensor<[2,4],f32>" in asm
    assert "util.global.load @__auto.fc1.weight : tensor<16x8xf32>" in asm
    assert "torch_c.from_builtin_tensor" in asm


def test_inline_weights_run(iree_device):
    torch.manual_seed(0)
    m = MLP()
    x = torch.randn(2, 8)
    b, _ = _import(m, (x,))
    (got,) = run_module(iree_device, b.asm(), "main", [(x,)])
    torch.testing.assert_close(got[0], m(x), rtol=1e-4, atol=1e-4)


def test_external_weights_golden_and_run(iree_device, tmp_path):
    torch.manual_seed(0)
    m = MLP()
    x = torch.randn(2, 8)
    expected = m(x)
    externalize_module_parameters(m)
    b, _ = _import(m, (x,))
    asm = b.asm()
    assert (
        'util.global private @__auto.fc1.weight = #flow.parameter.named<"model"::"fc1.weight"> '
        ": tensor<16x8xf32>" in asm
    )
    assert "dense_resource" not in asm
    irpa = tmp_path / "weights.irpa"
    save_module_parameters(irpa, m)
    (got,) = run_module(iree_device, asm, "main", [(x,)], parameters={"model": irpa})
    torch.testing.assert_close(got[0], expected, rtol=1e-4, atol=1e-4)


def test_meta_weights_need_externalizing():
    with torch.device("meta"):
        m = MLP()
    ep = torch.export.export(m, (torch.randn(2, 8, device="meta"),))
    b = Built()
    with b, pytest.raises(FxImportError, match="externalize_module_parameters"):
        import_exported_program(b.mb, ep)
    assert "func.func" not in b.asm()  # no half-imported function is left behind
    externalize_module_parameters(m)
    b = Built()
    with b:
        import_exported_program(b.mb, ep)
    assert "#flow.parameter.named" in b.asm()


class KVCache(nn.Module):
    """Writes one row of a cache per call at a position given as a tensor."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(3, 4))

    def forward(self, x, pos):
        self.cache.index_put_((pos,), self.proj(x))
        return self.cache.sum(0)


def test_mutable_buffer_golden_ir():
    b, _ = _import(KVCache(), (torch.randn(1, 4), torch.tensor([0])))
    asm = b.asm()
    assert "util.global private mutable @__auto.cache" in asm
    assert re.search(r"util.global.store %\d+, @__auto.cache : tensor<3x4xf32>", asm)
    # Weights stay immutable.
    assert "util.global private @__auto.proj.weight" in asm
    # The old value is loaded before the new one is stored.
    assert asm.index("util.global.load @__auto.cache") < asm.index("util.global.store")


def test_kv_cache_state_persists_over_three_calls(iree_device):
    torch.manual_seed(0)
    m = KVCache()
    eager = KVCache()
    eager.load_state_dict(m.state_dict())
    b, _ = _import(m, (torch.randn(1, 4), torch.tensor([0])))
    calls = [(torch.randn(1, 4), torch.tensor([i])) for i in range(3)]
    results = run_module(iree_device, b.asm(), "main", calls)
    for (x, pos), got in zip(calls, results):
        torch.testing.assert_close(got[0], eager(x, pos), rtol=1e-5, atol=1e-5)
    # The third result depends on all three writes.
    assert torch.count_nonzero(eager.cache.abs().sum(-1)) == 3


class TinyAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.norm = nn.RMSNorm(16)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).split(16, -1)
        q, k, v = (z.view(b, t, 2, 8).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return a.transpose(1, 2).reshape(b, t, 16) + x


def test_dynamic_batch_and_sequence(iree_device):
    if iree_device.name in ("vmvx", "vulkan-spirv"):
        pytest.skip(
            f"IREE 3.13's {iree_device.name} backend cannot compile dynamically shaped attention "
            "(iree_linalg_ext.attention / online_attention codegen fails on dynamic sizes)"
        )
    torch.manual_seed(0)
    m = TinyAttention()
    batch, seq = torch.export.Dim("batch", max=8), torch.export.Dim("seq", max=64)
    b, _ = _import(m, (torch.randn(2, 5, 16),), dynamic_shapes={"x": {0: batch, 1: seq}})
    asm = b.asm()
    assert "!torch.vtensor<[?,?,16],f32>" in asm
    calls = [(torch.randn(1, 3, 16),), (torch.randn(4, 7, 16),)]
    for (x,), got in zip(calls, run_module(iree_device, asm, "main", calls)):
        torch.testing.assert_close(got[0], m(x), rtol=1e-4, atol=1e-4)


def test_symbolic_shape_expressions_golden_and_run(iree_device):
    m = TinyAttention()
    seq = torch.export.Dim("seq", max=64)
    b, _ = _import(
        m,
        (torch.randn(2, 5, 16),),
        dynamic_shapes={"x": {1: seq}},
        import_symbolic_shape_expressions=True,
    )
    asm = b.asm()
    assert re.search(r'torch.symbolic_int "s\d+" \{min_val = \d+, max_val = 64\}', asm)
    assert "torch.bind_symbolic_shape" in asm
    if iree_device.name in ("vmvx", "vulkan-spirv"):
        pytest.skip(f"dynamically shaped attention does not compile for {iree_device.name}")
    x = torch.randn(2, 9, 16)
    (got,) = run_module(iree_device, asm, "main", [(x,)])
    torch.testing.assert_close(got[0], m(x), rtol=1e-4, atol=1e-4)


class Structured(nn.Module):
    def forward(self, x, n: int, flag: bool):
        y = x[:n] * n
        return {"y": y, "pair": (y.sum(), None), "k": 3, "list": [x + 1 if flag else x - 1]}


def test_scalar_inputs_and_nested_outputs(iree_device):
    x = torch.randn(8)
    # A dynamic int is a runtime argument (!torch.int); a bool is specialized by torch.export.
    ep = torch.export.export(
        Structured(),
        (x, 3, True),
        dynamic_shapes={"x": None, "n": torch.export.Dim.DYNAMIC, "flag": None},
    )
    b = Built()
    with b:
        func = import_exported_program(b.mb, ep)
        consts = json.loads(StringAttr(func.attributes[CONSTANT_RESULTS_ATTR]).value)
    asm = b.asm()
    assert "%arg1: !torch.int" in asm
    assert consts == {"2": None, "3": 3}  # None and 3 are not returned by the function
    for n in (2, 5):
        results = run_module(iree_device, asm, "main", [(x, n)])[0]
        flat = with_constant_results(results, constant_results(func))
        rebuilt = ep.call_spec.out_spec.unflatten(flat)
        expected = Structured()(x, n, True)
        torch.testing.assert_close(rebuilt["y"], expected["y"])
        torch.testing.assert_close(rebuilt["pair"][0], expected["pair"][0])
        assert rebuilt["pair"][1] is None and rebuilt["k"] == 3
        torch.testing.assert_close(rebuilt["list"][0], expected["list"][0])


def test_same_tensor_is_one_global_across_programs():
    m = MLP()
    ep1 = torch.export.export(m, (torch.randn(2, 8),))
    ep2 = torch.export.export(m, (torch.randn(5, 8),))
    b = Built()
    with b:
        import_exported_program(b.mb, ep1, symbol_name="a")
        import_exported_program(b.mb, ep2, symbol_name="b")
    asm = b.asm()
    assert asm.count("util.global private @__auto.fc1.weight") == 1
    assert "func.func @a(" in asm and "func.func @b(" in asm
    with b:
        again = import_exported_program(b.mb, ep1, symbol_name="a")
        assert StringAttr(again.attributes["sym_name"]).value == "a_1"  # names stay unique


def test_program_is_not_modified():
    m = TinyAttention()
    ep = torch.export.export(m, (torch.randn(2, 5, 16),))
    before = str(ep.graph)
    b = Built()
    with b:
        import_exported_program(b.mb, ep)
    assert str(ep.graph) == before


class Unsupported(nn.Module):
    def forward(self, x):
        return torch.histc(x, bins=4) + 1  # the user's line


def test_unsupported_op_error_names_op_node_line_and_dump(tmp_path, monkeypatch):
    monkeypatch.setenv("TURBINE_DUMP_DIR", str(tmp_path))
    ep = torch.export.export(Unsupported(), (torch.randn(8),))
    b = Built()
    with b, pytest.raises(UnsupportedOpError) as info:
        import_exported_program(b.mb, ep)
    e = info.value
    msg = str(e)
    assert e.op == "aten.histc.default"
    assert e.node in msg
    assert "test_import.py" in msg and "the user's line" in msg
    assert "extend_aot_decompositions(add_ops=" in msg and "strict_export=False" in msg
    assert e.dump_dir and str(tmp_path) in e.dump_dir
    dumped = (tmp_path / e.dump_dir).glob("*")
    names = {p.name for p in dumped}
    assert {"module.mlir", "fx_graph.txt"} <= names
    assert "torch.operator" in (tmp_path / e.dump_dir / "module.mlir").read_text()
    # The failed function is not left in the module.
    assert "func.func" not in b.asm()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_low_precision_weights(iree_device, dtype):
    torch.manual_seed(0)

    class Cast(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 8).to(dtype), requires_grad=False)

        def forward(self, x):
            return x @ self.w.to(torch.float32).T

    m = Cast()
    x = torch.randn(2, 8)
    b, _ = _import(m, (x,))
    asm = b.asm()
    elt = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "f8E4M3FN"}[dtype]
    assert f"tensor<4x8x{elt}>" in asm
    if dtype == torch.float8_e4m3fn and iree_device.name == "vulkan-spirv":
        pytest.skip("IREE 3.13's baseline SPIR-V target cannot convert f8E4M3FN to f32")
    (got,) = run_module(iree_device, asm, "main", [(x,)])
    torch.testing.assert_close(got[0], m(x), rtol=1e-3, atol=1e-3)


class Variadic(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, *args):
        return sum(a.sum(0) for a in args) * self.w


def test_variadic_forward_with_dynamic_shapes(iree_device):
    torch.manual_seed(0)
    m = Variadic()
    dims = {"args": ({0: torch.export.Dim("a", max=32)}, {0: torch.export.Dim("b", max=32)})}
    b, _ = _import(m, (torch.randn(2, 4), torch.randn(3, 4)), dynamic_shapes=dims)
    asm = b.asm()
    assert "%arg0: !torch.vtensor<[?,4],f32>, %arg1: !torch.vtensor<[?,4],f32>" in asm
    calls = [(torch.randn(5, 4), torch.randn(7, 4))]
    (got,) = run_module(iree_device, asm, "main", calls)
    torch.testing.assert_close(got[0], m(*calls[0]), rtol=1e-4, atol=1e-4)


def test_device_affinities_golden():
    from turbine_params import DeviceAffinity, DeviceTensorTrait

    m = MLP()
    DeviceTensorTrait(1).set(m.fc2.weight)
    b, _ = _import(m, (torch.randn(2, 8),), arg_device={0: DeviceAffinity(0)})
    asm = b.asm()
    assert "iree.abi.affinity = #hal.device.promise<@__device_0>" in asm
    assert re.search(
        r"util.global private @__auto.fc2.weight \{stream.affinity = "
        r"#hal.device.promise<@__device_1>\}",
        asm,
    ) or re.search(r"@__auto.fc2.weight.*stream.affinity = #hal.device.promise<@__device_1>", asm)


def test_unsupported_dtype_error_names_node_and_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("TURBINE_DUMP_DIR", str(tmp_path))

    class U16(nn.Module):
        def forward(self, x):
            return x.to(torch.uint16)  # the user's uint16 line

    ep = torch.export.export(U16(), (torch.ones(4, dtype=torch.int32),))
    b = Built()
    with b, pytest.raises(UnsupportedOpError, match=r"unsupported dtype torch\.uint16") as info:
        import_exported_program(b.mb, ep)
    assert "the user's uint16 line" in str(info.value)
    assert "Convert the tensor to a supported dtype" in str(info.value)
    assert info.value.dump_dir.startswith(str(tmp_path))


class SliceKV(nn.Module):
    """A KV-cache written at a dynamic offset with a dynamic number of new positions."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 16, 4))

    def forward(self, x, start: int):
        t = x.shape[1]
        self.k[:, start : start + t] = x
        return self.k[:, : start + t].sum(1)


def test_kv_cache_dynamic_offset_and_length_over_three_calls(iree_device):
    seq = torch.export.Dim("seq", max=8)
    ep = torch.export.export(
        SliceKV(),
        (torch.randn(1, 3, 4), 2),
        dynamic_shapes={"x": {1: seq}, "start": torch.export.Dim.DYNAMIC},
        strict=False,
    )
    b = Built()
    with b:
        import_exported_program(b.mb, ep)
    asm = b.asm()
    assert "%arg0: !torch.vtensor<[1,?,4],f32>, %arg1: !torch.int" in asm
    assert "util.global private mutable @__auto.k" in asm
    eager, pos, calls = SliceKV(), 0, []
    for t in (3, 1, 2):
        calls.append((torch.randn(1, t, 4), pos))
        pos += t
    results = run_module(iree_device, asm, "main", calls)
    for (x, start), got in zip(calls, results):
        torch.testing.assert_close(got[0], eager(x, start))


class TransientKVCache(KVCache):
    def __init__(self):
        super().__init__()
        del self.cache
        self.register_buffer("cache", torch.zeros(3, 4), persistent=False)


def test_meta_device_kv_cache_starts_as_zeros(iree_device, tmp_path):
    torch.manual_seed(0)
    real = TransientKVCache()
    with torch.device("meta"):
        meta = TransientKVCache()
    externalize_module_parameters(meta)  # weights only: a non-persistent cache is not a parameter
    ep = torch.export.export(meta, (torch.randn(1, 4, device="meta"), torch.tensor([0])))
    b = Built()
    with b:
        import_exported_program(b.mb, ep)
    asm = b.asm()
    assert (
        "util.global private mutable @__auto.cache = dense<0.000000e+00> : tensor<3x4xf32>" in asm
    )
    irpa = tmp_path / "w.irpa"
    save_module_parameters(irpa, real)
    calls = [(torch.randn(1, 4), torch.tensor([i])) for i in range(2)]
    results = run_module(iree_device, asm, "main", calls, parameters={"model": irpa})
    for (x, pos), got in zip(calls, results):
        torch.testing.assert_close(got[0], real(x, pos), rtol=1e-5, atol=1e-5)


class SmallCNN(nn.Module):
    def __init__(self, count_calls: bool):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)
        self.count_calls = count_calls
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x):
        if self.count_calls:
            self.calls.add_(1)  # a mutation: the program must be functionalized
        y = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        y = F.interpolate(y, scale_factor=2, mode="bilinear")
        return self.head(F.adaptive_avg_pool2d(y, 1).flatten(1))


@pytest.mark.parametrize("count_calls", [False, True], ids=["as-exported", "functionalized"])
def test_cnn_with_batchnorm_and_bilinear_upsampling(iree_device, count_calls):
    if iree_device.name == "vmvx":
        pytest.skip(
            "IREE 3.13's vmvx backend computes wrong values for batch_norm and bilinear "
            "upsampling (also with the plain FxImporter); llvm-cpu and vulkan match eager"
        )
    torch.manual_seed(0)
    m = SmallCNN(count_calls).eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 1.5)
    eager = SmallCNN(count_calls).eval()
    eager.load_state_dict(m.state_dict())
    x = torch.randn(2, 3, 8, 8)
    b, _ = _import(m, (x,))
    (got,) = run_module(iree_device, b.asm(), "main", [(x,)])
    torch.testing.assert_close(got[0], eager(x), rtol=1e-4, atol=1e-4)


class CrossEntropy(nn.Module):
    def forward(self, x, t):
        return F.cross_entropy(x, t)  # the user's loss line


def test_verify_lowering_names_the_op_and_source_line(tmp_path, monkeypatch):
    from turbine_fx import verify_lowering

    monkeypatch.setenv("TURBINE_DUMP_DIR", str(tmp_path))
    ep = torch.export.export(CrossEntropy(), (torch.randn(3, 4), torch.tensor([0, 1, 3])))
    b = Built()
    with b:
        import_exported_program(b.mb, ep)  # imports: every op is known to the torch dialect
        with pytest.raises(UnsupportedOpError, match="IREE cannot lower") as info:
            verify_lowering(b.mb)
    e = info.value
    assert e.op and e.op.startswith("torch.")
    assert "test_import.py" in e.source_line and "the user's loss line" in e.source_line
    assert (Path(e.dump_dir) / "diagnostics.txt").exists()
    b2, _ = _import(MLP(), (torch.randn(2, 8),))
    verify_lowering(b2.mb)  # a supported program passes


class Branchy(nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))  # the cond line


def test_unsupported_higher_order_op_names_the_node(tmp_path, monkeypatch):
    monkeypatch.setenv("TURBINE_DUMP_DIR", str(tmp_path))
    ep = torch.export.export(Branchy(), (torch.randn(3),))
    b = Built()
    with b, pytest.raises(UnsupportedOpError, match="cannot import FX node 'cond'") as info:
        import_exported_program(b.mb, ep)
    assert "the cond line" in str(info.value)
    assert "func.func @main" not in b.asm()


def test_attention_kept_by_default_and_decomposed_on_request(iree_device):
    """The exported IR keeps SDPA (target-neutral); decomposing it at export is the user's choice
    (turbine's matmul/softmax form), as is N-d linear -> 2-d mm (a default decomposition)."""
    from turbine_fx import extend_aot_decompositions

    torch.manual_seed(0)
    m = TinyAttention()
    batch, seq = torch.export.Dim("batch", max=8), torch.export.Dim("seq", max=64)
    shapes = {"x": {0: batch, 1: seq}}
    b, _ = _import(m, (torch.randn(2, 5, 16),), dynamic_shapes=shapes)
    asm = b.asm()
    assert "torch.aten.scaled_dot_product_attention" in asm and "torch.aten.linear" not in asm
    with extend_aot_decompositions(add_ops=[torch.ops.aten.scaled_dot_product_attention]):
        b, _ = _import(m, (torch.randn(2, 5, 16),), dynamic_shapes=shapes)
    asm = b.asm()
    assert "scaled_dot_product_attention" not in asm
    assert "torch.aten.softmax" in asm or "torch.aten._softmax" in asm
    # Decomposed, dynamic attention compiles on every backend (vmvx/vulkan included).
    calls = [(torch.randn(1, 3, 16),), (torch.randn(4, 7, 16),)]
    for (x,), got in zip(calls, run_module(iree_device, asm, "main", calls)):
        torch.testing.assert_close(got[0], m(x), rtol=1e-4, atol=1e-4)
