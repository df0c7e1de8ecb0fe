#!/usr/bin/env python3
"""The layering contract of the turbine monorepo, checked on source with ``ast``.

Layers, lowest first: turbine_params < turbine_ir < turbine_trace < turbine_fx < turbine_aot.
A package may import only lower layers (and itself). In addition:

* only ``turbine_ir`` imports ``iree.compiler.ir`` / ``iree.compiler.dialects`` /
  ``iree.compiler.passmanager`` / ``iree.compiler._mlir_libs`` (everyone else gets MLIR through it);
* ``turbine_params`` imports neither IREE nor (at module level) torch: it must work with numpy alone;
* no import cycle inside a package: the graph of a package's modules importing each other (its
  relative and absolute imports of itself, those inside functions and under ``if TYPE_CHECKING:``
  included) has no cycle. A cycle hidden behind a function-level or a ``TYPE_CHECKING`` import is
  still a cycle: each module has one place in the package's order, below every module it imports
  (a type a lower module needs from a higher one is a ``Protocol`` in the lower module, or moves
  below both);
* a function-level (lazy) import is for an optional or heavy dependency only: the imported module
  must be on ``LAZY_IMPORTS_ALLOWED`` (by module), with the reason it may not load at import time;
* a sub-layer inside a package (``SUBLAYERS``: each of turbine-aot's subpackages, ``_compiler``,
  ``_signatures``, ``_runtime``, ``_export``, ...) imports, of its own package, only itself and the
  modules (and the subpackages, with their modules) listed for it: the compiler layer sits below
  everything, the runtime below the export side (it never imports it), the command line on top.

Every import statement counts, including those inside functions (lazy imports are still
dependencies) and those under ``if TYPE_CHECKING:`` (a type is a dependency too; they never run,
so they are not lazy imports and load nothing heavy).
``KNOWN_CYCLES`` / ``KNOWN_LAZY_IMPORTS`` list what existed when the rules were introduced: they
may only shrink (a listed entry that no longer exists is reported too, so that the lists are
kept exact). Usage: ``python tools/check_layers.py [ROOT]``; exit 1 on violations.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
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
#: sub-layer -> the modules of its package (outside it) that it may import: a listed module or
#: subpackage with everything in it; the package itself (its ``__init__``) only by its exact name.
SUBLAYERS: dict[str, tuple[str, ...]] = {
    # the compiler layer: an imported MLIR module in, a .vmfb out
    "turbine_aot._compiler": ("turbine_aot._errors",),
    # call signatures: recorded at export (on the compiler layer's IR helpers), read at load
    "turbine_aot._signatures": ("turbine_aot._errors", "turbine_aot._compiler"),
    # CompiledModule and its import phases
    "turbine_aot._compiled_module": ("turbine_aot._errors", "turbine_aot._compiler"),
    # the runtime loads, it never compiles: of the compiler layer only the AMX tile permission
    # (a module built for AMX needs it before it runs), the host CPU's flags (a module built
    # for instructions this CPU lacks is refused) and the name of the functions that wait on
    # stored state (a call of a function storing state may need one); never the export side
    "turbine_aot._runtime": (
        "turbine_aot._errors",
        "turbine_aot._compiler.amx",
        "turbine_aot._compiler.host",
        "turbine_aot._compiler.stored_state",
        "turbine_aot._signatures",
    ),
    # the export side: export(), ExportOutput (compiles through _compiler, loads through _runtime)
    "turbine_aot._export": (
        "turbine_aot._errors",
        "turbine_aot._compiler",
        "turbine_aot._signatures",
        "turbine_aot._compiled_module",
        "turbine_aot._runtime",
    ),
    # bundles: written from a compiled module, loaded through the runtime
    "turbine_aot._bundle": (
        "turbine_aot._errors",
        "turbine_aot._version",
        "turbine_aot._hashing",
        "turbine_aot._compiler",
        "turbine_aot._signatures",
        "turbine_aot._runtime",
    ),
    # build actions: export as an iree.build action
    "turbine_aot._build_actions": (
        "turbine_aot._errors",
        "turbine_aot._hashing",
        "turbine_aot._export",
    ),
    # turbine_aot.llm: on the public API
    "turbine_aot.llm": ("turbine_aot", "turbine_aot._errors", "turbine_aot.runtime"),
    # the command line, on top of everything but the build actions
    "turbine_aot._cli": (
        "turbine_aot",
        "turbine_aot._errors",
        "turbine_aot._compiler",
        "turbine_aot._signatures",
        "turbine_aot._runtime",
        "turbine_aot._export",
        "turbine_aot._bundle",
        "turbine_aot.runtime",
        "turbine_aot.llm",
    ),
}


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


_trees: dict[tuple[Path, int, int], ast.Module] = {}


def _parse(path: Path) -> ast.Module:
    """The file's syntax tree (parsed once per version of the file: each rule walks it)."""
    st = path.stat()
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _trees:
        _trees[key] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return _trees[key]


def _matches(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def check_file(path: Path, package: str) -> list[Violation]:
    rank = LAYERS.index(package)
    tree = _parse(path)
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


def _sources(root: Path, package: str) -> Path:
    return root / "packages" / package.replace("_", "-") / "src" / package


def check_tree(
    root: Path,
    *,
    known_cycles: Iterable[Iterable[str]] = (),
    known_lazy: Iterable[tuple[str, str]] = (),
) -> list[Violation]:
    """Every violation under ``root``; ``known_*``: accepted entries (listing a missing one is one)."""
    violations: list[Violation] = []
    graphs = []
    for package in LAYERS:
        src = _sources(root, package)
        for path in sorted(src.rglob("*.py")):
            violations.extend(check_file(path, package))
        graphs.append(package_graph(src, package))
    violations.extend(check_cycles(graphs, known_cycles))
    violations.extend(check_lazy_imports(graphs, known_lazy))
    violations.extend(check_sublayers(graphs))
    return violations


def _sublayer_may_import(imported: str, allowed: Iterable[str], package: str) -> bool:
    return any(imported == a or (a != package and _matches(imported, a)) for a in allowed)


def check_sublayers(graphs: Iterable[PackageGraph]) -> list[Violation]:
    """Imports from a sub-layer (``SUBLAYERS``) of modules of its package above it."""
    found: list[Violation] = []
    for graph in graphs:
        for sub, allowed in SUBLAYERS.items():
            if not _matches(sub, graph.package):
                continue
            for e in graph.edges:
                if (
                    _matches(e.importer, sub)
                    and not _matches(e.imported, sub)
                    and not _sublayer_may_import(e.imported, allowed, graph.package)
                ):
                    found.append(
                        Violation(
                            e.path,
                            e.line,
                            e.importer,
                            e.imported,
                            f"{sub} is a sub-layer: of {graph.package} it imports only itself "
                            f"and {', '.join(allowed)} (SUBLAYERS in tools/check_layers.py)",
                        )
                    )
    return found


# -- inside a package: cycles and lazy imports ----------------------------------------------------

#: Modules a function may import lazily (prefix match), with why they may not load at import time.
LAZY_IMPORTS_ALLOWED: dict[str, str] = {
    "torch": "heavy; turbine_params works with numpy alone, turbine_aot.runtime without torch",
    "iree.compiler": "heavy; compile-only paths (running a .vmfb needs iree.runtime alone)",
    "iree.runtime": "heavy; run-only paths (export and compile need no runtime)",
    "iree.build": "optional: build actions only",
    "dask": "optional extra (turbine-aot[dask])",
    "safetensors": "optional extra",
    "ml_dtypes": "optional: bf16/fp8 numpy dtypes where installed",
    "psutil": "optional",
    "transformers": "optional, heavy",
    "torchao": "optional extra (turbine-aot[quant]): only for quantize= of the LLM export",
    "turbine_ir": "compiler side (imports iree.compiler): not loaded by run-only paths",
    "turbine_trace": "compiler side (imports turbine_ir): not loaded by run-only paths",
    "turbine_fx": "compiler side (imports torch): not loaded by run-only paths",
    "turbine_aot._build_actions.dask_executor": "optional: imports dask",
    "turbine_aot._cli.demo": "the demo's model and table: only for `turbine-aot demo`",
    "turbine_aot.llm": "imports torch and turbine_fx: only for `turbine-aot llm` commands",
}


@dataclass(frozen=True)
class Edge:
    """``importer`` imports ``imported`` (both modules of one package) at ``path:line``."""

    importer: str
    imported: str
    path: Path
    line: int
    lazy: bool  # inside a function: runs when called
    type_only: bool = False  # under `if TYPE_CHECKING:`: never runs, still a dependency


@dataclass
class PackageGraph:
    package: str
    modules: dict[str, Path]  # dotted name -> file
    edges: list[Edge]  # inside the package
    lazy: list[tuple[str, Path, int, str]]  # (importer, path, line, imported) of every lazy import


def _module_name(src: Path, package: str, path: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _literal_import_module(node: ast.AST) -> ast.Import | None:
    """``importlib.import_module("a.b")`` (a literal name) as the ``import a.b`` it is: a
    dynamic import of a known module is still a dependency (it must not hide a cycle)."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute)):
        return None
    func, arg = node.func, node.args[0]
    if not (
        func.attr == "import_module"
        and isinstance(func.value, ast.Name)
        and func.value.id == "importlib"
        and isinstance(arg, ast.Constant)
        and isinstance(arg.value, str)
    ):
        return None
    imp = ast.Import(names=[ast.alias(name=arg.value)])
    imp.lineno, imp.col_offset = node.lineno, node.col_offset
    return imp


def _all_imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """(import statement, lazy, type_only) for every import: ``lazy`` inside a function,
    ``type_only`` under ``if TYPE_CHECKING:`` (its ``else:`` branch runs)."""
    out: list[tuple[ast.Import | ast.ImportFrom, bool, bool]] = []

    def visit_body(body: list[ast.stmt], lazy: bool, type_only: bool) -> None:
        visit(ast.Module(body=body, type_ignores=[]), lazy, type_only)

    def visit(node: ast.AST, lazy: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                visit_body(child.body, lazy, True)
                visit_body(child.orelse, lazy, type_only)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child, lazy, type_only))
            elif (dynamic := _literal_import_module(child)) is not None:
                out.append((dynamic, lazy, type_only))
            visit(
                child,
                lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
                type_only,
            )

    visit(tree, False, False)
    return out


def _runtime_imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """(import statement, lazy) for every import that runs (not under ``if TYPE_CHECKING:``)."""
    return [(node, lazy) for node, lazy, type_only in _all_imports(tree) if not type_only]


def _imported_names(
    node: ast.Import | ast.ImportFrom, importer: str, is_package: bool
) -> list[tuple[str, str | None]]:
    """(absolute module, imported attribute or None) for each name the statement imports."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names]
    if node.level:
        base = importer.split(".")
        if not is_package:
            base.pop()
        base = base[: len(base) - (node.level - 1)]
        module = ".".join([*base, *([node.module] if node.module else [])])
    else:
        module = node.module or ""
    return [(module, a.name) for a in node.names]


def package_graph(src: Path, package: str) -> PackageGraph:
    """The modules of one package and the imports between them."""
    modules = {_module_name(src, package, p): p for p in sorted(src.rglob("*.py"))}
    edges: list[Edge] = []
    lazy: list[tuple[str, Path, int, str]] = []
    for name, path in modules.items():
        tree = _parse(path)
        is_package = path.name == "__init__.py"
        for node, is_lazy, type_only in _all_imports(tree):
            for module, attr in _imported_names(node, name, is_package):
                target = module
                if attr is not None and f"{module}.{attr}" in modules:
                    target = f"{module}.{attr}"  # "from . import _x" names a submodule
                if is_lazy and not type_only:
                    lazy.append((name, path, node.lineno, target))
                if not _matches(target, package):
                    continue
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    edges.append(Edge(name, target, path, node.lineno, is_lazy, type_only))
    return PackageGraph(package, modules, edges, lazy)


def _strongly_connected(nodes: Iterable[str], succ: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(succ.get(start, ())))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(succ.get(nxt, ()))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    out.append(sorted(comp))
    return out


def _one_cycle(component: list[str], edges: list[Edge]) -> list[Edge]:
    """A shortest cycle through the component's first module, as the edges that form it."""
    members = set(component)
    by_importer: dict[str, list[Edge]] = {}
    for e in edges:
        if e.importer in members and e.imported in members:
            by_importer.setdefault(e.importer, []).append(e)
    start = component[0]
    paths: dict[str, list[Edge]] = {start: []}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for e in sorted(
                by_importer.get(node, []), key=lambda e: (e.type_only, e.lazy, e.imported)
            ):
                if e.imported == start:
                    return [*paths[node], e]
                if e.imported not in paths:
                    paths[e.imported] = [*paths[node], e]
                    nxt_frontier.append(e.imported)
        frontier = nxt_frontier
    return []


def import_cycles(graph: PackageGraph) -> list[list[str]]:
    """The package's import cycles: each a sorted list of the modules that import each other."""
    succ: dict[str, list[str]] = {}
    for e in graph.edges:
        succ.setdefault(e.importer, []).append(e.imported)
    return [c for c in _strongly_connected(graph.modules, succ) if len(c) > 1]


def check_cycles(
    graphs: Iterable[PackageGraph], known: Iterable[Iterable[str]] = ()
) -> list[Violation]:
    known_sets = {frozenset(k) for k in known}
    found: list[Violation] = []
    seen: set[frozenset[str]] = set()
    for graph in graphs:
        for component in import_cycles(graph):
            key = frozenset(component)
            seen.add(key)
            if key in known_sets:
                continue
            cycle = _one_cycle(component, graph.edges)
            first = cycle[0]
            steps = " -> ".join(
                [cycle[0].importer] + [f"{e.imported} ({_where(e)})" for e in cycle]
            )
            hidden = [
                what
                for what, hides in (
                    ("a function-level import", any(e.lazy for e in cycle)),
                    ("an `if TYPE_CHECKING:` import", any(e.type_only for e in cycle)),
                )
                if hides
            ]
            rule = (
                f"import cycle in {graph.package}: {steps}"
                + (
                    f" — {' and '.join(hidden)} hide{'s' if len(hidden) == 1 else ''} it"
                    if hidden
                    else ""
                )
                + f"; the modules in the cycle: {', '.join(component)}. Move what both sides "
                "need into a module below them (see docs/architecture.md)"
            )
            found.append(Violation(first.path, first.line, first.importer, first.imported, rule))
    for key in sorted(known_sets - seen, key=sorted):
        found.append(
            Violation(
                Path(__file__),
                0,
                "KNOWN_CYCLES",
                ", ".join(sorted(key)),
                "this known import cycle no longer exists: remove it from KNOWN_CYCLES "
                "in tools/check_layers.py (or list the smaller cycle that remains)",
            )
        )
    return found


def _where(e: Edge) -> str:
    kind = "under TYPE_CHECKING, " if e.type_only else "in a function, " if e.lazy else ""
    return f"{kind}line {e.line}"


def _lazy_allowed(module: str) -> bool:
    return any(_matches(module, m) for m in LAZY_IMPORTS_ALLOWED) or (
        module.split(".")[0] in sys.stdlib_module_names
    )


def _heavy_at_import(graph: PackageGraph) -> dict[str, set[str]]:
    """Per module of the package: the allowed-lazy (heavy, optional) modules importing it loads.

    Follows the package's module-level imports; a lazy import of a module of the same package
    is justified when it keeps one of those off the importer's import path.
    """
    direct: dict[str, set[str]] = {m: set() for m in graph.modules}
    succ: dict[str, set[str]] = {m: set() for m in graph.modules}
    for name, path in graph.modules.items():
        tree = _parse(path)
        for node, lazy in _runtime_imports(tree):
            if lazy:
                continue
            for module, _ in _imported_names(node, name, path.name == "__init__.py"):
                heavy = (
                    _lazy_allowed(module) and module.split(".")[0] not in sys.stdlib_module_names
                )
                if heavy and not _matches(module, graph.package):
                    direct[name].add(module)
    for e in graph.edges:
        if not e.lazy and not e.type_only:
            succ[e.importer].add(e.imported)
    out: dict[str, set[str]] = {}
    for m in graph.modules:
        seen, todo, heavy = {m}, [m], set()
        while todo:
            cur = todo.pop()
            heavy |= direct[cur]
            for nxt in succ[cur] - seen:
                seen.add(nxt)
                todo.append(nxt)
        out[m] = heavy
    return out


def check_lazy_imports(
    graphs: Iterable[PackageGraph], known: Iterable[tuple[str, str]] = ()
) -> list[Violation]:
    """Function-level imports of modules that are neither optional nor heavy."""
    known_set = set(known)
    seen: set[tuple[str, str]] = set()
    found: list[Violation] = []
    for graph in graphs:
        heavy = _heavy_at_import(graph)
        in_cycle = {m: frozenset(c) for c in import_cycles(graph) for m in c}
        reported: set[tuple[str, str]] = set()
        for importer, path, line, module in graph.lazy:
            if _lazy_allowed(module):
                continue
            if module in in_cycle.get(importer, ()):
                continue  # part of an import cycle: the cycle rule reports it
            if module in heavy and heavy[module] - heavy[importer]:
                continue  # keeps a heavy or optional dependency off the importer's import path
            seen.add((importer, module))
            if (importer, module) in known_set or (importer, module) in reported:
                continue
            reported.add((importer, module))
            found.append(
                Violation(
                    path,
                    line,
                    importer,
                    module,
                    "function-level import of a module that is neither optional nor heavy: "
                    "import it at module level (if that makes an import cycle, move the shared "
                    "code below both modules), or add the module to LAZY_IMPORTS_ALLOWED in "
                    "tools/check_layers.py with the reason",
                )
            )
    for importer, module in sorted(known_set - seen):
        found.append(
            Violation(
                Path(__file__),
                0,
                importer,
                module,
                "this known function-level import no longer exists: remove it from "
                "KNOWN_LAZY_IMPORTS in tools/check_layers.py",
            )
        )
    return found


#: Import cycles that exist while the rule is being tightened; they may only shrink. Empty: the
#: two turbine_aot cycles that ``TYPE_CHECKING`` imports closed (``_build_actions`` /
#: ``_build_actions_marshal`` / ``_build_actions_remote``, ``_compiled_module`` /
#: ``_compiled_module_trace``) are gone (issue 24). Only turbine_aot may have entries
#: (tests/test_layering.py checks it): the lower packages have no cycle of any kind.
KNOWN_CYCLES: list[list[str]] = []

#: Function-level imports of ordinary modules that existed then: (importer, imported).
KNOWN_LAZY_IMPORTS: list[tuple[str, str]] = []


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]) or len(argv) > 1:
        print(__doc__)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    repo = Path(__file__).resolve().parent.parent
    root = Path(argv[0]).resolve() if argv else repo
    missing = [p for p in LAYERS if not _sources(root, p).is_dir()]
    if missing:
        # A wrong root must not read as a clean tree.
        print(
            f"{root}: no sources of {', '.join(missing)} (expected "
            "packages/<name>/src/<package>/): pass the repository's root",
            file=sys.stderr,
        )
        return 2
    known = {"known_cycles": KNOWN_CYCLES, "known_lazy": KNOWN_LAZY_IMPORTS} if root == repo else {}
    violations = check_tree(root, **known)
    for v in violations:
        print(v)
    if violations:
        print(f"{len(violations)} layering violation(s)")
        return 1
    print("layering contract holds")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
