"""FxPrograms / FxProgramsBuilder: shared state, save/load without pickle, import and run."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch
import torch.nn as nn
from fx_helpers import Built, run_module

from turbine_fx import FxPrograms, FxProgramsBuilder, FxProgramsError, import_exported_program
from turbine_params import ExternalTensorTrait


class Decoder(nn.Module):
    """Prefill computes a projection; decode also writes a cache row (shared weights)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("cache", torch.zeros(3, 4))
        self.scale = torch.tensor([0.5, 1.0, 1.5, 2.0])  # a lifted constant

    def forward(self, x):
        return self.proj(x) * self.scale

    def decode(self, x, pos):
        self.cache.index_put_((pos,), self.proj(x))
        return self.cache.sum(0)


def _builder(model):
    fxb = FxProgramsBuilder(model)

    @fxb.export_program(
        args=(torch.randn(2, 4),), dynamic_shapes={"x": {0: torch.export.Dim("batch", max=16)}}
    )
    def prefill(m, x):
        return m(x)

    @fxb.export_program(args=(torch.randn(1, 4), torch.tensor([0])), name="decode")
    def _decode(m, x, pos):
        return m.decode(x, pos)

    return fxb


def test_programs_share_the_root_tensors():
    model = Decoder()
    fxb = _builder(model)
    assert list(fxb.programs) == ["prefill", "decode"]
    prefill, decode = fxb.programs["prefill"], fxb.programs["decode"]
    assert prefill.state_dict["proj.weight"] is model.proj.weight
    assert decode.state_dict["proj.weight"] is model.proj.weight
    # The mutating program was functionalized (decompositions applied where needed).
    assert "cache" in decode.graph_signature.buffers_to_mutate.values()


def test_save_load_dedupes_and_restores_sharing(tmp_path):
    model = Decoder()
    ExternalTensorTrait("model", "proj.weight").set(model.proj.weight)
    fxb = _builder(model)
    deduped = fxb.save(tmp_path / "set.json")
    assert deduped >= 2  # proj.weight and proj.bias at least are shared by both programs
    descriptor = json.loads((tmp_path / "set.json").read_text())
    assert descriptor["format"] == "turbine-fx-programs"
    assert not list(tmp_path.glob("*.pt*"))  # no pickle files
    loaded = FxPrograms.load(tmp_path / "set.json")
    a, b = loaded.programs["prefill"], loaded.programs["decode"]
    assert a.state_dict["proj.weight"] is b.state_dict["proj.weight"]
    torch.testing.assert_close(a.state_dict["proj.weight"], model.proj.weight.detach())
    trait = ExternalTensorTrait.get(a.state_dict["proj.weight"])
    assert trait is not None and trait.external_name == "proj.weight"


def test_load_rejects_other_formats(tmp_path):
    (tmp_path / "x.json").write_text('{"format": "something-else"}')
    with pytest.raises(FxProgramsError, match="not a turbine FxPrograms descriptor"):
        FxPrograms.load(tmp_path / "x.json")


def test_load_with_a_missing_graph_file_or_field_is_an_fx_programs_error(tmp_path):
    _builder(Decoder()).save(tmp_path / "set.json")
    descriptor = json.loads((tmp_path / "set.json").read_text())
    (tmp_path / descriptor["programs"]["decode"]["file"]).unlink()
    with pytest.raises(FxProgramsError, match="cannot read the graph of program 'decode'"):
        FxPrograms.load(tmp_path / "set.json")
    descriptor = json.loads((tmp_path / "set.json").read_text())
    del descriptor["bindings"]
    (tmp_path / "set.json").write_text(json.dumps(descriptor))
    with pytest.raises(FxProgramsError, match=r"set.json: bindings: missing"):
        FxPrograms.load(tmp_path / "set.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(FxProgramsError, match="not a turbine FxPrograms descriptor"):
        FxPrograms.load(tmp_path / "list.json")


def test_saved_files_have_the_usual_mode_not_mkstemps_0600(tmp_path):
    mask = os.umask(0o022)
    try:
        _builder(Decoder()).save(tmp_path / "set.json")
    finally:
        os.umask(mask)
    files = sorted(tmp_path.iterdir())
    generation = json.loads((tmp_path / "set.json").read_text())["data_file"].split(".")[1]
    assert [f.name for f in files] == [
        f"set.{generation}.decode.ep.json",
        f"set.{generation}.prefill.ep.json",
        f"set.{generation}.tensors.safetensors",
        "set.json",
    ]  # no temporary files left behind
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == {f.name: 0o644 for f in files}


def test_a_save_that_cannot_complete_writes_no_file(tmp_path):
    programs = FxPrograms()
    programs.programs = dict(_builder(Decoder()).programs)
    programs.programs["../escape"] = programs.programs["prefill"]  # checked after the others
    with pytest.raises(FxProgramsError, match="cannot name a file"):
        programs.save(tmp_path / "set.json")
    assert list(tmp_path.iterdir()) == []


def test_duplicate_program_name_is_an_error():
    fxb = FxProgramsBuilder(Decoder())
    fxb.export_program(lambda m, x: m(x), args=(torch.randn(2, 4),), name="p")
    with pytest.raises(FxProgramsError, match="already exists"):
        fxb.export_program(lambda m, x: m(x), args=(torch.randn(2, 4),), name="p")


def test_two_entry_points_saved_loaded_and_exported_again(iree_device, tmp_path):
    torch.manual_seed(0)
    model = Decoder()
    eager = Decoder()
    eager.load_state_dict(model.state_dict())
    _builder(model).save(tmp_path / "set.json")
    loaded = FxPrograms.load(tmp_path / "set.json")

    b = Built()
    with b:
        for name, program in loaded.programs.items():
            import_exported_program(b.mb, program.target, symbol_name=name)
    asm = b.asm()
    # One set of globals for both entry points; the cache is mutable.
    assert asm.count("util.global private @__auto.proj.weight") == 1
    assert asm.count("util.global private mutable @__auto.cache") == 1
    assert "func.func @prefill(" in asm and "func.func @decode(" in asm

    vmfb = iree_device.compile(asm, extra_args=["--iree-input-type=torch"])
    module = iree_device.load(vmfb)
    x = torch.randn(5, 4)
    got = module.prefill(x.numpy()).to_host()
    torch.testing.assert_close(torch.from_numpy(got), eager(x), rtol=1e-5, atol=1e-5)
    for i in range(3):
        xi = torch.randn(1, 4)
        got = module.decode(xi.numpy(), torch.tensor([i]).numpy()).to_host()
        torch.testing.assert_close(
            torch.from_numpy(got), eager.decode(xi, torch.tensor([i])), rtol=1e-5, atol=1e-5
        )


_ = run_module


def test_arg_device_is_kept_through_save_and_load(tmp_path):
    from turbine_params import DeviceAffinity

    fxb = FxProgramsBuilder(Decoder())
    fxb.export_program(
        lambda m, x: m(x), args=(torch.randn(2, 4),), name="p", arg_device={0: DeviceAffinity(1)}
    )
    assert fxb.programs["p"].arg_device == {0: DeviceAffinity(1)}
    fxb.save(tmp_path / "s.json")
    loaded = FxPrograms.load(tmp_path / "s.json")
    assert loaded.arg_devices == {"p": {0: DeviceAffinity(1)}}
    assert loaded.programs["p"].arg_device == {0: DeviceAffinity(1)}


def test_export_program_decomposes_only_needed_nodes():
    class M(nn.Module):
        def forward(self, x):
            return torch.logsumexp(x, -1) + x.sum(-1)

    fxb = FxProgramsBuilder(M())
    program = fxb.export_program(lambda m, x: m(x), args=(torch.randn(3, 4),), name="p")
    targets = {n.target for n in program.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.logsumexp.default not in targets
    x = torch.randn(3, 4)
    torch.testing.assert_close(program.module()(x), M()(x))


def test_dynamic_shapes_for_a_later_argument_only():
    # Only the second argument is dynamic: the first still needs its (static) slot.
    fxb = FxProgramsBuilder(Decoder())
    batch = torch.export.Dim("batch", max=16)

    @fxb.export_program(
        args=(torch.randn(3), torch.randn(2, 4)),
        dynamic_shapes={"y": {0: batch}},
    )
    def f(m, x, y):
        return m.proj(y).sum(0) + x.sum()

    program = fxb.programs["f"]
    inputs = program.graph_signature.user_inputs
    shapes = [n.meta["val"].shape for n in program.graph.nodes if n.name in inputs]
    assert len(shapes) == 2
    assert str(shapes[0][0]) == "3"
    assert not str(shapes[1][0]).isdigit()  # symbolic batch


def _snapshot(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


class Wider(nn.Module):
    """Another set for the same path: other graphs, other weights."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 6)

    def forward(self, x):
        return self.proj(x).relu()


@pytest.mark.parametrize("fail_at", ["tensor data", "descriptor"])
def test_a_save_failing_midway_keeps_the_previous_set(tmp_path, monkeypatch, fail_at):
    """save() is atomic for the whole set: a failure after some files are written (the tensor
    data, or the descriptor that commits the set) leaves the previous set loadable and every
    file byte for byte as it was, with no new file beside it."""
    import turbine_fx._fx_programs as fxp

    path = tmp_path / "set.json"
    torch.manual_seed(0)
    old = Decoder()
    _builder(old).save(path)
    before = _snapshot(tmp_path)
    new = FxProgramsBuilder(Wider())
    new.export_program(lambda m, x: m(x), args=(torch.randn(2, 4),), name="prefill")

    if fail_at == "tensor data":

        def broken(*args, **kwargs):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(fxp, "_save_tensor_data", broken)
    else:
        real_dumps = json.dumps

        def broken(obj, *args, **kwargs):
            if isinstance(obj, dict) and obj.get("format") == "turbine-fx-programs":
                raise OSError(28, "No space left on device")
            return real_dumps(obj, *args, **kwargs)

        monkeypatch.setattr(fxp.json, "dumps", broken)
    with pytest.raises(OSError, match="No space left"):
        new.save(path)
    monkeypatch.undo()
    assert _snapshot(tmp_path) == before
    loaded = FxPrograms.load(path)
    assert list(loaded.programs) == ["prefill", "decode"]
    torch.testing.assert_close(
        loaded.programs["prefill"].state_dict["proj.weight"], old.proj.weight.detach()
    )
    # A save that completes replaces the set and removes the previous one's files.
    new.save(path)
    loaded = FxPrograms.load(path)
    assert list(loaded.programs) == ["prefill"]
    assert loaded.programs["prefill"].state_dict["proj.weight"].shape == (6, 4)
    descriptor = json.loads(path.read_text())
    assert descriptor["version"] == 1  # no shared storage: readable by earlier turbine-fx
    named = {descriptor["data_file"], *(p["file"] for p in descriptor["programs"].values())}
    assert {p.name for p in tmp_path.iterdir()} == {"set.json", *named}


class Aliased(nn.Module):
    """Two distinct state tensors over one storage: a buffer that is a row of the weight."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("row", self.w.detach()[1])
        self.register_buffer("other", torch.arange(4.0))

    def forward(self, x):
        return x @ self.w + self.row + self.other


def test_tensors_sharing_storage_still_share_it_after_load(tmp_path):
    model = Aliased()
    fxb = FxProgramsBuilder(model)
    fxb.export_program(lambda m, x: m(x), args=(torch.randn(2, 4),), name="main")
    fxb.save(tmp_path / "a.json")
    sd = FxPrograms.load(tmp_path / "a.json").programs["main"].state_dict
    w, row = sd["w"], sd["row"]
    assert isinstance(w, nn.Parameter) and not isinstance(row, nn.Parameter)
    torch.testing.assert_close(w, model.w.detach())
    torch.testing.assert_close(row, model.row)
    assert row.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
    assert row.storage_offset() == 4 and row.stride() == (1,)
    with torch.no_grad():
        w[1, 2] = 42.0
    assert row[2].item() == 42.0  # one storage, as in the saved model
    assert sd["other"].untyped_storage().data_ptr() != w.untyped_storage().data_ptr()
    # Such a set is version 2 (readers of 1 refuse it by version); a descriptor whose view does
    # not fit its stored storage is an FxProgramsError, not a crash or a read out of bounds.
    descriptor = json.loads((tmp_path / "a.json").read_text())
    assert descriptor["version"] == 2
    row_key = descriptor["bindings"]["main"]["state_dict"]["row"]
    descriptor["tensors"][row_key]["storage"]["offset"] = 14
    (tmp_path / "a.json").write_text(json.dumps(descriptor))
    with pytest.raises(FxProgramsError, match=r"tensor t\d+ .*does not fit in its storage"):
        FxPrograms.load(tmp_path / "a.json")


def test_a_tensor_safetensors_cannot_store_is_an_fx_programs_error(tmp_path):
    """complex128 has no safetensors dtype: the save says so (it was a bare KeyError from the
    safetensors package) and leaves nothing behind."""

    class C(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("z", torch.zeros(2, dtype=torch.complex128))

        def forward(self, x):
            return x + self.z.real

    fxb = FxProgramsBuilder(C())
    fxb.export_program(lambda m, x: m(x), args=(torch.randn(2, dtype=torch.float64),), name="main")
    with pytest.raises(FxProgramsError, match=r"dtype torch.complex128, which safetensors cannot"):
        fxb.save(tmp_path / "set.json")
    assert list(tmp_path.iterdir()) == []
