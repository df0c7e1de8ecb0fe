"""Facts about the CPU that compiles (read from Linux's ``/proc/cpuinfo`` and sysfs): its
feature flags, vendor, last-level cache and physical cores, which the CPU rewrites' choices
depend on, and :func:`host_fingerprint`, which the compile cache keys host-tuned builds on.

Each reader returns an empty value where the fact cannot be read (not Linux, no such file):
the rewrites then keep IREE's own code, and the fingerprint still differs from any real host's.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from pathlib import Path

__all__ = [
    "cpu_flags",
    "cpu_vendor",
    "host_fingerprint",
    "host_l3_bytes",
    "host_physical_cores",
    "is_x86_64_linux",
]


@functools.lru_cache(maxsize=1)
def _first_cpu() -> dict[str, str]:
    """The first processor's ``name : value`` lines of ``/proc/cpuinfo`` (read once: they do
    not change while the process runs; empty where there is no such file)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break  # the end of the first processor's block
                    continue
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _cpuinfo_field(name: str) -> str:
    """The first processor's ``name`` in ``/proc/cpuinfo`` (empty where there is none)."""
    return _first_cpu().get(name, "")


def is_x86_64_linux() -> bool:
    """Whether this is Linux on x86-64, where the CPU flags read here name x86 extensions."""
    return platform.system() == "Linux" and platform.machine().lower() in ("x86_64", "amd64")


def cpu_flags() -> set[str]:
    """The host CPU's ``/proc/cpuinfo`` flags (empty where there is none)."""
    return set(_cpuinfo_field("flags").split())


def cpu_vendor() -> str:
    """The host CPU's vendor id (``GenuineIntel``, ``AuthenticAMD``; empty where unknown)."""
    return _cpuinfo_field("vendor_id")


@functools.lru_cache(maxsize=1)
def host_l3_bytes() -> int:
    """The host's last-level (L3) cache in bytes, from Linux's sysfs (0 where unknown)."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in sorted(base.glob("index*")):
            if (index / "level").read_text().strip() != "3":
                continue
            size = (index / "size").read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            return int(size.rstrip("KMG")) * scale
    except (OSError, ValueError):
        pass
    return 0


@functools.lru_cache(maxsize=1)
def host_physical_cores() -> int:
    """The host's physical cores this process may run on (distinct ``physical id`` / ``core
    id`` pairs of ``/proc/cpuinfo`` among the processors of its CPU affinity; the processors
    where those are missing; 0 where unknown): the number of workers IREE's ``local-task``
    driver starts by default (one per physical core)."""
    try:
        allowed: set[int] | None = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = None
    cores: set[tuple[str, str]] = set()
    processors: set[int] = set()
    cpu, package = -1, ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "processor" and value.isdigit():
                    cpu, package = int(value), ""
                    if allowed is None or cpu in allowed:
                        processors.add(cpu)
                elif key == "physical id":
                    package = value
                elif key == "core id" and cpu in processors:
                    cores.add((package, value))
    except OSError:
        return 0
    return len(cores) or len(processors)


def host_fingerprint() -> str:
    """A short digest of what host-tuned builds depend on: the vendor, model name, CPU flags, L3
    size and physical cores. A module built with ``--iree-llvmcpu-target-cpu=host`` carries
    the host's instructions (AMX, AVX-512) and the rewrites' host-dependent choices (the
    workgroup grids: :mod:`.workgroups`), so a compile cache shared by two machines (a home
    directory on a network disk, a copied container) must not serve one machine's build to the
    other (docs/development.md, "The compile cache")."""
    parts = (
        cpu_vendor(),
        _cpuinfo_field("model name"),
        " ".join(sorted(cpu_flags())),
        str(host_l3_bytes()),
        str(host_physical_cores()),
    )
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
