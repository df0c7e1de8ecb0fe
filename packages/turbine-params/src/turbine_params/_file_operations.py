"""Whole-file operations behind the CLI: describe, strip and verify archives, convert by file type."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._archive import ParameterArchive, describe_keys
from ._builder import ParameterArchiveBuilder
from ._convert import irpa_to_safetensors, safetensors_to_irpa, torch_checkpoint_to_irpa
from ._dtypes import TensorMetadata
from ._errors import ParameterArchiveError
from ._irpa_format import DEFAULT_DATA_ALIGNMENT, EntryType
from ._safetensors import read_safetensors_header

__all__ = ["EntryInfo", "convert_parameters", "describe_archive", "strip_archive", "verify_archive"]

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


@dataclass(frozen=True)
class EntryInfo:
    """One row of ``turbine-params inspect``."""

    key: str
    type: str
    dtype: str | None
    shape: tuple[int, ...] | None
    nbytes: int
    offset: int | None
    entry_offset: int


def describe_archive(path: str | os.PathLike, *, include_skipped: bool = False) -> list[EntryInfo]:
    """Every entry of an archive in file order (SKIP entries when asked)."""
    rows = []
    with ParameterArchive(os.fspath(path), mmap=False) as archive:
        if os.fspath(path).endswith(".safetensors"):
            for key, e in archive.items():
                md = e.tensor_metadata
                rows.append(
                    EntryInfo(
                        key,
                        "data",
                        md.dtype.torch_name if md else None,
                        md.shape if md else None,
                        e.length,
                        e.raw.offset,
                        0,
                    )
                )
            return rows
        entries = iter(archive.items())
        for _, raw in archive.index.raw_entries:
            if raw.type == EntryType.SKIP:
                if include_skipped:
                    rows.append(EntryInfo(raw.key, "skip", None, None, 0, None, raw.entry_offset))
                continue
            _, entry = next(entries)
            md = entry.tensor_metadata
            rows.append(
                EntryInfo(
                    raw.key,
                    raw.type.name.lower(),
                    _dtype_name(md),
                    (md.packed[1] if md.packed else md.shape) if md else None,
                    raw.length,
                    raw.data_offset if raw.type in (EntryType.DATA, EntryType.EXTERNAL) else None,
                    raw.entry_offset,
                )
            )
    return rows


def _dtype_name(md: TensorMetadata | None) -> str | None:
    """The entry's dtype; for packed sub-byte data the logical one (``torch.int4``)."""
    if md is None:
        return None
    return f"torch.{md.packed[0]}" if md.packed else md.dtype.torch_name


def strip_archive(
    src: str | os.PathLike, dst: str | os.PathLike, *, keep: tuple[str, ...] = ()
) -> Path:
    """Writes a copy of an archive whose data entries are zero splats (for test builds).

    Metadata and sizes are kept, so programs compiled against the original load the stripped
    archive; the file holds only the entry table. Keys in ``keep`` keep their data.

    Raises:
        ParameterArchiveError: a key in ``keep`` is not in the archive (a typo would otherwise
            silently strip the entry it meant to keep).
    """
    _check_output(src, dst, (".irpa",))
    keep_set = set(keep)
    with ParameterArchive(os.fspath(src), mmap=False) as archive:
        unknown = sorted(keep_set.difference(archive.keys()))
        if unknown:
            raise ParameterArchiveError(
                f"keep: no entry {', '.join(map(repr, unknown))} in the archive "
                f"({describe_keys(archive.keys())})",
                path=src,
            )
        builder = ParameterArchiveBuilder()
        for key, entry in archive.items():
            if entry.is_splat or key in keep_set:
                builder.add_index_entry(entry)
                continue
            md = entry.tensor_metadata
            width = md.dtype.itemsize if md else 1
            if width not in (1, 2, 4, 8, 16) or entry.length % width:
                width = 1
            builder.add_splat(key, bytes(width), length=entry.length, metadata=entry.metadata)
        return builder.save(dst)


def verify_archive(
    path: str | os.PathLike, *, against: str | os.PathLike | None = None
) -> tuple[int, int]:
    """Checks an archive thoroughly; optionally compares its contents with a source file.

    Checks: the structure (as on open), every entry's metadata (known dtype, shape matching the
    length), external files, and with ``against`` (a .safetensors or .irpa file) that the keys
    and bytes are identical.

    Returns:
        (number of entries, total bytes).

    Raises:
        ParameterArchiveError: the first problem found.
    """
    total = 0
    with ParameterArchive(os.fspath(path), mmap=True) as archive:
        items = archive.items()
        for key, entry in items:
            md = entry.tensor_metadata
            if md is not None and md.nbytes != entry.length:
                raise ParameterArchiveError(
                    f"entry {key!r}: metadata says {md.dtype.torch_name}{list(md.shape)} "
                    f"({md.nbytes} bytes) but the entry holds {entry.length} bytes",
                    path=path,
                    offset=entry.raw.entry_offset,
                )
            total += entry.length
        if against is not None:
            _compare(archive, against)
        return len(items), total


def _compare(archive: ParameterArchive, against: str | os.PathLike) -> None:
    ref = os.fspath(against)
    if ref.endswith(".safetensors"):
        base, tensors = read_safetensors_header(ref)
        expected = {name: (base + b, e - b) for name, _, b, e in tensors}
        if set(expected) != set(archive.keys()):
            missing = sorted(set(expected) - set(archive.keys()))[:5]
            extra = sorted(set(archive.keys()) - set(expected))[:5]
            raise ParameterArchiveError(
                f"keys differ from {ref}: missing {missing}, unexpected {extra}"
            )
        ref_map = np.memmap(ref, mode="r") if os.path.getsize(ref) else None
        for key, (off, n) in expected.items():
            got = archive[key].as_flat_array()
            if n != got.size or (
                n and ref_map is not None and not np.array_equal(ref_map[off : off + n], got)
            ):
                raise ParameterArchiveError(f"entry {key!r} differs from {ref}")
        return
    with ParameterArchive(ref) as other:
        if other.keys() != archive.keys():
            raise ParameterArchiveError(f"keys differ from {ref}")
        for key in other:
            a, b = archive[key], other[key]
            if a.length != b.length or not np.array_equal(a.as_flat_array(), b.as_flat_array()):
                raise ParameterArchiveError(f"entry {key!r} differs from {ref}")


def _check_output(
    src: str | os.PathLike, dst: str | os.PathLike, suffixes: tuple[str, ...]
) -> None:
    """Refuses an output path that would not be written as given: a directory (the writer would
    make ``<dir>.irpa`` beside it) or a name without one of ``suffixes`` (``o.xyz`` would become
    ``o.xyz.irpa``)."""
    d = Path(dst)
    if d.is_dir():
        example = d / f"{Path(src).stem}{suffixes[0]}"
        raise ParameterArchiveError(
            f"output {str(d)!r} is a directory; give a file name, e.g. {str(example)!r}"
        )
    if not d.name.endswith(suffixes):
        raise ParameterArchiveError(
            f"output {str(d)!r} does not end with {' or '.join(suffixes)}; name the file to "
            f"write with one of those suffixes (the suffix selects the format), e.g. "
            f"{str(d.with_suffix(suffixes[0]))!r}"
        )


def convert_parameters(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    data_alignment: int = DEFAULT_DATA_ALIGNMENT,
) -> Path:
    """Converts by file type: .safetensors -> .irpa, .irpa -> .safetensors or .irpa (repack),
    torch checkpoint (.pt/.pth/.bin/.ckpt) -> .irpa.

    Raises:
        ParameterArchiveError: an unreadable input, a combination not listed, or an output
            that is a directory or does not end with ``.irpa`` / ``.safetensors``.
    """
    s, d = os.fspath(src), os.fspath(dst)
    _check_output(src, dst, (".irpa", ".safetensors"))
    if s.endswith(".safetensors") and not d.endswith(".safetensors"):
        return safetensors_to_irpa(s, d, data_alignment=data_alignment)
    if s.endswith(".irpa") and d.endswith(".safetensors"):
        return irpa_to_safetensors(s, d)
    if s.endswith(".irpa"):
        with ParameterArchive(s, mmap=False) as archive:
            builder = ParameterArchiveBuilder(data_alignment=data_alignment)
            for _, entry in archive.items():
                builder.add_index_entry(entry)
            return builder.save(d)
    if s.endswith(TORCH_SUFFIXES) and not d.endswith(".safetensors"):
        return torch_checkpoint_to_irpa(s, d, data_alignment=data_alignment)
    raise ParameterArchiveError(
        f"cannot convert {s!r} to {d!r}: expected .safetensors -> .irpa, .irpa -> .safetensors, "
        f".irpa -> .irpa, or a torch checkpoint ({', '.join(TORCH_SUFFIXES)}) -> .irpa"
    )
