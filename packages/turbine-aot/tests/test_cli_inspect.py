"""turbine-aot inspect (.vmfb, bundle directory and archive, .mlir), --version, run's value
syntax and checks, --dynamic ARG:DIM:MIN:MAX, formatted text output and help on every option."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from turbine_aot._cli.inputs import CliError, _make_input
from turbine_aot._cli.main import main
from turbine_aot._cli.parser import build_parser as _parser

MODEL_SRC = textwrap.dedent(
    """
    import torch

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x):
            return {"y": torch.tanh(self.lin(x)), "total": x.sum()}

    model = Small().eval()
    """
)

SQUARE_MLIR = """
func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %r = arith.mulf %x, %x : tensor<2x3xf32>
  return %r : tensor<2x3xf32>
}
"""


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """small.mlir (external weights, dim 0 dynamic in 2..16), small.vmfb, a bundle directory
    and a bundle archive, all made with the CLI."""
    d = tmp_path_factory.mktemp("cli")
    src = d / "small.py"
    src.write_text(MODEL_SRC)
    mlir, irpa, vmfb = d / "small.mlir", d / "small.irpa", d / "small.vmfb"
    argv = ["export", str(src), "-i", "3x8xf32", "--dynamic", "0:0:2:16"]
    assert main([*argv, "--external-params", str(irpa), "-o", str(mlir)]) == 0
    assert main(["compile", str(mlir), "-o", str(vmfb), "--input-type", "torch"]) == 0
    assert main(["bundle", str(vmfb), "-o", str(d / "b"), "-p", f"model={irpa}"]) == 0
    assert main(["bundle", str(vmfb), "-o", str(d / "b.tar.gz"), "-p", f"model={irpa}"]) == 0
    return {"dir": d, "src": src, "mlir": mlir, "irpa": irpa, "vmfb": vmfb}


@pytest.mark.parametrize("what", ["mlir", "vmfb", "bundle", "archive"])
def test_inspect_json(built, what, capsys):
    path = {
        "mlir": built["mlir"],
        "vmfb": built["vmfb"],
        "bundle": built["dir"] / "b",
        "archive": built["dir"] / "b.tar.gz",
    }[what]
    capsys.readouterr()
    assert main(["--json", "inspect", str(path)]) == 0
    report = _json(capsys)
    assert report["kind"] == {"archive": "bundle"}.get(what, what)
    main_fn = report["functions"]["main"]
    assert main_fn["inputs"] == [{"shape": [None, 8], "dtype": "f32"}]
    assert [o["shape"] for o in main_fn["outputs"]] == [[None, 4], []]
    call = main_fn["call"]
    assert call["arg_names"] == ["x"]
    assert list(call["dims"].values()) == [{"min": 2, "max": 16}]
    assert [r["path"] for r in call["results"]] == ["['y']", "['total']"]
    params = {p["key"]: p for p in report["parameters"]["model"]}
    assert params["lin.weight"]["bytes"] == 4 * 8 * 4 and params["lin.bias"]["bytes"] == 16
    assert params["lin.weight"]["type"] == "tensor<4x8xf32>"
    if what == "mlir":
        assert report["compile_flags"] is None
    else:
        assert "--iree-hal-target-device=local" in report["compile_flags"]
        assert report["versions"]["iree_compiler"].startswith("3.13")
    if what in ("bundle", "archive"):
        assert report["devices"] == ["local-task"]
        assert report["parameter_files"]["model"][0]["path"] == "params/model.irpa"


def test_inspect_text(built, capsys):
    capsys.readouterr()
    assert main(["inspect", str(built["vmfb"])]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    sig = next(line.strip() for line in lines if line.strip().startswith("main("))
    assert re.fullmatch(
        r"main\(x: tensor<s\d+x8xf32>\) -> \{'y': tensor<\?x4xf32>, 'total': tensor<f32>\}", sig
    ), sig
    assert any(re.fullmatch(r"\s+dynamic s\d+: 2\.\.16", line) for line in lines)
    assert any(re.fullmatch(r"\s+lin\.weight\s+tensor<4x8xf32>\s+128 B", line) for line in lines)
    assert "  --iree-hal-target-device=local" in lines
    assert any(line.startswith("built with: iree_compiler 3.13") for line in lines)


def test_inspect_errors(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope.vmfb")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["inspect", str(tmp_path / "notes.txt")]) == 2
    assert "is not a .vmfb, a bundle" in capsys.readouterr().err


def test_run_checks_inputs_like_a_call(built, capsys):
    irpa = built["irpa"]
    capsys.readouterr()
    rc = main(["run", str(built["vmfb"]), "-i", "20x8xf32", "-p", f"model={irpa}"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "module.main(): argument x dimension 0 is 20, outside the range 2..16" in err
    rc = main(["run", str(built["vmfb"]), "-i", "3x8xf16", "-p", f"model={irpa}"])
    assert rc == 2
    assert "argument x expects dtype float32" in capsys.readouterr().err
    rc = main(["--json", "run", str(built["vmfb"]), "-i", "3x8xf32=0.5", "-p", f"model={irpa}"])
    assert rc == 0
    res = _json(capsys)
    assert res["outputs"] == [
        {"name": "['y']", "shape": [3, 4], "dtype": "float32"},
        {"name": "['total']", "shape": [], "dtype": "float32"},
    ]
    # The eager check rebuilds the eager call from the flat inputs and compares the dict.
    rc = main(
        [
            "--json",
            "run",
            str(built["vmfb"]),
            "-i",
            "5x8xf32",
            "-p",
            f"model={irpa}",
            "--check-eager",
            f"{built['src']}:model",
        ]
    )
    res = _json(capsys)
    assert rc == 0 and res["ok"] is True and len(res["numerics"]["outputs"]) == 2


def test_text_output_is_formatted(built, capsys):
    """No Python reprs (lists, dicts) in the human-readable output."""
    irpa = built["irpa"]
    capsys.readouterr()
    out_vmfb = built["dir"] / "again.vmfb"
    assert main(["compile", str(built["mlir"]), "-o", str(out_vmfb), "--input-type", "torch"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == "compile flags:" and "['--" not in out
    rc = main(
        [
            "run",
            str(built["vmfb"]),
            "-i",
            "3x8xf32",
            "-p",
            f"model={irpa}",
            "--check-eager",
            f"{built['src']}:model",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "numerics:" not in out and "{'" not in out and "'ok'" not in out
    assert "  x  float32 [3, 8]" in out.splitlines()
    assert "result: OK, matches eager" in out


def test_input_value_syntax(tmp_path, capsys):
    t = _make_input("2x3xf32=1,2,3,4,5,6", None)
    assert t.dtype == torch.float32 and t.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert _make_input("1x4xi64=1 2 3 4", None).tolist() == [[1, 2, 3, 4]]
    assert torch.equal(_make_input("2x2xf16=7", None), torch.full((2, 2), 7.0, dtype=torch.half))
    assert _make_input("3xi1=1,0,true", None).tolist() == [True, False, True]
    assert _make_input("i32=-3", None).tolist() == -3
    with pytest.raises(CliError, match=r"3 values for shape \[2, 2\] \(4 elements\); give 4"):
        _make_input("2x2xf32=1,2,3", None)
    with pytest.raises(CliError, match=r"'x' is not a int64 value"):
        _make_input("2xi64=1,x", None)
    src = tmp_path / "sq.mlir"
    src.write_text(SQUARE_MLIR)
    vmfb = tmp_path / "sq.vmfb"
    assert main(["compile", str(src), "-o", str(vmfb), "--no-cache"]) == 0
    out = tmp_path / "out"
    assert main(["run", str(vmfb), "-i", "2x3xf32=1,2,3,4,5,6", "--output-dir", str(out)]) == 0
    np.testing.assert_allclose(np.load(out / "main_0.npy"), [[1, 4, 9], [16, 25, 36]])
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    assert main(["run", str(vmfb), "-i", f"@{tmp_path / 'x.npy'}", "--output-dir", str(out)]) == 0
    np.testing.assert_allclose(np.load(out / "main_0.npy"), np.ones((2, 3)))
    capsys.readouterr()
    assert main(["run", str(vmfb), "-i", "2x4xf32=0"]) == 2
    assert "argument 0 expects dimension 1 to be 3" in capsys.readouterr().err


@pytest.mark.parametrize(
    "spec, message",
    [
        ("0", "expected ARG:DIM, ARG:DIM:MAX or ARG:DIM:MIN:MAX"),
        ("1:0", "with ARG < 1"),
        ("0:2", "input 0 has 2 dimension"),
        ("0:0:8:4", "MIN 8 is above MAX 4"),
        ("0:0:4:16", "has size 3 in dimension 0, outside the range"),
    ],
)
def test_dynamic_option_errors(tmp_path, spec, message, capsys):
    src = tmp_path / "small.py"
    src.write_text(MODEL_SRC)
    rc = main(["export", str(src), "-i", "3x8xf32", "--dynamic", spec, "-o", str(tmp_path / "m")])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("turbine-aot ")
    names = {line.split()[0] for line in lines[1:]}
    assert {"turbine-params", "torch", "iree-base-compiler", "iree-base-runtime"} <= names


def test_turbine_params_version_needs_neither_torch_nor_iree():
    code = textwrap.dedent(
        """
        import sys
        from turbine_params import _versions
        real = _versions.package_version
        # torch and IREE missing: metadata says so, and importing them fails.
        _versions.package_version = lambda n: None if n in ("torch", "iree-base-runtime") else real(n)
        sys.modules["torch"] = None
        sys.modules["iree"] = None
        from turbine_params._cli import main
        main(["--version"])
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("turbine-params ")
    assert any(re.fullmatch(r"\s+torch\s+not installed", line) for line in lines)
    assert any(re.fullmatch(r"\s+iree-base-runtime\s+not installed", line) for line in lines)
    assert any(re.fullmatch(r"\s+numpy\s+\d+\.\d+.*", line) for line in lines)


def _all_actions(parser: argparse.ArgumentParser, path: str = "turbine-aot"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _all_actions(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            yield path, action


def test_every_option_has_help():
    from turbine_params._cli import _parser as params_parser

    missing = [
        f"{path} {'/'.join(a.option_strings) or a.dest}"
        for parser in (_parser(), params_parser())
        for path, a in _all_actions(parser)
        if a.option_strings and not a.help
    ]
    assert not missing, f"options without help: {missing}"
    # Including the ones the issue named.
    helps = {(path, opt): a.help for path, a in _all_actions(_parser()) for opt in a.option_strings}
    for key in [
        ("turbine-aot export", "--function-name"),
        ("turbine-aot export", "--seed"),
        ("turbine-aot compile", "--cache-dir"),
        ("turbine-aot run", "--json"),
        ("turbine-aot run", "--debug"),
    ]:
        assert helps[key]
