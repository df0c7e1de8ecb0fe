"""Ordinary mistakes on the turbine-aot and turbine-params command lines: one line
``<prog>: error: ...``, exit status 2, no traceback (``--debug`` shows it); wrong things that
used to be accepted silently are refused with what to do."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from turbine_aot import runtime as R
from turbine_aot._cli.main import main

LINEAR = "import torch\n\nmodel = torch.nn.Linear(4, 3)\n"
SQUARE = """
func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %r = arith.mulf %x, %x : tensor<2x3xf32>
  return %r : tensor<2x3xf32>
}
"""


def _one_error(capsys, pattern: str, prog: str = "turbine-aot") -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith(f"{prog}: error:")]
    assert len(errors) == 1, err
    assert re.search(pattern, errors[0]), errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def square_vmfb(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sq") / "sq.vmfb"
    path.write_bytes(R.compile_mlir(SQUARE, R.device_compile_flags(["local-task"]), cache=False))
    return path


# ----------------------------------------------------------------------------- model sources
def test_model_file_that_raises_on_import(tmp_path, capsys):
    src = tmp_path / "raises.py"
    src.write_text("import torch\nraise ValueError('no weights here')\n")
    assert main(["export", str(src), "-i", "2x4xf32"]) == 2
    _one_error(
        capsys, rf"{re.escape(str(src))}:2: importing .*raises.py raised ValueError: no weights"
    )


def test_model_file_with_a_syntax_error_names_file_and_line(tmp_path, capsys):
    src = tmp_path / "syntax.py"
    src.write_text("import torch\n\nmodel = torch.nn.Linear(4, 3\nx = 1\n")
    assert main(["export", str(src), "-i", "2x4xf32"]) == 2
    _one_error(capsys, rf"{re.escape(str(src))}:3: syntax error while importing .*never closed")


def test_factory_that_raises(tmp_path, capsys):
    src = tmp_path / "factory.py"
    src.write_text("def make():\n    raise RuntimeError('needs a GPU')\n")
    assert main(["export", f"{src}:make", "-i", "2x4xf32"]) == 2
    _one_error(capsys, r"factory.py:2: calling .*factory.py:make\(\) raised RuntimeError: needs")


def test_module_path_that_raises_on_import(tmp_path, capsys, monkeypatch):
    (tmp_path / "badpkg_h16b.py").write_text("x = 1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["export", "badpkg_h16b:model", "-i", "2x4xf32"]) == 2
    _one_error(capsys, r"badpkg_h16b.py:1: importing badpkg_h16b raised ZeroDivisionError")


# ----------------------------------------------------------------------------- inputs
def test_input_too_large_to_allocate(tmp_path, capsys):
    src = tmp_path / "lin.py"
    src.write_text(LINEAR)
    assert main(["export", str(src), "-i", "99999999999x99999xf32"]) == 2
    _one_error(
        capsys, r"input '99999999999x99999xf32' needs 39999599999600004 bytes .*smaller shape"
    )


def test_integer_input_for_a_float_model_says_which_dtype(tmp_path, capsys):
    """torch.export accepts an i64 input into a float Linear (its fake kernels do not check)."""
    src = tmp_path / "lin.py"
    src.write_text(LINEAR)
    out = tmp_path / "lin.mlir"
    assert main(["export", str(src), "-i", "2x4xi64", "-o", str(out)]) == 2
    _one_error(
        capsys,
        r"input 0 \(2x4xi64\) is int64 but the model uses it in matmul with float32 tensors: "
        r"it expects float32 there; give --input with that dtype \(e\.g\. 2x4xf32\)",
    )
    assert not out.exists()


_EMBED = textwrap.dedent(
    """
    import torch

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, ids, scale):
            return self.lin(self.emb(ids)) * scale.float()

    model = Embed()
    """
)


def test_integer_inputs_a_model_uses_as_integers_are_fine(tmp_path, capsys):
    src = tmp_path / "embed.py"
    src.write_text(_EMBED)
    out = tmp_path / "embed.mlir"
    assert main(["export", str(src), "-i", "1x5xi64", "-i", "1xi32", "-o", str(out)]) == 0
    assert "si64" in out.read_text()


def test_shape_error_is_one_line_without_torch_s_logged_traceback(tmp_path):
    """torch logs the failing fake-tensor call with ~20 lines of traceback before raising;
    the CLI mutes that, and names the cause; --debug shows everything."""
    src = tmp_path / "lin.py"
    src.write_text(LINEAR)
    cmd = [sys.executable, "-m", "turbine_aot", "export", str(src), "-i", "2x5xf32"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    noise = [ln for ln in lines if not ln.startswith(("  done ", "turbine-aot: error:"))]
    assert noise == [], proc.stderr
    assert lines[-1].startswith("turbine-aot: error: torch.export failed: ")
    assert "must have same reduction dim, but got [2, 5] X [4, 3]" in lines[-1]
    debug = subprocess.run(
        [*cmd[:3], "--debug", *cmd[3:]], capture_output=True, text=True, timeout=600, env=env
    )
    assert debug.returncode != 0 and "Traceback" in debug.stderr


# ----------------------------------------------------------------------------- demo
@pytest.mark.parametrize(
    "argv, pattern",
    [
        (["--repeat", "-1"], r"--repeat -1: give a number of timed calls, at least 1"),
        (["--repeat", "0"], r"--repeat 0: give a number of timed calls, at least 1"),
        (["--threads", "0"], r"--threads 0: give a number of CPU threads, at least 1"),
    ],
)
def test_demo_bad_numbers(argv, pattern, capsys):
    assert main(["demo", *argv]) == 2
    _one_error(capsys, pattern)


def test_demo_workdir_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("")
    assert main(["demo", "--workdir", str(f)]) == 2
    _one_error(capsys, r"--workdir '.*file' is a file, not a directory")


# ----------------------------------------------------------------------------- bundle / run
def test_bundle_refuses_random_bytes_as_parameters(tmp_path, capsys, square_vmfb):
    junk = tmp_path / "w.irpa"
    junk.write_bytes(os.urandom(4096))
    out = tmp_path / "b"
    assert main(["bundle", str(square_vmfb), "-o", str(out), "-p", str(junk)]) == 2
    _one_error(
        capsys,
        r"parameter file '.*w.irpa' \(scope 'model'\) is not a readable parameter archive: "
        r"wrong magic",
    )
    assert not out.exists()
    with pytest.raises(R.BundleError, match="not a readable parameter archive"):
        R.save_bundle(out, square_vmfb, parameters=junk)
    gguf = tmp_path / "w.gguf"
    gguf.write_bytes(b"nope" + bytes(60))
    with pytest.raises(R.BundleError, match=r"not a GGUF file \(it starts with b'nope'"):
        R.save_bundle(out, square_vmfb, parameters=gguf)


def test_run_refuses_random_bytes_as_parameters(tmp_path, capsys, square_vmfb):
    junk = tmp_path / "w.safetensors"
    junk.write_bytes(os.urandom(4096))
    assert main(["run", str(square_vmfb), "-p", str(junk)]) == 2
    _one_error(capsys, r"'.*w.safetensors' \(scope 'model'\) is not a readable parameter archive")


def test_run_verify_and_ignore_versions(tmp_path, capsys, square_vmfb):
    assert main(["--json", "run", "--check-in-child", str(square_vmfb)]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["function"] == "main"
    R.save_bundle(tmp_path / "b", square_vmfb)
    man_path = tmp_path / "b" / "manifest.json"
    man = json.loads(man_path.read_text())
    man["versions"]["iree_runtime"] = "2.0.0"
    man_path.write_text(json.dumps(man))
    assert main(["run", str(tmp_path / "b")]) == 2
    _one_error(capsys, r"built with IREE 2\.0\.0 but this runtime is IREE .*--ignore-versions")
    assert main(["run", "--ignore-versions", "--verify", str(tmp_path / "b")]) == 0
    assert main(["run", "--ignore-versions", "--check-in-child", str(tmp_path / "b")]) == 0


def test_run_verify_on_a_vmfb_is_the_former_check_in_child(capsys, square_vmfb, monkeypatch):
    """``run --verify m.vmfb`` (its meaning before --check-in-child) still checks in a child,
    and says it is now --check-in-child."""
    from turbine_aot._cli import commands

    seen = {}
    real = commands.load_module

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(commands, "load_module", spy)
    assert main(["run", "--verify", str(square_vmfb)]) == 0
    assert seen["check_in_child"] is True
    assert "--verify on a .vmfb is now --check-in-child" in capsys.readouterr().err


# ----------------------------------------------------------------------------- turbine-params
@pytest.fixture
def irpa(tmp_path) -> Path:
    import numpy as np

    from turbine_params import ParameterArchiveBuilder

    b = ParameterArchiveBuilder()
    b.add_tensor("w", np.ones((2, 2), np.float32))
    return b.save(tmp_path / "a.irpa")


def test_params_convert_to_an_unknown_suffix_is_refused(irpa, tmp_path, capsys):
    from turbine_params._cli import main as params_main

    assert params_main(["convert", str(irpa), str(tmp_path / "o.xyz")]) == 2
    _one_error(
        capsys,
        r"output '.*o.xyz' does not end with .irpa or .safetensors; .* e\.g\. '.*o.irpa'",
        prog="turbine-params",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.irpa"]


def test_params_strip_into_a_directory_is_refused(irpa, tmp_path, capsys):
    from turbine_params._cli import main as params_main

    d = tmp_path / "out"
    d.mkdir()
    assert params_main(["strip", str(irpa), str(d)]) == 2
    _one_error(
        capsys,
        r"output '.*out' is a directory; give a file name, e.g. '.*out/a.irpa'",
        "turbine-params",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.irpa", "out"]
    assert params_main(["strip", str(irpa), str(d / "a.irpa")]) == 0
    with pytest.raises(Exception, match="is a directory"):
        params_main(["--debug", "strip", str(irpa), str(d)])
