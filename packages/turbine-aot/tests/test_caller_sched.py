"""The calling thread under ``SCHED_BATCH`` while a call runs on ``local-task`` workers
(docs/running.md, "The calling thread during a call"): the mode and the driver rule as pure
functions, the switch and its undoing on real threads, and real modules on ``local-task`` /
``local-sync`` observed from inside the call. Real IREE."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

import turbine_aot
from turbine_aot import runtime as R
from turbine_aot._errors import TurbineRuntimeError
from turbine_aot._runtime.caller_sched import (
    ENV_VAR,
    BatchWhileCalling,
    resolve_mode,
    switches_policy,
)


def _switch_refused() -> str | None:
    """Why this process cannot switch a thread to SCHED_BATCH and back (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "SCHED_BATCH is a Linux scheduling policy"
    out: list[str | None] = [None]

    def probe():
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError as e:
            out[0] = f"this sandbox refuses sched_setscheduler ({e})"

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return out[0]


_REFUSED = _switch_refused()
needs_sched_switch = pytest.mark.skipif(_REFUSED is not None, reason=_REFUSED or "")


# --- the mode and the rule -------------------------------------------------------------------
def test_mode_defaults_to_auto_and_follows_the_environment(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_mode() == "auto"
    monkeypatch.setenv(ENV_VAR, "")
    assert resolve_mode() == "auto"
    monkeypatch.setenv(ENV_VAR, "normal")
    assert resolve_mode() == "normal"
    assert resolve_mode("batch") == "batch"  # an explicit value wins over the environment


def test_an_unknown_mode_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "fifo")
    with pytest.raises(TurbineRuntimeError) as e:
        resolve_mode()
    msg = str(e.value)
    assert ENV_VAR in msg and "'fifo'" in msg
    assert all(m in msg for m in ("auto", "batch", "normal"))


@needs_sched_switch
def test_auto_switches_only_for_local_task():
    assert switches_policy(["local-task"], "auto")
    assert switches_policy(["local-sync", "local-task"], "auto")
    assert not switches_policy(["local-sync"], "auto")
    assert not switches_policy(["vulkan"], "auto")
    assert not switches_policy(["cuda", "hip"], "auto")
    assert switches_policy(["vulkan"], "batch")
    assert not switches_policy(["local-task"], "normal")


# --- the switch on a real thread -------------------------------------------------------------
def _in_thread(fn):
    """Runs fn on a fresh thread (the test's own thread keeps its policy) and returns its
    result, re-raising what it raised."""
    out: dict = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as e:  # handed back to the test
            out["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


@needs_sched_switch
def test_batch_inside_and_the_normal_policy_back_after():
    def body():
        before = os.sched_getscheduler(0)
        with BatchWhileCalling():
            inside = os.sched_getscheduler(0)
        return before, inside, os.sched_getscheduler(0)

    assert _in_thread(body) == (os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_OTHER)


@needs_sched_switch
def test_the_policy_comes_back_when_the_call_raises():
    def body():
        with pytest.raises(ValueError), BatchWhileCalling():
            raise ValueError("the call failed")
        return os.sched_getscheduler(0)

    assert _in_thread(body) == os.SCHED_OTHER


@needs_sched_switch
def test_a_policy_the_user_chose_is_left_alone():
    def body():
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        with BatchWhileCalling():
            inside = os.sched_getscheduler(0)
        return inside, os.sched_getscheduler(0)

    # SCHED_IDLE cannot be left without privileges: it stays, inside and after.
    assert _in_thread(body) == (os.SCHED_IDLE, os.SCHED_IDLE)


# --- real modules, observed from inside the call ---------------------------------------------
class _Recording:
    """Stands in for a LoadedModule's VM context: records the calling thread's policy while
    IREE runs the call."""

    def __init__(self, context):
        self._context = context
        self.policies: list[int] = []

    def invoke(self, *args):
        self.policies.append(os.sched_getscheduler(0))
        return self._context.invoke(*args)


@pytest.fixture(scope="module")
def linear_export():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU())
    x = torch.randn(4, 64)
    return model, x, turbine_aot.export(model, args=(x,))


@needs_sched_switch
@pytest.mark.parametrize(
    "device, mode, during",
    [
        ("local-task", "auto", "SCHED_BATCH"),
        ("local-task", "normal", "SCHED_OTHER"),
        ("local-sync", "auto", "SCHED_OTHER"),
    ],
)
def test_a_call_runs_with_the_policy_of_its_driver_and_mode(
    linear_export, monkeypatch, device, mode, during
):
    model, x, eo = linear_export
    monkeypatch.setenv(ENV_VAR, mode)
    m = R.load_module(eo, device=device)
    recording = _Recording(m._context)
    m._context = recording

    def body():
        y = m.main(x)
        return y, os.sched_getscheduler(0)

    y, after = _in_thread(body)
    assert recording.policies == [getattr(os, during)]
    assert after == os.SCHED_OTHER
    torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)


def test_an_unknown_mode_fails_the_load(linear_export, monkeypatch):
    _, _, eo = linear_export
    monkeypatch.setenv(ENV_VAR, "realtime")
    with pytest.raises(TurbineRuntimeError, match=ENV_VAR):
        R.load_module(eo, device="local-sync")
