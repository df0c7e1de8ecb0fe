"""The safetensors file format, read directly: an 8-byte little-endian header length, a JSON
header naming each tensor's dtype, shape and byte range, then the raw data.

Reading only the header lets the index map tensors in place and the converters copy file ranges,
without loading a model into memory and without torch or the ``safetensors`` package (which
reads the same format, tensor by tensor).
"""

from __future__ import annotations

import json
import os
import struct

from ._dtypes import TensorMetadata, dtype_info_for_safetensors
from ._errors import ParameterArchiveError

__all__ = ["read_safetensors_header"]

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
