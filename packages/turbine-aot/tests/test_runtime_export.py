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
