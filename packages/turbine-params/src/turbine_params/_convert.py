"""Streaming converters: safetensors <-> irpa and torch checkpoints -> irpa.

The safetensors side is implemented directly on its file format (8-byte little-endian header
length, JSON header, raw data), so conversions copy file ranges with the kernel's
``copy_file_range`` and never hold a model in memory, and need neither torch nor safetensors.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ._archive import ParameterArchive
from ._builder import ParameterArchiveBuilder
from ._errors import ParameterArchiveError
from ._io import atomic_fd, copy_file_range, write_all
from ._irpa_format import DEFAULT_DATA_ALIGNMENT
from ._progress import Progress
from ._safetensors import read_safetensors_header

__all__ = [
    "irpa_to_safetensors",
    "safetensors_to_irpa",
    "torch_checkpoint_to_irpa",
]

logger = logging.getLogger("turbine.params")

_SPLAT_CHUNK = 16 << 20


def safetensors_to_irpa(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    data_alignment: int = DEFAULT_DATA_ALIGNMENT,
) -> Path:
    """Converts a .safetensors file to an .irpa archive, streaming file ranges.

    Returns:
        The path written (``.irpa`` appended when missing).
    """
    base, tensors = read_safetensors_header(src)
    builder = ParameterArchiveBuilder(data_alignment=data_alignment)
    for name, md, begin, end in tensors:
        builder.add_file_range(name, src, offset=base + begin, length=end - begin, metadata=md)
    return builder.save(dst)


def _check_free_space(dst: Path, nbytes: int, src: str | os.PathLike) -> None:
    """Refuses up front an output larger than the free space of its filesystem (expanded
    splats: a 4 KB archive can declare exabytes), instead of filling the disk."""
    import shutil

    directory = dst.parent if str(dst.parent) else Path(".")
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return  # a missing directory is reported by the writer
    if nbytes > free:
        raise ParameterArchiveError(
            f"converting it needs {nbytes} bytes (splats are expanded) but {str(directory)!r} "
            f"has {free} bytes free; free some space or convert to .irpa, which keeps splats",
            path=src,
        )


def irpa_to_safetensors(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Converts an .irpa archive to a .safetensors file, streaming.

    Entries without ``PYTORCH:`` metadata become flat ``U8`` tensors; splats are expanded; tied
    entries are written once per name (safetensors cannot share storage).

    Raises:
        ParameterArchiveError: duplicate keys, or a dtype safetensors has no name for.
    """
    path = Path(dst)
    with ParameterArchive(os.fspath(src), mmap=False) as archive:
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        plan = []
        offset = 0
        for key, entry in archive.items():
            if key == "__metadata__":
                raise ParameterArchiveError(
                    "entry '__metadata__' cannot be written: safetensors reserves that name for "
                    "its header metadata; rename the entry",
                    path=src,
                    offset=entry.raw.entry_offset,
                )
            if key in header:
                raise ParameterArchiveError(
                    f"key {key!r} appears more than once; safetensors needs unique names",
                    path=src,
                    offset=entry.raw.entry_offset,
                )
            md = entry.tensor_metadata
            if md is not None and md.nbytes != entry.length:
                md = None
            if md is None:
                st, shape = "U8", [entry.length]
            else:
                if md.dtype.safetensors is None:
                    raise ParameterArchiveError(
                        f"entry {key!r} has dtype {md.dtype.torch_name}, which safetensors cannot "
                        f"store; keep it in .irpa",
                        path=src,
                        offset=entry.raw.entry_offset,
                    )
                st, shape = md.dtype.safetensors, list(md.shape)
            header[key] = {
                "dtype": st,
                "shape": shape,
                "data_offsets": [offset, offset + entry.length],
            }
            offset += entry.length
            plan.append(entry)
        blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
        blob += b" " * (-len(blob) % 8)
        _check_free_space(path, 8 + len(blob) + offset, src)
        progress = Progress(offset, f"writing {path.name}")
        with atomic_fd(path) as fd:
            write_all(fd, memoryview(struct.pack("<Q", len(blob)) + blob))
            for entry in plan:
                progress.advance(entry.length)
                raw = entry.raw
                if raw.splat_pattern is not None:
                    chunk = np.broadcast_to(
                        np.frombuffer(raw.splat_pattern, np.uint8),
                        (
                            min(raw.length, _SPLAT_CHUNK) // len(raw.splat_pattern),
                            len(raw.splat_pattern),
                        ),
                    ).tobytes()
                    left = raw.length
                    while left:
                        n = min(left, len(chunk))
                        write_all(fd, memoryview(chunk)[:n])
                        left -= n
                elif raw.file is not None:
                    copy_file_range(raw.file.fd, fd, raw.offset, raw.length)
                else:
                    write_all(fd, raw.flat_array().data)
        progress.close()
    return path


def torch_checkpoint_to_irpa(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    prefix: str = "",
    data_alignment: int = DEFAULT_DATA_ALIGNMENT,
) -> Path:
    """Converts a torch checkpoint (a state dict, possibly nested) to an .irpa archive.

    The checkpoint is opened with ``torch.load(weights_only=True, mmap=True)``, so tensors are
    paged in from the file one at a time as they are written rather than loaded up front.
    Nested dicts/lists are flattened with dotted keys; non-tensor values are skipped (logged).
    Tensors sharing storage (tied weights) are stored once.
    """
    import torch

    p = os.fspath(src)
    legacy = object()

    def load(mmap: bool) -> Any:
        try:
            return torch.load(p, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError as e:
            if mmap and "mmap" in str(e):
                return legacy  # legacy (non-zip) checkpoints cannot be mapped
            raise ParameterArchiveError(f"cannot load torch checkpoint ({e})", path=p) from e
        except Exception as e:
            raise ParameterArchiveError(
                f"cannot load torch checkpoint with weights_only=True ({type(e).__name__}: {e})",
                path=p,
            ) from e

    obj = load(mmap=True)
    mapped = obj is not legacy
    if not mapped:
        logger.warning("%s is a legacy checkpoint; loading it without mmap", p)
        obj = load(mmap=False)
    builder = ParameterArchiveBuilder(data_alignment=data_alignment)
    builder._release_file_backed_pages = mapped

    def walk(value: Any, name: str) -> None:
        if isinstance(value, torch.Tensor):
            builder.add_tensor(name, value)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{name}.{k}" if name else str(k))
        elif isinstance(value, list | tuple):
            for i, v in enumerate(value):
                walk(v, f"{name}.{i}" if name else str(i))
        else:
            logger.info("skipping non-tensor value %r (%s)", name, type(value).__name__)

    walk(obj, prefix.rstrip(".") if prefix else "")
    if not len(builder):
        raise ParameterArchiveError("the checkpoint holds no tensors", path=p)
    return builder.save(dst)
