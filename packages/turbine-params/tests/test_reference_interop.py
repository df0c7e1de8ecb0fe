"""Archives interoperate with the reference ``iree.turbine.aot`` in both directions.

Frozen fixtures in ``tests/data`` (``make_fixtures.py`` wrote them): ``reference_format.irpa`` is
written as the reference writes archives (IREE's ``ParameterIndex`` with ``PYTORCH:`` metadata
whose dtype is ``"float32"``, ``"bfloat16"``, ...), ``turbine_format.irpa`` by turbine. The
reference's reader is emulated by :func:`reference_read`: IREE's ``ParameterIndex`` plus a lookup
of the metadata's dtype in a table of names without the ``torch.`` prefix, failing as the
reference does ("Unknown dtype name 'torch.float32'") on other spellings.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from turbine_params import (
    ParameterArchive,
    ParameterArchiveBuilder,
    ParameterArchiveError,
    TensorMetadata,
    save_module_parameters,
)

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = DATA / "reference_format.irpa"
TURBINE = DATA / "turbine_format.irpa"

_spec = importlib.util.spec_from_file_location("make_fixtures", DATA / "make_fixtures.py")
assert _spec is not None and _spec.loader is not None
fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixtures)


def _torch():
    return pytest.importorskip("torch", reason="torch is needed to view bf16/bool entries")


def _rt():
    try:
        import iree.runtime as rt
    except ImportError:
        pytest.skip("iree-base-runtime is not installed (the standalone session has numpy only)")
    return rt


def _expected_tensor(key: str):
    torch = _torch()
    dtype, shape, data = fixtures.EXPECTED[key]
    return torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype)).reshape(shape)


def reference_read(path: Path) -> dict:
    """Reads an archive as the reference does: tensors for PYTORCH entries, bytes otherwise."""
    torch = _torch()
    rt = _rt()
    plain = (
        "float64 float32 float16 bfloat16 int64 int32 int16 int8 uint8 bool complex64 complex128"
    )
    names = {n: getattr(torch, n) for n in plain.split()}
    index = rt.ParameterIndex()
    index.load(str(path))
    out: dict = {}
    for key, raw in index.items():
        md = raw.metadata.decode()
        if raw.is_splat:
            pattern = torch.frombuffer(bytearray(raw.splat_pattern), dtype=torch.uint8)
            flat = pattern.repeat(raw.length // len(raw.splat_pattern))
        else:
            flat = torch.frombuffer(bytearray(raw.file_view), dtype=torch.uint8)
        if not md.startswith("PYTORCH:"):
            out[key] = bytes(flat.numpy())
            continue
        props = json.loads(md[len("PYTORCH:") :])
        if props["dtype"] not in names:
            raise ValueError(f"Unknown dtype name '{props['dtype']}'")
        out[key] = flat.view(names[props["dtype"]]).reshape(props["shape"])
    return out


def _check_contents(tensors: dict) -> None:
    torch = _torch()
    for key in fixtures.EXPECTED:
        torch.testing.assert_close(tensors[key], _expected_tensor(key), rtol=0, atol=0)
    torch.testing.assert_close(tensors[fixtures.SPLAT_KEY], torch.zeros(8), rtol=0, atol=0)
    assert json.loads(tensors[fixtures.CONFIG_KEY]) == fixtures.CONFIG


def _turbine_read(path: Path) -> dict:
    with ParameterArchive(path) as archive:
        out = {
            k: (e.as_tensor().clone() if e.tensor_metadata else bytes(e.raw.file_view))
            for k, e in archive.items()
        }
    return out


def test_turbine_reads_the_reference_format_fixture():
    _torch()
    _check_contents(_turbine_read(REFERENCE))


def test_turbine_reads_the_reference_format_fixture_with_numpy_alone():
    """Without torch (the standalone session), metadata and every numpy-viewable entry read."""
    with ParameterArchive(REFERENCE) as archive:
        assert archive["model.norm.weight"].dtype_name == "torch.bfloat16"
        assert archive["model.embed.weight"].shape == (3, 4)
        np.testing.assert_array_equal(
            archive["model.positions"].as_array(), np.arange(5, dtype=np.int64)
        )
        for key, (dtype, shape, data) in fixtures.EXPECTED.items():
            if dtype in ("bfloat16", "bool"):
                continue
            np.testing.assert_array_equal(
                archive[key].as_array(), np.frombuffer(data, dtype=dtype).reshape(shape)
            )
        assert json.loads(bytes(archive[fixtures.CONFIG_KEY].raw.file_view)) == fixtures.CONFIG


def test_reference_reader_reads_the_frozen_turbine_fixture():
    _check_contents(reference_read(TURBINE))


def test_turbine_still_writes_the_frozen_fixture(tmp_path):
    """What turbine writes today is byte-identical to the frozen fixture, and to the reference."""
    _torch()
    fixtures.write_turbine(tmp_path / "now.irpa")
    now = (tmp_path / "now.irpa").read_bytes()
    assert now == TURBINE.read_bytes()
    assert now == REFERENCE.read_bytes()
    _check_contents(reference_read(tmp_path / "now.irpa"))


def test_round_trip_turbine_to_reference_and_back(tmp_path):
    """turbine archive -> reference reader -> reference writer -> turbine reader."""
    rt = _rt()
    torch = _torch()
    tensors = reference_read(TURBINE)
    index = rt.ParameterIndex()
    for key, value in tensors.items():
        if isinstance(value, bytes):
            index.add_buffer(key, np.frombuffer(value, np.uint8))
            continue
        dtype = str(value.dtype).removeprefix("torch.")
        data = value.contiguous().view(torch.uint8).numpy()
        index.add_buffer(key, data, metadata=fixtures.reference_metadata(dtype, tuple(value.shape)))
    path = tmp_path / "via_reference.irpa"
    index.create_archive_file(str(path))
    _check_contents(_turbine_read(path))


def test_metadata_writes_dtype_names_without_the_torch_prefix(tmp_path):
    torch = _torch()
    m = torch.nn.Linear(2, 3).to(torch.bfloat16)
    save_module_parameters(tmp_path / "m.irpa", m)
    with ParameterArchive(tmp_path / "m.irpa") as archive:
        md = json.loads(archive["weight"].metadata.removeprefix(b"PYTORCH:"))
    assert md["dtype"] == "bfloat16"
    assert md["shape"] == [3, 2]
    assert md["dtype_desc"]["itemsize"] == 2
    reference_read(tmp_path / "m.irpa")  # no "Unknown dtype name"


def test_reader_accepts_the_torch_prefixed_spelling(tmp_path):
    """Archives written by earlier turbine versions say "torch.float32": still readable."""
    b = ParameterArchiveBuilder()
    legacy = b'PYTORCH:{"type": "Tensor", "dtype": "torch.float32", "shape": [2]}'
    b.add_blob("w", np.array([1.5, -2.0], np.float32), metadata=legacy)
    path = b.save(tmp_path / "legacy.irpa")
    with ParameterArchive(path) as archive:
        np.testing.assert_array_equal(archive["w"].as_array(), [1.5, -2.0])
        assert archive["w"].dtype_name == "torch.float32"
    with pytest.raises(ValueError, match=r"Unknown dtype name 'torch\.float32'"):
        reference_read(path)  # why the writer changed: the reference cannot read this spelling
    assert TensorMetadata.decode(legacy) == TensorMetadata.decode(
        legacy.replace(b"torch.float32", b"float32")
    )


@pytest.mark.parametrize("mmap", [True, False])
def test_raw_entry_offers_iree_parameter_index_entry_attributes(mmap):
    """entry.raw has the attributes of iree.runtime.ParameterIndexEntry, with the same values."""
    rt = _rt()
    iree_index = rt.ParameterIndex()
    iree_index.load(str(REFERENCE))
    theirs = dict(iree_index.items())
    with ParameterArchive(REFERENCE, mmap=mmap) as archive:
        assert archive.keys() == list(theirs)
        for key, entry in archive.items():
            ours, ref = entry.raw, theirs[key]
            assert (ours.key, ours.length, ours.metadata) == (ref.key, ref.length, ref.metadata)
            assert type(ours.metadata) is bytes and type(ours.length) is int
            assert (ours.is_file, ours.is_splat) == (ref.is_file, ref.is_splat)
            if ref.is_file:
                # IREE gives (FileHandle, offset); turbine (path, offset) of the same bytes.
                assert ours.file_storage == (str(REFERENCE), ref.file_storage[1])
                view = ours.file_view
                assert isinstance(view, memoryview)
                assert (view.format, view.readonly, view.nbytes) == ("B", True, ref.length)
                assert bytes(view) == bytes(ref.file_view)
            else:
                assert ours.splat_pattern == ref.splat_pattern
                assert type(ours.splat_pattern) is bytes
                with pytest.raises(ValueError, match="not file storage based"):
                    _ = ours.file_view
                with pytest.raises(ValueError, match="not file storage based"):
                    _ = ref.file_view
        # A client reading its JSON config blob, as model libraries do.
        config = json.loads(bytes(archive[fixtures.CONFIG_KEY].raw.file_view))
        assert config == fixtures.CONFIG


def test_file_view_is_zero_copy_over_the_mapping():
    with ParameterArchive(REFERENCE) as archive:
        entry = archive["model.embed.weight"]
        view = np.frombuffer(entry.raw.file_view, dtype=np.uint8)
        assert np.shares_memory(view, entry.as_flat_array())
        with pytest.raises(ValueError):
            view[0] = 1  # read-only, as IREE's


def test_file_view_of_a_splat_is_a_clear_error():
    with (
        ParameterArchive(REFERENCE) as archive,
        pytest.raises(ParameterArchiveError, match=r"'model\.zeros' is not file storage"),
    ):
        _ = archive[fixtures.SPLAT_KEY].raw.file_view


def test_prefix_joins_with_a_dot(tmp_path):
    """save_module_parameters / add_module / externalize_module_parameters: "<prefix>.<name>"."""
    torch = _torch()
    from turbine_params import ExternalTensorTrait, externalize_module_parameters

    m = torch.nn.Sequential()
    m.add_module("classifier", torch.nn.Linear(2, 2))
    save_module_parameters(tmp_path / "a.irpa", m, prefix="foobar.model")
    b = ParameterArchiveBuilder()
    b.add_module(m, prefix="foobar.model")
    b.save(tmp_path / "b.irpa")
    for name in ("a.irpa", "b.irpa"):
        with ParameterArchive(tmp_path / name) as archive:
            assert archive.keys() == [
                "foobar.model.classifier.weight",
                "foobar.model.classifier.bias",
            ]
    externalize_module_parameters(m, prefix="foobar.model")
    trait = ExternalTensorTrait.get(m.classifier.weight)
    assert trait is not None and trait.external_name == "foobar.model.classifier.weight"
    # A prefix that already ends with a dot gets no second one; no prefix, no dot.
    externalize_module_parameters(m, prefix="p.")
    assert ExternalTensorTrait.get(m.classifier.bias).external_name == "p.classifier.bias"
    externalize_module_parameters(m)
    assert ExternalTensorTrait.get(m.classifier.bias).external_name == "classifier.bias"
