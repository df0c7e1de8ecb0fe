"""Export errors keep what torch said: its whole message (suggested fixes included), a hint only
where it applies, the docs link; the CLI words them with its own options."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from turbine_aot import ExportError, export
from turbine_aot._cli.main import main
from turbine_aot._export.diagnosis import DOCS_EXPORT_ERRORS

ROOT = Path(__file__).resolve().parents[3]


class Reshape4(nn.Module):
    """Fixes dimension 0 to 4: it cannot be dynamic."""

    def forward(self, x):
        return x.reshape(4, 8) * 2


@torch._dynamo.disable
def _untraceable(x):
    return x * 2


class CallsDisabled(nn.Module):
    """Strict export (TorchDynamo) refuses the call; non-strict export runs it as Python."""

    def forward(self, x):
        return _untraceable(x) + 1


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # fails in both modes
            return x
        return -x


def test_dynamic_dim_specialization_keeps_torchs_message_and_suggested_fixes():
    batch = torch.export.Dim("batch", min=1, max=64)
    with pytest.raises(ExportError) as info:
        export(Reshape4(), args=(torch.randn(4, 8),), dynamic_shapes={"x": {0: batch}})
    msg = str(info.value)
    assert msg.startswith("torch.export.export of Reshape4 failed: UserError: Constraints violated")
    assert "You marked batch as dynamic but your code specialized it to be a constant (4)" in msg
    assert re.search(r"Suggested fixes:\n\s+batch = 4", msg), msg
    assert "x.reshape(4, 8)" in msg  # torch's user stack: where the code fixed it
    assert "strict_export=False" not in msg  # non-strict export fails the same way
    assert info.value.specialized == {"batch": 4}
    assert not info.value.non_strict_may_help
    assert msg.endswith(f"(export errors are explained in {DOCS_EXPORT_ERRORS})")
    # The same in non-strict mode, and still no hint.
    with pytest.raises(ExportError, match="specialized it to be a constant") as info:
        export(
            Reshape4(),
            args=(torch.randn(4, 8),),
            dynamic_shapes={"x": {0: batch}},
            strict_export=False,
        )
    assert "hint:" not in str(info.value)


def test_the_non_strict_hint_only_where_non_strict_export_gets_past_it():
    with pytest.raises(ExportError) as info:
        export(CallsDisabled(), args=(torch.randn(3),))
    msg = str(info.value)
    assert "Unsupported: Skip calling `torch.compiler.disable()`d function" in msg
    assert "hint: strict export (TorchDynamo) could not trace this" in msg
    assert "strict_export=False" in msg and info.value.non_strict_may_help
    # The hint is right: non-strict export succeeds and the program computes the same.
    out = export(CallsDisabled(), args=(torch.randn(3),), strict_export=False)
    assert "func.func @main" in str(out.mlir_module)
    # Data-dependent control flow fails in both modes: no hint, torch's advice (torch.cond) kept.
    with pytest.raises(ExportError) as info:
        export(DataDependent(), args=(torch.randn(3),))
    assert "hint:" not in str(info.value) and "torch.cond" in str(info.value)


def test_wrong_dynamic_shapes_keys_keep_torchs_explanation():
    batch = torch.export.Dim("batch")
    with pytest.raises(ExportError) as info:
        export(Reshape4(), args=(torch.randn(4, 8),), dynamic_shapes={"y": {0: batch}})
    assert (
        "its top-level keys must be the arg names ['x'] of `inputs`, but here they are ['y']"
        in (str(info.value))
    )
    assert "hint:" not in str(info.value)


def test_the_docs_section_exists():
    page, anchor = DOCS_EXPORT_ERRORS.split("#")
    headings = re.findall(r"^#+ (.+)$", (ROOT / page).read_text(encoding="utf-8"), re.M)
    # GitHub's anchors: lower case, punctuation dropped, spaces to dashes.
    anchors = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
    assert anchor in anchors, sorted(anchors)


# -- the CLI: the same errors worded with its options --------------------------------------------

MODELS = textwrap.dedent(
    """
    import torch

    class Reshape4(torch.nn.Module):
        def forward(self, x):
            return x.reshape(4, 8) * 2

    @torch._dynamo.disable
    def _untraceable(x):
        return x * 2

    class CallsDisabled(torch.nn.Module):
        def forward(self, x):
            return _untraceable(x) + 1

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.lin(x)
    """
)


@pytest.fixture
def models(tmp_path: Path) -> Path:
    src = tmp_path / "models.py"
    src.write_text(MODELS)
    return src


def _one_line_error(capsys) -> str:
    """The error line (after the stage lines), checking it is one line and no traceback."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if not ln.startswith("done ")]
    assert len(lines) == 1 and lines[0].startswith("turbine-aot: error: "), err
    return lines[0].removeprefix("turbine-aot: error: ")


def test_cli_names_the_dynamic_flag_that_was_specialized(models, tmp_path, capsys):
    out = str(tmp_path / "m.mlir")
    argv = ["export", f"{models}:Reshape4", "-i", "4x8xf32", "--dynamic", "0:0:64", "-o", out]
    assert main(argv) == 2
    err = _one_line_error(capsys)
    assert err.startswith(
        "--dynamic 0:0:64: the model's code makes dimension 0 of input 0 the constant 4, so it "
        "cannot be dynamic; drop this --dynamic or change the code"
    )
    assert DOCS_EXPORT_ERRORS in err and "dynamic_shapes" not in err


def test_cli_suggests_non_strict_and_non_strict_works(models, tmp_path, capsys):
    out = tmp_path / "m.mlir"
    argv = ["export", f"{models}:CallsDisabled", "-i", "3xf32", "-o", str(out)]
    assert main(argv) == 2
    err = _one_line_error(capsys)
    assert err.startswith("torch.export failed: Skip calling `torch.compiler.disable()`d function")
    assert "try --non-strict" in err and "strict_export" not in err
    assert main([*argv, "--non-strict"]) == 0, capsys.readouterr()
    assert "func.func @main" in out.read_text()


def test_cli_run_without_the_parameters_names_the_p_option(models, tmp_path, capsys):
    mlir, irpa, vmfb = tmp_path / "s.mlir", tmp_path / "s.irpa", tmp_path / "s.vmfb"
    argv = ["export", f"{models}:Small", "-i", "2x8xf32", "--external-params", str(irpa)]
    assert main([*argv, "-o", str(mlir)]) == 0
    assert main(["compile", str(mlir), "-o", str(vmfb), "--no-cache"]) == 0
    capsys.readouterr()
    assert main(["run", str(vmfb), "-i", "2x8xf32"]) == 2
    err = _one_line_error(capsys)
    assert "pass the parameter archives it needs: -p model=weights.irpa" in err
    assert "parameters={" not in err
    assert main(["run", str(vmfb), "-i", "2x8xf32", "-p", f"model={irpa}"]) == 0
