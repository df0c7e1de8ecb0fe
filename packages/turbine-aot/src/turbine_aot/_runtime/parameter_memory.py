"""Where a parameter archive's bytes live for a load on CPU devices: IREE's memory map of the
file, or a private anonymous copy advised for transparent huge pages (``parameter_memory=``).

Why a copy: on local (CPU) drivers the weights are read in place from wherever the archive's
bytes are. IREE maps the file, so they sit in the page cache's 4 KiB pages. Read into anonymous
memory advised with ``MADV_HUGEPAGE``, they sit in 2 MiB pages: fewer TLB misses, and the
hardware prefetchers are not stopped at every 4 KiB page boundary while a decode step streams
the weights. Measured on a 110M-parameter Llama decode step (one thread, the same compiled
module, the two loads timed interleaved in one process), the copy was faster than IREE's map:
w8a8 1.09x, int8 weight-only 1.05x, int4 1.04x, fp32 1.03x. IREE imports the wrapped memory
without copying it again (the process grows by the archive once).

The costs (the archive is read whole at load instead of paged in lazily; its pages are private
to the process instead of shared through the page cache) decide ``"auto"``: a copy only on Linux
with transparent huge pages enabled (``[always]`` or ``[madvise]``), for archives of at least
2 MiB (below one huge page there is nothing to gain) and at most half of ``MemAvailable`` (an
archive larger than memory must still load lazily), on modules whose devices are all local CPU
drivers (other devices copy the weights into their own memory anyway). See docs/running.md,
"Parameter memory".
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turbine_aot._errors import TurbineRuntimeError

from .devices import driver_of
from .tensors import LOCAL_DRIVERS

__all__ = [
    "ENV_VAR",
    "HUGE_PAGE_BYTES",
    "HUGE_PAGE_FORMATS",
    "MIN_HUGE_PAGE_ARCHIVE_BYTES",
    "POLICIES",
    "ArchiveMemory",
    "HostMemory",
    "host_memory",
    "parse_mem_available",
    "parse_thp_mode",
    "read_archive",
    "resolve_policy",
    "thp_unavailable_reason",
    "use_huge_pages",
]

#: ``parameter_memory=`` values: decide per archive, always IREE's map, always the copy.
POLICIES = ("auto", "mmap", "huge-pages")
#: The policy when ``load_module`` is given none.
ENV_VAR = "TURBINE_PARAMETER_MEMORY"
#: Below one 2 MiB huge page an archive has nothing to gain from the copy.
MIN_HUGE_PAGE_ARCHIVE_BYTES = 2 << 20
#: The drivers that run on the host CPU and read the weights in place.
CPU_DRIVERS = LOCAL_DRIVERS
#: Archive formats (file suffixes) IREE parses from memory as well as from a file.
HUGE_PAGE_FORMATS = ("irpa", "safetensors", "gguf")

THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MEMINFO = Path("/proc/meminfo")


def resolve_policy(parameter_memory: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The policy for a load: ``parameter_memory`` if given, else ``$TURBINE_PARAMETER_MEMORY``
    if set (and not empty), else ``"auto"``; an unknown value raises ``TurbineRuntimeError``."""
    env = os.environ if environ is None else environ
    source = "parameter_memory"
    value = parameter_memory
    if value is None:
        value = env.get(ENV_VAR) or None
        source = f"${ENV_VAR}"
    if value is None:
        return "auto"
    if value not in POLICIES:
        raise TurbineRuntimeError(
            f"{source}={value!r} is not a parameter memory policy; use one of "
            f"{', '.join(repr(p) for p in POLICIES)} (docs/running.md, 'Parameter memory')"
        )
    return value


@dataclass(frozen=True)
class HostMemory:
    """What ``"auto"`` reads of the host: the platform, the transparent huge page mode
    (``"always"``, ``"madvise"``, ``"never"``; None when the kernel has no such setting) and
    ``MemAvailable`` in bytes (None when unknown)."""

    linux: bool
    thp_mode: str | None
    mem_available: int | None


def parse_thp_mode(text: str) -> str | None:
    """The bracketed mode of ``/sys/kernel/mm/transparent_hugepage/enabled``
    (``"always [madvise] never"`` -> ``"madvise"``); None if none is bracketed."""
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def parse_mem_available(text: str) -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; None if the line is missing."""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            fields = line.split()
            try:
                value = int(fields[1])
            except (IndexError, ValueError):
                return None
            unit = fields[2].lower() if len(fields) > 2 else "b"
            return value * 1024 if unit == "kb" else value
    return None


def host_memory() -> HostMemory:
    """Reads the host's transparent huge page mode and available memory."""
    linux = sys.platform.startswith("linux")
    thp_mode = mem_available = None
    if linux:
        try:
            thp_mode = parse_thp_mode(THP_ENABLED.read_text())
        except OSError:
            thp_mode = None
        try:
            mem_available = parse_mem_available(MEMINFO.read_text())
        except OSError:
            mem_available = None
    return HostMemory(linux=linux, thp_mode=thp_mode, mem_available=mem_available)


def thp_unavailable_reason(host: HostMemory) -> str | None:
    """Why this host gives no transparent huge pages to an advised mapping; None if it does."""
    if not host.linux:
        return f"transparent huge pages are a Linux feature and this is {sys.platform}"
    if host.thp_mode is None:
        return f"this kernel has no transparent huge pages ({THP_ENABLED} is missing)"
    if host.thp_mode not in ("always", "madvise"):
        return f"transparent huge pages are off ({THP_ENABLED} says [{host.thp_mode}])"
    return None


def use_huge_pages(
    policy: str, *, archive_bytes: int, device_uris: Sequence[str], host: HostMemory
) -> bool:
    """Whether an archive of ``archive_bytes`` is read into huge-page memory under ``policy``
    for a module on ``device_uris`` (a pure function of its arguments).

    ``"mmap"``: never. ``"huge-pages"``: always, but for an empty archive (nothing to copy).
    ``"auto"``: on Linux with transparent huge pages ``[always]`` or ``[madvise]``, all devices
    local CPU drivers, and ``MIN_HUGE_PAGE_ARCHIVE_BYTES <= archive_bytes <= MemAvailable / 2``.
    """
    if policy not in POLICIES:
        raise TurbineRuntimeError(
            f"parameter_memory={policy!r} is not a parameter memory policy; use one of "
            f"{', '.join(repr(p) for p in POLICIES)}"
        )
    if policy == "mmap" or archive_bytes <= 0:
        return False
    if policy == "huge-pages":
        return True
    return (
        thp_unavailable_reason(host) is None
        and bool(device_uris)
        and all(driver_of(uri) in CPU_DRIVERS for uri in device_uris)
        and archive_bytes >= MIN_HUGE_PAGE_ARCHIVE_BYTES
        and host.mem_available is not None
        and archive_bytes <= host.mem_available // 2
    )


class ArchiveMemory:
    """An archive's bytes in a private anonymous mapping, and IREE's file handle wrapping them
    (``handle``); kept alive with the module that reads its parameters.

    Attributes:
        address: where the bytes start (for checking the mapping in ``/proc/self/smaps``).
        size: the archive's size in bytes.
        advised: whether the mapping was advised ``MADV_HUGEPAGE``.
    """

    def __init__(
        self,
        mapping: mmap.mmap,
        view: memoryview,
        handle: Any,
        address: int,
        size: int,
        advised: bool,
    ):
        self._mapping: mmap.mmap | None = mapping
        self._view: memoryview | None = view
        self.handle = handle
        self.address = address
        self.size = size
        self.advised = advised

    def close(self) -> None:
        """Drops IREE's handle and unmaps the bytes (for an archive IREE refused: nothing of it
        is kept). A mapping something still exports is left to be freed with its last user."""
        self.handle = None
        view, self._view = self._view, None
        if view is not None:
            with contextlib.suppress(BufferError):
                view.release()
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            with contextlib.suppress(BufferError):
                mapping.close()


def _anonymous_mapping(size: int) -> mmap.mmap:
    if hasattr(mmap, "MAP_ANONYMOUS"):
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mmap.mmap(-1, size)  # Windows: anonymous memory backed by the paging file


#: A transparent huge page (x86-64, AArch64 with 4 KiB pages): the copy starts on one.
HUGE_PAGE_BYTES = 2 << 20


def read_archive(path: Path) -> ArchiveMemory:
    """Reads the file at ``path`` into a private anonymous mapping advised ``MADV_HUGEPAGE``
    (where the platform has it; before the bytes are written, so that the pages they fault in
    are huge ones) and wraps it in an IREE file handle. The bytes start on a 2 MiB boundary of a
    mapping rounded up to 2 MiB: the kernel gives huge pages to aligned 2 MiB ranges only, and
    an anonymous mapping whose size is not a multiple of 2 MiB need not start on one.

    Raises:
        OSError: the file cannot be read, or it shrank while it was read.
    """
    import iree.runtime as rt

    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size <= 0:
            raise OSError(f"{str(path)!r} is empty")
        total = -(-(size + HUGE_PAGE_BYTES) // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
        mapping = _anonymous_mapping(total)
        view = None
        try:
            advised = False
            if hasattr(mmap, "MADV_HUGEPAGE"):
                try:
                    mapping.madvise(mmap.MADV_HUGEPAGE)
                    advised = True
                except OSError:  # a kernel without transparent huge pages (EINVAL)
                    pass
            anchor = ctypes.c_char.from_buffer(mapping)
            base = ctypes.addressof(anchor)
            del anchor
            start = -base % HUGE_PAGE_BYTES
            view = memoryview(mapping)[start : start + size]
            done = 0
            while done < size:
                with view[done:] as rest:
                    n = f.readinto(rest)
                if not n:
                    raise OSError(
                        f"the file shrank while it was read ({done} of {size} bytes); "
                        "load it again once nothing writes it"
                    )
                done += n
            handle = rt.FileHandle.wrap_memory(view, readable=True, writable=False)
        except BaseException:
            if view is not None:
                view.release()
            mapping.close()
            raise
    return ArchiveMemory(mapping, view, handle, base + start, size, advised)
