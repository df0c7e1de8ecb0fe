"""export() and CompiledModule consume FxPrograms.programs values (FxProgram wrappers), built live
or loaded, with their argument affinities; varargs entry points with dynamic shapes compile."""

from __future__ import annotations

import torch
from torch import nn
from torch.export import Dim

import turbine_aot as aot
from turbine_aot import CompiledModule
from turbine_aot.runtime import load_module

FAST = ["--iree-opt-data-tiling=false", "--iree-llvmcpu-enable-ukernels=none"]


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.proj(x))


def _builder() -> aot.FxProgramsBuilder:
    torch.manual_seed(0)
    fxb = aot.FxProgramsBuilder(Decoder())

    @fxb.export_program(args=(torch.randn(4, 8),), arg_device={0: aot.DeviceAffinity(0)})
    def prefill(m, x):
        return m(x)

    @fxb.export_program(args=(torch.randn(1, 8),))
    def decode(m, x):
        return m(x) * 2

    return fxb


def test_export_of_a_loaded_set_unwraps_programs_and_keeps_affinities(tmp_path):
    fxb = _builder()
    fxb.save(tmp_path / "set.json")
    loaded = aot.FxPrograms.load(tmp_path / "set.json")
    out = aot.export(loaded)
    ir = str(out.mlir_module)
    assert "func.func @prefill(%arg0: !torch.vtensor<[4,8],f32> {iree.abi.affinity = " in ir
    assert "func.func @decode(%arg0: !torch.vtensor<[1,8],f32>)" in ir
    assert ir.count("util.global private @__auto.proj.weight") == 1  # shared by both
    m = load_module(out.compile(None, extra_args=FAST))
    x = torch.randn(1, 8)
    torch.testing.assert_close(m.decode(x), fxb.root_module(x) * 2, rtol=1e-5, atol=1e-5)


def test_compiled_module_member_from_programs():
    fxb = _builder()

    class Served(CompiledModule):
        decode = fxb.programs["decode"]
        prefill = fxb.programs["prefill"]

    ir = str(aot.export(Served).mlir_module)
    assert "func.func @decode(" in ir
    assert "func.func @prefill(%arg0: !torch.vtensor<[4,8],f32> {iree.abi.affinity = " in ir


def test_varargs_program_exports_and_runs_with_dynamic_shapes():
    class MatMul(nn.Module):
        def forward(self, *args):
            return args[0] @ args[1]

    fxb = aot.FxProgramsBuilder(MatMul())
    k = Dim("K", max=512)

    @fxb.export_program(
        args=(torch.randn(64, 16), torch.randn(16, 64)),
        dynamic_shapes={"args": ((64, k), (k, 64))},
    )
    def entry(module, *args):
        return module(*args)

    out = aot.export(fxb)
    assert (
        "func.func @entry(%arg0: !torch.vtensor<[64,?],f32>, %arg1: !torch.vtensor<[?,64],f32>)"
        in (str(out.mlir_module))
    )
    m = load_module(out.compile(None, extra_args=FAST))
    a, b = torch.randn(64, 100), torch.randn(100, 64)
    torch.testing.assert_close(m.entry(a, b), a @ b, rtol=1e-4, atol=1e-4)
