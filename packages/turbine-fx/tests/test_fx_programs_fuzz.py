"""Property-based fuzzing of FxPrograms.load: hostile expression strings are refused and never
run; mutated descriptors and graph files load or raise FxProgramsError, nothing else.

Bounded by a fixed number of examples; no per-example deadline (CI machines are loaded). The
module prints how many inputs it tried (``pytest -s`` shows it).
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn as nn

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from turbine_fx import FxPrograms, FxProgramsBuilder, FxProgramsError  # noqa: E402
from turbine_fx._fx_programs_exprs import (  # noqa: E402
    ExprError,
    check_guard,
    check_sym_expr,
    check_target,
)

_TRIED = {
    "torch-written expressions": 0,
    "hostile strings (parser)": 0,
    "hostile strings (load)": 0,
    "mutated descriptors": 0,
    "mutated graph files": 0,
}


@pytest.fixture(scope="module", autouse=True)
def _report_count():
    yield
    print(f"\nFxPrograms fuzz: inputs tried: {_TRIED}")


_SETTINGS = settings(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# -- what torch writes is accepted ----------------------------------------------------------------


def _torch_sympy_table() -> dict:
    import torch.utils._sympy.functions as f

    return {n: getattr(f, n) for n in ("FloorDiv", "Mod", "CeilDiv", "PythonMod", "ToFloat")}


def _sym_exprs():
    import sympy
    from torch.utils._sympy.functions import CeilDiv, FloorDiv, Mod, PythonMod

    leaves = st.one_of(
        st.integers(0, 200).map(lambda i: sympy.Symbol(f"s{i}", integer=True, positive=True)),
        st.integers(0, 9).map(lambda i: sympy.Symbol(f"u{i}", integer=True, nonnegative=True)),
        st.integers(0, 2**40).map(sympy.Integer),  # torch's Mod wants no negative number
    )

    def combine(children):
        pair = st.tuples(children, children)
        return st.one_of(
            pair.map(lambda p: p[0] + p[1]),
            pair.map(lambda p: p[0] * p[1]),
            pair.map(lambda p: sympy.Max(*p)),
            pair.map(lambda p: sympy.Min(*p)),
            st.tuples(children, st.integers(1, 9)).map(lambda p: FloorDiv(p[0], p[1])),
            st.tuples(children, st.integers(1, 9)).map(lambda p: Mod(p[0], p[1])),
            st.tuples(children, st.integers(1, 9)).map(lambda p: CeilDiv(p[0], p[1])),
            st.tuples(children, st.integers(1, 9)).map(lambda p: PythonMod(p[0], p[1])),
        )

    ints = st.recursive(leaves, combine, max_leaves=12)
    relations = st.tuples(ints, ints, st.sampled_from([sympy.Eq, sympy.Ne, sympy.Le, sympy.Lt]))
    return st.one_of(ints, ints.map(lambda e: -e), relations.map(lambda p: p[2](p[0], p[1])))


@settings(_SETTINGS, max_examples=150)
@given(_sym_exprs())
def test_fuzz_expressions_torch_writes_are_accepted(expr):
    """srepr (what torch writes for symbolic values) and str (range-constraint keys) of random
    expressions over torch's symbols and sympy functions parse (and sympy reads them back)."""
    import sympy

    _TRIED["torch-written expressions"] += 1
    text = sympy.srepr(expr)
    check_sym_expr(text)
    if not isinstance(expr, sympy.Rel):
        check_sym_expr(str(expr))
    assert isinstance(sympy.sympify(text, locals=_torch_sympy_table()), sympy.Basic)


# -- hostile strings are refused ------------------------------------------------------------------

_HOSTILE = [
    "__import__", "('os')", ".system", "('touch MARKER')", "Symbol", ".__new__", ".__globals__",
    "['__builtins__']", "lambda", " x:", "x", "eval", "exec", "getattr", "(", ")", "[", "]", ",",
    "'", '"', ".", "=", "==", ":", ";", "\n", "{", "}", "\\", "s0", "u1", "Integer(2)", "Add",
    "Max", "Mod", "FloorDiv", "open", "compile", "globals", "vars", "__class__", "__subclasses__",
    "mro", "()", "L", "['x']", ".size()", "[0]", "+", "-", "*", "//", "**", "%", "9" * 50, "1e9",
    "not", "and", "if", "else", "import", "os", "sys", "breakpoint", "Float('1.5')", "True",
]  # fmt: skip
_hostile_text = st.one_of(
    st.lists(st.sampled_from(_HOSTILE), min_size=1, max_size=14).map("".join),
    st.text(max_size=40),
    st.integers(1, 400).map(lambda n: "(" * n + "s0" + ")" * n),  # deep nesting
    st.integers(1, 60).map(lambda n: "Pow(" * n + "s0" + ", 64)" * n),  # nested powers
)


def _safe_when_accepted(text: str) -> None:
    """Whatever a check accepts contains none of what code needs: no dunder, no lambda, no
    attribute access except of an input in a guard, no statement separators."""
    assert "__" not in text and "lambda" not in text
    assert not any(c in text for c in ";\n{}\\:")


@settings(_SETTINGS, max_examples=600)
@given(text=_hostile_text)
def test_fuzz_hostile_strings_are_refused_or_harmless(text, tmp_path):
    import sympy

    _TRIED["hostile strings (parser)"] += 1
    marker = tmp_path / "MARKER"
    text = text.replace("MARKER", str(marker))
    for check in (check_sym_expr, check_guard, check_target):
        try:
            check(text)
        except ExprError:
            continue
        _safe_when_accepted(text)
        if check is check_sym_expr:
            # What torch would do next with it (sympy may refuse it: then it ran nothing).
            with contextlib.suppress(Exception):
                sympy.sympify(text, locals=_torch_sympy_table())
    assert not marker.exists()


class _Dyn(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x).relu()


@pytest.fixture(scope="module")
def saved_set(tmp_path_factory) -> Path:
    fxb = FxProgramsBuilder(_Dyn())
    fxb.export_program(
        lambda m, x: m(x),
        args=(torch.randn(3, 4),),
        dynamic_shapes={"args": ({0: torch.export.Dim("b", min=2, max=64)},)},
        name="main",
    )
    path = tmp_path_factory.mktemp("fuzzset") / "set.json"
    fxb.save(path)
    return path


def _fresh_copy(src: Path, directory: Path) -> tuple[Path, Path]:
    for f in directory.iterdir():
        f.unlink()
    for f in src.parent.iterdir():
        shutil.copy(f, directory / f.name)
    name = json.loads(src.read_text())["programs"]["main"]["file"]
    return directory / src.name, directory / name


def _paths(doc) -> list[tuple]:
    out: list[tuple] = []
    stack: list[tuple[object, tuple]] = [(doc, ())]
    while stack:
        v, where = stack.pop()
        out.append(where)
        if isinstance(v, dict):
            stack.extend((x, (*where, k)) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, (*where, i)) for i, x in enumerate(v))
    return sorted(out, key=repr)


def _expr_paths(doc) -> list[tuple]:
    return [p for p in _paths(doc) if p and p[-1] == "expr_str"]


@settings(_SETTINGS, max_examples=150)
@given(hostile=_hostile_text, pick=st.integers(0, 10**6))
def test_fuzz_hostile_expressions_in_a_graph_never_run(hostile, pick, saved_set, tmp_path):
    """The end-to-end form: a hostile string in place of a symbolic size of a real graph
    file; load raises FxProgramsError (or loads, for a harmless accepted string) and the
    payload never ran."""
    _TRIED["hostile strings (load)"] += 1
    marker = tmp_path / "MARKER"
    path, graph = _fresh_copy(saved_set, tmp_path)
    doc = json.loads(graph.read_text())
    where = _expr_paths(doc)[pick % len(_expr_paths(doc))]
    _set(doc, where, hostile.replace("MARKER", str(marker)))
    graph.write_text(json.dumps(doc))
    with contextlib.suppress(FxProgramsError):
        FxPrograms.load(path)
    assert not marker.exists()


# -- JSON structure fuzz ------------------------------------------------------------------------

_json = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.sampled_from([0, -1, 1, 2**31, 2**62, 2**63, 2**64]),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=12),
        st.sampled_from(["../x", "/etc/passwd", "", "float32", "main", "t0", "s0", "as_expr"]),
    ),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=8,
)


def _set(doc, where: tuple, value) -> None:
    target = doc
    for k in where[:-1]:
        target = target[k]
    target[where[-1]] = value


def _mutate(doc, data) -> object:
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = _paths(doc)
        where = paths[data.draw(st.integers(0, len(paths) - 1), label="path")]
        if not where:
            return data.draw(_json, label="whole document")
        how = data.draw(st.sampled_from(["replace", "delete", "duplicate"]), label="how")
        parent = doc
        for k in where[:-1]:
            parent = parent[k]
        if how == "delete":
            del parent[where[-1]]
        elif how == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[where[-1]]))
        else:
            parent[where[-1]] = data.draw(_json, label="value")
    return doc


def _load_is_clean(path: Path) -> None:
    with contextlib.suppress(FxProgramsError):
        FxPrograms.load(path)


@settings(_SETTINGS, max_examples=200)
@given(data=st.data())
def test_fuzz_mutated_descriptors_load_or_raise_fx_programs_error(data, saved_set, tmp_path):
    _TRIED["mutated descriptors"] += 1
    path, _ = _fresh_copy(saved_set, tmp_path)
    path.write_text(json.dumps(_mutate(json.loads(path.read_text()), data)))
    _load_is_clean(path)


@settings(_SETTINGS, max_examples=120)
@given(data=st.data())
def test_fuzz_mutated_graph_files_load_or_raise_fx_programs_error(data, saved_set, tmp_path):
    _TRIED["mutated graph files"] += 1
    path, graph = _fresh_copy(saved_set, tmp_path)
    graph.write_text(json.dumps(_mutate(json.loads(graph.read_text()), data)))
    _load_is_clean(path)
