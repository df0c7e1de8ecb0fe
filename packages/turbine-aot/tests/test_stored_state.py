"""Calls whose stored module state may still read their arguments (``_compiler.stored_state``).

IREE's synchronous calls wait for their results, not for the work writing mutable globals: a
function storing its argument returns while the copy into the global may not have read it yet.
A caller that writes the argument's memory right away (``PreparedCall``'s input buffers, a
``zero_copy_inputs`` tensor) changed what the module kept: 123 of 200 tries on ``local-task``
before the fix. The compile copy gets, for each function storing state, an exported
``__turbine_wait_state.<name>`` that waits on it; the runtime hands such functions copies of
small prepared arguments, and waits otherwise (docs/running.md, "Module state and argument
buffers").
"""

from __future__ import annotations

import iree.compiler as ic
import numpy as np
import pytest
import torch
from ir_check import check_ir

from turbine_aot import runtime as R
from turbine_aot._compiler.rewrites import module_for_compile
from turbine_aot._compiler.stored_state import (
    WAIT_STATE_PREFIX,
    functions_storing_state,
    wait_for_stored_state,
)
from turbine_aot._runtime import prepared_calls
from turbine_ir import ir

CPU_FLAGS = R.device_compile_flags(["local-task"])
TRIES = 40  # before the fix, each try lost the race about 6 times in 10

MLIR = """
module @state {
util.global private mutable @kept = dense<0.0> : tensor<4xf32>
util.global private mutable @count = 0 : i64
util.global private mutable @rows : tensor<?x4xf32>
func.func @keep(%x: tensor<4xf32>) -> tensor<4xf32> {
  util.global.store %x, @kept : tensor<4xf32>
  return %x : tensor<4xf32>
}
func.func @keep_through(%x: tensor<4xf32>) {
  util.call @store_it(%x) : (tensor<4xf32>) -> ()
  return
}
util.func private @store_it(%x: tensor<4xf32>) {
  util.global.store %x, @kept : tensor<4xf32>
  util.return
}
func.func @tick(%x: tensor<4xf32>) -> tensor<4xf32> {
  %n = util.global.load @count : i64
  %c1 = arith.constant 1 : i64
  %m = arith.addi %n, %c1 : i64
  util.global.store %m, @count : i64
  return %x : tensor<4xf32>
}
func.func @read() -> tensor<4xf32> {
  %k = util.global.load @kept : tensor<4xf32>
  return %k : tensor<4xf32>
}
}
"""


def _vm_function(vm_text: str, name: str) -> str:
    start = vm_text.index(f"vm.func private @{name}(")
    return vm_text[start : vm_text.index("\n    }", start)]


def test_iree_still_returns_before_a_stored_argument_is_copied():
    """Why the compile copy gets the waits: compiled as written, ``@keep`` queues the copy of
    its argument into ``@kept``, records the copy's fence as the global's timepoint and returns
    without waiting on it. When this test fails, IREE waits for stored state itself: drop
    ``wait_for_stored_state`` from ``rewrites.module_for_compile`` (bump ``REVISION``), the
    runtime's copies and waits, and this test."""
    vm = ic.compile_str(MLIR, extra_args=[*CPU_FLAGS, "--compile-to=vm"]).decode()
    keep = _vm_function(vm, "keep")
    assert "@hal.device.queue.copy" in keep
    assert "vm.global.store.ref" in keep and "@kept__timepoint" in keep
    assert "@hal.fence.await" not in keep  # returns with the copy possibly still queued


def test_the_functions_storing_state_and_their_waits():
    with ir.Context():
        module = ir.Module.parse(MLIR)
        # @tick stores a scalar (host state: nothing queued); @read stores nothing; the
        # dynamic-shape @rows is stored by no function here and is never waited on
        assert functions_storing_state(module.operation) == {
            "keep": ["kept"],
            "keep_through": ["kept"],  # through the private function it calls
        }
        assert wait_for_stored_state(module.operation) == 2
        text = str(module)
        assert wait_for_stored_state(module.operation) == 2  # idempotent: nothing added
        assert str(module) == text
    check_ir(
        text,
        r"util\.func public @__turbine_wait_state\.keep\(\) \{",
        r"hal\.devices\.get %c0 : !hal\.device",
        r"hal\.fence\.create device\(.*\) flags\(\"None\"\) : !hal\.fence",
        r"%kept = util\.global\.load @kept : tensor<4xf32>",
        r"hal\.tensor\.barrier join\(%kept : tensor<4xf32>\) => %fence : !hal\.fence",
        r"hal\.fence\.await until\(\[%fence\]\)",
        r"util\.func public @__turbine_wait_state\.keep_through\(\) \{",
    )
    # the functions themselves are unchanged: an async caller is never blocked by them
    assert text.count("__turbine_wait_state") == 2


def test_only_cpu_compiles_get_the_waits():
    def compiled_copy(flags: list[str]) -> str:
        with ir.Context():
            module = ir.Module.parse(MLIR)
            copy, owned = module_for_compile(module.operation, flags)
            return str(copy) if owned else ""

    assert WAIT_STATE_PREFIX + "keep" in compiled_copy(CPU_FLAGS)
    assert WAIT_STATE_PREFIX + "keep" in compiled_copy(R.device_compile_flags(["local-sync"]))
    vulkan = ["--iree-hal-target-device=vulkan", "--iree-vulkan-target=host"]
    assert WAIT_STATE_PREFIX not in compiled_copy(vulkan)


@pytest.fixture(scope="module")
def vmfb(tmp_path_factory):
    return R.compile_mlir(MLIR, CPU_FLAGS, cache=R.CompileCache(tmp_path_factory.mktemp("cc")))


def test_the_waits_are_not_listed_and_mark_the_storing_functions(vmfb):
    m = R.load_module(vmfb, device="local-task")
    assert sorted(m.function_names) == ["keep", "keep_through", "read", "tick"]
    assert m.keep._wait_state is not None and m.keep_through._wait_state is not None
    assert m.read._wait_state is None and m.tick._wait_state is None


@pytest.mark.parametrize("how", ["copies", "waits"])
@pytest.mark.parametrize("device", ["local-task", "local-sync"])
def test_prepared_arguments_written_after_a_call_do_not_reach_the_state(
    vmfb, device, how, monkeypatch
):
    if how == "waits":  # arguments too large to copy: the call waits for the state instead
        monkeypatch.setattr(prepared_calls, "COPY_LIMIT", 0)
    m = R.load_module(vmfb, device=device)
    for i in range(TRIES):
        call = R.PreparedCall([m.keep, m.keep_through], [np.full(4, i, np.float32)])
        call(i % 2)  # @keep, or @keep_through storing it in a function of its own
        call.inputs[0][...] = -1.0  # the next arguments, written at once
        assert np.array_equal(m.read().numpy(), [i] * 4), f"try {i}"


def test_zero_copy_arguments_changed_after_a_call_do_not_reach_the_state(vmfb):
    m = R.load_module(vmfb, device="local-task", zero_copy_inputs=True)
    for i in range(TRIES):
        x = torch.full((4,), float(i))
        m.keep_through(x)  # the tensor's own memory: no copy on the way in
        x.fill_(-1.0)
        assert torch.equal(m.read(), torch.full((4,), float(i))), f"try {i}"
