"""Flags set on an ``ExportOutput``'s compiler session reach ``compile`` exactly as set: list
options (``--iree-hal-target-device`` twice) stay two flags, not the one joined value
``Session.get_flags`` prints."""

from __future__ import annotations

import pytest
import torch
from iree.compiler.api import Session

from turbine_aot import DeviceAffinity, ExportOutput, export
from turbine_aot._compiler.session import new_session, session_flags
from turbine_aot._compiler.text import split_top_level_commas

TWO_DEVICE_FLAGS = (
    "--iree-hal-target-device=__device_0=local",
    "--iree-hal-target-device=__device_1=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
)


def test_get_flags_joins_list_values_but_session_flags_replays_them():
    session = new_session()
    session.set_flags(*TWO_DEVICE_FLAGS)
    # What IREE prints: one flag, values joined (set on a new session, that is ONE device alias).
    assert "--iree-hal-target-device=__device_0=local,__device_1=local" in session.get_flags(
        non_default_only=True
    )
    assert session_flags(session) == ["--iree-input-type=torch", *TWO_DEVICE_FLAGS]


def test_foreign_session_flags_are_split_back():
    session = Session()  # not created by turbine: no record, the joined text is split
    session.set_flags(*TWO_DEVICE_FLAGS)
    flags = session_flags(session)
    assert flags.count("--iree-hal-target-device=__device_0=local") == 1
    assert flags.count("--iree-hal-target-device=__device_1=local") == 1
    assert "--iree-hal-local-target-device-backends=llvm-cpu" in flags


def test_split_top_level_commas_keeps_attribute_syntax_whole():
    assert split_top_level_commas("a=local,b=local") == ["a=local", "b=local"]
    assert split_top_level_commas('#hal.device.target<"local", [x, y]>,cuda') == [
        '#hal.device.target<"local", [x, y]>',
        "cuda",
    ]
    assert split_top_level_commas('"a,b",c') == ['"a,b"', "c"]


class _TwoArgs(torch.nn.Module):
    def forward(self, x, y):
        return x + 1, y * 2


def test_two_devices_from_session_flags_compile_and_run(monkeypatch):
    from turbine_aot import runtime as R

    x, y = torch.randn(4), torch.randn(4)
    eo = export(_TwoArgs(), args=(x, y), arg_device={0: DeviceAffinity(0), 1: DeviceAffinity(1)})
    assert "#hal.device.promise<@__device_1>" in str(eo.mlir_module)
    eo.session.set_flags(*TWO_DEVICE_FLAGS)
    used: list[list[str]] = []
    real_compile = ExportOutput._compile

    def spy(self, flags, *args, **kwargs):
        used.append(list(flags))
        return real_compile(self, flags, *args, **kwargs)

    monkeypatch.setattr(ExportOutput, "_compile", spy)
    out = eo.compile(save_to=None, target_backends=None)
    device_flags = [f for f in used[0] if f.startswith("--iree-hal-target-device")]
    assert device_flags == list(TWO_DEVICE_FLAGS[:2])
    assert "--iree-hal-local-target-device-backends=llvm-cpu" in used[0]
    m = R.load_module(bytes(out.map_memory()), device=["local-task", "local-task"])
    assert len(m.devices) == 2 and m.devices[0] is not m.devices[1]
    a, b = m.main(x, y)
    torch.testing.assert_close(a, x + 1)
    torch.testing.assert_close(b, y * 2)


def test_bad_session_flag_is_still_reported():
    session = new_session()
    with pytest.raises(ValueError):
        session.set_flags("--iree-no-such-flag")
    assert "--iree-no-such-flag" not in session_flags(session)
