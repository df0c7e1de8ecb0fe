"""Calling a compiled module exactly like the eager module: keyword and nested arguments, the
eager result structure, and input errors that name the function, the argument and the fix."""

# ruff: noqa: B008

from __future__ import annotations

import re

import pytest
import torch

import turbine_aot
from turbine_aot import runtime as R
from turbine_aot._signatures.call import CallSignature
from turbine_aot._signatures.keys import ARGS_SCHEMA, RETURN_SCHEMA, SIGNATURE_KEY


def _check_ordered(text: str, *patterns: str) -> None:
    """FileCheck-style: each regex matches after the previous match."""
    pos = 0
    for p in patterns:
        m = re.compile(p).search(text, pos)
        assert m, f"{p!r} not found after position {pos} in:\n{text[pos : pos + 2000]}"
        pos = m.end()


class Nested(torch.nn.Module):
    """Positional, nested (dict) and keyword inputs; a dict result holding a tuple with a
    constant (None) and a shape-dependent value."""

    def forward(self, x, d, scale, opt=None):
        return {"y": x * scale + d["a"], "z": (x + 1, None, d["b"].sum())}


SEQ = torch.export.Dim("seq", min=1, max=512)


class TwoInputs(torch.nn.Module):
    def forward(self, ids, mask):
        return (ids * mask).sum(-1), ids + 1


@pytest.fixture(scope="module")
def nested():
    x = torch.randn(2, 4)
    d = {"a": torch.randn(4), "b": torch.randn(3)}
    s = torch.tensor(2.0)
    eo = turbine_aot.export(
        Nested(),
        args=(x, d),
        kwargs={"scale": s},
        dynamic_shapes={
            "x": {0: torch.export.Dim("batch", min=1, max=8)},
            "d": {"a": None, "b": None},
            "scale": None,
        },
    )
    return eo, eo.load(), (x, d, s)


@pytest.fixture(scope="module")
def two_inputs():
    ids = torch.randint(0, 9, (1, 16), dtype=torch.int64)
    mask = torch.ones(1, 16, dtype=torch.int64)
    eo = turbine_aot.export(TwoInputs(), args=(ids, mask), dynamic_shapes=({1: SEQ}, {1: SEQ}))
    return eo.load()


def _assert_same_tree(got, want):
    from torch.utils._pytree import tree_flatten

    got_leaves, got_spec = tree_flatten(got)
    want_leaves, want_spec = tree_flatten(want)
    assert got_spec == want_spec, f"{got_spec} != {want_spec}"
    assert type(got) is type(want)
    for g, w in zip(got_leaves, want_leaves):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
        else:
            assert g == w


def test_records_are_in_the_exported_ir(nested):
    eo, _, _ = nested
    text = str(eo.mlir_module)
    _check_ordered(
        text,
        r"func\.func @main\(%arg0: !torch\.vtensor<\[\?,4\],f32>",
        r"iree\.reflection = \{",
        r'torch\.args_schema = "\[1, \{\\22type\\22: \\22builtins\.tuple',
        r'torch\.return_schema = "\[1, \{\\22type\\22: \\22builtins\.dict',
        r"turbine\.signature = ",
    )


def test_keyword_and_nested_arguments_give_the_eager_structure(nested):
    _, m, (x, d, s) = nested
    want = Nested()(x, d, scale=s)
    _assert_same_tree(m.main(x, d, scale=s), want)
    _assert_same_tree(m.main(x, d, s), want)  # a keyword given positionally, as in Python
    _assert_same_tree(m.main(scale=s, d=d, x=x), want)
    # A dict in another key order, and the unexported default passed with its default value.
    _assert_same_tree(m.main(x, {"b": d["b"], "a": d["a"]}, scale=s, opt=None), want)
    # A dynamic dimension inside its range.
    x5 = torch.randn(5, 4)
    _assert_same_tree(m.main(x5, d, scale=s), Nested()(x5, d, scale=s))


def test_records_survive_compilation_into_the_vmfb(nested, tmp_path):
    eo, _, (x, d, s) = nested
    path = tmp_path / "nested.vmfb"
    eo.compile(save_to=path)
    import iree.runtime as rt

    vm = rt.VmModule.mmap(rt.VmInstance(), str(path))
    reflection = vm.lookup_function("main").reflection
    assert {ARGS_SCHEMA, RETURN_SCHEMA, SIGNATURE_KEY} <= set(reflection)
    call = CallSignature.from_reflection(reflection)
    assert call is not None and call.arg_names == ("x", "d", "scale")
    assert [a.path for a in call.args] == ["x", "d['a']", "d['b']", "scale"]
    assert list(call.dims.values()) == [(1, 8)]
    # A bare .vmfb (no MLIR at hand) is called like the eager module too.
    m = R.load_module(path)
    _assert_same_tree(m.main(x, d=d, scale=s), Nested()(x, d, scale=s))
    assert str(m.main.signature.inputs[0]) == "tensor<?x4xf32>"


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda m, x, d, s: m.main(x, d, s, s),
            TypeError,
            r"module\.main\(\) takes 3 positional argument\(s\) \(x, d, scale\); got 4",
        ),
        (
            lambda m, x, d, s: m.main(x, d),
            TypeError,
            r"module\.main\(\) missing 1 required argument\(s\): 'scale'",
        ),
        (
            lambda m, x, d, s: m.main(x, d, scale=s, bias=s),
            TypeError,
            r"module\.main\(\) got an unexpected keyword argument 'bias'; it takes x, d, scale",
        ),
        (
            lambda m, x, d, s: m.main(x, d, s, x=x),
            TypeError,
            r"module\.main\(\) got multiple values for argument 'x'",
        ),
        (
            lambda m, x, d, s: m.main(x.double(), d, scale=s),
            ValueError,
            r"module\.main\(\): argument x expects dtype float32 \(tensor<\?x4xf32>\); got a "
            r"float64 tensor of shape \[2, 4\]\. Convert it with \.to\(torch\.float32\)",
        ),
        (
            lambda m, x, d, s: m.main(x[0], d, scale=s),
            ValueError,
            r"argument x expects rank 2 \(tensor<\?x4xf32>\); got a float32 tensor of shape \[4\]",
        ),
        (
            lambda m, x, d, s: m.main(x, {"a": torch.randn(5), "b": d["b"]}, scale=s),
            ValueError,
            r"argument d\['a'\] expects dimension 0 to be 4 \(tensor<4xf32>\); got a float32 "
            r"tensor of shape \[5\]\. The dimension is static",
        ),
        (
            lambda m, x, d, s: m.main(torch.randn(9, 4), d, scale=s),
            ValueError,
            r"argument x dimension 0 is 9, outside the range 1\.\.8 of that dynamic dimension",
        ),
        (
            lambda m, x, d, s: m.main(torch.randn(0, 4), d, scale=s),
            ValueError,
            r"argument x dimension 0 is 0, outside the range 1\.\.8",
        ),
        (
            lambda m, x, d, s: m.main(x, {"a": d["a"]}, scale=s),
            TypeError,
            r"argument d expects a dict with keys 'a', 'b'; got one missing 'b'",
        ),
        (
            lambda m, x, d, s: m.main(x, {**d, "c": s}, scale=s),
            TypeError,
            r"argument d expects a dict with keys 'a', 'b'; got one unexpected 'c'",
        ),
        (
            lambda m, x, d, s: m.main(x, (d["a"], d["b"]), scale=s),
            TypeError,
            r"argument d expects a dict with keys 'a', 'b'; got a tuple of 2",
        ),
        (
            lambda m, x, d, s: m.main(x.tolist(), d, scale=s),
            TypeError,
            r"argument x expects a tensor tensor<\?x4xf32>; got a list of 2",
        ),
        (
            lambda m, x, d, s: m.main(x, d, scale=s, opt=3),
            ValueError,
            r"argument 'opt' was not passed at export, so the compiled program uses its default "
            r"None; got int 3",
        ),
    ],
    ids=[
        "count",
        "missing",
        "unknown-keyword",
        "duplicate",
        "dtype",
        "rank",
        "static-dim",
        "dynamic-above-max",
        "dynamic-below-min",
        "dict-missing-key",
        "dict-extra-key",
        "structure",
        "not-a-tensor",
        "default",
    ],
)
def test_input_errors_name_function_argument_expected_and_given(nested, call, error, message):
    _, m, (x, d, s) = nested
    with pytest.raises(error, match=message) as info:
        call(m, x, d, s)
    assert isinstance(info.value, R.TurbineRuntimeError)


def test_dynamic_dims_checked_against_range_and_each_other(two_inputs):
    m = two_inputs
    ids = torch.randint(0, 9, (1, 600), dtype=torch.int64)
    # The case: 1x600 into a program exported with a sequence dimension of max 512.
    with pytest.raises(
        ValueError, match=r"main\(\): argument ids dimension 1 is 600, outside the range 1\.\.512"
    ):
        m.main(ids, torch.ones(1, 600, dtype=torch.int64))
    with pytest.raises(
        ValueError,
        match=r"argument mask dimension 1 is 7 but ids dimension 1 is 6; they are the same "
        r"dynamic dimension",
    ):
        m.main(ids[:, :6], torch.ones(1, 7, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"argument mask expects dtype int64"):
        m.main(ids[:, :6], torch.ones(1, 6))
    a, b = m.main(ids[:, :6], mask=torch.ones(1, 6, dtype=torch.int64))
    torch.testing.assert_close(a, ids[:, :6].sum(-1))
    torch.testing.assert_close(b, ids[:, :6] + 1)


def test_flat_calls_are_checked_the_same_way(two_inputs):
    m = two_inputs
    ids = torch.ones(1, 600, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"argument ids dimension 1 is 600, outside the range"):
        m.main.call_flat(ids, ids)
    with pytest.raises(TypeError, match=r"main\(\) takes 2 tensor argument\(s\) \(ids: "):
        m.main.call_flat(ids)
    a, _ = m.main.call_flat(ids[:, :3], ids[:, :3])
    torch.testing.assert_close(a, torch.tensor([3]))


def test_positional_tensor_calls_bind_the_short_way_and_fall_back_on_any_doubt(two_inputs, nested):
    """A call passing the function's tensors positionally, in order, is bound without the tree
    walk (docs/running.md, "What a call costs"): the same flat arguments as the full binding;
    anything else, or any failed check, is left to the full binding, whose errors the tests
    above pin."""
    call = two_inputs.main.signature.call
    ids = torch.randint(0, 9, (1, 6), dtype=torch.int64)
    mask = torch.ones(1, 6, dtype=torch.int64)
    short = call.bind_positional((ids, mask))
    assert short is not None
    full = call.bind("main", (ids, mask), {})
    assert len(short) == len(full) and all(a is b for a, b in zip(short, full))
    long_ids = torch.ones(1, 600, dtype=torch.int64)
    for args in (
        (ids,),  # too few
        (ids, mask.float()),  # a dtype
        (ids, mask[0]),  # a rank
        (long_ids, long_ids),  # outside the dynamic dimension's range
        (ids, torch.ones(1, 7, dtype=torch.int64)),  # the same symbol, two sizes
        (ids.numpy(), mask),  # not a tensor
        (torch.nn.Parameter(ids.float(), requires_grad=False), mask),  # a subclass
    ):
        assert call.bind_positional(args) is None
    # nested arguments and specialized constants: always the full binding
    _, m, (x, d, s) = nested
    assert m.main.signature.call.bind_positional((x, d, s)) is None
    a, b = two_inputs.main(ids, mask)
    torch.testing.assert_close(a, (ids * mask).sum(-1))
    torch.testing.assert_close(b, ids + 1)


class Constants(torch.nn.Module):
    def forward(self, x, n):
        return x * n, None, 3


def test_specialized_constants_in_and_out():
    x = torch.randn(3)
    m = turbine_aot.export(Constants(), args=(x, 2)).load()
    _assert_same_tree(m.main(x, 2), Constants()(x, 2))
    _assert_same_tree(m.main(x, n=2), Constants()(x, 2))
    with pytest.raises(
        ValueError, match=r"argument n was specialized to 2 at export; got int 5\. Export again"
    ):
        m.main(x, 5)


def test_procedural_compiled_module_keywords_and_tree_results():
    from turbine_aot import AbstractTensor, CompiledModule, jittable

    @jittable
    def combine(x, y):
        return x + y, x * y

    class Proc(CompiledModule):
        def main(
            self,
            x=AbstractTensor(None, 4, dtype=torch.float32),
            y=AbstractTensor(4, dtype=torch.float32),
        ):
            s, t = combine(x, y)
            return {"sum": s, "rest": (t, x)}

    m = turbine_aot.export(Proc).load()
    x, y = torch.randn(3, 4), torch.randn(4)
    want = {"sum": x + y, "rest": (x * y, x)}
    _assert_same_tree(m.main(x, y), want)
    _assert_same_tree(m.main(y=y, x=x), want)
    with pytest.raises(ValueError, match=r"proc\.main\(\): argument y expects dimension 0 to be 4"):
        m.main(x, torch.randn(5))


def test_transformers_model_output_comes_back_as_model_output():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    model = BertModel(config).eval()  # random init, small config
    ids = torch.randint(0, 64, (1, 8))
    m = turbine_aot.export(model, kwargs={"input_ids": ids}, strict_export=False).load()
    with torch.no_grad():
        want = model(input_ids=ids)
    got = m.main(input_ids=ids)
    assert type(got) is type(want)
    assert list(got.keys()) == list(want.keys())
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=1e-4, rtol=1e-4)
    got = m.main(ids, attention_mask=None)  # positional, and a default passed as its default
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match=r"argument input_ids expects dimension 1 to be 8"):
        m.main(input_ids=torch.randint(0, 64, (1, 9)))


def test_unknown_result_types_come_back_as_dicts(nested, monkeypatch):
    """A result type whose package is not loaded (a deployment without transformers) is read as
    a dict with the same keys; its package is never imported for it."""
    import json

    from turbine_aot._signatures.trees import load_spec as _load_spec

    _, m, _ = nested
    data = json.loads(m.main.signature.call.return_schema)
    data[1]["type"] = "not_a_loaded_package.outputs.Output"
    spec = _load_spec(json.dumps(data))
    assert spec.type is dict and spec.context == ["y", "z"]


def test_a_call_parses_the_recorded_trees_once(nested, monkeypatch):
    """The argument and result trees of a signature are parsed at its first call and kept:
    later calls give the same results without parsing JSON again."""
    import dataclasses

    import torch.utils._pytree as pytree

    _, m, (x, d, s) = nested
    call = dataclasses.replace(m.main.signature.call)  # a fresh copy: nothing kept yet
    m2 = type(m.main)(
        m.main._module, m.main._fn, dataclasses.replace(m.main.signature, call=call), False
    )
    parsed: list[str] = []
    loads = pytree.treespec_loads

    def counting(text):
        parsed.append(text)
        return loads(text)

    monkeypatch.setattr(pytree, "treespec_loads", counting)
    first = m2(x, d, scale=s)
    assert sorted(parsed) == sorted([call.args_schema, call.return_schema])
    again = m2(x * 2, d, scale=s)
    assert len(parsed) == 2, "a second call parsed a recorded tree again"
    want = Nested()(x * 2, d, scale=s)
    _assert_same_tree(again, want)
    assert type(first) is dict


def test_a_tree_read_with_dicts_is_not_kept(nested, monkeypatch):
    """A result tree with a type unknown here is read as dicts at each call, not kept: once its
    package is imported, the next call gives the real type."""
    import dataclasses
    import json

    _, m, _ = nested
    data = json.loads(m.main.signature.call.return_schema)
    data[1]["type"] = "not_a_loaded_package.outputs.Output"
    call = dataclasses.replace(m.main.signature.call, return_schema=json.dumps(data))
    assert call.tree("return_schema").type is dict
    assert "return_schema" not in call.__dict__.get("_trees", {})
    assert call.tree("args_schema") is call.tree("args_schema")  # known types: kept


def test_bundle_from_a_vmfb_records_the_call_signatures(nested, tmp_path):
    eo, _, (x, d, s) = nested
    vmfb = eo.compile().map_memory()
    b = R.save_bundle(tmp_path / "b", bytes(vmfb))
    rec = b.manifest["functions"]["main"]
    assert [i["shape"] for i in rec["inputs"]] == [[None, 4], [4], [3], []]
    assert rec["call"]["arg_names"] == ["x", "d", "scale"]
    assert rec["call"]["dims"] == {next(iter(rec["call"]["dims"])): {"min": 1, "max": 8}}
    m = R.load_bundle(tmp_path / "b")
    _assert_same_tree(m.main(x, d, scale=s), Nested()(x, d, scale=s))


def test_default_compile_flags_is_public_api():
    from turbine_aot._compiler import flags as _flags

    assert turbine_aot.default_compile_flags is _flags.default_compile_flags
    assert "default_compile_flags" in dir(turbine_aot)
    assert "default_compile_flags" not in turbine_aot.__all__  # not a reference star-import name
    flags = turbine_aot.default_compile_flags("llvm-cpu", host=False)
    assert "--iree-llvmcpu-target-cpu=generic" in flags
    assert R.default_runtime_flags is _flags.default_runtime_flags
    assert issubclass(R.CallArgumentTypeError, TypeError)
    assert issubclass(R.CallArgumentValueError, ValueError)
