"""Atomic file output: the one implementation every turbine package writes files through.

A reader (another process, a crash, a second export running at the same time) sees either the
previous file or the complete new one, never a half-written file: data goes to a temporary file
in the destination's directory, which is fsynced, given the mode a plain ``open()`` would give it
(``0o666 & ~umask``; ``mkstemp`` makes ``0o600``) and renamed over the destination; the
directory is then fsynced so the rename itself survives a power cut. On any failure (including
``KeyboardInterrupt``) the temporary file is removed and the destination is untouched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_output_file", "atomic_write_bytes"]


@contextlib.contextmanager
def atomic_output_file(path: str | os.PathLike[str], *, parents: bool = False) -> Iterator[Path]:
    """Yields a temporary path beside ``path``; on success it replaces ``path`` atomically.

    Write the temporary path by any means (``open``, a library that takes a file name, a
    subprocess). When the ``with`` body returns, the file is fsynced, given the usual file mode
    (``0o666 & ~umask``), renamed over ``path`` and the directory fsynced. When the body raises,
    the temporary file is removed, ``path`` keeps its previous content (or stays absent) and the
    exception propagates. Temporary files are named ``.<name>.<random>.tmp``.

    Args:
        path: the file to (re)place.
        parents: create ``path``'s missing parent directories first (as ``mkdir -p``); by
            default a missing directory is an error, as for ``open()``.

    Raises:
        FileNotFoundError: ``path``'s directory does not exist and ``parents`` is false.
        OSError: the directory cannot be written, or the rename fails.

    Example::

        with atomic_output_file("model.vmfb") as tmp:
            tmp.write_bytes(vmfb)
    """
    target = Path(path)
    directory = target.parent
    if parents:
        directory.mkdir(parents=True, exist_ok=True)
    elif not directory.is_dir():
        raise FileNotFoundError(
            errno.ENOENT,
            f"cannot write {target.name!r}: directory {str(directory)!r} does not exist "
            f"(create it first)",
            str(directory),
        )
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDWR)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(directory)


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes | bytearray | memoryview, *, parents: bool = False
) -> None:
    """Writes ``data`` to ``path`` atomically (see :func:`atomic_output_file`)."""
    with atomic_output_file(path, parents=parents) as tmp, open(tmp, "wb") as f:
        f.write(data)


def _fsync_dir(directory: Path) -> None:
    """Makes a rename in ``directory`` durable; best effort (not every platform can)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def current_umask() -> int:
    """The process umask, read without changing it where the platform allows.

    ``os.umask()`` reads the mask only by setting it, which briefly leaves it 0 for every thread
    of the process (files another thread creates meanwhile would be world-writable); Linux
    reports it in /proc instead.
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask
