"""Checked loading of untrusted .vmfb files (load_module(..., verify=True), run --verify).

IREE does not verify module contents: some byte-flipped modules kill the loading process with
SIGSEGV/SIGBUS/SIGILL. The checked load tries them in a child process first.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import turbine_aot
from turbine_aot import runtime as R
from turbine_aot._module_check import check_module_in_child


class _Net(torch.nn.Module):
    def forward(self, x, y):
        return (x @ y).relu() + 1.0


X, Y = torch.randn(2, 3), torch.randn(3, 4)


@pytest.fixture(scope="module")
def vmfb(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vmfb") / "m.vmfb"
    turbine_aot.export(_Net(), args=(X, Y)).compile(path)
    return path


def _mutants(data: bytes, seed: int):
    """Endless byte-flipped copies of ``data`` (1-8 flipped bits each), reproducible by seed."""
    rng = random.Random(seed)
    while True:
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        yield bytes(b)


_UNCHECKED_LOAD = (
    "import sys; from turbine_aot import runtime as R; R.load_module(sys.argv[1]); print('loaded')"
)


def test_checked_load_of_an_intact_module_runs(vmfb):
    m = R.load_module(vmfb, verify=True)
    torch.testing.assert_close(m.main(X, Y), _Net()(X, Y))
    m = R.load_module(vmfb.read_bytes(), verify=True)
    torch.testing.assert_close(m.main(X, Y), _Net()(X, Y))


def test_a_module_that_crashes_iree_is_refused_without_killing_the_caller(vmfb, tmp_path):
    """Failing-first: an unchecked load of this module kills the process (shown in a child
    here); the checked load raises TurbineRuntimeError naming the signal instead."""
    crasher = None
    for i, data in enumerate(_mutants(vmfb.read_bytes(), seed=1)):
        if i == 300:
            pytest.fail("none of 300 byte-flipped modules crashed IREE (about 5% do)")
        try:
            check_module_in_child(data, None, ["local-task"])
        except R.TurbineRuntimeError:
            crasher = data
            break
    bad = tmp_path / "bad.vmfb"
    bad.write_bytes(crasher)
    unchecked = subprocess.run(
        [sys.executable, "-c", _UNCHECKED_LOAD, str(bad)], capture_output=True, timeout=300
    )
    assert unchecked.returncode < 0, "the unchecked load survived the module it crashed on"
    with pytest.raises(
        R.TurbineRuntimeError, match=r"crashed the IREE runtime while loading: .* killed by SIG"
    ):
        R.load_module(bad, verify=True)
    with pytest.raises(R.TurbineRuntimeError, match=r"given module bytes crashed the IREE"):
        R.load_module(crasher, verify=True)


def test_a_hung_check_is_killed_and_reported(vmfb):
    with pytest.raises(R.TurbineRuntimeError, match=r"did not finish loading within 0.001 s"):
        check_module_in_child(None, vmfb, ["local-task"], timeout=0.001)


def test_ordinary_errors_are_left_to_the_in_process_load(tmp_path):
    junk = tmp_path / "junk.vmfb"
    junk.write_bytes(b"not a module at all" * 10)
    with pytest.raises(R.TurbineRuntimeError, match=r"junk.vmfb is not a loadable IREE module"):
        R.load_module(junk, verify=True)


def test_fuzz_byte_flipped_modules_never_kill_the_process(vmfb):
    """Every mutant through the checked load either loads (and its functions are callable
    objects) or raises TurbineRuntimeError; none takes the test process down."""
    n = int(os.environ.get("TURBINE_FUZZ_VMFB", "25"))
    outcomes = {"loaded": 0, "refused (child crashed)": 0, "refused (error)": 0}
    for data in _mutants(vmfb.read_bytes(), seed=2):
        if sum(outcomes.values()) == n:
            break
        try:
            m = R.load_module(data, verify=True)
        except R.TurbineRuntimeError as e:
            key = "refused (child crashed)" if "crashed the IREE" in str(e) else "refused (error)"
            outcomes[key] += 1
            continue
        outcomes["loaded"] += 1
        assert all(callable(m[name]) for name in m.function_names)
    print(f"\nvmfb fuzz: {n} byte-flipped modules tried: {outcomes}")
    assert sum(outcomes.values()) == n
