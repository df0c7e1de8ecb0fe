"""jittable called from procedural traces: export once per signature, globals, run on IREE."""

from __future__ import annotations

import gc
import re

import pytest
import torch
from fx_helpers import Built

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
    # WEIGHT, deduplicated, named as the reference names lifted constants
    assert asm.count("util.global private @__auto.constant_8_8_torch.float32 =") == 1
    assert "@__auto.constant_8_8_torch.float32$1" not in asm
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
    with pytest.raises(JittableError, match=r"arg0_1 .. arg0_1 by position"), b:
        _procedure(b, "main", (AbstractTensor(4),), lambda x: bad(x))
