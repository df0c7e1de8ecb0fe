"""A call's ``ModelOutput`` result built from a template after the first call
(``_signatures.model_outputs``): the same object the constructor makes (type, items, attributes,
equality, pickling), a new one each call, and the constructor kept where a template would
differ."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import turbine_aot
from turbine_aot._signatures.model_outputs import ModelOutputBuilder, is_model_output_type

modeling_outputs = pytest.importorskip(
    "transformers.modeling_outputs", reason="transformers is a dev requirement"
)


def _ident(x, y) -> bool:
    """The same tensors (or None) at the same places of the same tuples."""
    if isinstance(y, tuple | list):
        return type(x) is type(y) and all(_ident(a, b) for a, b in zip(x, y, strict=True))
    return x is y


def _same(a, b) -> None:
    """``a`` and ``b`` are alike as a ModelOutput's user sees it, each tensor the same object."""
    assert type(a) is type(b)
    assert list(a.keys()) == list(b.keys())
    assert _ident(list(a.values()), list(b.values()))
    for f in dataclasses.fields(b):
        assert _ident(getattr(a, f.name), getattr(b, f.name))
    assert list(vars(a)) == list(vars(b))
    assert a == b and a.to_tuple() == b.to_tuple()
    assert repr(a) == repr(b)
    assert type(pickle.loads(pickle.dumps(a))) is type(b)


@pytest.mark.parametrize(
    "make",
    [
        lambda: modeling_outputs.BaseModelOutput(last_hidden_state=torch.randn(2, 3)),
        lambda: modeling_outputs.BaseModelOutputWithPooling(
            last_hidden_state=torch.randn(2, 3), pooler_output=torch.randn(3)
        ),
        lambda: modeling_outputs.BaseModelOutput(  # a tuple below the root
            last_hidden_state=torch.randn(2), hidden_states=(torch.randn(1), torch.randn(2))
        ),
        lambda: modeling_outputs.CausalLMOutput(logits=torch.randn(1, 4)),  # first field None
    ],
)
def test_later_results_are_the_constructors(make):
    first = make()
    leaves, spec = tree_flatten(first)
    assert is_model_output_type(spec.type)
    build = ModelOutputBuilder(spec, tree_unflatten)
    _same(build(leaves), first)  # the constructor's, template kept
    assert build._attributes is not None
    for _ in range(2):
        other = make()
        new_leaves, _ = tree_flatten(other)
        got = build(new_leaves)
        assert got is not other
        _same(got, tree_unflatten(new_leaves, spec))


def test_a_subclass_with_its_own_post_init_or_extra_attributes_keeps_the_constructor():
    @dataclasses.dataclass
    class Scaled(modeling_outputs.BaseModelOutput):
        scale: float | None = None

        def __post_init__(self):
            super().__post_init__()
            self.scale = 2.0  # an attribute that is neither an item nor None

    assert not is_model_output_type(Scaled)

    @dataclasses.dataclass
    class Tagged(modeling_outputs.BaseModelOutput):
        tag: str | None = None

    made = Tagged(last_hidden_state=torch.randn(2))
    made.__dict__["note"] = "x"  # an attribute neither an item nor None: no template
    leaves, spec = tree_flatten(made)
    assert is_model_output_type(Tagged)

    def unflatten_with_note(leaves, spec):
        out = tree_unflatten(leaves, spec)
        out.__dict__["note"] = "x"
        return out

    build = ModelOutputBuilder(spec, unflatten_with_note)
    assert build(leaves).note == "x"
    assert build._attributes is None and build._disabled
    assert build(leaves).note == "x"  # the constructor (here: its stand-in) again


def test_other_types_are_not_model_outputs():
    assert not is_model_output_type(dict)
    assert not is_model_output_type(tuple)
    assert not is_model_output_type(modeling_outputs.ModelOutput)  # not a dataclass itself


class _Pooled(torch.nn.Module):
    """A model returning a ``ModelOutput`` with two tensors and one field left None."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        return modeling_outputs.BaseModelOutputWithPooling(
            last_hidden_state=h, pooler_output=h.mean(1)
        )


def test_a_compiled_models_output_from_the_second_call_on():
    model = _Pooled().eval()
    m = turbine_aot.export(model, args=(torch.randn(2, 5, 8),)).load()
    first = m.main(torch.randn(2, 5, 8))
    assert m.main.signature.call.__dict__.get("_result_builder") is not None
    for _ in range(2):
        x = torch.randn(2, 5, 8)
        got = m.main(x)
        with torch.no_grad():
            want = model(x)
        assert got is not first and got.last_hidden_state is not first.last_hidden_state
        _same(got, type(want)(**{k: got[k] for k in want}))
        assert got.hidden_states is None and list(got.keys()) == list(want.keys())
        torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=1e-5, rtol=1e-5)
