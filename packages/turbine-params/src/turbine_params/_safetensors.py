"""The safetensors file format, read and written directly: an 8-byte little-endian header
length, a JSON header naming each tensor's dtype, shape and byte range, then the raw data.

Reading only the header lets the index map tensors in place and the converters copy file ranges,
without loading a model into memory and without torch or the ``safetensors`` package (which
reads the same format, tensor by tensor). Writing streams each tensor's bytes into turbine's
atomic temporary (``atomic_output_file``): the ``safetensors`` package's ``save_file`` writes
through a temporary of its own (``.tmpXXXXXX``, from Rust's ``tempfile``) that a killed writer
leaves behind under a name nobody can attribute.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._dtypes import TensorMetadata, dtype_info_for_safetensors
from ._errors import ParameterArchiveError
from ._io import atomic_fd, write_all
from ._sources import host_bytes, host_nbytes, tensor_metadata

__all__ = ["read_safetensors_header", "write_safetensors"]

_MAX_SAFETENSORS_HEADER = 100 << 20  # the safetensors library's own limit


def read_safetensors_header(
    path: str | os.PathLike,
) -> tuple[int, list[tuple[str, TensorMetadata, int, int]]]:
    """Parses a .safetensors header.

    Returns:
        (absolute offset of the data section, [(name, metadata, begin, end)] sorted by offset,
        with begin/end relative to the data section).

    Raises:
        ParameterArchiveError: malformed header, unknown dtype, or ranges past the end of file.
    """
    p = os.fspath(path)
    size = os.path.getsize(p)
    with open(p, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ParameterArchiveError(
                "file truncated: expected an 8-byte safetensors header length", path=p, offset=0
            )
        (n,) = struct.unpack("<Q", head)
        if n > min(_MAX_SAFETENSORS_HEADER, size - 8):
            raise ParameterArchiveError(
                f"safetensors header length {n} exceeds the file ({size} bytes) or the "
                f"{_MAX_SAFETENSORS_HEADER}-byte limit; not a safetensors file?",
                path=p,
                offset=0,
            )
        raw = f.read(n)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ParameterArchiveError(
            f"safetensors header is not valid UTF-8 JSON ({e})", path=p, offset=8
        ) from None
    if not isinstance(doc, dict):
        raise ParameterArchiveError("safetensors header is not a JSON object", path=p, offset=8)
    base = 8 + n
    out = []
    for name, desc in doc.items():
        if name == "__metadata__":
            continue
        try:
            info = dtype_info_for_safetensors(desc["dtype"])
            shape = tuple(int(s) for s in desc["shape"])
            begin, end = (int(x) for x in desc["data_offsets"])
        except ParameterArchiveError as e:
            raise ParameterArchiveError(f"tensor {name!r}: {e.reason}", path=p, offset=8) from None
        except (KeyError, TypeError, ValueError) as e:
            raise ParameterArchiveError(
                f"tensor {name!r}: malformed header entry {desc!r} ({e}); expected dtype, shape "
                f"and data_offsets",
                path=p,
                offset=8,
            ) from None
        md = TensorMetadata(info, shape)
        if not 0 <= begin <= end or base + end > size or end - begin != md.nbytes:
            raise ParameterArchiveError(
                f"tensor {name!r}: data_offsets [{begin}, {end}) do not hold {md.nbytes} bytes "
                f"of {info.torch_name}{list(shape)} inside the file ({size} bytes)",
                path=p,
                offset=base + begin,
            )
        out.append((name, md, begin, end))
    out.sort(key=lambda t: t[2])
    return base, out


# torch's float4_e2m1fn_x2 holds two values per element; safetensors' F4 counts values.
_PACKED = {"float4_e2m1fn_x2": ("F4", 2)}


def write_safetensors(
    path: str | os.PathLike,
    tensors: Mapping[str, Any],
    *,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Writes ``tensors`` (name -> torch tensor or numpy array) as a ``.safetensors`` file,
    atomically and streamed (one tensor's bytes in memory at a time, none for contiguous CPU
    tensors), readable by the ``safetensors`` package.

    The data are laid out by element size, largest first, then by name, so that each tensor
    starts at a multiple of its element size (as the ``safetensors`` package lays them out).

    Args:
        path: the file to (re)place; its directory must exist.
        tensors: the tensors by name.
        metadata: the header's ``__metadata__`` (strings only).

    Raises:
        ParameterArchiveError: a dtype safetensors cannot store, the reserved name
            ``__metadata__``, metadata that is not strings, or another object than a tensor.
    """
    header: dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ParameterArchiveError("safetensors metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    planned = []
    for name, obj in tensors.items():
        if name == "__metadata__" or not isinstance(name, str):
            raise ParameterArchiveError(
                f"tensor name {name!r} cannot be written: safetensors names are strings and "
                "'__metadata__' is reserved for its header metadata"
            )
        md = tensor_metadata(obj, f"tensor {name!r}")
        if md is None:
            raise ParameterArchiveError(
                f"tensor {name!r} is a {type(obj).__name__}; pass a torch tensor or numpy array"
            )
        st, shape = md.dtype.safetensors, list(md.shape)
        if md.dtype.name in _PACKED:
            st, per = _PACKED[md.dtype.name]
            shape = [*shape[:-1], shape[-1] * per] if shape else [per]
        if st is None:
            raise ParameterArchiveError(
                f"tensor {name!r} has dtype {md.dtype.torch_name}, which safetensors cannot "
                "store; convert it (e.g. complex128 to two float64 tensors) or keep it in .irpa"
            )
        planned.append((-md.dtype.itemsize, name, obj, st, shape))
    planned.sort(key=lambda t: (t[0], t[1]))
    offset = 0
    for _, name, obj, st, shape in planned:
        n = host_nbytes(obj)
        header[name] = {"dtype": st, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    with atomic_fd(path) as fd:
        write_all(fd, memoryview(struct.pack("<Q", len(blob)) + blob))
        for _, _, obj, _, _ in planned:
            write_all(fd, host_bytes(obj).data)
    return Path(path)
