"""The devices turbine creates for IREE's CPU drivers (``local-sync``, ``local-task``): one per
URI and allocator choice; on ``local-sync`` by default an allocator that keeps the buffers a
call frees for the next call (docs/running.md, "Memory between calls").

Why: every call allocates its transient buffers (one slab per execution region, plus the
arguments and results) and frees them at its end. With IREE's plain heap allocator each call
gets fresh blocks from the C allocator; a call of a bf16 ResNet-18 on one thread spent 7-10 % of
its time on that (4.86 against 4.40 ms with the buffers kept; no page faults either way, the
same resident memory). IREE's caching allocator (``iree/hal/utils/caching_allocator.h``) keeps
freed buffers in a free list and hands one of the same size to the next request.

Bounds: a buffer over :data:`MAX_BUFFER` bypasses the cache, and a freed buffer is only kept
while the pool's buffers, in use and free together, stay within :data:`CAPACITY` (else it goes
back to the C allocator, and older free ones are let go before a new allocation). What it
keeps after a module is gone (its globals, the last call's transients) stays until a buffer of
that size is asked for again, :func:`release_cached_memory`, or the process ends.

A cached buffer points back at its pool without holding a reference on it (IREE 3.13): a buffer
freed after its device is gone frees into released memory. A result tensor that outlived its
device crashed the interpreter at exit (the module's device dropped, or kept in a module global
while the result was kept by a module imported before turbine: Python clears the globals of the
modules imported last first). So the devices are kept in a dict on the ``sys`` module, whose
globals Python clears after every other module's: results held anywhere else are freed first.
One device per URI and choice lives as long as the process, as IREE's own device cache does.

Only ``local-sync`` by default: on ``local-task`` (two workers) the same A/B did not point one
way (ResNets 0.98-1.04x, BERT 0.92-1.20x in four runs). ``TURBINE_CPU_ALLOCATOR`` chooses:
``auto`` (default: the bounded cache on ``local-sync``, IREE's plain allocator on ``local-task``),
``caching`` (the cache on both), ``iree`` (IREE's cached device of the URI, its plain allocator,
on both) or an IREE allocator spec beginning with ``caching:`` for both (e.g.
``caching:*=64mib;256mib;32``: largest buffer, capacity, free-list length).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from turbine_aot._errors import TurbineRuntimeError

__all__ = [
    "CAPACITY",
    "ENV_VAR",
    "MAX_BUFFER",
    "allocator_spec",
    "cpu_device",
    "release_cached_memory",
]

#: The environment variable that chooses the CPU devices' allocator.
ENV_VAR = "TURBINE_CPU_ALLOCATOR"
#: The largest buffer the cache keeps; larger ones are allocated and freed each time.
MAX_BUFFER = 512 << 20
#: The most the cache's pool holds, buffers in use and free together.
CAPACITY = 1 << 30
#: Free buffers remembered at most.
_FREE_LIST = 64

#: Devices made here, by (URI, allocator spec): a dict on ``sys``, freed after every module's
#: globals at exit (module doc).
_devices: dict[tuple[str, str], Any] = sys.__dict__.setdefault("_turbine_cpu_devices", {})


def allocator_spec(driver: str) -> str | None:
    """The IREE allocator spec for a device of ``driver`` (``local-sync`` or ``local-task``):
    by ``$TURBINE_CPU_ALLOCATOR``, else ``"auto"``; None for IREE's plain allocator.

    Raises:
        TurbineRuntimeError: a value that is none of the module doc's.
    """
    choice = os.environ.get(ENV_VAR, "") or "auto"
    if choice == "auto":
        choice = "caching" if driver == "local-sync" else "iree"
    if choice == "iree":
        return None
    if choice == "caching":
        return f"caching:*={MAX_BUFFER};{CAPACITY};{_FREE_LIST}"
    if choice.startswith("caching:"):
        return choice
    raise TurbineRuntimeError(
        f"{ENV_VAR}={choice!r} is not an allocator choice; use 'auto' (the default), 'caching', "
        "'iree' (IREE's plain allocator) or an IREE caching allocator spec such as "
        "'caching:*=64mib;256mib;32' (docs/running.md, 'Memory between calls')"
    )


def cpu_device(uri: str, driver: str) -> Any:
    """The device for ``uri`` of a CPU ``driver``: IREE's cached device where the choice is its
    plain allocator, else the device made here with the caching allocator (the same one for
    every load in this process).

    Raises:
        TurbineRuntimeError: a bad ``$TURBINE_CPU_ALLOCATOR``, or IREE refused its spec.
    """
    import iree.runtime as rt

    spec = allocator_spec(driver)
    if spec is None:
        return rt.get_device(uri, cache=True)
    key = (uri, spec)
    device = _devices.get(key)
    if device is None:
        try:
            device = rt.get_driver(uri).create_device_by_uri(uri, allocators=[spec])
        except Exception as e:
            raise TurbineRuntimeError(
                f"IREE refused the allocator spec {spec!r} for {uri!r} ({e}); fix "
                f"${ENV_VAR} (docs/running.md, 'Memory between calls')"
            ) from e
        _devices[key] = device
    return device


def release_cached_memory() -> None:
    """Returns the free buffers the CPU devices' caches hold to the C allocator (after dropping a
    module, to give its memory back at once). Buffers in use are not touched; the next calls
    allocate afresh."""
    for device in _devices.values():
        device.allocator.trim()
