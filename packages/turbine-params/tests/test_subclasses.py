"""Tensor subclasses (torchao's quantized weights) in archives: inner tensors, int4 packed.

torchao is a dev requirement; the tests needing it skip when it is absent (and all of them in
the numpy-only session).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from turbine_params import (  # noqa: E402
    ParameterArchive,
    ParameterArchiveBuilder,
    ParameterArchiveError,
    TensorMetadata,
    archive_tensors,
    describe_archive,
    externalize_module_parameters,
    pack_int4,
    save_module_parameters,
    unpack_int4,
    verify_archive,
)


def _torchao():
    return pytest.importorskip(
        "torchao.quantization", reason="torchao is a dev requirement (tools/requirements-dev.txt)"
    )


def _quantized(config, *, out=256, inp=512, bias=True):
    q = _torchao()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(inp, out, bias=bias)).eval()
    q.quantize_(m, config(q))
    return m


def _int8(q):
    return q.Int8WeightOnlyConfig()


def _int4(group):
    def config(q):
        from torchao.quantization.granularity import PerGroup

        return q.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group))

    return config


# ------------------------------------------------------------------------------ int4 packing
def test_pack_int4_layout_is_low_nibble_first_and_round_trips():
    values = torch.tensor([[-8, 7, 0, -1], [1, 2, -3, 4]], dtype=torch.int8)
    packed = pack_int4(values)
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == (2, 2)
    # element 2i in the low nibble, 2i + 1 in the high one (IREE's i4 layout)
    assert packed[0].tolist() == [0x8 | (0x7 << 4), 0x0 | (0xF << 4)]
    assert torch.equal(unpack_int4(packed), values)
    assert np.array_equal(unpack_int4(packed.numpy(), (2, 4)), values.numpy())
    every = torch.arange(-8, 8, dtype=torch.int8).repeat(3, 2)
    assert torch.equal(unpack_int4(pack_int4(every)), every)


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.tensor([[8, 0]], dtype=torch.int8), r"values in \[0, 8\], outside \[-8, 7\]"),
        (torch.zeros(2, 3, dtype=torch.int8), "even last dimension"),
        (torch.zeros(2, 2, dtype=torch.int32), "needs an int8 tensor"),
    ],
)
def test_pack_int4_refuses_what_is_not_int4_data(bad, match):
    with pytest.raises(ParameterArchiveError, match=match):
        pack_int4(bad)


def test_packed_metadata_round_trips_and_is_checked():
    md = TensorMetadata(
        TensorMetadata.decode(b'PYTORCH:{"dtype": "uint8", "shape": [4, 8]}').dtype,
        (4, 8),
        ("int4", (4, 16)),
    )
    raw = md.encode()
    assert json.loads(raw[len(b"PYTORCH:") :])["packed"] == {"dtype": "int4", "shape": [4, 16]}
    assert TensorMetadata.decode(raw) == md
    wrong_size = (
        b'PYTORCH:{"dtype": "uint8", "shape": [4, 8], "packed": {"dtype": "int4", "shape": [4, 8]}}'
    )
    with pytest.raises(ParameterArchiveError, match="does not fill the stored uint8"):
        TensorMetadata.decode(wrong_size)
    with pytest.raises(ParameterArchiveError, match="'packed' must be"):
        TensorMetadata.decode(
            b'PYTORCH:{"dtype": "uint8", "shape": [2], "packed": {"dtype": "int3"}}'
        )


# ------------------------------------------------------------------------ torchao subclasses
def test_int8_weight_only_module_archives_its_inner_tensors(tmp_path):
    m = _quantized(_int8)
    path = tmp_path / "int8.irpa"
    save_module_parameters(path, m)
    with ParameterArchive(path) as a:
        assert sorted(a.keys()) == [
            "0.bias",
            "0.weight.qdata",
            "0.weight.scale",
            "0.weight.zero_point",
        ]
        w = m[0].weight
        assert torch.equal(a["0.weight.qdata"].as_tensor(), w.qdata)
        assert torch.equal(a["0.weight.scale"].as_tensor(), w.scale)
        assert a["0.weight.qdata"].tensor_metadata.dtype.name == "int8"
    verify_archive(path)


def test_int4_module_archive_holds_packed_values_that_unpack_to_torchaos(tmp_path):
    m = _quantized(_int4(32))
    path = tmp_path / "int4.irpa"
    save_module_parameters(path, m)
    w = m[0].weight
    with ParameterArchive(path) as a:
        entry = a["0.weight.qdata"]
        md = entry.tensor_metadata
        assert md.dtype.name == "uint8" and md.shape == (256, 256)
        assert md.packed == ("int4", (256, 512))
        assert entry.length == 256 * 512 // 2
        assert torch.equal(unpack_int4(entry.as_tensor(), md.packed[1]), w.qdata)
        assert torch.equal(a["0.weight.scale"].as_tensor(), w.scale)
        assert torch.equal(a["0.weight.zero_point"].as_tensor(), w.zero_point)
    rows = {r.key: r for r in describe_archive(path)}
    assert rows["0.weight.qdata"].dtype == "torch.int4"  # inspect shows the logical view
    assert rows["0.weight.qdata"].shape == (256, 512)
    assert rows["0.weight.qdata"].nbytes == 256 * 256
    verify_archive(path)
    # archive_tensors (in-memory parameters) gives the same bytes.
    mem = dict(archive_tensors("0.weight", w))
    assert torch.equal(mem["0.weight.qdata"], ParameterArchive(path)["0.weight.qdata"].as_tensor())


@pytest.mark.parametrize(
    "config, ratio",
    [(_int8, 0.26), (_int4(32), 0.17), (_int4(64), 0.15), (_int4(128), 0.14)],
    ids=["int8", "int4-g32", "int4-g64", "int4-g128"],
)
def test_quantized_archive_is_a_fraction_of_fp32(tmp_path, config, ratio):
    """The archive holds the integer data: ~1/4 of fp32 for int8, ~1/8 (+ scales) for int4."""
    torch.manual_seed(0)
    fp32 = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False) for _ in range(2)])
    save_module_parameters(tmp_path / "fp32.irpa", fp32)
    q = _torchao()
    q.quantize_(fp32, config(q))
    save_module_parameters(tmp_path / "q.irpa", fp32)
    got = (tmp_path / "q.irpa").stat().st_size / (tmp_path / "fp32.irpa").stat().st_size
    assert got <= ratio, got


def test_externalized_subclass_keeps_its_trait_and_builder_entries_tie():
    from turbine_params import ExternalTensorTrait

    m = _quantized(_int4(64), bias=False)
    externalize_module_parameters(m)
    assert ExternalTensorTrait.get(m[0].weight).external_name == "0.weight"
    b = ParameterArchiveBuilder()
    b.add_tensor("a", m[0].weight)
    b.add_tensor("b", m[0].weight)  # the same quantized weight under two names: stored once
    keys = [k for k, _ in b.index.items()]
    assert keys == [f"{n}.{t}" for n in "ab" for t in ("qdata", "scale", "zero_point")]
    assert len(b._sources) == 3


def test_raw_bytes_of_a_subclass_are_refused_with_what_to_do():
    m = _quantized(_int8)
    with pytest.raises(ParameterArchiveError, match=r"tensor subclass.*add_tensor\(\)"):
        ParameterArchiveBuilder().add_blob("w", m[0].weight)
