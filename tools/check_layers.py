#!/usr/bin/env python3
"""The layering contract of the turbine monorepo, checked on source with ``ast``.

Layers, lowest first: turbine_params < turbine_ir < turbine_trace < turbine_fx < turbine_aot.
A package may import only lower layers (and itself). In addition:

* only ``turbine_ir`` imports ``iree.compiler.ir`` / ``iree.compiler.dialects`` /
  ``iree.compiler.passmanager`` / ``iree.compiler._mlir_libs`` (everyone else gets MLIR through it);
* ``turbine_params`` imports neither IREE nor (at module level) torch: it must work with numpy alone.

Every import statement counts, including those inside functions (lazy imports are still
dependencies). Usage: ``python tools/check_layers.py [ROOT]``; exit 1 on violations.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

LAYERS = ("turbine_params", "turbine_ir", "turbine_trace", "turbine_fx", "turbine_aot")
MLIR_MODULES = (
    "iree.compiler.ir",
    "iree.compiler.dialects",
    "iree.compiler.passmanager",
    "iree.compiler._mlir_libs",
    "iree.compiler.rewrite",
)
MLIR_OWNER = "turbine_ir"


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    importer: str
    imported: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported}: {self.rule}"


def _imports(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, module, runs_at_import_time) for every absolute import in the tree.

    An import inside a function body runs only when called (a lazy import); anything else
    (module level, class bodies, module-level if/try) runs when the module is imported.
    """
    out: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, at_import: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend((child.lineno, a.name, at_import) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                out.append((child.lineno, child.module, at_import))
                # "from iree.compiler import ir" names a submodule.
                out.extend(
                    (child.lineno, f"{child.module}.{a.name}", at_import) for a in child.names
                )
            lazy = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, at_import and not lazy)

    visit(tree, True)
    return out


def _matches(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def check_file(path: Path, package: str) -> list[Violation]:
    rank = LAYERS.index(package)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[Violation] = []
    for line, mod, toplevel in _imports(tree):
        root = mod.split(".")[0]
        if root in LAYERS and LAYERS.index(root) > rank:
            found.append(
                Violation(path, line, package, mod, f"{package} is below {root} in the layers")
            )
        if package != MLIR_OWNER and any(_matches(mod, m) for m in MLIR_MODULES):
            found.append(
                Violation(path, line, package, mod, f"only {MLIR_OWNER} may import MLIR bindings")
            )
        if package == "turbine_params":
            if root == "iree":
                found.append(
                    Violation(path, line, package, mod, "turbine_params must not depend on IREE")
                )
            if root == "torch" and toplevel:
                found.append(
                    Violation(path, line, package, mod, "turbine_params imports torch lazily only")
                )
    return found


def check_tree(root: Path) -> list[Violation]:
    violations: list[Violation] = []
    for package in LAYERS:
        dist = package.replace("_", "-")
        src = root / "packages" / dist / "src" / package
        for path in sorted(src.rglob("*.py")):
            violations.extend(check_file(path, package))
    return violations


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    violations = check_tree(root)
    for v in violations:
        print(v)
    if violations:
        print(f"{len(violations)} layering violation(s)")
        return 1
    print("layering contract holds")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
