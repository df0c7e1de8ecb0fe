"""Golden IR of every global kind and of loads/stores in procedures; assignment errors."""

from __future__ import annotations

import pytest
import torch

from turbine_ir import GlobalAttributes
from turbine_params import ExternalTensorTrait
from turbine_trace import (
    IREE,
    AbstractI32,
    AbstractTensor,
    GlobalsDefError,
    IrGlobalScalar,
    IrGlobalTensor,
    LiveGlobalCollectionProxy,
    MaterializedGlobal,
    ProcedureTraceError,
    export_buffers,
    export_global,
    export_global_tree,
    export_parameters,
)


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 3)
        self.register_buffer("steps", torch.zeros(1, dtype=torch.int64))


def test_export_global_inline_tensor(harness):
    g = harness.track(export_global(torch.arange(4, dtype=torch.float32), name="w"), "consts")
    assert isinstance(g, IrGlobalTensor) and isinstance(g, MaterializedGlobal)
    assert g.symbol_name == "_consts.w" and g.export_name == "consts.w"
    assert g.dtype == torch.float32 and g.shape == [4]

    @harness.proc("read")
    def _():
        return g

    harness.check(
        r"util.global private @_consts.w = "
        r"(dense_resource<torch_tensor_4_torch\.float32>|dense<.*>) : tensor<4xf32>",
        r"func.func @read\(\) -> tensor<4xf32>",
        r"util.global.load @_consts.w : tensor<4xf32>",
    )


def test_export_global_mutable_noinline_uninitialized(harness):
    harness.track(export_global(torch.ones(2), name="m", mutable=True), "s")
    harness.track(export_global(torch.ones(2), name="n", noinline=True), "s")
    harness.track(export_global(torch.ones(2), name="u", mutable=True, uninitialized=True), "s")
    harness.track(export_global(torch.ones(2), name="i", mutable=True, initialize=False), "s")
    harness.check(
        r"util.global private mutable @_s.m = .* : tensor<2xf32>",
        r"util.global private @_s.n <inlining_policy = #util.inline.never> = .* : tensor<2xf32>",
        r"util.global private mutable @_s.u = #util.uninitialized : tensor<2xf32>",
        r"util.global private mutable @_s.i = #util.uninitialized : tensor<2xf32>",
    )


def test_export_global_external_scope_and_name_mapping(harness):
    harness.track(
        export_global(torch.ones(2), name="w", external=True, external_scope="weights"), "p"
    )
    harness.track(
        export_global(torch.ones(3), name="v", external=True, name_mapper=lambda n: f"layer0.{n}"),
        "p",
    )
    t = torch.ones(5)
    ExternalTensorTrait(external_scope="traits", external_name="from.trait").set(t)
    harness.track(export_global(t, name="t"), "p")
    harness.check(
        r'util.global private @_p.w = #flow.parameter.named<"weights"::"p.w"> : tensor<2xf32>',
        r'util.global private @_p.v = #flow.parameter.named<"model"::"layer0.p.v"> : tensor<3xf32>',
        r'util.global private @_p.t = #flow.parameter.named<"traits"::"from.trait"> : tensor<5xf32>',
    )


def test_abstract_tensor_and_scalar_globals(harness):
    harness.track(
        export_global(AbstractTensor(None, 4), name="dyn", mutable=True, uninitialized=True), "st"
    )
    harness.track(
        export_global(AbstractTensor(2, 2, dtype=torch.float16), name="ext", external=True), "st"
    )
    c = harness.track(export_global(AbstractI32, name="count", mutable=True), "st")
    assert isinstance(c, IrGlobalScalar) and str(c.ir_type) == "i32"
    harness.check(
        # Dynamically shaped and uninitialized: declared without an initial value.
        r"util.global private mutable @_st.dyn : tensor<\?x4xf32>\n",
        r'util.global private @_st.ext = #flow.parameter.named<"model"::"st.ext"> : tensor<2x2xf16>',
        r"util.global private mutable @_st.count = 0 : i32\n",
    )


def test_python_scalar_globals(harness):
    harness.track(export_global(7, name="i", mutable=True), "sc")
    harness.track(export_global(0.5, name="f"), "sc")
    harness.track(export_global(True, name="b"), "sc")
    harness.track(export_global(3, name="u", uninitialized=True, mutable=True), "sc")
    harness.check(
        r"util.global private mutable @_sc.i = 7 : i64",
        r"util.global private @_sc.f = 5.000000e-01 : f64",
        r"util.global private @_sc.b = true",
        r"util.global private mutable @_sc.u = #util.uninitialized : i64",
    )


def test_export_global_tree_names_and_structure(harness):
    tree = {"a": [torch.ones(1), torch.zeros(2)], "b": {"c": 4}}
    d = export_global_tree(tree, mutable=True)
    assert [n for n, _ in d.items()] == ["a.0", "a.1", "b.c"]
    assert d.abstractify() == {
        "a": [AbstractTensor(1), AbstractTensor(2)],
        "b": {"c": d.abstractify()["b"]["c"]},
    }
    g = harness.track(d, "tree")
    assert set(g) == {"a", "b"} and isinstance(g["a"][1], IrGlobalTensor)
    assert isinstance(g["b"]["c"], IrGlobalScalar)
    harness.check(
        r"util.global private mutable @_tree.a.0 = .* : tensor<1xf32>",
        r"util.global private mutable @_tree.a.1 = .* : tensor<2xf32>",
        r"util.global private mutable @_tree.b.c = 4 : i64",
    )


def test_export_parameters_and_buffers(harness):
    m = Small()
    params = export_parameters(m, external=True, external_scope="model")
    assert [n for n, _ in params.items()] == ["fc.weight", "fc.bias"]
    assert params.abstractify_tree() == {
        "fc.weight": AbstractTensor(3, 2),
        "fc.bias": AbstractTensor(3),
    }
    p = harness.track(params, "params")
    b = harness.track(export_buffers(m, mutable=True), "buffers")
    assert set(p) == {"fc.weight", "fc.bias"} and set(b) == {"steps"}
    harness.check(
        r'util.global private @_params.fc.weight = #flow.parameter.named<"model"::"params.fc.weight"> : tensor<3x2xf32>',
        r'util.global private @_params.fc.bias = #flow.parameter.named<"model"::"params.fc.bias"> : tensor<3xf32>',
        r"util.global private mutable @_buffers.steps = .* : tensor<1xi64>",
    )


def test_same_tensor_twice_gives_one_global(harness):
    w = torch.ones(3)
    first = harness.track(export_global(w, name="a"), "x")
    second = harness.track(export_global_tree({"again": w, "view": w.detach()}), "y")
    assert second["again"] is first and second["view"] is first
    assert harness.mb.global_ref_tracker.lookup(w).value is first
    assert harness.asm().count("util.global private") == 1


def test_same_tensor_with_another_mutability_is_an_error(harness):
    # Returning the first (immutable) global would make the "mutable" export unassignable, and
    # the reverse would let an "immutable" export be assigned.
    w = torch.ones(3)
    harness.track(export_global(w, name="ro"), "g")
    with pytest.raises(GlobalsDefError, match=r"already exported as 'g\.ro'.*mutable=True"):
        harness.track(export_global(w, name="rw", mutable=True), "g")


def test_unsupported_global_value():
    with pytest.raises(GlobalsDefError, match=r"global 'g.bad': cannot export a value of type str"):
        from turbine_ir import ModuleBuilder, ir

        with ir.Context(), ir.Location.unknown():
            mb = ModuleBuilder(ir.Module.create().operation)
            export_global("text", name="bad").track(mb, "g")
    with pytest.raises(GlobalsDefError, match=r"needs a torch\.nn\.Module"):
        export_parameters(object())


def test_tensor_subclass_parameters_are_refused_with_what_to_do(harness):
    """A quantized weight (torchao's tensor subclasses; TwoTensor stands in) is not one global:
    turbine_aot.export imports it as globals of its inner tensors (docs/quantization.md)."""
    from torch.testing._internal.two_tensor import TwoTensor

    lin = torch.nn.Linear(4, 4)
    lin.weight = torch.nn.Parameter(TwoTensor(torch.ones(4, 4), torch.zeros(4, 4)), False)
    with pytest.raises(
        GlobalsDefError,
        match=r"global 'p\.weight': a torch TwoTensor is a tensor subclass.*turbine_aot\.export",
    ):
        harness.track(export_parameters(lin), "p")


def test_stores_to_mutable_globals(harness):
    state = harness.track(
        export_global(AbstractTensor(None, 4), name="state", mutable=True, uninitialized=True), "g"
    )
    count = harness.track(export_global(0, name="count", mutable=True), "g")
    tree = harness.track(export_global_tree({"x": torch.zeros(2), "n": 1}, mutable=True), "t")

    @harness.proc("update", (AbstractTensor(3, 4),))
    def _(x):
        trace = harness_trace()
        trace.handle_assignment(None, state, x)  # static -> dynamic: tensor.cast
        count.set(count + 1)
        live = LiveGlobalCollectionProxy(tree)
        live["n"] = 5
        trace.handle_assignment(
            None, tree, {"x": IREE.tensor_splat(2, value=1.0, dtype=torch.float32), "n": count}
        )

    harness.check(
        r"(%\w+) = tensor.cast %arg0 : tensor<3x4xf32> to tensor<\?x4xf32>",
        r"util.global.store %cast, @_g.state : tensor<\?x4xf32>",
        r"(%\S+) = util.global.load @_g.count : i64",
        r"(%\d+) = arith.addi %_g.count, %c1_i64 : i64",
        r"util.global.store %0, @_g.count : i64",
        r"%c5_i64 = arith.constant 5 : i64",
        r"util.global.store %c5_i64, @_t.n : i64",
        r"util.global.store %\d+, @_t.x : tensor<2xf32>",
        r"util.global.store %_g.count_0, @_t.n : i64",
    )


def harness_trace():
    from turbine_trace import current_ir_trace

    return current_ir_trace()


def test_assigning_to_immutable_global_is_an_error(harness):
    frozen = harness.track(export_global(torch.ones(2), name="frozen"), "g")
    with pytest.raises(
        ProcedureTraceError,
        match=r"procedure 'write': cannot assign to global 'g.frozen' \(@_g.frozen\): it is not "
        r"mutable; export it with mutable=True",
    ):

        @harness.proc("write", (AbstractTensor(2),))
        def _(x):
            harness_trace().handle_assignment(None, frozen, x)


def test_assignment_type_errors(harness):
    state = harness.track(export_global(AbstractTensor(2, 4), name="s", mutable=True), "g")
    tree = harness.track(
        export_global_tree({"a": torch.ones(1), "b": torch.ones(1)}, mutable=True), "t"
    )
    cases = [
        (lambda x: harness_trace().handle_assignment(None, state, x), r"dimension 1 is 3, not 4"),
        (lambda x: harness_trace().handle_assignment(None, state, "no"), r"cannot assign str"),
        (lambda x: harness_trace().handle_assignment(None, tree, {"a": x}), r"structure"),
        (lambda x: harness_trace().handle_assignment(None, [1, 2], x), r"only globals"),
        (
            lambda x: LiveGlobalCollectionProxy(tree).__setitem__("zz", x),
            r"no global 'zz' in this collection; available: 'a', 'b'",
        ),
    ]
    for i, (body, message) in enumerate(cases):
        with pytest.raises(ProcedureTraceError, match=message):
            harness.proc(f"bad{i}", (AbstractTensor(2, 3),))(body)


def test_live_proxy_reads(harness):
    tree = harness.track(export_global_tree({"a": [torch.ones(1)], "b": torch.ones(2)}), "t")
    live = LiveGlobalCollectionProxy(tree)
    assert isinstance(live["a"], LiveGlobalCollectionProxy)
    assert isinstance(live["a"][0], IrGlobalTensor)
    assert sorted(live.keys()) == ["a", "b"] and len(live) == 2 and "b" in live
    # Nested collections are proxied through get/values/items too (assignments into them must
    # reach the globals, not the plain list).
    assert isinstance(live.get("a"), LiveGlobalCollectionProxy)
    assert live.get("zz", 5) == 5
    assert isinstance(dict(live.items())["a"], LiveGlobalCollectionProxy)
    assert any(isinstance(v, LiveGlobalCollectionProxy) for v in live.values())

    @harness.proc("ret_tree")
    def _():
        return live  # proxies are unwrapped when returned

    harness.check(r"func.func @ret_tree\(\) -> \(tensor<1xf32>, tensor<2xf32>\)")


def test_globals_attrs_object_overrides_options(harness):
    attrs = GlobalAttributes(mutable=True, noinline=True)
    d = export_global(torch.ones(1), name="a", attrs=attrs)
    assert d.attrs is attrs
    harness.track(d, "x")
    harness.check(r"util.global private mutable @_x.a <inlining_policy = #util.inline.never>")


def test_typed_globals_start_at_zero(harness):
    from turbine_trace import AbstractBool, AbstractF32, AbstractF64, AbstractI64, AbstractIndex

    for name, typ in (
        ("idx", AbstractIndex),
        ("f32", AbstractF32),
        ("f64", AbstractF64),
        ("i32", AbstractI32),
        ("i64", AbstractI64),
        ("b", AbstractBool),
    ):
        harness.track(export_global(typ, name=name, mutable=True), "z")
    harness.track(export_global(AbstractTensor(1, dtype=torch.int32), name="t"), "z")
    harness.track(export_global(AbstractTensor(2, dtype=torch.float64), name="u"), "z")
    harness.check(
        r"util.global private mutable @_z.idx = 0 : index\n",
        r"util.global private mutable @_z.f32 = 0.000000e\+00 : f32\n",
        r"util.global private mutable @_z.f64 = 0.000000e\+00 : f64\n",
        r"util.global private mutable @_z.i32 = 0 : i32\n",
        r"util.global private mutable @_z.i64 = 0 : i64\n",
        r"util.global private mutable @_z.b = false\n",
        r"util.global private @_z.t = dense<0> : tensor<1xi32>\n",
        r"util.global private @_z.u = dense<0.000000e\+00> : tensor<2xf64>\n",
    )


def test_dynamic_typed_global_needs_uninitialized_or_external(harness):
    with pytest.raises(
        ValueError, match=r"Cannot create initialization value for dynamic shaped tensor"
    ):
        harness.track(export_global(AbstractTensor(None, 2), name="d", mutable=True), "dyn")


def test_global_attributes_validation_order():
    with pytest.raises(ValueError, match=r"external=True"):
        export_global(torch.ones(2), external=True, uninitialized=True)
    with pytest.raises(
        ValueError, match=r"Globals with uninitialized=True must also be mutable=True"
    ):
        export_global(torch.ones(2), uninitialized=True)
    with pytest.raises(
        ValueError, match=r"Globals with uninitialized=True must also be mutable=True"
    ):
        export_global(torch.ones(2), initialize=False)


def test_abstract_tensor_type_in_a_bare_context():
    from turbine_ir import ModuleBuilder, ir

    context = ir.Context()  # no Location on the stack
    with context:
        module = ir.Module.create(ir.Location.unknown())
    mb = ModuleBuilder(module.operation)
    assert str(AbstractTensor(None, 3).get_ir_type(mb)) == "tensor<?x3xf32>"
