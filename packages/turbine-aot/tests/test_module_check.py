"""Checked loading of untrusted .vmfb files (load_module(..., check_in_child=True), run --check-in-child).

IREE does not verify module contents: some byte-flipped modules kill the loading process with
SIGSEGV/SIGBUS/SIGILL, while loading or at the first call (damaged compiled code runs only
then). The checked load loads them and calls each function once on zeros in a child process
first.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import random
import re
import struct
import subprocess
import sys
from pathlib import Path

import iree.runtime as rt
import pytest
import torch

import turbine_aot
from turbine_aot import runtime as R
from turbine_aot._runtime.module_check import check_module_in_child, zero_arguments
from turbine_aot._signatures.abi import FlatSignature, TensorSpec
from turbine_aot._signatures.call import CallSignature
from turbine_aot._signatures.leaf import Leaf


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
    m = R.load_module(vmfb, check_in_child=True)
    torch.testing.assert_close(m.main(X, Y), _Net()(X, Y))
    m = R.load_module(vmfb.read_bytes(), check_in_child=True)
    torch.testing.assert_close(m.main(X, Y), _Net()(X, Y))


def test_a_module_that_crashes_iree_is_refused_without_killing_the_caller(vmfb, tmp_path):
    """Failing-first: an unchecked load of this module kills the process (shown in a child
    here); the checked load raises TurbineRuntimeError naming the signal instead.

    The crashing mutant is found by the check itself (load only, killed by a signal) and then
    confirmed by an unchecked load in a child. Which flipped bits crash depends on the code
    compiled for this host's CPU, and whether damaged code crashes can depend on memory
    contents: a mutant whose crash did not happen again on every load below (from the file,
    from bytes, and once more from the file) is passed over, as is one whose flips also damaged
    a record that is refused before the load (an ordinary, non-crash refusal)."""
    bad = tmp_path / "bad.vmfb"

    def checked_refusal(source) -> str:
        with pytest.raises(R.TurbineRuntimeError) as refused:
            R.load_module(source, check_in_child=True)
        return str(refused.value)

    for i, data in enumerate(_mutants(vmfb.read_bytes(), seed=1)):
        if i == 600:
            pytest.fail("none of 600 byte-flipped modules crashed IREE on every load")
        try:
            check_module_in_child(data, None, ["local-task"], calls=False)
        except R.TurbineRuntimeError as e:
            if "killed by SIG" not in str(e):
                continue  # a damaged record: an ordinary refusal, not a crash
        else:
            continue
        bad.write_bytes(data)
        unchecked = subprocess.run(
            [sys.executable, "-c", _UNCHECKED_LOAD, str(bad)], capture_output=True, timeout=300
        )
        if unchecked.returncode >= 0:
            continue
        try:
            from_file = checked_refusal(bad)
            from_bytes = checked_refusal(data)
            again = checked_refusal(bad)
        except pytest.fail.Exception:
            continue  # this time the damaged code did not crash and the load went through
        if not all("crashed the IREE runtime" in m for m in (from_file, from_bytes, again)):
            continue
        break
    # The caller is alive, and each refusal named the crash and where it came from.
    assert re.search(r"crashed the IREE runtime while loading: .* killed by SIG", from_file)
    assert re.search(r"crashed the IREE runtime while loading: .* killed by SIG", again)
    assert re.search(r"given module bytes crashed the IREE", from_bytes)


def test_a_hung_check_is_killed_and_reported(vmfb):
    with pytest.raises(R.TurbineRuntimeError, match=r"did not finish loading within 0.001 s"):
        check_module_in_child(None, vmfb, ["local-task"], timeout=0.001)


def test_ordinary_errors_are_left_to_the_in_process_load(tmp_path):
    junk = tmp_path / "junk.vmfb"
    junk.write_bytes(b"not a module at all" * 10)
    with pytest.raises(R.TurbineRuntimeError, match=r"junk.vmfb is not a loadable IREE module"):
        R.load_module(junk, check_in_child=True)


# ----------------------------------------------------------------------------- calls in the child
@pytest.fixture(scope="module")
def linear(tmp_path_factory) -> tuple[Path, Path]:
    """Issue 23's module: ``Linear(4, 3)``, weights in an ``.irpa``."""
    d = tmp_path_factory.mktemp("linear")
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3).eval()
    turbine_aot.externalize_module_parameters(lin)
    turbine_aot.save_module_parameters(d / "w.irpa", lin)
    turbine_aot.export(lin, args=(torch.randn(2, 4),)).compile(d / "m.vmfb")
    return d / "m.vmfb", d / "w.irpa"


def _elf_code(data: bytes) -> tuple[int, int]:
    """The byte range of the compiled code (the embedded ELF's ``.text``) in a ``.vmfb``."""
    elf = data.index(b"\x7fELF")
    shoff = struct.unpack_from("<Q", data, elf + 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, elf + 0x3A)
    names = struct.unpack_from("<Q", data, elf + shoff + shstrndx * shentsize + 0x18)[0]
    for k in range(shnum):
        name, _, _, _, off, size = struct.unpack_from("<IIQQQQ", data, elf + shoff + k * shentsize)
        start = elf + names + name
        if data[start : data.index(b"\0", start)] == b".text":
            return elf + off, elf + off + size
    raise AssertionError("no .text section in the module's executable")


def _records(data: bytes) -> tuple[int, int]:
    """The byte range holding the functions' signature records (reflection strings)."""
    starts = [data.index(k) for k in (b"turbine.signature", b"torch.args_schema")]
    ends = [data.rindex(k) + len(k) + 300 for k in (b"turbine.signature", b"torch.args_schema")]
    return min(starts), min(max(ends), len(data))


def _damaged(data: bytes, rng: random.Random, region: tuple[int, int]) -> bytes:
    """``data`` with 1-16 random bytes in ``region`` overwritten by random values."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 16)):
        b[rng.randrange(*region)] = rng.randrange(256)
    return bytes(b)


def test_a_module_that_crashes_when_called_is_refused_by_the_checked_load(linear, tmp_path):
    """Failing-first (issue 23): a module whose compiled code is damaged passes a load in the
    child and kills the caller at its first call; the checked load now calls it in the child
    and refuses it, naming the function."""
    vmfb, params = linear
    data = vmfb.read_bytes()
    rng = random.Random(8)
    crasher = None
    for _ in range(80):
        candidate = _damaged(data, rng, _elf_code(data))
        try:
            check_module_in_child(candidate, None, ["local-task"], params, calls=False)
            check_module_in_child(candidate, None, ["local-task"], params)
        except R.TurbineRuntimeError as e:
            if "while calling main()" in str(e):
                crasher = candidate
                break
    assert crasher is not None, "none of 80 damaged code sections crashed only when called"
    bad = tmp_path / "bad.vmfb"
    bad.write_bytes(crasher)
    unchecked = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_CALL, str(bad), str(params), "False"],
        capture_output=True,
        timeout=300,
    )
    assert unchecked.returncode < 0, "an unchecked call survived the module it crashed on"
    loaded_only = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_CALL, str(bad), str(params), "'load'"],
        capture_output=True,
        timeout=300,
    )
    assert b"loaded" in loaded_only.stdout and loaded_only.returncode < 0  # what verify missed
    with pytest.raises(
        R.TurbineRuntimeError,
        match=r"bad.vmfb' crashed the IREE runtime while calling main\(\) on zeros of its "
        r"signature: a checking child process was killed by SIG",
    ):
        R.load_module(bad, parameters=params, check_in_child=True)


_LOAD_AND_CALL = """
import sys, torch
from turbine_aot import runtime as R
m = R.load_module(sys.argv[1], parameters=sys.argv[2], check_in_child=eval(sys.argv[3]))
print("loaded", flush=True)
m.main(torch.zeros(2, 4))
print("called", flush=True)
"""


def test_checked_calls_say_what_the_child_called(linear):
    vmfb, params = linear
    m = R.load_module(vmfb, parameters=params, check_in_child=True)
    assert m.checked_calls == {"main": "called"}
    assert R.load_module(vmfb, parameters=params, check_in_child="load").checked_calls is None
    assert R.load_module(vmfb, parameters=params).checked_calls is None
    with pytest.raises(
        R.TurbineRuntimeError, match=r"check_in_child must be True, False or 'load'"
    ):
        R.load_module(vmfb, check_in_child="calls")


def test_verify_is_the_deprecated_spelling_of_check_in_child(linear):
    """Code written before the rename keeps its protection: ``verify=True`` still runs the
    child check (with a DeprecationWarning naming the new argument), ``verified_calls`` still
    reads the child's report."""
    vmfb, params = linear
    with pytest.warns(DeprecationWarning, match="check_in_child"):
        m = R.load_module(vmfb, parameters=params, verify=True)
    assert m.checked_calls == {"main": "called"}
    assert m.verified_calls == m.checked_calls
    with pytest.warns(DeprecationWarning):
        assert R.load_module(vmfb, parameters=params, verify="load").checked_calls is None


def test_a_bundle_is_checked_in_a_child_too(linear, tmp_path):
    """``load_bundle(check_in_child=True)``: the bundle's hashes say its files are the ones
    bundled, not that its module is safe to run; the child check says that."""
    vmfb, params = linear
    R.save_bundle(tmp_path / "b", vmfb, parameters=params)
    m = R.load_bundle(tmp_path / "b", verify=True, check_in_child=True)
    assert m.checked_calls == {"main": "called"}
    assert R.load_bundle(tmp_path / "b").checked_calls is None


_COUNTER = """
module @counter {
util.global private mutable @n = 0 : i32
func.func @step() -> i32 {
  %n = util.global.load @n : i32
  %c1 = arith.constant 1 : i32
  %m = arith.addi %n, %c1 : i32
  util.global.store %m, @n : i32
  return %m : i32
}
func.func @nonzero(%x: i32) -> i32 {
  %c0 = arith.constant 0 : i32
  %ok = arith.cmpi ne, %x, %c0 : i32
  cf.assert %ok, "x must not be zero"
  return %x : i32
}
func.func @dynamic(%x: tensor<?xf32>) -> tensor<?xf32> {
  return %x : tensor<?xf32>
}
}
"""


def test_the_child_calls_a_stateful_module_without_changing_its_state_here(caplog):
    """The child's calls mutate the child's globals only; a call that IREE refuses on zeros
    (not a crash) loads with a warning; a dynamic dimension without a recorded range is not
    called (a module not exported by turbine)."""
    vmfb = R.compile_mlir(_COUNTER, R.device_compile_flags(["local-task"]), cache=False)
    with caplog.at_level(logging.WARNING, logger="turbine.aot.runtime"):
        m = R.load_module(vmfb, check_in_child=True)
    assert m.checked_calls["step"] == "called"
    assert m.checked_calls["nonzero"].startswith("call failed: ")
    assert "x must not be zero" in m.checked_calls["nonzero"]
    assert m.checked_calls["dynamic"] == (
        "not called: argument 0 (tensor<?xf32>) has a dynamic dimension without a recorded range"
    )
    assert "nonzero() on zeros of its signature failed in the checking child" in caplog.text
    assert m.step() == 1  # the child's call did not count here
    assert m.nonzero(5) == 5


def _sig(leaves, dims, inputs=None) -> FlatSignature:
    call = CallSignature("[1, {}]", None, ("x",), tuple(leaves), dims=dims)
    specs = inputs or tuple(
        TensorSpec(tuple(d if isinstance(d, int) else None for d in leaf.shape), leaf.dtype)
        if leaf.kind == "tensor"
        else TensorSpec((), leaf.dtype, is_tensor=False)
        for leaf in leaves
    )
    return FlatSignature("main", specs, (), call)


def test_zero_arguments_take_the_smallest_size_of_at_least_one_each_range_allows():
    leaves = [
        Leaf("x", "tensor", 0, "f32", ("s0", 4)),
        Leaf("y", "tensor", 1, "i64", ("s1", "2*s0 + 1")),
        Leaf("n", "scalar", 2, "i64"),
    ]
    args = zero_arguments(_sig(leaves, {"s0": (3, 8), "s1": (0, None)}), {}, 1)
    assert [a.get("tensor") for a in args] == [[3, 4], [1, 7], None]
    assert args[2] == {"int": 0}
    assert args[0]["element_type"] == int(rt.HalElementType.FLOAT_32)
    unranged = [Leaf("x", "tensor", 0, "f32", ("s9",))]
    assert "without a recorded range" in zero_arguments(_sig(unranged, {}), {}, 1)
    leaf = Leaf("x", "tensor", 0, "f32", (2,), device="__device_1")
    elsewhere = _sig([leaf], {}, (TensorSpec((2,), "f32", device="__device_1"),))
    assert "placed on device 1; 1 are loaded" in zero_arguments(elsewhere, {}, 1)


# The child damages the module with the same functions as the tests here.
_FUZZ_CHILD = "import json, random, struct, sys\n"
_FUZZ_CHILD += "\n".join(inspect.getsource(f) for f in (_elf_code, _records, _damaged))
_FUZZ_CHILD += """
import torch
from turbine_aot import runtime as R
from turbine_aot._runtime import module_check as _module_check
_module_check.DEFAULT_CHECK_TIMEOUT = 20.0  # a damaged module can loop: a few cost that long
data = open(sys.argv[1], "rb").read()
params, seed, start, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
regions = {"anywhere": (0, len(data)), "records": _records(data), "code": _elf_code(data)}
rng = random.Random(seed)
for i in range(n):
    region = list(regions)[i % 3]
    mutant = _damaged(data, rng, regions[region])
    if i < start:
        continue
    print(json.dumps({"trying": i, "region": region}), flush=True)
    try:
        m = R.load_module(mutant, parameters=params, check_in_child=True)
    except R.TurbineRuntimeError as e:
        kind = "refused: child crashed" if "crashed the IREE" in str(e) else "refused: error"
        print(json.dumps({"i": i, "outcome": kind}), flush=True)
        continue
    except BaseException as e:
        print(json.dumps({"i": i, "outcome": f"raw {type(e).__name__}: {e}"[:300]}), flush=True)
        continue
    try:
        m.main(torch.zeros(2, 4))
        outcome = "loaded and called"
    except R.TurbineRuntimeError:
        outcome = "loaded, call refused: error"
    except BaseException as e:
        outcome = f"raw {type(e).__name__}: {e}"[:300]
    print(json.dumps({"i": i, "outcome": outcome}), flush=True)
"""


def test_fuzz_damaged_modules_never_raise_raw_exceptions_or_kill_the_caller(linear):
    """Issue 23's fuzz, seeded and small: 1-16 random bytes overwritten anywhere, in the
    signature records or in the compiled code; each mutant through the checked load and one
    call, in a child process that reports per mutant (a mutant that kills it is reported and
    the run goes on from the next). Every outcome is a result or a TurbineRuntimeError."""
    vmfb, params = linear
    n = int(os.environ.get("TURBINE_FUZZ_VMFB", "18"))
    results: dict[int, str] = {}
    start = 0
    while start < n:
        proc = subprocess.run(
            [sys.executable, "-c", _FUZZ_CHILD, str(vmfb), str(params), "23", str(start), str(n)],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        trying = None
        for line in proc.stdout.splitlines():
            msg = json.loads(line)
            if "trying" in msg:
                trying = msg["trying"]
            else:
                results[msg["i"]] = msg["outcome"]
        if proc.returncode != 0:
            assert trying is not None and trying not in results, proc.stderr[-2000:]
            results[trying] = f"killed the process (status {proc.returncode})"
            start = trying + 1
        else:
            start = n
    counts: dict[str, int] = {}
    for outcome in results.values():
        key = outcome.split(":")[0] if outcome.startswith(("raw", "killed")) else outcome
        counts[key] = counts.get(key, 0) + 1
    print(f"\nvmfb fuzz: {n} damaged modules tried: {counts}")
    bad = {i: o for i, o in results.items() if o.startswith(("raw", "killed"))}
    assert not bad, f"mutants (seed 23) that escaped turbine's errors: {bad}"
    assert len(results) == n
