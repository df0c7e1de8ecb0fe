"""The layering contract (tools/check_layers.py): lower packages never import higher ones, no
import cycle inside a package, function-level imports only for optional or heavy dependencies."""

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
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def _aot(name: str) -> str:
    return f"packages/turbine-aot/src/turbine_aot/{name}"


def test_repository_respects_layers():
    violations = check_layers.check_tree(
        ROOT,
        known_cycles=check_layers.KNOWN_CYCLES,
        known_lazy=check_layers.KNOWN_LAZY_IMPORTS,
    )
    assert violations == [], "\n".join(map(str, violations))
    assert check_layers.main([]) == 0


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
            _aot("_ok.py"): "import turbine_fx, turbine_params\n",
            "packages/turbine-ir/src/turbine_ir/_ok.py": "from iree.compiler import ir\n",
            "packages/turbine-params/src/turbine_params/_ok.py": "def f():\n    import torch\n",
        },
    )
    assert check_layers.check_tree(root) == []
    assert check_layers.main([str(root)]) == 0


# -- import cycles inside a package --------------------------------------------------------------


@pytest.mark.parametrize(
    "files, cycle",
    [
        pytest.param(
            {
                _aot("_a.py"): "from ._b import B\nA = 1\n",
                _aot("_b.py"): "from ._a import A\nB = 2\n",
            },
            "turbine_aot._a -> turbine_aot._b (line 1) -> turbine_aot._a (line 1)",
            id="module-level, relative",
        ),
        pytest.param(
            {
                _aot("_a.py"): "import turbine_aot._b\n",
                _aot("_b.py"): "from turbine_aot import _c\n",
                _aot("_c.py"): "from turbine_aot._a import x\n",
            },
            "turbine_aot._a -> turbine_aot._b (line 1) -> turbine_aot._c (line 1) "
            "-> turbine_aot._a (line 1)",
            id="three modules, absolute",
        ),
        pytest.param(
            {
                _aot("_a.py"): "from ._b import B\n",
                _aot("_b.py"): "B = 1\n\ndef use():\n    from ._a import thing\n",
            },
            "turbine_aot._a -> turbine_aot._b (line 1) -> turbine_aot._a (in a function, line 4)",
            id="hidden behind a function-level import",
        ),
        pytest.param(
            {
                _aot("__init__.py"): "from ._a import f\n",
                _aot("_a.py"): "def f():\n    from turbine_aot import __version__\n",
            },
            "turbine_aot -> turbine_aot._a (line 1) -> turbine_aot (in a function, line 2)",
            id="through the package __init__",
        ),
        pytest.param(
            {
                _aot("sub/__init__.py"): "from .x import X\n",
                _aot("sub/x.py"): "from .. import _top\nX = 1\n",
                _aot("_top.py"): "from .sub.x import X\n",
            },
            "turbine_aot._top -> turbine_aot.sub.x (line 1) -> turbine_aot._top (line 1)",
            id="subpackage, parent-relative",
        ),
        pytest.param(
            {
                _aot("_commands.py"): (
                    "import importlib\n\ndef parser():\n"
                    "    importlib.import_module('turbine_aot._commands_llm').register()\n"
                ),
                _aot("_commands_llm.py"): "from turbine_aot._commands import parser\n",
            },
            "turbine_aot._commands -> turbine_aot._commands_llm (in a function, line 4) -> "
            "turbine_aot._commands (line 1)",
            id="hidden behind importlib.import_module",
        ),
    ],
)
def test_import_cycles_are_reported(tmp_path, files, cycle):
    root = _make_tree(tmp_path, files)
    violations = check_layers.check_tree(root)
    assert len(violations) == 1, violations
    assert f"import cycle in turbine_aot: {cycle}" in violations[0].rule
    assert ("function-level import hides it" in violations[0].rule) == ("in a function" in cycle)
    assert check_layers.main([str(root)]) == 1


@pytest.mark.parametrize("package", ["params", "ir", "trace", "fx", "aot"])
def test_a_cycle_through_a_type_checking_import_is_reported_in_every_package(tmp_path, package):
    """A type is a dependency too: ``if TYPE_CHECKING:`` imports count for cycles (issue 24)."""
    src = f"packages/turbine-{package}/src/turbine_{package}"
    root = _make_tree(
        tmp_path,
        {
            f"{src}/_a.py": "from ._b import B\n",
            f"{src}/_b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._a import A\nB = 1\n"
            ),
        },
    )
    violations = check_layers.check_tree(root)
    assert len(violations) == 1, violations
    rule = violations[0].rule
    pkg = f"turbine_{package}"
    assert (
        f"import cycle in {pkg}: {pkg}._a -> {pkg}._b (line 1) -> {pkg}._a "
        "(under TYPE_CHECKING, line 3) — an `if TYPE_CHECKING:` import hides it" in rule
    ), rule


def test_type_checking_imports_are_neither_lazy_nor_loaded(tmp_path):
    """Under TYPE_CHECKING (module level or in a function): no lazy-import rule, nothing heavy
    loaded; the ``else:`` branch runs like any other code."""
    root = _make_tree(
        tmp_path,
        {
            _aot("_a.py"): "from ._b import B\nfrom ._c import C\n",
            _aot("_b.py"): "from ._c import C\nB = 1\n",
            _aot("_c.py"): (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    import numpy\nelse:\n    import json\nC = 1\n"
                "def f():\n    if TYPE_CHECKING:\n        from ._b import B\n"
            ),
        },
    )
    violations = check_layers.check_tree(root)
    # _c -> _b under TYPE_CHECKING (in a function) closes _b -> _c: a cycle, not a lazy import.
    assert len(violations) == 1, violations
    assert "under TYPE_CHECKING, line 9" in violations[0].rule
    assert "neither optional nor heavy" not in violations[0].rule
    (root / _aot("_c.py")).write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import numpy\nelse:\n    from ._b import B\nC = 1\n"
    )
    # The else branch runs: _c -> _b at import time, and _b -> _c closes the cycle.
    rules = [v.rule for v in check_layers.check_tree(root)]
    assert (
        len(rules) == 1
        and "turbine_aot._b -> turbine_aot._c (line 1) -> turbine_aot._b (line 5)" in rules[0]
    ), rules
    assert "hides it" not in rules[0]


def test_acyclic_graphs_pass(tmp_path):
    root = _make_tree(
        tmp_path,
        {
            _aot("_a.py"): "from ._b import B\nfrom ._c import C\n",
            _aot("_b.py"): "from ._c import C\nB = 1\n",
            _aot("_c.py"): (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    import numpy\nelse:\n    import json\nC = 1\n"
            ),
        },
    )
    assert check_layers.check_tree(root) == []


def test_known_cycles_are_turbine_aots_only():
    """The lower packages have no import cycle at all; the list only holds turbine_aot's
    cycles that the turbine_aot half of issue 24 removes."""
    for cycle in check_layers.KNOWN_CYCLES:
        assert all(m.startswith("turbine_aot.") for m in cycle), cycle


def test_a_new_cycle_fails_beside_known_ones(tmp_path):
    files = {
        _aot("_a.py"): "from ._b import B\n",
        _aot("_b.py"): "def f():\n    from ._a import A\n",
    }
    root = _make_tree(tmp_path, files)
    known = [["turbine_aot._a", "turbine_aot._b"]]
    assert check_layers.check_tree(root, known_cycles=known) == []
    # A module joining the known cycle makes it another cycle: reported.
    (root / _aot("_c.py")).write_text("from ._a import A\n")
    (root / _aot("_b.py")).write_text("from ._c import C\ndef f():\n    from ._a import A\n")
    violations = check_layers.check_tree(root, known_cycles=known)
    rules = [v.rule for v in violations]
    assert any("import cycle in turbine_aot" in r and "turbine_aot._c" in r for r in rules), rules
    assert any("known import cycle no longer exists" in r for r in rules), rules


def test_a_known_cycle_that_is_gone_must_leave_the_list(tmp_path):
    root = _make_tree(tmp_path, {_aot("_a.py"): "A = 1\n"})
    violations = check_layers.check_tree(root, known_cycles=[["turbine_aot._a", "turbine_aot._b"]])
    assert [v.importer for v in violations] == ["KNOWN_CYCLES"]
    assert "remove it from KNOWN_CYCLES" in violations[0].rule


# -- function-level imports ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "files, line",
    [
        pytest.param({_aot("_a.py"): "def f():\n    import numpy\n"}, 2, id="numpy"),
        pytest.param(
            {_aot("_a.py"): "def f():\n    from ._b import B\n", _aot("_b.py"): "B = 1\n"},
            2,
            id="a light module of the package",
        ),
        pytest.param(
            {
                _aot("_a.py"): "import torch\ndef f():\n    from ._b import B\n",
                _aot("_b.py"): "import torch\nB = 1\n",
            },
            3,
            id="a module whose heavy imports the importer has already",
        ),
    ],
)
def test_needless_function_level_imports_are_reported(tmp_path, files, line):
    root = _make_tree(tmp_path, files)
    violations = check_layers.check_tree(root)
    assert [(v.importer, v.line) for v in violations] == [("turbine_aot._a", line)]
    assert "neither optional nor heavy" in violations[0].rule
    known = [(violations[0].importer, violations[0].imported)]
    assert check_layers.check_tree(root, known_lazy=known) == []


def test_function_level_imports_of_heavy_or_optional_modules_pass(tmp_path):
    root = _make_tree(
        tmp_path,
        {
            _aot("_a.py"): (
                "def f():\n    import torch\n    import iree.runtime as rt\n    import json\n"
                "    from turbine_fx import passes\n    from . import _heavy\n"
            ),
            _aot("_heavy.py"): "import dask.distributed\n",
            "packages/turbine-params/src/turbine_params/_t.py": "def f():\n    import torch\n",
        },
    )
    assert check_layers.check_tree(root) == []


def test_a_known_lazy_import_that_is_gone_must_leave_the_list(tmp_path):
    root = _make_tree(tmp_path, {_aot("_a.py"): "A = 1\n"})
    violations = check_layers.check_tree(root, known_lazy=[("turbine_aot._a", "numpy")])
    assert len(violations) == 1
    assert "remove it from KNOWN_LAZY_IMPORTS" in violations[0].rule


def test_the_compiler_layer_imports_nothing_above_it(tmp_path):
    """turbine_aot._compiler sits below the exporter and the runtime: importing either (relative
    or absolute, at module level or in a function) is reported; _errors and itself are fine."""
    root = _make_tree(
        tmp_path,
        {
            _aot("_errors.py"): "X = 1\n",
            _aot("_exporter.py"): "from ._compiler.targets import F\n",
            _aot("_runtime.py"): "from ._compiler.amx import A\n",
            _aot("_compiler/__init__.py"): "",
            _aot("_compiler/amx.py"): "A = 1\n",
            _aot("_compiler/targets.py"): "from .._errors import X\nF = X\n",
            _aot("_compiler/cache.py"): (
                "from .targets import F\n"
                "def g():\n"
                "    from turbine_aot._runtime import targets\n"
                "    return targets\n"
            ),
            _aot("_compiler/invoke.py"): "from .. import _exporter\n",
        },
    )
    found = check_layers.check_sublayers(
        [check_layers.package_graph(check_layers._sources(root, "turbine_aot"), "turbine_aot")]
    )
    assert sorted((v.importer, v.imported) for v in found) == [
        ("turbine_aot._compiler.cache", "turbine_aot._runtime"),
        ("turbine_aot._compiler.invoke", "turbine_aot._exporter"),
    ], found
    assert all("sub-layer" in v.rule for v in found)


def test_each_turbine_aot_subpackage_imports_only_what_it_is_allowed(tmp_path):
    """Every turbine_aot subpackage is a sub-layer: the runtime importing the export side or
    compiling (the compile cache), the compiler layer importing call signatures, or a subpackage importing the package's
    ``__init__`` without it being listed (a prefix would allow everything) is reported, with
    the subpackage named; the listed imports (a subpackage's modules, a listed module) pass."""
    root = _make_tree(
        tmp_path,
        {
            _aot("_errors.py"): "X = 1\n",
            _aot("_compiler/__init__.py"): "",
            _aot("_compiler/cache.py"): "from .._signatures.abi import A\n",
            _aot("_signatures/__init__.py"): "",
            _aot("_signatures/abi.py"): "from turbine_aot._compiler import cache\nA = 1\n",
            _aot("_runtime/__init__.py"): "",
            _aot("_runtime/loading.py"): (
                "from .._errors import X\n"
                "from .._signatures.abi import A\n"
                "def f():\n"
                "    from turbine_aot._export.output import ExportOutput\n"
                "    return ExportOutput\n"
            ),
            _aot("_runtime/tensors.py"): "import turbine_aot\n",
            # the runtime loads, it never compiles: the AMX permission is all it may take of
            # the compiler layer
            _aot("_runtime/cpu.py"): "from .._compiler.amx import request\n",
            _aot("_runtime/compiling.py"): "from turbine_aot._compiler.cache import compile_mlir\n",
            _aot("_compiler/amx.py"): "def request():\n    pass\n",
            _aot("_export/__init__.py"): "",
            _aot("_export/output.py"): "from .._runtime.loading import f\nExportOutput = f\n",
            _aot("_cli/__init__.py"): "",
            _aot("_cli/main.py"): "import turbine_aot\nfrom .._export import output\n",
        },
    )
    found = check_layers.check_sublayers(
        [check_layers.package_graph(check_layers._sources(root, "turbine_aot"), "turbine_aot")]
    )
    assert sorted((v.importer, v.imported) for v in found) == [
        ("turbine_aot._compiler.cache", "turbine_aot._signatures.abi"),
        ("turbine_aot._runtime.compiling", "turbine_aot._compiler.cache"),
        ("turbine_aot._runtime.loading", "turbine_aot._export.output"),
        ("turbine_aot._runtime.tensors", "turbine_aot"),
    ], found
    rules = {v.importer: v.rule for v in found}
    assert "turbine_aot._runtime is a sub-layer" in rules["turbine_aot._runtime.loading"]
    assert "turbine_aot._signatures" in rules["turbine_aot._runtime.loading"]  # what it may


def test_a_root_without_the_packages_is_refused(tmp_path, capsys):
    """A wrong root (or a misspelt argument) must not read as a tree that holds the contract."""
    (tmp_path / "packages").mkdir()
    assert check_layers.main([str(tmp_path)]) == 2
    assert "no sources of turbine_params" in capsys.readouterr().err
    assert check_layers.main(["--help"]) == 0
    assert "Usage" in capsys.readouterr().out
