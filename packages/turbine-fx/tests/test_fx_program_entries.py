"""FxPrograms.programs values (FxProgram: .target, .arg_device) and dynamic_shapes for entry
points with varargs, as the reference's users write them."""

from __future__ import annotations

import pytest
import torch
from fx_helpers import Built, run_module
from torch import nn
from torch.export import Dim, ExportedProgram

from turbine_fx import (
    FxProgram,
    FxPrograms,
    FxProgramsBuilder,
    FxProgramsError,
    import_exported_program,
    program_and_arg_device,
)
from turbine_params import DeviceAffinity


class Proj(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x @ self.w


def test_programs_values_have_target_and_arg_device(tmp_path):
    fxb = FxProgramsBuilder(Proj())

    @fxb.export_program(args=(torch.randn(2, 4),), arg_device={0: DeviceAffinity(1)})
    def main(m, x):
        return m(x)

    @fxb.export_program(args=(torch.randn(3, 4),))
    def other(m, x):
        return m(x)

    assert isinstance(main, ExportedProgram)  # the decorator still returns the program
    entry = fxb.programs["main"]
    assert isinstance(entry, FxProgram)
    assert entry.target is main
    assert entry.arg_device == {0: DeviceAffinity(1)}
    assert fxb.programs["other"].arg_device is None
    # Reads other than .target / .arg_device reach the program (code written for bare values).
    assert entry.state_dict is main.state_dict

    fxb.save(tmp_path / "set.json")
    loaded = FxPrograms.load(tmp_path / "set.json")
    assert all(isinstance(v, FxProgram) for v in loaded.programs.values())
    assert isinstance(loaded.programs["main"].target, ExportedProgram)
    assert loaded.programs["main"].arg_device == {0: DeviceAffinity(1)}
    assert loaded.programs["other"].arg_device is None
    # The programs still share their weight after load.
    assert (
        loaded.programs["main"].target.state_dict["w"]
        is loaded.programs["other"].target.state_dict["w"]
    )


def test_program_and_arg_device_unwraps_both_forms():
    ep = torch.export.export(Proj(), (torch.randn(2, 4),))
    assert program_and_arg_device(ep) == (ep, None)
    wrapped = FxProgram(ep, arg_device={0: DeviceAffinity(0)})
    assert program_and_arg_device(wrapped) == (ep, {0: DeviceAffinity(0)})


def test_importing_a_loaded_set_unwraps_it(tmp_path):
    fxb = FxProgramsBuilder(Proj())
    fxb.export_program(lambda m, x: m(x), args=(torch.randn(2, 4),), name="p")
    fxb.save(tmp_path / "s.json")
    loaded = FxPrograms.load(tmp_path / "s.json")
    b = Built()
    with b:
        import_exported_program(b.mb, loaded.programs["p"].target, symbol_name="p")
    assert "func.func @p(" in b.asm()


class VarArgs(nn.Module):
    def forward(self, *args):
        return args[0] @ args[1]


def test_varargs_entry_point_with_dynamic_shapes(iree_device):
    """The issue's case (an open bug in the reference since torch 2.9)."""
    fxb = FxProgramsBuilder(VarArgs())
    k = Dim("K", max=256)

    @fxb.export_program(
        args=(torch.randn(64, 16), torch.randn(16, 64)),
        dynamic_shapes={"args": ((64, k), (k, 64))},
    )
    def entry(module, *args):
        return module(*args)

    shapes = [n.meta["val"].shape for n in entry.graph.nodes if n.op == "placeholder"]
    assert str(shapes[0][1]) == str(shapes[1][0]) and not isinstance(shapes[0][1], int)
    b = Built()
    with b:
        import_exported_program(b.mb, fxb.programs["entry"].target, symbol_name="entry")
    asm = b.asm()
    assert (
        "func.func @entry(%arg0: !torch.vtensor<[64,?],f32>, %arg1: !torch.vtensor<[?,64],f32>)"
        in (asm)
    )
    a, c = torch.randn(64, 40), torch.randn(40, 64)
    (got,) = run_module(iree_device, asm, "entry", [(a, c)])
    torch.testing.assert_close(got[0], a @ c, rtol=1e-4, atol=1e-4)


def test_dynamic_shapes_map_onto_named_varargs_and_tuple_forms():
    fxb = FxProgramsBuilder(VarArgs())
    k = Dim("K", max=256)
    a, c, d = torch.randn(8, 16), torch.randn(16, 8), torch.randn(8, 8)

    @fxb.export_program(args=(a, c, d), dynamic_shapes={"x": {1: k}, "rest": ({0: k}, None)})
    def mixed(module, x, *rest):
        return module(x, rest[0]) + rest[1]

    @fxb.export_program(args=(a, c), dynamic_shapes=({1: k}, {0: k}))
    def as_tuple(module, x, y):
        return module(x, y)

    for program in (mixed, as_tuple):
        shapes = [n.meta["val"].shape for n in program.graph.nodes if n.op == "placeholder"]
        assert not isinstance(shapes[0][1], int) and not isinstance(shapes[1][0], int)
        assert all(isinstance(s, int) for s in shapes[0][:1])


def test_varargs_dynamic_shapes_of_the_wrong_length_name_the_parameter():
    fxb = FxProgramsBuilder(VarArgs())
    with pytest.raises(FxProgramsError, match=r"dynamic_shapes\['args'\] needs one spec per"):
        fxb.export_program(
            lambda module, *args: module(*args),
            args=(torch.randn(4, 4), torch.randn(4, 4)),
            dynamic_shapes={"args": ({0: Dim("n")},)},
            name="bad",
        )
