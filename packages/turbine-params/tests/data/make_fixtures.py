"""Writes the frozen archives next to this script (run it only to re-create them, then review).

* ``reference_format.irpa``: an archive as the reference ``iree.turbine.aot`` writes it. Its
  ``ParameterArchiveBuilder`` puts each tensor in an ``iree.runtime.ParameterIndex`` with the
  metadata ``PYTORCH:`` + JSON ``{"type": "Tensor", "dtype": "<name without 'torch.'>", "shape":
  [...], "dtype_desc": {...}}`` and calls ``create_archive_file``; this script does the same, the
  metadata spelled out by hand (no turbine code), plus a splat and a JSON config blob without
  metadata, as model libraries store them.
* ``turbine_format.irpa``: the same content written by ``turbine_params.ParameterArchiveBuilder``.

The tensors are deterministic (no RNG); ``EXPECTED`` (imported by the tests) gives their values.

    .venv/bin/python packages/turbine-params/tests/data/make_fixtures.py
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "reference_format.irpa"
TURBINE = HERE / "turbine_format.irpa"

CONFIG = {"model_type": "tiny", "hidden_size": 4, "vocab_size": 3}


def _bf16_bytes(values: list[float]) -> bytes:
    """bfloat16 = the upper 16 bits of float32 (the values below are exact in bf16)."""
    f32 = np.array(values, dtype="<f4").view("<u4")
    return (f32 >> 16).astype("<u2").tobytes()


#: key -> (dtype name, shape, little-endian bytes, dtype_desc fields)
EXPECTED: dict[str, tuple[str, tuple[int, ...], bytes]] = {
    "model.embed.weight": (
        "float32",
        (3, 4),
        (np.arange(12, dtype="<f4") / 4).tobytes(),
    ),
    "model.norm.weight": ("bfloat16", (4,), _bf16_bytes([1.0, 0.5, -2.0, 3.0])),
    "model.head.bias": ("float16", (2, 2), np.arange(4, dtype="<f2").tobytes()),
    "model.positions": ("int64", (5,), np.arange(5, dtype="<i8").tobytes()),
    "model.mask": ("bool", (3,), np.array([True, False, True]).tobytes()),
}
SPLAT_KEY = "model.zeros"
SPLAT = ("float32", (8,), struct.pack("<f", 0.0))
CONFIG_KEY = "config.json"

_DESC = {
    # class_name, is_complex, is_floating_point, is_signed, itemsize (as torch.dtype reports)
    "float32": (False, True, True, 4),
    "bfloat16": (False, True, True, 2),
    "float16": (False, True, True, 2),
    "int64": (False, False, True, 8),
    "bool": (False, False, False, 1),
}


def reference_metadata(dtype: str, shape: tuple[int, ...]) -> str:
    """The metadata string the reference writes for a tensor."""
    is_complex, is_fp, is_signed, itemsize = _DESC[dtype]
    props = {
        "type": "Tensor",
        "dtype": dtype,
        "shape": list(shape),
        "dtype_desc": {
            "class_name": "dtype",
            "is_complex": is_complex,
            "is_floating_point": is_fp,
            "is_signed": is_signed,
            "itemsize": itemsize,
        },
    }
    return "PYTORCH:" + json.dumps(props)


def write_reference(path: Path = REFERENCE) -> None:
    import iree.runtime as rt

    index = rt.ParameterIndex()
    for key, (dtype, shape, data) in EXPECTED.items():
        index.add_buffer(
            key, np.frombuffer(data, np.uint8), metadata=reference_metadata(dtype, shape)
        )
    dtype, shape, pattern = SPLAT
    index.add_splat(SPLAT_KEY, pattern, 8 * 4, metadata=reference_metadata(dtype, shape))
    index.add_buffer(CONFIG_KEY, np.frombuffer(json.dumps(CONFIG).encode(), np.uint8))
    index.create_archive_file(str(path))


def write_turbine(path: Path = TURBINE) -> None:
    import torch

    from turbine_params import ParameterArchiveBuilder

    builder = ParameterArchiveBuilder()
    for key, (dtype, shape, data) in EXPECTED.items():
        t = torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype)).reshape(shape)
        builder.add_tensor(key, t)
    builder.add_splat(SPLAT_KEY, 0.0, shape=SPLAT[1], dtype=torch.float32)
    builder.add_blob(CONFIG_KEY, json.dumps(CONFIG).encode())
    builder.save(path)


if __name__ == "__main__":
    write_reference()
    write_turbine()
    print(f"wrote {REFERENCE.name} and {TURBINE.name} in {HERE}")
