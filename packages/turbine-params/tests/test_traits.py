"""Tensor traits and module externalization."""

from __future__ import annotations

import pickle

import pytest

from turbine_params import (
    DeviceAffinity,
    DeviceTensorTrait,
    ExternalTensorTrait,
    externalize_module_parameters,
)


def test_device_affinity_is_a_value():
    a = DeviceAffinity(1, ["q0", "q1"])
    assert a == DeviceAffinity(1, ["q0", "q1"])
    assert a != DeviceAffinity(1)
    assert a != DeviceAffinity(2, ["q0", "q1"])
    assert hash(a) == hash(DeviceAffinity(1, ("q0", "q1")))
    assert len({DeviceAffinity(0), DeviceAffinity(0, None), DeviceAffinity(3)}) == 2
    assert a.ordinal == 1 and a.queues == ["q0", "q1"]
    a.queues.append("mutated")  # a copy: the value cannot change
    assert a.queues == ["q0", "q1"]
    with pytest.raises(AttributeError, match="immutable"):
        a.ordinal = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(a)) == a
    assert repr(DeviceAffinity(2)) == "DeviceAffinity(2)"


def test_device_affinity_rejects_bad_ordinal():
    with pytest.raises(ValueError, match="ordinal"):
        DeviceAffinity(-1)
    with pytest.raises(ValueError, match="ordinal"):
        DeviceAffinity("0")  # type: ignore[arg-type]


def test_traits_attach_to_tensors():
    torch = pytest.importorskip("torch")
    t = torch.zeros(3)
    assert ExternalTensorTrait.get(t) is None
    assert DeviceTensorTrait.get(t) is None
    ExternalTensorTrait("scope", "w").set(t)
    DeviceTensorTrait(2, ["a"]).set(t)
    ext = ExternalTensorTrait.get(t)
    dev = DeviceTensorTrait.get(t)
    assert (ext.external_scope, ext.external_name) == ("scope", "w")
    assert (dev.ordinal, dev.queues) == (2, ["a"])
    assert dev.affinity == DeviceAffinity(2, ["a"])
    # Parameters accept traits too.
    p = torch.nn.Parameter(torch.ones(2))
    ExternalTensorTrait("", "p").set(p)
    assert ExternalTensorTrait.get(p).external_name == "p"


def test_traits_reject_non_tensors():
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match="torch"):
        ExternalTensorTrait("s", "n").set(np.zeros(2))
    assert ExternalTensorTrait.get(np.zeros(2)) is None


def test_externalize_module_parameters():
    torch = pytest.importorskip("torch")

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 3)
            self.register_buffer("kept", torch.zeros(1))
            self.register_buffer("dropped", torch.zeros(1), persistent=False)

    m = M()
    externalize_module_parameters(m, external_scope="model", prefix="p.")
    assert ExternalTensorTrait.get(m.fc.weight) == ExternalTensorTrait("model", "p.fc.weight")
    assert ExternalTensorTrait.get(m.fc.bias).external_name == "p.fc.bias"
    assert ExternalTensorTrait.get(m.kept).external_name == "p.kept"
    assert ExternalTensorTrait.get(m.dropped) is None


def test_externalize_tied_keeps_first_name():
    torch = pytest.importorskip("torch")
    m = torch.nn.Module()
    m.a = torch.nn.Linear(2, 2, bias=False)
    m.b = torch.nn.Linear(2, 2, bias=False)
    m.b.weight = m.a.weight
    externalize_module_parameters(m)
    assert ExternalTensorTrait.get(m.b.weight) == ExternalTensorTrait("", "a.weight")
