"""jittable called from procedural traces: export once per signature, globals, run on IREE."""

from __future__ import annotations

import gc
import re

import pytest
import torch
from fx_helpers import Built, run_module
from ir_check import check_ir

from turbine_fx import JittableError, jittable
from turbine_fx.passes import functorch_functionalize
from turbine_ir.ir import Location
from turbine_trace import AbstractTensor, ProcedureTrace

WEIGHT = torch.randn(8, 8)


@jittable
def project(x, *, scale=2.0):
    return {"y": (x @ WEIGHT) * scale, "n": None}


@jittable
def project_again(x):
    return x @ WEIGHT


@jittable
def pair_sum(pair, *, bias):
    a, c = pair
    return [a.sum(0) + c.sum(0) + bias, (a.shape[0],)]


def _procedure(b, name, args, fn):
    trace = ProcedureTrace.define_func(
        b.mb, symbol_name=name, posargs=args, kwargs={}, loc=Location.unknown(b.context)
    )
    trace.trace_py_func(fn)


def test_called_twice_with_different_shapes(iree_device):
    b = Built()
    with b:
        # Static [2, 8] and dynamic [?, 8]: two signatures -> two private functions; the same
        # signature again reuses the first; the captured WEIGHT is one global for all.
        _procedure(
            b,
            "main",
            (AbstractTensor(2, 8), AbstractTensor(None, 8)),
            lambda a, c: (
                project(a)["y"],
                project(c, scale=3.0)["y"],
                project(a)["y"],
                project_again(c),
            ),
        )
    asm = b.asm()
    # (2,8,scale=2) and (?,8,scale=3)
    assert len(re.findall(r"func.func private @project(_\d+)?\(", asm)) == 2
    assert len(re.findall(r"func.func private @project_again(_\d+)?\(", asm)) == 1
    # WEIGHT, captured implicitly: inlined as the reference inlines it, one blob for all uses
    assert "util.global" not in asm
    literal = (
        "torch.vtensor.literal(dense_resource<torch_tensor_8_8_torch.float32> : tensor<8x8xf32>)"
    )
    assert asm.count(literal) == 3
    assert len(re.findall(r"^\s*torch_tensor_8_8_torch\.float32\w*: \"0x", asm, re.M)) == 1
    assert len(re.findall(r"call @project(_\d+)?\(", asm)) == 3

    vmfb = iree_device.compile(asm, extra_args=["--iree-input-type=torch"])
    module = iree_device.load(vmfb)
    a, c = torch.randn(2, 8), torch.randn(5, 8)
    results = module.main(a.numpy(), c.numpy())
    got = [torch.from_numpy(r.to_host()) for r in results]
    torch.testing.assert_close(got[0], a @ WEIGHT * 2.0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[1], c @ WEIGHT * 3.0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[2], got[0])
    torch.testing.assert_close(got[3], c @ WEIGHT, rtol=1e-4, atol=1e-4)


def test_eager_call_outside_a_trace():
    x = torch.randn(3, 8)
    torch.testing.assert_close(project_again(x), x @ WEIGHT)


def test_unknown_pass_is_an_error():
    with pytest.raises(JittableError, match="unknown passes"):
        jittable(lambda x: x, passes=("nope",))


def test_functorch_functionalize_removes_mutation():
    def f(x):
        y = x.clone()
        y.mul_(2)
        x.add_(1)
        return y

    gm = functorch_functionalize(f, torch.zeros(3))
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "aten.mul_.Tensor" not in targets and "aten.add_.Tensor" not in targets
    x = torch.ones(3)
    torch.testing.assert_close(gm(x), torch.full((3,), 2.0))
    torch.testing.assert_close(x, torch.full((3,), 2.0))  # input mutation still applied


def test_pytree_arguments_and_results(iree_device):
    b = Built()
    with b:
        _procedure(
            b,
            "main",
            (AbstractTensor(None, 8), AbstractTensor(3, 8)),
            lambda a, c: pair_sum((a, c), bias=1.0)[0],
        )
    asm = b.asm()
    assert "func.func private @pair_sum" in asm
    module = iree_device.load(iree_device.compile(asm, extra_args=["--iree-input-type=torch"]))
    a, c = torch.randn(4, 8), torch.randn(3, 8)
    got = torch.from_numpy(module.main(a.numpy(), c.numpy()).to_host())
    torch.testing.assert_close(got, a.sum(0) + c.sum(0) + 1.0, rtol=1e-5, atol=1e-5)


def test_imports_are_not_kept_for_a_discarded_module_builder():
    @jittable
    def double(x):
        return x * 2

    for _ in range(2):
        b = Built()
        with b:
            _procedure(b, "main", (AbstractTensor(2, 8),), lambda a: double(a))
        # Each new module gets its own private function (no stale symbol from an old builder).
        assert "func.func private @double(" in b.asm()
        assert len(double._imported) == 1
        del b
        gc.collect()
        assert len(double._imported) == 0  # nothing (no MLIR types, no context) kept alive


@pytest.mark.parametrize("key", ["x", "arg0_1"])
def test_dynamic_shapes_by_name_or_legacy_graph_argument_name(key, iree_device):
    # torch's legacy graph-argument names (arg0_1: the first argument) work like names.
    def scale_add(x, y):
        return x * 2 + y

    scaled = jittable(scale_add, dynamic_shapes={key: {0: torch.export.Dim("n", max=1024)}})
    b = Built()
    with b:
        _procedure(
            b,
            "main",
            (AbstractTensor(4, 8), AbstractTensor(8)),
            lambda x, y: scaled(x, y),
        )
    asm = b.asm()
    assert re.search(r"func.func private @scale_add\(%arg0: !torch.vtensor<\[\?,8\],f32>", asm)
    module = iree_device.load(iree_device.compile(asm, extra_args=["--iree-input-type=torch"]))
    x, y = torch.randn(4, 8), torch.randn(8)
    got = torch.from_numpy(module.main(x.numpy(), y.numpy()).to_host())
    torch.testing.assert_close(got, x * 2 + y)


def test_dynamic_shapes_unknown_key_names_the_choices():
    bad = jittable(lambda x: x + 1, dynamic_shapes={"arg5_1": {0: torch.export.Dim("n")}})
    b = Built()
    with (
        pytest.raises(
            JittableError,
            match=r"names argument 'arg5_1', but the function's arguments are \['x'\] "
            r"\(arg0_1 .. arg0_1 for its 1 tensor arguments in flattened order\)",
        ),
        b,
    ):
        _procedure(b, "main", (AbstractTensor(4),), lambda x: bad(x))


# A decode step written for iree.turbine.aot: forward(token0, *state0_flat), the KV caches
# [1, seq, kv_heads, head_dim] sliced up to the current step (dimension 1 dynamic).
STATE = 4  # 2 layers x (keys, values)


@jittable
def decode_step(token0, *state0_flat):
    return token0 + 1, *[s[:, -1:] * 0.5 + s[:, :1] for s in state0_flat]


def _decode_step_procedure(b, dynamic_shapes):
    args = (AbstractTensor(1, 1, dtype=torch.int64),) + (AbstractTensor(1, None, 2, 4),) * STATE
    _procedure(
        b,
        "decode",
        args,
        lambda token, *state: decode_step(token, *state, dynamic_shapes=dynamic_shapes),
    )
    return b.asm()


def _run_decode_step(iree_device, asm):
    token = torch.tensor([[3]])
    state = [torch.randn(1, 5, 2, 4) for _ in range(STATE)]
    (got,) = run_module(iree_device, asm, "decode", [(token, *state)])
    want = decode_step(token, *state)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_placeholder_names_count_flattened_tensor_arguments(iree_device):
    # arg<N>_1 is torch's name of the N-th graph placeholder: the N-th tensor after flattening,
    # so `*state0_flat` contributes arg1_1 .. arg4_1 (it used to be refused: "names argument
    # 'arg2_1', but the function's arguments are ['token0', 'state0_flat']").
    seq = torch.export.Dim("state_arg0_dim", max=31)
    dynamic_shapes = {"arg0_1": None, **{f"arg{i}_1": {1: seq} for i in range(1, STATE + 1)}}
    b = Built()
    with b:
        asm = _decode_step_procedure(b, dynamic_shapes)
    state_type = r"!torch\.vtensor<\[1,\?,2,4\],f32>"
    check_ir(
        asm,
        r"= call @decode_step\(%0, %1, %2, %3, %4\)",
        r"func\.func private @decode_step\(%arg0: !torch\.vtensor<\[1,1\],si64>, "
        + ", ".join(rf"%arg{i}: {state_type}" for i in range(1, STATE + 1)),
    )
    _run_decode_step(iree_device, asm)


def test_a_varargs_parameter_takes_one_spec_per_tensor():
    seq = torch.export.Dim("seq", max=31)
    b = Built()
    with b:
        asm = _decode_step_procedure(b, {"state0_flat": ({1: seq},) * STATE})
    assert "func.func private @decode_step(" in asm
    b = Built()
    with pytest.raises(JittableError, match=r"dynamic_shapes\['state0_flat'\] has 2 entries"), b:
        _decode_step_procedure(b, {"state0_flat": ({1: seq},) * 2})


# The jittable export accepts what the reference's (dynamo's export with aten graphs) accepts:
# torch.export(strict=False) refuses a named Dim whose range it cannot prove a shape guard over,
# even a guard true everywhere. Growing a [1, s, 2, 16] KV cache by one step and repeating it for
# grouped-query attention (transformers' repeat_kv) guards
# min(16 + 16*s, 32 + 32*s) == 16 + 16*s (a contiguity check), true for every s >= 0.
@jittable
def grow_and_repeat(k, new):
    k = torch.cat([k.transpose(1, 2), new], dim=2)
    n = k.shape[2]
    return k[:, :, None].expand(1, 2, 2, n, 16).reshape(1, 4, n, 16)


@pytest.mark.parametrize("seq", [{"max": 31}, {}], ids=["bounded", "unbounded"])
def test_a_guard_true_over_the_dim_range_is_accepted(seq, iree_device):
    dim = torch.export.Dim("state_arg0_dim", **seq)
    b = Built()
    with b:
        _procedure(
            b,
            "main",
            (AbstractTensor(1, None, 2, 16), AbstractTensor(1, 2, 1, 16)),
            lambda k, new: grow_and_repeat(k, new, dynamic_shapes={"k": {1: dim}}),
        )
    asm = b.asm()
    check_ir(
        asm,
        r"func\.func private @grow_and_repeat\(%arg0: !torch\.vtensor<\[1,\?,2,16\],f32>, "
        r"%arg1: !torch\.vtensor<\[1,2,1,16\],f32>\) -> !torch\.vtensor<\[1,4,\?,16\],f32>",
    )
    assert "_assert_scalar" not in asm  # the checked guard is not imported
    k, new = torch.randn(1, 5, 2, 16), torch.randn(1, 2, 1, 16)
    (got,) = run_module(iree_device, asm, "main", [(k, new)])
    torch.testing.assert_close(got[0], grow_and_repeat(k, new))


def test_a_guard_false_somewhere_in_the_range_is_still_refused():
    sevenths = jittable(lambda x: x.reshape(7, -1))  # the stand-in size of a dynamic dim is 7
    dim = torch.export.Dim("n", max=30)
    b = Built()
    with (
        pytest.raises(
            JittableError,
            match=r"(?s)Constraints violated.*turbine checked the guards over the declared "
            r"ranges: Eq\(Mod\(s\d+, 7\), 0\): false at s\d+=1",
        ),
        b,
    ):
        _procedure(
            b,
            "main",
            (AbstractTensor(None),),
            lambda x: sevenths(x, dynamic_shapes={"x": {0: dim}}),
        )


# A module-level constant a jittable captures implicitly: a literal, as the reference inlines it
# (torch_tensor_<dims>_<dtype>, one blob however many functions use it), not a __auto.constant_*
# global; whatever its size.
OFFSETS = torch.tensor([1, 2, 3], dtype=torch.int32)
TABLE = torch.arange(2048, dtype=torch.float32).reshape(2, 1024)


@jittable
def shift(x):
    return x + OFFSETS


@jittable
def scale(x):
    return x * OFFSETS


@jittable
def lookup(x):
    return TABLE[x.long()]  # int32 indices: IREE 3.13 fails on aten.index.Tensor ("arith.cmpi")


def test_captured_constants_are_inlined_once(iree_device):
    b = Built()
    with b:
        _procedure(
            b,
            "main",
            (AbstractTensor(3, dtype=torch.int32), AbstractTensor(None, 3, dtype=torch.int32)),
            lambda x, y: (shift(x), scale(y), shift(y), lookup(x)),
        )
    asm = b.asm()
    literal = (
        r"torch\.vtensor\.literal\(dense_resource<torch_tensor_3_torch\.int32> : tensor<3xi32>\)"
    )
    check_ir(
        asm,
        r"func\.func private @shift\(",
        rf"= {literal} : !torch\.vtensor<\[3\],si32>",
        r"func\.func private @scale\(",
        rf"= {literal} : !torch\.vtensor<\[3\],si32>",
        r"func\.func private @shift_1\(",
        rf"= {literal} : !torch\.vtensor<\[3\],si32>",
        r"torch\.vtensor\.literal\(dense_resource<torch_tensor_2_1024_torch\.float32> : "
        r"tensor<2x1024xf32>\)",
        r"^\s*torch_tensor_3_torch\.int32: \"0x04000000010000000200000003000000\"",
    )
    assert "util.global" not in asm and "__auto.constant" not in asm
    assert len(re.findall(r"^\s*torch_tensor_3_torch\.int32\w*: ", asm, re.M)) == 1
    x = torch.tensor([0, 1, 1], dtype=torch.int32)
    y = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    (got,) = run_module(iree_device, asm, "main", [(x, y)])
    for g, w in zip(got, (x + OFFSETS, y * OFFSETS, y + OFFSETS, TABLE[x.long()]), strict=True):
        torch.testing.assert_close(g, w)


def test_a_tensor_dims_spec_may_be_a_dict_or_one_entry_per_dimension():
    n = torch.export.Dim("n", max=1024)
    for spec in ({0: n}, (n, None), [n, None]):
        f = jittable(lambda x: x * 2, dynamic_shapes={"x": spec}, function_name="double")
        b = Built()
        with b:
            _procedure(b, "main", (AbstractTensor(4, 8),), lambda x, f=f: f(x))
        assert "func.func private @double(%arg0: !torch.vtensor<[?,8],f32>)" in b.asm(), spec
    bad = jittable(lambda x: x * 2, dynamic_shapes={"arg0_1": 5})
    b = Built()
    with pytest.raises(JittableError, match=r"dynamic_shapes\['arg0_1'\] is 5; give"), b:
        _procedure(b, "main", (AbstractTensor(4, 8),), lambda x: bad(x))
