"""The turbine-aot CLI: each subcommand end to end, and its error paths."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import turbine_aot
from turbine_aot._cli.inputs import CliError, parse_input_spec
from turbine_aot._cli.main import main

needs_export = pytest.mark.skipif(
    not hasattr(turbine_aot, "export"), reason="turbine_aot.export is not in this checkout yet"
)

MODEL_SRC = textwrap.dedent(
    """
    import torch

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x):
            return torch.tanh(self.lin(x))

    model = Small().eval()
    """
)

MLIR = """
func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %r = arith.mulf %x, %x : tensor<2x3xf32>
  return %r : tensor<2x3xf32>
}
"""


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_parse_input_spec():
    assert parse_input_spec("2x8xf32") == ((2, 8), torch.float32)
    assert parse_input_spec("1x128xi64") == ((1, 128), torch.int64)
    assert parse_input_spec("bf16") == ((), torch.bfloat16)
    for bad in ("2x8", "2xx8xf32", "axbxf32", "2x8xfloat99", ""):
        with pytest.raises(CliError):
            parse_input_spec(bad)


def test_compile_run_bundle_from_mlir(tmp_path, capsys):
    src = tmp_path / "sq.mlir"
    src.write_text(MLIR)
    vmfb = tmp_path / "sq.vmfb"
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert main(["--json", "compile", str(src), "-o", str(vmfb), "-d", "local-task", *cache]) == 0
    out = _json(capsys)
    assert out["vmfb"] == str(vmfb) and vmfb.stat().st_size == out["bytes"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    outdir = tmp_path / "out"
    rc = main(["run", str(vmfb), "-i", str(tmp_path / "x.npy"), "--output-dir", str(outdir)])
    assert rc == 0
    np.testing.assert_allclose(np.load(outdir / "main_0.npy"), x * x)
    # Generated inputs from the signature when none are given.
    assert main(["--json", "run", str(vmfb)]) == 0
    capsys.readouterr()
    assert main(["--json", "bundle", str(src), "-o", str(tmp_path / "b")]) == 0
    assert _json(capsys)["functions"] == ["main"]
    rc = main(
        ["run", str(tmp_path / "b"), "-i", str(tmp_path / "x.npy"), "--output-dir", str(outdir)]
    )
    assert rc == 0
    np.testing.assert_allclose(np.load(outdir / "main_0.npy"), x * x)


@needs_export
def test_export_compile_run_check_eager(tmp_path, capsys):
    src = tmp_path / "small.py"
    src.write_text(MODEL_SRC)
    mlir, irpa = tmp_path / "small.mlir", tmp_path / "small.irpa"
    rc = main(
        [
            "--json",
            "export",
            str(src),
            "-i",
            "3x8xf32",
            "--dynamic",
            "0:0:16",
            "--external-params",
            str(irpa),
            "-o",
            str(mlir),
        ]
    )
    assert rc == 0, capsys.readouterr()
    assert irpa.is_file() and "#flow.parameter.named" in mlir.read_text()
    capsys.readouterr()
    vmfb = tmp_path / "small.vmfb"
    assert main(["compile", str(mlir), "-o", str(vmfb), "--input-type", "torch", "--no-cache"]) == 0
    capsys.readouterr()
    rc = main(
        [
            "--json",
            "run",
            str(vmfb),
            "-i",
            "5x8xf32",
            "-p",
            f"model={irpa}",
            "--check-eager",
            f"{src}:model",
        ]
    )
    res = _json(capsys)
    assert rc == 0 and res["ok"] is True
    assert res["outputs"] == [{"name": "result", "shape": [5, 4], "dtype": "float32"}]
    assert res["numerics"]["outputs"][0]["max_abs_error"] < 1e-4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["compile", "missing.mlir"], "input file 'missing.mlir' does not exist"),
        (["run", "missing.vmfb"], "module 'missing.vmfb' does not exist"),
        (["export", "nope.py", "-i", "2x2xf32"], "source file 'nope.py' does not exist"),
        (["bundle", "missing.vmfb", "-o", "x"], "does not exist"),
    ],
)
def test_missing_files_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("turbine-aot: error:") and message in err
    assert len(err.splitlines()) == 1


def test_bad_shape_and_unknown_device_exit_2(tmp_path, capsys):
    src = tmp_path / "sq.mlir"
    src.write_text(MLIR)
    assert main(["compile", str(src), "-d", "tpu"]) == 2
    assert "unknown device 'tpu'" in capsys.readouterr().err
    vmfb = tmp_path / "sq.vmfb"
    assert main(["compile", str(src), "-o", str(vmfb), "--no-cache"]) == 0
    capsys.readouterr()
    assert main(["run", str(vmfb), "-i", "2xx3xf32"]) == 2
    assert "bad shape string '2xx3xf32'" in capsys.readouterr().err
    assert main(["run", str(vmfb), "-i", "4x4xf32"]) == 2  # wrong shape for the function
    assert "argument 0 expects dimension 0 to be 2" in capsys.readouterr().err
    assert main(["run", str(vmfb), "-f", "nope"]) == 2
    assert "no function 'nope'" in capsys.readouterr().err
    assert main(["--json", "run", str(vmfb), "-d", "tpu"]) == 2
    assert _json(capsys) == {
        "ok": False,
        "error": "unknown device 'tpu'; available IREE drivers: "
        + ", ".join(__import__("iree.runtime").runtime.query_available_drivers()),
    }


def test_compile_error_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.mlir"
    bad.write_text("func.func @f() -> i32 { return %nope : i32 }")
    assert main(["compile", str(bad), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("turbine-aot: error: iree-compile failed: ") and "undeclared SSA" in err
    assert len(err.splitlines()) == 1


def test_subprocess_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "turbine_aot", "run", str(tmp_path / "none.vmfb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        == f"turbine-aot: error: module '{tmp_path / 'none.vmfb'}' does not exist"
    )


@needs_export
def test_demo_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TURBINE_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["--json", "demo", "--repeat", "2", "--workdir", str(tmp_path / "w")]) == 0
    res = _json(capsys)
    assert res["ok"] is True and res["numerics"]["outputs"][0]["shape"] == [1, 32, 512]
    assert set(res["timings"]) >= {"export", "compile", "load", "run + check"}
    assert res["latency_ms"]["iree"] > 0 and res["latency_ms"]["eager"] > 0
    assert (tmp_path / "w" / "tiny_gpt.irpa").is_file()
    assert res["compile_cache_hit"] is False  # a fresh cache (hits: test_runtime_export)


CM_SRC = textwrap.dedent(
    """
    import torch
    from turbine_aot import CompiledModule
    from turbine_aot.support.procedural import AbstractTensor

    class Doubler(CompiledModule):
        def run(self, x=AbstractTensor(2, 3)):
            return x
    """
)


@needs_export
def test_export_compiled_module_then_run(tmp_path, capsys):
    src = tmp_path / "cm.py"
    src.write_text(CM_SRC)
    mlir = tmp_path / "cm.mlir"
    rc = main(["--json", "export", f"{src}:Doubler", "-o", str(mlir)])
    assert rc == 0, capsys.readouterr()
    assert "@run" in mlir.read_text()
    capsys.readouterr()
    vmfb = tmp_path / "cm.vmfb"
    assert main(["compile", str(mlir), "-o", str(vmfb), "--no-cache"]) == 0
    capsys.readouterr()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    rc = main(
        [
            "run",
            str(vmfb),
            "-f",
            "run",
            "-i",
            str(tmp_path / "x.npy"),
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert rc == 0
    np.testing.assert_array_equal(np.load(tmp_path / "run_0.npy"), x)


def test_compile_output_has_the_usual_mode(tmp_path):
    """`turbine-aot compile -o` writes like any tool (0666 & ~umask), not mkstemp's 0600."""
    import os

    src = tmp_path / "sq.mlir"
    src.write_text(MLIR)
    vmfb = tmp_path / "out" / "sq.vmfb"
    mask = os.umask(0o022)
    os.umask(mask)
    assert main(["compile", str(src), "-o", str(vmfb), "--no-cache"]) == 0
    assert vmfb.stat().st_mode & 0o777 == 0o666 & ~mask
    assert sorted(p.name for p in vmfb.parent.iterdir()) == ["sq.vmfb"]  # no temp file left


PEEL = "--iree-llvmcpu-vector-pproc-strategy=peel"
SPLIT_K = "--iree-dispatch-creation-split-matmul-reduction=32"


def test_compile_applies_the_program_dependent_defaults(tmp_path, capsys, monkeypatch):
    """Like ExportOutput.compile: peeling for dynamic programs on CPU (on an AVX-512 host;
    without AVX-512 every host build peels), split-K for static fp32 programs on CUDA (compiled
    here, no GPU needed)."""
    from turbine_aot._compiler import flags

    monkeypatch.setattr(flags, "cpu_flags", lambda: {"avx2", "fma", "avx512f"})
    static = tmp_path / "static.mlir"
    static.write_text(MLIR)
    dynamic = tmp_path / "dynamic.mlir"
    dynamic.write_text(MLIR.replace("tensor<2x3xf32>", "tensor<?x3xf32>"))
    results = {}
    for name, src, device in (
        ("static-cpu", static, "local-task"),
        ("dynamic-cpu", dynamic, "local-task"),
        ("static-cuda", static, "cuda"),
        ("dynamic-cuda", dynamic, "cuda"),
    ):
        out = tmp_path / f"{name}.vmfb"
        assert (
            main(["--json", "compile", str(src), "-d", device, "-o", str(out), "--no-cache"]) == 0
        )
        results[name] = _json(capsys)["flags"]
        assert out.stat().st_size > 0
    assert PEEL in results["dynamic-cpu"] and PEEL not in results["static-cpu"]
    assert SPLIT_K in results["static-cuda"] and SPLIT_K not in results["dynamic-cuda"]


def test_compile_refuses_fp16_for_the_default_vulkan_target(tmp_path, capsys):
    src = tmp_path / "half.mlir"
    src.write_text(MLIR.replace("f32", "f16"))
    out = tmp_path / "half.vmfb"
    assert main(["compile", str(src), "-d", "vulkan", "-o", str(out), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("turbine-aot: error: this program computes in float16")
    assert "--iree-vulkan-target=" in err and len(err.splitlines()) == 1
    assert not out.exists()
    flag = "--flag=--iree-vulkan-target=valhall4"
    assert main(["compile", str(src), "-d", "vulkan", flag, "-o", str(out), "--no-cache"]) == 0
    assert out.stat().st_size > 0


def test_run_help_says_what_run_without_input_does(capsys, tmp_path):
    """Issue 23: `run` without -i calls a static function on random values of its signature,
    prints that signature and exits 0; `run --help` says so (it did not)."""
    with pytest.raises(SystemExit) as e:
        main(["run", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "Without --input, a function whose arguments all have static shapes is called once" in text
    )
    assert "which prints its signature and exits 0" in text
    assert "a function with dynamic dimensions then asks for --input" in text
    # ... and that is what it does.
    src = tmp_path / "sq.mlir"
    src.write_text(MLIR)
    vmfb = tmp_path / "sq.vmfb"
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert main(["compile", str(src), "-o", str(vmfb), "-d", "local-task", *cache]) == 0
    capsys.readouterr()
    assert main(["run", str(vmfb)]) == 0
    out = capsys.readouterr().out
    assert "function: main" in out and "inputs:" in out and "outputs:" in out
    assert "float32 [2, 3]" in out
