"""Property-based fuzzing: mutated archives either read or raise ParameterArchiveError.

Bounded by a fixed number of examples (a few seconds in all). No per-example deadline: on a
loaded CI machine a deadline makes the test flaky without making it any more bounded.
"""

from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from turbine_params import (  # noqa: E402
    ParameterArchive,
    ParameterArchiveBuilder,
    ParameterArchiveError,
    TensorMetadata,
    dtype_info,
)


def _seed_archive() -> bytes:
    import os
    import tempfile

    b = ParameterArchiveBuilder()
    b.add_tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    b.add_splat("s", np.int16(3), shape=(5,))
    b.add_skip("gone")
    b.add_blob("raw", b"0123456789")
    b.add_blob("bf", bytes(8), metadata=TensorMetadata(dtype_info("bfloat16"), (2, 2)).encode())
    b.add_tensor("w", np.ones(2, np.int64))  # duplicate key
    with tempfile.TemporaryDirectory() as d:
        path = b.save(os.path.join(d, "seed.irpa"))
        return path.read_bytes()


_TRIED = {"mutated archives read": 0, "mutated tables parsed twice": 0}


@pytest.fixture(scope="module", autouse=True)
def _report_count():
    """Prints how many inputs the fuzz tests tried (``pytest -s`` shows it)."""
    yield
    print(f"\nirpa fuzz: inputs tried: {_TRIED}")


SEED = _seed_archive()
HEAD = struct.unpack_from("<Q", SEED, 64)[0] + struct.unpack_from("<Q", SEED, 56)[0]


def _read_everything(path, mmap: bool = True) -> None:
    with ParameterArchive(path, mmap=mmap) as archive:
        for _, e in archive.items():
            e.as_flat_array()
            try:
                md = e.tensor_metadata
            except ParameterArchiveError:
                continue
            if md is not None:
                with contextlib.suppress(ParameterArchiveError):
                    e.as_array()


mutation = st.tuples(st.integers(0, HEAD + 64), st.integers(0, 255))
field_write = st.tuples(
    st.integers(0, HEAD // 4).map(lambda i: i * 4),
    st.sampled_from([0, 1, 7, 16, 60, 64, 85, 4095, 4096, 2**31, 2**63, 2**64 - 1]),
)


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(
    mutations=st.lists(mutation, max_size=8),
    fields=st.lists(field_write, max_size=3),
    truncate=st.one_of(st.none(), st.integers(0, len(SEED))),
)
def test_mutated_archives_never_crash(tmp_path_factory, mutations, fields, truncate):
    data = bytearray(SEED)
    for pos, val in mutations:
        data[pos] = val
    for pos, val in fields:
        if pos + 8 <= len(data):
            struct.pack_into("<Q", data, pos, val)
    if truncate is not None:
        del data[truncate:]
    path = tmp_path_factory.mktemp("fuzz") / "m.irpa"
    path.write_bytes(bytes(data))
    _TRIED["mutated archives read"] += 1
    for mmap in (True, False):
        try:
            _read_everything(path, mmap=mmap)
        except ParameterArchiveError as e:
            assert str(path) in str(e)


def _parse(data: bytes, fast: bool):
    from turbine_params._irpa_parser import parse_archive
    from turbine_params._irpa_vectorized import EntryTable

    def read(off: int, n: int) -> bytes:
        return data[off : off + n]

    try:
        items, _ = parse_archive(read, len(data), "mem.irpa", fast=fast)
    except ParameterArchiveError as e:
        return ("error", e.offset, e.reason)
    raws = []
    for item in items:
        raws.extend(item.raw_entries() if isinstance(item, EntryTable) else [item])
    return [
        (r.type, r.key, r.metadata, r.entry_offset, r.length, r.data_offset, r.splat_pattern)
        for r in raws
    ]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    mutations=st.lists(mutation, max_size=6),
    fields=st.lists(field_write, max_size=3),
)
def test_vectorized_parser_agrees_with_exact_parser(mutations, fields):
    """The fast numpy path accepts exactly what the per-entry parser accepts, with equal results
    (on any doubt it defers to the exact parser, so errors are identical too)."""
    data = bytearray(SEED)
    for pos, val in mutations:
        data[pos] = val
    for pos, val in fields:
        if pos + 8 <= len(data):
            struct.pack_into("<Q", data, pos, val)
    _TRIED["mutated tables parsed twice"] += 1
    assert _parse(bytes(data), True) == _parse(bytes(data), False)


def test_fast_path_is_used_for_well_formed_archives():
    from turbine_params._irpa_parser import parse_archive
    from turbine_params._irpa_vectorized import EntryTable

    items, _ = parse_archive(lambda o, n: SEED[o : o + n], len(SEED), "seed", fast=True)
    assert len(items) == 1 and isinstance(items[0], EntryTable) and items[0].count == 6


def test_seed_reads():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "seed.irpa"
        p.write_bytes(SEED)
        _read_everything(p)
        assert [k for k, _ in ParameterArchive(p).items()] == ["w", "s", "raw", "bf", "w"]


entry_spec = st.one_of(
    st.tuples(
        st.just("array"),
        st.sampled_from(["<f4", "<f8", "<i8", "u1", "?", "<c8", "<u2"]),
        st.lists(st.integers(0, 5), max_size=3),
    ),
    st.tuples(st.just("splat"), st.sampled_from([1, 2, 4, 8, 16]), st.integers(0, 64)),
    st.tuples(st.just("blob"), st.binary(max_size=100), st.just(None)),
)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    entries=st.lists(st.tuples(st.text(max_size=12), entry_spec), max_size=8),
    alignment=st.sampled_from([1, 8, 64, 4096]),
)
def test_random_archives_round_trip(tmp_path_factory, entries, alignment):
    """Whatever is added (any Unicode keys, duplicates, dtypes, shapes, splats, blobs) reads
    back identically, through both parsers."""
    rng = np.random.default_rng(0)
    b = ParameterArchiveBuilder(data_alignment=alignment)
    expected = []
    for key, (kind, a, c) in entries:
        if kind == "array":
            arr = rng.integers(0, 255, size=int(np.prod(c)) * np.dtype(a).itemsize, dtype=np.uint8)
            arr = (
                arr.view(np.dtype(a)).reshape(c)
                if np.dtype(a).kind != "b"
                else (arr % 2).astype("?").reshape(c)
            )
            b.add_tensor(key, arr)
            expected.append((key, arr.tobytes()))
        elif kind == "splat":
            pattern = bytes(rng.integers(0, 255, size=a, dtype=np.uint8))
            b.add_splat(key, pattern, length=a * c)
            expected.append((key, pattern * c))
        else:
            b.add_blob(key, a)
            expected.append((key, a))
    path = b.save(tmp_path_factory.mktemp("rt") / "r.irpa")
    data = path.read_bytes()
    assert _parse(data, True) == _parse(data, False)
    with ParameterArchive(path) as archive:
        got = [(k, e.as_flat_array().tobytes()) for k, e in archive.items()]
    assert got == expected
