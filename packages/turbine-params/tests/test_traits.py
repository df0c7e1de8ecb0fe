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
    a = DeviceAffinity(1, ["0", "1"])
    assert a == DeviceAffinity(1, ["0", "1"])
    assert a == DeviceAffinity(1, [0, 1])  # queue ordinals are kept as decimal strings
    assert a != DeviceAffinity(1)
    assert a != DeviceAffinity(2, ["0", "1"])
    assert hash(a) == hash(DeviceAffinity(1, ("0", "1")))
    assert len({DeviceAffinity(0), DeviceAffinity(0, None), DeviceAffinity(3)}) == 2
    assert a.ordinal == 1 and a.queues == ["0", "1"]
    a.queues.append("mutated")  # a copy: the value cannot change
    assert a.queues == ["0", "1"]
    with pytest.raises(AttributeError, match="immutable"):
        a.ordinal = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(a)) == a
    assert repr(DeviceAffinity(2)) == "DeviceAffinity(2)"


def test_device_affinity_rejects_bad_ordinal():
    with pytest.raises(ValueError, match=r"ordinal must be an int >= 0 .*got -1"):
        DeviceAffinity(-1)
    for bad in ("0", 1.0, True, None):
        with pytest.raises(TypeError, match=r"ordinal must be an int >= 0 .*got "):
            DeviceAffinity(bad)  # type: ignore[arg-type]
    np = pytest.importorskip("numpy")
    assert DeviceAffinity(np.int64(2)) == DeviceAffinity(2)


@pytest.mark.parametrize("cls", [DeviceAffinity, DeviceTensorTrait])
def test_bad_queues_are_refused_at_construction(cls):
    """Queue ordinals that IREE cannot address fail when the affinity is made (naming the bad
    value and what is accepted), not later when a module using it is exported."""
    name = cls.__name__
    with pytest.raises(
        ValueError, match=rf"{name} queue 'q0' is not a queue ordinal.*\['0', '1'\]"
    ):
        cls(0, ["q0"])
    with pytest.raises(ValueError, match=rf"{name} queue '-1' is not a queue ordinal"):
        cls(0, ["-1"])
    with pytest.raises(ValueError, match=rf"{name} queue -2 is negative"):
        cls(0, [0, -2])
    for bad in (1.5, True, None, b"0"):
        with pytest.raises(TypeError, match=rf"{name} queue .* is not a queue ordinal; give ints"):
            cls(0, [bad])
    for bad in (b"01", 1.5, {"0": 1}):
        with pytest.raises(TypeError, match=rf"{name} queues must be a list of queue ordinals"):
            cls(0, bad)
    with pytest.raises(TypeError, match=rf"{name} ordinal"):
        cls("1", ["0"])
    with pytest.raises(ValueError, match=rf"{name} ordinal"):
        cls(-3)
    # Accepted: ints, digit strings, one bare queue, numpy integers.
    np = pytest.importorskip("numpy")
    for good in ([0, "1"], ("0", 1), 1, "1", [np.int32(1)]):
        cls(2, good)
    assert DeviceAffinity(2, "01").queues == ["1"]


def test_traits_attach_to_tensors():
    torch = pytest.importorskip("torch")
    t = torch.zeros(3)
    assert ExternalTensorTrait.get(t) is None
    assert DeviceTensorTrait.get(t) is None
    ExternalTensorTrait("scope", "w").set(t)
    DeviceTensorTrait(2, ["3"]).set(t)
    ext = ExternalTensorTrait.get(t)
    dev = DeviceTensorTrait.get(t)
    assert (ext.external_scope, ext.external_name) == ("scope", "w")
    assert (dev.ordinal, dev.queues) == (2, ["3"])
    assert dev.affinity == DeviceAffinity(2, [3])
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
