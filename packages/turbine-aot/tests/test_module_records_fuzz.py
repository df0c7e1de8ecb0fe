"""Damaged signature records of compiled modules are turbine errors, never raw exceptions.

A ``.vmfb`` carries each function's call-signature records as reflection strings
(``turbine.signature``, ``torch.args_schema``, ``torch.return_schema``; docs/running.md). A
damaged file can make them invalid UTF-8 (IREE's binding then raises a bare ``RuntimeError``),
invalid JSON, or JSON with missing keys and wrong types. Issue 23 found such modules raising
``RuntimeError: nanobind::...conversion error!``, ``JSONDecodeError`` and
``KeyError: 'children_spec'`` at the first call. Here: the issue's three cases, then property
tests of the readers (the records as strings) and of the loader (the records' bytes spliced into
a real module). Every outcome is a load and a call, or a ``TurbineRuntimeError`` that names the
file and says what is damaged, with the original exception chained.

Bounded by a fixed number of examples; no per-example deadline (CI machines are loaded).
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import pytest
import torch

import turbine_aot as aot
from turbine_aot import runtime as R
from turbine_aot._signatures.abi import parse_abi_declaration
from turbine_aot._signatures.call import rebuild_results
from turbine_aot._signatures.element_types import element_type_name
from turbine_aot._signatures.keys import ARGS_SCHEMA, RETURN_SCHEMA, SIGNATURE_KEY
from turbine_aot._signatures.reflection import function_signature

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_TRIED = {"records": 0, "refused": 0, "read": 0, "modules": 0, "modules refused": 0}
_RECORDS = (ARGS_SCHEMA, RETURN_SCHEMA, SIGNATURE_KEY)


@pytest.fixture(scope="module", autouse=True)
def _report_count():
    yield
    print(f"\nsignature record fuzz: {_TRIED}")


class _Module(tuple):
    """(vmfb bytes, parameter archive, ``main``'s reflection); printed short in reports."""

    def __repr__(self) -> str:
        return f"<Linear(4, 3) module, {len(self[0])} bytes>"


@pytest.fixture(scope="module")
def linear(tmp_path_factory) -> tuple[bytes, Path, dict[str, str]]:
    """The issue's module: ``Linear(4, 3)`` with its weights in an ``.irpa``; its bytes, the
    archive, and ``main``'s reflection."""
    d = tmp_path_factory.mktemp("linear")
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3).eval()
    aot.externalize_module_parameters(lin)
    aot.save_module_parameters(d / "w.irpa", lin)
    vmfb = bytes(aot.export(lin, args=(torch.randn(2, 4),)).compile(None).map_memory())
    m = R.load_module(vmfb, parameters=d / "w.irpa")
    reflection = dict(m._vm_module.lookup_function("main").reflection)
    assert set(_RECORDS) <= set(reflection)
    return _Module((vmfb, d / "w.irpa", reflection))


@pytest.fixture(scope="module")
def dynamic_reflection() -> dict[str, str]:
    """Records of a function with a dynamic dimension, a keyword argument and a dict result,
    plus an ABI declaration (the parser's input), to give the fuzzer more fields."""

    class M(torch.nn.Module):
        def forward(self, x, *, scale):
            return {"y": x * scale, "n": x.sum(0)}

    batch = torch.export.Dim("batch", min=2, max=64)
    out = aot.export(
        M(),
        args=(torch.randn(3, 4),),
        kwargs={"scale": torch.tensor(2.0)},
        dynamic_shapes={"x": {0: batch}, "scale": None},
    )
    m = R.load_module(out)
    reflection = dict(m._vm_module.lookup_function("main").reflection)
    reflection["iree.abi.declaration"] = (
        "sync func @main(%input0: tensor<?x4xf32>, %input1: tensor<f32> "
        "{iree.abi.affinity = #hal.device.promise<@__device_0>}) -> "
        "(%output0: tensor<?x4xf32>, %output1: tensor<4xf32>)"
    )
    assert function_signature("main", reflection).call is not None
    return reflection


def _splice(vmfb: bytes, old: bytes, new: bytes) -> bytes:
    """``vmfb`` with every copy of the string ``old`` (``main`` and ``main$async`` carry the
    same records) overwritten by ``new`` of the same length: the file's structure is intact,
    only the record's bytes are damaged."""
    assert len(old) == len(new) and old in vmfb
    return vmfb.replace(old, new)


def _call_once(vmfb: bytes, params: Path) -> None:
    """Loads and calls ``main`` once; a TurbineRuntimeError propagates, anything else fails."""
    m = R.load_module(vmfb, parameters=params)
    m.main(torch.zeros(2, 4))


# ----------------------------------------------------------------------------- the issue's cases
def _non_utf8(reflection: dict[str, str]) -> tuple[bytes, bytes]:
    old = reflection[SIGNATURE_KEY].encode()
    return old, b"\xff\xfe" + old[2:]


def _bad_json(reflection: dict[str, str]) -> tuple[bytes, bytes]:
    old = reflection[ARGS_SCHEMA].encode()
    return old, old.replace(b'"type":', b'"type";', 1)


def _no_children_spec(reflection: dict[str, str]) -> tuple[bytes, bytes]:
    old = reflection[ARGS_SCHEMA].encode()
    return old, old.replace(b'"children_spec"', b'"children_spaz"', 1)


@pytest.mark.parametrize(
    ("damage", "what", "cause"),
    [
        (
            _non_utf8,
            r"the reflection \(signature record\) of function \d+ \('main'\)",
            RuntimeError,
        ),
        (_bad_json, r"function 'main': its argument tree \(torch.args_schema\)", ValueError),
        (_no_children_spec, r"function 'main': its argument tree \(torch.args_schema\)", KeyError),
    ],
    ids=["not-utf8", "bad-json", "no-children_spec"],
)
def test_the_issues_damaged_records_are_turbine_errors_naming_file_and_record(
    linear, tmp_path, damage, what, cause
):
    """Failing-first: these raised a raw RuntimeError (not UTF-8), JSONDecodeError and
    KeyError: 'children_spec' from load_module or the first call."""
    vmfb, params, reflection = linear
    old, new = damage(reflection)
    bad = tmp_path / "damaged.vmfb"
    bad.write_bytes(_splice(vmfb, old, new))
    for source, named in (
        (bad, r"'.*damaged\.vmfb'"),
        (bad.read_bytes(), "the given module bytes"),
    ):
        with pytest.raises(R.TurbineRuntimeError, match=rf"^{named}: {what} is unreadable") as e:
            _call_once(source, params)
        assert "the module is damaged: rebuild it" in str(e.value)
        assert isinstance(e.value.__cause__, cause)
    # The checked load reads the records with the same reader: the same error, no child crash.
    with pytest.raises(R.TurbineRuntimeError, match=rf"{what} is unreadable"):
        R.load_module(bad, parameters=params, check_in_child=True)


def test_an_intact_module_still_loads_and_calls(linear):
    vmfb, params, _ = linear
    m = R.load_module(vmfb, parameters=params)
    x = torch.randn(2, 4)
    assert m.main(x).shape == (2, 3)
    assert m.main.signature.call is not None


# ----------------------------------------------------------------------------- the readers
_json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**66), 2**66),
        st.floats(allow_nan=True),
        st.sampled_from(["", "tensor", "scalar", "constant", "s0", "2*s0 + 1", "f32", "x"]),
        st.text(max_size=6),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _edit_json(doc, path, value, delete: bool):
    if not path:
        return value
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@st.composite
def _damaged(draw, reflection: dict[str, str]) -> dict[str, str]:
    """A reflection with one record damaged: text edits (bytes as a damaged file gives them,
    as far as a str can hold them), a JSON field removed or given another type, a record
    dropped."""
    out = dict(reflection)
    key = draw(st.sampled_from([*_RECORDS, "iree.abi.declaration"]))
    kind = draw(st.sampled_from(["text", "json", "json", "drop"]))
    text = out.get(key, "")
    if kind == "drop" or key not in out:
        out.pop(key, None)
    elif kind == "text":
        chars = list(text)
        for pos, ch in draw(
            st.lists(st.tuples(st.integers(0, 10**6), st.characters()), max_size=6)
        ):
            if chars:
                chars[pos % len(chars)] = ch
        cut = draw(st.one_of(st.none(), st.integers(0, len(chars))))
        out[key] = "".join(chars[:cut] if cut is not None else chars)
    else:
        try:
            doc = json.loads(text)
        except ValueError:
            doc = text
        for pick, value, delete in draw(
            st.lists(
                st.tuples(st.integers(0, 10**6), _json_values, st.booleans()),
                min_size=1,
                max_size=3,
            )
        ):
            paths = list(_paths(doc))
            path = paths[pick % len(paths)]
            doc = _edit_json(copy.deepcopy(doc), path, value, delete and bool(path))
        out[key] = json.dumps(doc)
    return out


def _zeros_for(sig) -> list:
    """Flat arguments that fit the record's leaves (dynamic dims at their minimum, at least 1)."""
    call = sig.call
    sizes = {s: max(lo, 1) for s, (lo, _hi) in call.dims.items()}
    flat = []
    for leaf in call.flat_inputs():
        if leaf.kind != "tensor":
            flat.append(0)
            continue
        shape = [d if isinstance(d, int) and d < 64 else sizes.get(d, 1) for d in leaf.shape]
        dtype = element_type_name(leaf.dtype) if isinstance(leaf.dtype, str) else None
        flat.append(torch.zeros(shape[:6], dtype=dtype or torch.float32))
    return flat


def _exercise(sig) -> None:
    """What a call does with the records: bind arguments, check them, rebuild the results."""
    call = sig.call
    if call is None:
        return
    flat = _zeros_for(sig)
    try:
        call.check_flat("main", flat)
        args, kwargs = call.unflatten_inputs(flat)
        call.bind("main", args, kwargs)
    except R.TurbineRuntimeError:
        pass
    if call.return_schema is not None:
        with contextlib.suppress(R.TurbineRuntimeError):
            rebuild_results(call, [torch.zeros(1)] * max(len(sig.outputs), len(call.results)))


def _read_or_refuse(reflection: dict[str, str]) -> None:
    _TRIED["records"] += 1
    try:
        sig = function_signature("main", reflection, where="'m.vmfb'")
    except R.TurbineRuntimeError as e:
        _TRIED["refused"] += 1
        assert str(e).startswith("'m.vmfb': function 'main': ")
        assert "damaged" in str(e)
        assert e.__cause__ is not None
        return
    _TRIED["read"] += 1
    _exercise(sig)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_damaged_records_are_read_or_refused_with_a_turbine_error(linear, dynamic_reflection, data):
    base = data.draw(st.sampled_from([linear[2], dynamic_reflection]))
    _read_or_refuse(data.draw(_damaged(base)))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    text=st.one_of(
        st.text(max_size=200), st.from_regex(r"sync func @\w+\((%\w+: .{0,40})?\) -> .{0,40}")
    )
)
def test_any_abi_declaration_parses(text):
    sig = parse_abi_declaration("main", text)
    assert all(d is None or isinstance(d, int) for s in sig.inputs + sig.outputs for d in s.shape)


# ----------------------------------------------------------------------------- the loader
@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_damaged_record_bytes_in_a_module_load_or_raise_a_turbine_error(linear, data):
    """The records' bytes overwritten in a real module (random bytes, mostly not UTF-8, or a
    few bytes of the record changed): loading and one call give a result or a
    TurbineRuntimeError naming the module."""
    vmfb, params, reflection = linear
    old = reflection[data.draw(st.sampled_from(_RECORDS))].encode()
    if data.draw(st.booleans()):
        new = data.draw(st.binary(min_size=len(old), max_size=len(old)))
    else:
        b = bytearray(old)
        for pos, x in data.draw(
            st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4)
        ):
            b[pos % len(b)] = x
        new = bytes(b)
    _TRIED["modules"] += 1
    try:
        m = R.load_module(_splice(vmfb, old, new), parameters=params)
    except R.TurbineRuntimeError as e:
        _TRIED["modules refused"] += 1
        assert str(e).startswith("the given module bytes: ")
        assert e.__cause__ is not None
        return
    try:
        m.main(torch.zeros(2, 4))
    except R.TurbineRuntimeError:  # e.g. the record now says another shape: a call error
        _TRIED["modules refused"] += 1


def test_records_of_a_newer_format_or_pytree_protocol_mean_flat_calls(linear, caplog):
    """Not damage: a module written by a newer turbine-aot or torch is called with flat
    arguments (a warning says why), as before."""
    reflection = dict(linear[2])
    newer = dict(reflection, **{SIGNATURE_KEY: json.dumps({"format": 99})})
    assert function_signature("main", newer).call is None
    protocol = reflection[ARGS_SCHEMA].replace("[1,", "[7,", 1)
    with caplog.at_level("WARNING", logger="turbine.aot.runtime"):
        assert function_signature("main", dict(reflection, **{ARGS_SCHEMA: protocol})).call is None
    assert "uses pytree protocol 7, newer than this torch reads" in caplog.text
