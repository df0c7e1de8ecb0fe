"""The layering contract: lower packages never import higher ones (tools/check_layers.py)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import check_layers  # noqa: E402


def _make_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for package in check_layers.LAYERS:
        src = tmp_path / "packages" / package.replace("_", "-") / "src" / package
        src.mkdir(parents=True)
        (src / "__init__.py").write_text("")
    for rel, text in files.items():
        (tmp_path / rel).write_text(textwrap.dedent(text))
    return tmp_path


def test_repository_respects_layers():
    violations = check_layers.check_tree(ROOT)
    assert violations == [], "\n".join(map(str, violations))


@pytest.mark.parametrize(
    "importer, source, rule",
    [
        ("params", "import turbine_ir\n", "below turbine_ir"),
        ("ir", "from turbine_aot import export\n", "below turbine_aot"),
        ("trace", "def f():\n    import turbine_fx.passes\n", "below turbine_fx"),
        ("fx", "from iree.compiler import ir\n", "only turbine_ir may import MLIR"),
        ("aot", "import iree.compiler.dialects.func\n", "only turbine_ir may import MLIR"),
        ("params", "import iree.runtime\n", "must not depend on IREE"),
        ("params", "import torch\n", "imports torch lazily only"),
    ],
)
def test_violations_are_reported(tmp_path, importer, source, rule):
    pkg = f"turbine_{importer}"
    rel = f"packages/turbine-{importer}/src/{pkg}/_bad.py"
    root = _make_tree(tmp_path, {rel: source})
    violations = check_layers.check_tree(root)
    assert len(violations) >= 1
    assert any(rule in v.rule for v in violations), violations
    assert all(v.path.name == "_bad.py" for v in violations)
    assert check_layers.main([str(root)]) == 1


def test_allowed_imports_pass(tmp_path):
    root = _make_tree(
        tmp_path,
        {
            "packages/turbine-aot/src/turbine_aot/_ok.py": "import turbine_fx, turbine_params\n",
            "packages/turbine-ir/src/turbine_ir/_ok.py": "from iree.compiler import ir\n",
            "packages/turbine-params/src/turbine_params/_ok.py": "def f():\n    import torch\n",
        },
    )
    assert check_layers.check_tree(root) == []
    assert check_layers.main([str(root)]) == 0
