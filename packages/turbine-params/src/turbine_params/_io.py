"""File output: the one atomic-write primitive every turbine package writes files through, and
the file-descriptor writes built on it (``write_all``, ``copy_file_range``, ``atomic_fd``).

A reader (another process, a crash, a second export running at the same time) sees either the
previous file or the complete new one, never a half-written file: data goes to a temporary file
in the destination's directory, which is fsynced, given the mode a plain ``open()`` would give it
(``0o666 & ~umask``; ``mkstemp`` makes ``0o600``) and renamed over the destination; the
directory is then fsynced so the rename itself survives a power cut. On any failure (including
``KeyboardInterrupt``) the temporary file is removed and the destination is untouched.

A writer killed outright (``kill -9``, power cut) cannot remove its temporary file, so temporary
names say who owns them: ``.<name>.turbine~<host>.<boot>.<pid>.<start>.<random>.tmp`` (the host
name, the first 8 hex digits of the Linux boot id, the writer's pid and its start time in clock
ticks since boot). Each write to ``<name>`` first removes the temporaries of ``<name>`` whose owner
is provably gone: written on this host (same host name) and either during an earlier boot, or by a
pid that no longer runs or now belongs to a process started at another time (pid reuse). Temporaries
of other hosts (a shared filesystem), of running writers, and anything not matching the pattern for
that destination are left alone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from ._errors import ParameterArchiveError

__all__ = [
    "atomic_fd",
    "atomic_output_file",
    "atomic_write_bytes",
    "copy_file_range",
    "make_owned_temp",
    "remove_stale_temps",
    "temp_owner_alive",
    "write_all",
]

# The fixed marker that tells turbine's temporaries from anyone else's.
TEMP_MARKER = "turbine~"
_NAME_LIMIT = 120  # longer destination names are shortened (+ a hash) to stay under NAME_MAX
_OWNER_RE = re.compile(
    r"(?P<host>[A-Za-z0-9-]{1,40})\.(?P<boot>[0-9a-f]{8})\.(?P<pid>[0-9]{1,10})\."
    r"(?P<start>[0-9]{1,20})\.[0-9a-f]{8}\.tmp"
)


@contextlib.contextmanager
def atomic_output_file(path: str | os.PathLike[str], *, parents: bool = False) -> Iterator[Path]:
    """Yields a temporary path beside ``path``; on success it replaces ``path`` atomically.

    Write the temporary path by any means (``open``, a library that takes a file name, a
    subprocess). When the ``with`` body returns, the file is fsynced, given the usual file mode
    (``0o666 & ~umask``), renamed over ``path`` and the directory fsynced. When the body raises,
    the temporary file is removed, ``path`` keeps its previous content (or stays absent) and the
    exception propagates. Temporary files are named
    ``.<name>.turbine~<host>.<boot>.<pid>.<start>.<random>.tmp``; before creating one, the stale
    temporaries of ``path`` (their writer was killed; see :func:`remove_stale_temps`) are removed.

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
    tmp = make_owned_temp(target)
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


def make_owned_temp(target: str | os.PathLike[str], *, directory: bool = False) -> Path:
    """Creates an empty temporary file (or directory) beside ``target``, named for its owner.

    The name is ``.<name>.turbine~<host>.<boot>.<pid>.<start>.<random>.tmp``, so that a later
    write to ``target`` can tell whether the process that made it still runs. Stale temporaries
    of ``target`` are removed first (:func:`remove_stale_temps`). The file is created with mode
    ``0o600`` (a directory ``0o777`` minus the umask, as ``mkdir``); the caller renames it over ``target`` or
    removes it.

    Args:
        target: the destination the temporary will replace.
        directory: create a directory instead of a file (for writers that assemble a tree).
    """
    target = Path(target)
    remove_stale_temps(target)
    for _ in range(100):
        tmp = target.parent / (
            _temp_prefix(target.name) + _owner_tag() + f".{secrets.token_hex(4)}.tmp"
        )
        try:
            if directory:
                os.mkdir(tmp, 0o777)
            else:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(errno.EEXIST, "no unused temporary name", str(target))  # pragma: no cover


def remove_stale_temps(target: str | os.PathLike[str]) -> list[Path]:
    """Removes the temporaries a killed writer of ``target`` left beside it; returns them.

    Only names of the pattern :func:`make_owned_temp` gives for this ``target`` are considered,
    and only those whose owner is provably gone (:func:`temp_owner_alive` is false) are removed
    (a directory with its contents). Errors (a file removed meanwhile, no permission) are
    ignored: cleaning up is best effort and never fails a write.
    """
    target = Path(target)
    prefix = _temp_prefix(target.name) + TEMP_MARKER
    removed: list[Path] = []
    try:
        entries = [e for e in os.scandir(target.parent) if e.name.startswith(prefix)]
    except OSError:
        return removed
    for entry in entries:
        if temp_owner_alive(entry.name[len(prefix) :]) is not False:
            continue
        path = Path(entry.path)
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def temp_owner_alive(owner: str) -> bool | None:
    """Whether the writer named by a temporary's owner part still runs.

    ``owner`` is the part after the marker, ``<host>.<boot>.<pid>.<start>.<random>.tmp``. Returns
    ``None`` when that cannot be known (another host, a name that does not match), ``True`` when
    the process may still be writing, ``False`` only when it is gone for sure: an earlier boot
    of this host, or no process with that pid started at that time.
    """
    m = _OWNER_RE.fullmatch(owner)
    if m is None or m["host"] != _host():
        return None
    boot = _boot_id()
    if boot != "0" * 8 and m["boot"] != "0" * 8 and m["boot"] != boot:
        return False  # written before this machine last booted
    pid, start = int(m["pid"]), int(m["start"])
    if pid <= 0:
        return None
    now = _start_time(pid)
    if now is not None:
        # /proc says who has the pid now: the owner only if it started when the owner did.
        return start == 0 or now == start
    if Path("/proc/self/stat").exists():
        return False  # /proc works and has no such pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by another user
    return True


def _temp_prefix(name: str) -> str:
    if len(name) > _NAME_LIMIT:
        import hashlib

        name = name[:_NAME_LIMIT] + "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return f".{name}."


_OWNER: str | None = None
_OWNER_PID = -1


def _owner_tag() -> str:
    """``turbine~<host>.<boot>.<pid>.<start>`` of this process (recomputed after a fork)."""
    global _OWNER, _OWNER_PID
    pid = os.getpid()
    if _OWNER is None or pid != _OWNER_PID:
        _OWNER = f"{TEMP_MARKER}{_host()}.{_boot_id()}.{pid}.{_start_time(pid) or 0}"
        _OWNER_PID = pid
    return _OWNER


def _host() -> str:
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40]
    return host or "localhost"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip().replace("-", "")[:8].lower()
    except OSError:
        return "0" * 8
    return boot if re.fullmatch(r"[0-9a-f]{8}", boot) else "0" * 8


def _start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks after boot, /proc/<pid>/stat field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    try:
        # The command name (field 2) is in parentheses and may contain spaces and ')'.
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


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


_COPY_CHUNK = 64 << 20


def write_all(fd: int, data: memoryview) -> None:
    """Writes every byte (``os.write`` may write less than asked, and at most ~2 GB a call)."""
    data = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    while len(data):
        n = os.write(fd, data[: 1 << 30])
        data = data[n:]


def copy_file_range(src_fd: int, dst_fd: int, offset: int, length: int) -> None:
    """Copies ``length`` bytes at ``offset`` of ``src_fd`` to the position of ``dst_fd``.

    Uses the kernel's ``copy_file_range`` (no user-space buffer) and falls back to chunked
    ``pread``/``write``.
    """
    done = 0
    fast = hasattr(os, "copy_file_range")
    while done < length:
        n = 0
        if fast:
            try:
                n = os.copy_file_range(src_fd, dst_fd, min(length - done, 1 << 30), offset + done)
            except OSError:
                fast = False
                continue
            if n == 0:
                fast = False
                continue
        else:
            chunk = os.pread(src_fd, min(length - done, _COPY_CHUNK), offset + done)
            if not chunk:
                raise ParameterArchiveError(
                    "unexpected end of source file while copying", offset=offset + done
                )
            write_all(dst_fd, memoryview(chunk))
            n = len(chunk)
        done += n


@contextlib.contextmanager
def atomic_fd(path: str | os.PathLike[str]) -> Iterator[int]:
    """:func:`atomic_output_file` for writers that want a file descriptor (``os.write``,
    :func:`copy_file_range`): yields one open for writing on the temporary file.

    Raises:
        ParameterArchiveError: ``path``'s directory does not exist.
    """
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise ParameterArchiveError(
            f"cannot save: directory {str(directory)!r} does not exist", path=path
        )
    with atomic_output_file(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY)
        try:
            yield fd
        finally:
            os.close(fd)
