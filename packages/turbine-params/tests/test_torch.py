"""torch tensors: every dtype, modules, tied weights, zero-copy views, copy-on-write safety."""

from __future__ import annotations

import ctypes
import json
import warnings

import pytest

torch = pytest.importorskip("torch")

from turbine_params import (  # noqa: E402
    ParameterArchive,
    ParameterArchiveBuilder,
    ParameterArchiveError,
    known_dtype_names,
    save_module_parameters,
)


def _torch_dtypes():
    out = []
    for name in known_dtype_names():
        dt = getattr(torch, name, None)
        if isinstance(dt, torch.dtype):
            out.append(dt)
    return out


def _sample(dtype, shape):
    n = 1
    for s in shape:
        n *= s
    raw = (torch.arange(n * dtype.itemsize, dtype=torch.int64) * 37 % 251).to(torch.uint8)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", _torch_dtypes(), ids=str)
@pytest.mark.parametrize("shape", [(3, 2), (), (0, 5)], ids=str)
def test_every_torch_dtype_round_trips(tmp_path, dtype, shape):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is "experimental"
        t = _sample(dtype, shape)
        b = ParameterArchiveBuilder()
        b.add_tensor("t", t)
        with ParameterArchive(b.save(tmp_path / "t.irpa")) as archive:
            e = archive["t"]
            got = e.as_tensor()
            assert got.dtype == dtype and tuple(got.shape) == shape
            assert torch.equal(got.view(torch.uint8), t.view(torch.uint8)) if shape else True
            assert bytes(got.reshape(-1).view(torch.uint8).numpy()) == bytes(
                t.reshape(-1).view(torch.uint8).numpy()
            )
            md = json.loads(e.metadata[len(b"PYTORCH:") :])
            assert md["type"] == "Tensor" and md["dtype"] == str(dtype).removeprefix("torch.")
            assert md["shape"] == list(shape)
            assert md["dtype_desc"]["itemsize"] == dtype.itemsize


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.complex64, torch.bool]
)
def test_torch_splats(tmp_path, dtype):
    value = torch.ones((), dtype=dtype)
    b = ParameterArchiveBuilder()
    b.add_splat("s", value, shape=(4, 3))
    with ParameterArchive(b.save(tmp_path / "s.irpa")) as archive:
        got = archive["s"].as_tensor()
        assert got.dtype == dtype and got.shape == (4, 3)
        assert torch.equal(
            got.contiguous().view(torch.uint8), value.expand(4, 3).contiguous().view(torch.uint8)
        )
        assert got.stride() == (0, 0)  # a view of the pattern
        assert archive["s"].as_flat_tensor().numel() == 12 * dtype.itemsize


def test_python_number_splat_needs_dtype_and_encodes_bf16(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_splat("h", 1.5, dtype=torch.bfloat16, shape=(2,))
    with ParameterArchive(b.save(tmp_path / "h.irpa")) as archive:
        torch.testing.assert_close(
            archive["h"].as_tensor(), torch.full((2,), 1.5, dtype=torch.bfloat16)
        )


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.proj = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 64, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("steps", torch.tensor(7, dtype=torch.int64))
        self.register_buffer("scratch", torch.zeros(1000), persistent=False)


def test_save_module_parameters_with_tied_weights(tmp_path):
    m = Tied()
    path = tmp_path / "tied"
    save_module_parameters(path, m, prefix="model.")
    with ParameterArchive(tmp_path / "tied.irpa") as archive:
        assert set(archive.keys()) == {f"model.{k}" for k in m.state_dict()}
        assert "model.scratch" not in archive
        for k, v in m.state_dict().items():
            torch.testing.assert_close(archive[f"model.{k}"].as_tensor(), v)
        a, b = archive["model.embed.weight"].raw, archive["model.head.weight"].raw
        assert (a.offset, a.length) == (b.offset, b.length)
        stored = sum(e.raw.length for _, e in archive.items())
        assert archive.index.raw_entries  # sanity
    size = (tmp_path / "tied.irpa").stat().st_size
    assert size < stored  # the tied 64x32 float matrix is stored once


def test_non_contiguous_and_conj_tensors(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    c = torch.complex(base, -base).conj()
    b = ParameterArchiveBuilder()
    b.add_tensor("t", base.t())
    b.add_tensor("slice", base[:, 1::2])
    b.add_tensor("conj", c)
    b.add_tensor("grad", torch.nn.Parameter(torch.ones(3)))
    with ParameterArchive(b.save(tmp_path / "nc.irpa")) as archive:
        torch.testing.assert_close(archive["t"].as_tensor(), base.t().contiguous())
        torch.testing.assert_close(archive["slice"].as_tensor(), base[:, 1::2].contiguous())
        torch.testing.assert_close(archive["conj"].as_tensor(), c.resolve_conj())
        assert not archive["grad"].as_tensor().requires_grad


def test_as_tensor_is_zero_copy(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("w", torch.randn(256, 256))
    with ParameterArchive(b.save(tmp_path / "z.irpa")) as archive:
        mapping = archive["w"].raw.file.mapping
        start = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        t = archive["w"].as_tensor()
        assert start <= t.data_ptr() and t.data_ptr() + t.nbytes <= start + len(mapping)
        assert t.data_ptr() == start + archive["w"].raw.offset
        del t


def test_writing_into_read_only_archive_tensor_is_safe(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("w", torch.zeros(64))
    path = b.save(tmp_path / "ro.irpa")
    before = path.read_bytes()
    archive = ParameterArchive(path)
    t = archive["w"].as_tensor()
    t.add_(1.0)  # copy-on-write: no segfault, file untouched
    assert torch.equal(t, torch.ones(64))
    del t
    archive.close()
    assert path.read_bytes() == before


def test_writable_archive_updates_file(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("w", torch.zeros(8))
    path = b.save(tmp_path / "rw.irpa")
    archive = ParameterArchive(path, writable=True)
    t = archive["w"].as_tensor()
    t.fill_(3.0)
    del t
    archive.close()
    with ParameterArchive(path) as again:
        assert torch.equal(again["w"].as_tensor(), torch.full((8,), 3.0))


def test_mmap_false_returns_owned_tensors(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_tensor("w", torch.arange(10.0))
    with ParameterArchive(b.save(tmp_path / "nm.irpa"), mmap=False) as archive:
        t = archive["w"].as_tensor()
        torch.testing.assert_close(t, torch.arange(10.0))
        t.zero_()
        torch.testing.assert_close(archive["w"].as_tensor(), torch.arange(10.0))


def test_as_tensor_without_metadata_raises_value_error(tmp_path):
    b = ParameterArchiveBuilder()
    b.add_blob("blob", torch.arange(4, dtype=torch.uint8))
    with ParameterArchive(b.save(tmp_path / "b.irpa")) as archive:
        assert torch.equal(archive["blob"].as_flat_tensor(), torch.arange(4, dtype=torch.uint8))
        with pytest.raises(ValueError, match="no PYTORCH tensor metadata"):
            archive["blob"].as_tensor()


def test_rejects_quantized_and_meta():
    b = ParameterArchiveBuilder()
    with pytest.raises(ParameterArchiveError, match="meta device"):
        b.add_tensor("m", torch.empty(3, device="meta"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)
    with pytest.raises(ParameterArchiveError, match="quantized"):
        b.add_tensor("q", q)


def test_builder_streams_without_copying(tmp_path):
    """Adding a tensor holds a reference; changes before save are what gets written."""
    t = torch.zeros(4)
    b = ParameterArchiveBuilder()
    b.add_tensor("t", t)
    t.fill_(2.0)
    with ParameterArchive(b.save(tmp_path / "late.irpa")) as archive:
        assert torch.equal(archive["t"].as_tensor(), torch.full((4,), 2.0))


@pytest.mark.parametrize(
    ("pattern", "dtype", "expected"),
    [
        (b"\x00", torch.float32, 0.0),  # what IREE's `iree-convert-parameters --strip` writes
        (b"\x00\x3c", torch.float16, 1.0),  # half 1.0 (0x3c00) repeated, pattern < element
        (torch.tensor([1.0, 2.0]).numpy().tobytes(), torch.float32, [1.0, 2.0] * 3),
    ],
)
def test_splat_pattern_not_one_element_as_tensor(tmp_path, pattern, dtype, expected):
    from turbine_params import TensorMetadata, dtype_info

    md = TensorMetadata(dtype_info(str(dtype)), (2, 3))
    b = ParameterArchiveBuilder()
    b.add_splat("s", pattern, length=md.nbytes, metadata=md.encode())
    with ParameterArchive(b.save(tmp_path / "s.irpa")) as archive:
        got = archive["s"].as_tensor()
    want = torch.tensor(expected, dtype=dtype).broadcast_to((6,)).reshape(2, 3)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want)
