"""From ``turbine_aot.export`` to a callable in one call, with external weights, and bundles."""

from __future__ import annotations

import pytest
import torch

import turbine_aot
from turbine_aot import runtime as R

if not hasattr(turbine_aot, "export"):
    pytest.skip("turbine_aot.export is not available in this checkout yet", allow_module_level=True)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 8)
        self.register_buffer("scale", torch.full((8,), 0.5))

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x))) * self.scale


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from turbine_params import externalize_module_parameters, save_module_parameters

    torch.manual_seed(0)
    model = Mlp().eval()
    d = tmp_path_factory.mktemp("exp")
    externalize_module_parameters(model)
    save_module_parameters(d / "mlp.irpa", model)
    batch = torch.export.Dim("batch", max=64)
    x = torch.randn(4, 16)
    eo = turbine_aot.export(model, args=(x,), dynamic_shapes={"x": {0: batch}})
    return model, eo, d / "mlp.irpa", R.CompileCache(d / "cache")


def test_export_output_to_callable_with_external_weights(exported):
    model, eo, irpa, cache = exported
    m = R.load_module(eo, parameters=irpa, cache=cache)
    assert m.main.signature.inputs[0].shape == (None, 16)
    for rows in (1, 5):
        x = torch.randn(rows, 16)
        report = R.check_numerics(m.main, model, x)
        assert report.ok, str(report)
    # Second load of the same export is a cache hit.
    R.load_module(eo, parameters=irpa, cache=cache)
    assert cache.stats.hits >= 1
    if hasattr(eo, "load"):  # the ExportOutput one-call method, where present
        torch.testing.assert_close(eo.load(parameters=irpa, cache=cache).main(x), m.main(x))


def test_missing_weights_are_named(exported):
    _, eo, _, cache = exported
    with pytest.raises(R.TurbineRuntimeError, match=r"parameter"):
        R.load_module(eo, cache=cache)


def test_bundle_from_export_output(exported, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    model, eo, irpa, cache = exported
    b = R.save_bundle(tmp_path / "mlp", eo, parameters=irpa, cache=cache)
    sig = b.functions["main"]
    assert sig.inputs[0].shape == (None, 16) and sig.inputs[0].dtype == "f32"
    assert sig.outputs[0].shape == (None, 8)
    assert any(f.startswith("--iree-hal-target-device") for f in b.manifest["compile_flags"])
    x = torch.randn(3, 16)
    m = R.load_bundle(tmp_path / "mlp")
    torch.testing.assert_close(m.main(x), model(x), atol=1e-4, rtol=1e-4)
    exe = Path(sys.executable).parent / "iree-run-module"
    if exe.exists():
        out = subprocess.run(
            [str(exe), "--flagfile=iree-run-module.flags", "--function=main", "--input=2x16xf32=0"],
            cwd=b.path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert "2x8xf32=" in out.stdout


def test_one_way_from_an_export_to_a_loaded_module(exported, tmp_path, monkeypatch):
    """``ExportOutput.load`` / ``load_module(export_output)``: the flags are computed once (one
    read of the program's traits, one flag computation), the export compiles itself through the
    cache on the export side, and the runtime only loads the bytes it gets back."""
    import turbine_aot._export.output as output
    from turbine_aot._runtime import loading

    model, eo, irpa, _ = exported
    calls = {"flags": 0, "traits": 0}
    real_flags, real_traits = output.compile_flags_for, output.program_traits

    def count(name, fn):
        def counted(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return counted

    monkeypatch.setattr(output, "compile_flags_for", count("flags", real_flags))
    monkeypatch.setattr(output, "program_traits", count("traits", real_traits))
    cache = R.CompileCache(tmp_path / "cache")
    m = eo.load(parameters=irpa, cache=cache)  # a miss: compiled once
    assert calls == {"flags": 1, "traits": 1}
    m2 = R.load_module(eo, parameters=irpa, cache=cache)  # a hit: flags computed to find it
    assert calls == {"flags": 2, "traits": 2} and cache.stats.hits == 1
    x = torch.randn(3, 16)
    torch.testing.assert_close(m.main(x), model(x), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(m2.main(x), m.main(x))
    # The runtime has no compiler entry point of its own; an export is a LoadableExport.
    assert not hasattr(loading, "compile_export_output")
    assert isinstance(eo, loading.LoadableExport)


def test_a_bundle_records_the_flags_its_module_was_built_with(exported, tmp_path):
    """The manifest's compile flags are read from the module's own record (``turbine.compile``),
    not computed again: the same on a compile and on a cache hit, and equal to what
    ``ExportOutput.compile`` used."""
    _, eo, irpa, _ = exported
    cache = R.CompileCache(tmp_path / "cache")
    first = R.save_bundle(tmp_path / "a", eo, parameters=irpa, cache=cache)
    again = R.save_bundle(tmp_path / "b", eo, parameters=irpa, cache=cache)
    assert cache.stats.hits == 1
    assert first.manifest["compile_flags"] == again.manifest["compile_flags"]
    eo.compile(save_to=None, target_device="llvm-cpu")
    assert first.manifest["compile_flags"] == eo._last_compile_flags


def _reentries(fn) -> set[tuple[str, str]]:
    """Calls ``fn`` and returns each (subpackage, function) of turbine_aot that was entered again
    while a call from it into another subpackage was still under way (A -> B -> A on the stack):
    a return to a module already left."""
    import sys

    def sub(frame) -> str | None:
        mod = frame.f_globals.get("__name__", "")
        return ".".join(mod.split(".")[:2]) if mod.startswith("turbine_aot.") else None

    found: set[tuple[str, str]] = set()

    def profile(frame, event, arg):
        me = sub(frame) if event == "call" else None
        if me is None:
            return
        chain: list[str] = []
        f = frame.f_back
        while f is not None:
            s = sub(f)
            if s and (not chain or chain[-1] != s):
                chain.append(s)
            f = f.f_back
        if chain and chain[0] != me and me in chain[1:]:
            found.add((me, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return found


def test_load_bundle_and_export_load_enter_each_subpackage_once(exported, tmp_path):
    """Issue 24: loading a bundle walked _bundle -> _runtime -> _signatures -> _compiler ->
    _signatures -> _runtime -> ... (returns to modules already left); ExportOutput.load went
    export -> runtime -> compile cache -> back into the export (15 re-entries). Now a bundle
    loads without re-entering any subpackage, and an export's load re-enters only through the
    compile-with-fallback rule, which takes the export's compile as a function."""
    _, eo, irpa, _ = exported
    R.save_bundle(tmp_path / "b", eo, parameters=irpa, cache=False)
    assert _reentries(lambda: R.load_bundle(tmp_path / "b")) == set()
    through_fallback = {e for e in _reentries(lambda: eo.load(parameters=irpa, cache=False))}
    assert {s for s, _ in through_fallback} <= {"turbine_aot._export", "turbine_aot._compiler"}
    assert ("turbine_aot._export", "<lambda>") in through_fallback  # the callback itself
    assert not {f for s, f in through_fallback if s == "turbine_aot._export"} - {"<lambda>"}
