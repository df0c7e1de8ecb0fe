"""The target registry of the compiler layer: turbine's target names, the IREE device and
backend each selects, the runtime driver that runs it, and which targets a flag list names.

:func:`resolve_target` maps a target, backend or driver name (``"llvm-cpu"``, ``"cpu"``,
``"local-task"``, ``"vulkan"``...) to its :class:`Target`; the flags turbine compiles with for
each target are in :mod:`.flags`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .._errors import TurbineAotError

__all__ = [
    "TARGETS",
    "Target",
    "TargetError",
    "flag_targets",
    "resolve_target",
    "target_device_flags",
]


class TargetError(TurbineAotError, ValueError):
    """A target, driver or flag given to turbine's target resolution is invalid."""


@dataclass(frozen=True)
class Target:
    """A compile target together with the runtime driver that runs it.

    Attributes:
        name: turbine's name for the target (``"llvm-cpu"``, ``"vmvx"``, ``"vulkan-spirv"``,
            ``"cuda"``, ``"rocm"``, ``"metal-spirv"``).
        hal_device: the ``--iree-hal-target-device`` value.
        local_backend: for ``hal_device == "local"``, the
            ``--iree-hal-local-target-device-backends`` value; else ``None``.
        driver: the default ``iree.runtime`` driver for modules built for this target.
        gpu: whether the target is a GPU.
    """

    name: str
    hal_device: str
    local_backend: str | None
    driver: str
    gpu: bool = False

    @property
    def device_flags(self) -> list[str]:
        """The flags that select this target device (no optimisation flags)."""
        flags = [f"--iree-hal-target-device={self.hal_device}"]
        if self.local_backend:
            flags.append(f"--iree-hal-local-target-device-backends={self.local_backend}")
        return flags


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("llvm-cpu", "local", "llvm-cpu", "local-task"),
        Target("vmvx", "local", "vmvx", "local-task"),
        Target("vulkan-spirv", "vulkan", None, "vulkan", gpu=True),
        Target("cuda", "cuda", None, "cuda", gpu=True),
        Target("rocm", "hip", None, "hip", gpu=True),
        Target("metal-spirv", "metal", None, "metal", gpu=True),
    )
}

# Other names users write for the same targets (IREE backend names, driver names).
_ALIASES: dict[str, str] = {
    "cpu": "llvm-cpu",
    "host": "llvm-cpu",
    "local-task": "llvm-cpu",
    "local-sync": "llvm-cpu",
    "local": "llvm-cpu",
    "vulkan": "vulkan-spirv",
    "hip": "rocm",
    "metal": "metal-spirv",
}


def resolve_target(name: str | None = None) -> Target:
    """Resolves a target, backend or driver name to a :class:`Target`.

    Args:
        name: ``"llvm-cpu"`` (default when ``None``), ``"vmvx"``, ``"vulkan-spirv"``, ``"cuda"``,
            ``"rocm"``, ``"metal-spirv"``, or an alias (``"cpu"``, ``"local-task"``,
            ``"vulkan"``, ``"hip"``, ...).

    Returns:
        The target. For ``"local-sync"`` the driver is ``local-sync``.

    Raises:
        TargetError: the name is not known; the message lists the valid names.
    """
    raw = (name or "llvm-cpu").strip()
    key = _ALIASES.get(raw, raw)
    try:
        target = TARGETS[key]
    except KeyError:
        valid = ", ".join([*TARGETS, *_ALIASES])
        raise TargetError(f"unknown IREE target {name!r}; choose one of: {valid}") from None
    if raw == "local-sync":
        target = Target(target.name, target.hal_device, target.local_backend, "local-sync")
    return target


def target_device_flags(hal_devices: Sequence[str]) -> list[str]:
    """One ``--iree-hal-target-device`` per device, in ``__device_N`` order.

    IREE merges identical target specifications into one device, so a repeated target gets an
    ordinal (``local[0]``, ``local[1]``): two CPU devices are then ``@__device_0`` and
    ``@__device_1``. (Named devices such as ``__device_1=local`` are merged too; a
    ``#hal.device.promise<@__device_1>`` then points at a device that does not exist, which
    crashes iree-compile 3.13.)
    """
    counts: dict[str, int] = {}
    for d in hal_devices:
        counts[d] = counts.get(d, 0) + 1
    seen: dict[str, int] = {}
    flags = []
    for d in hal_devices:
        if counts[d] > 1:
            k = seen.get(d, 0)
            seen[d] = k + 1
            flags.append(f"--iree-hal-target-device={d}[{k}]")
        else:
            flags.append(f"--iree-hal-target-device={d}")
    return flags


def flag_targets(flags: Sequence[str]) -> set[str]:
    """turbine target names that a flag list compiles for (from the device/backend flags)."""
    found: set[str] = set()
    for f in flags:
        key, _, value = f.partition("=")
        if key in (
            "--iree-hal-target-device",
            "--iree-hal-local-target-device-backends",
            "--iree-hal-target-backends",
        ):
            for v in value.split(","):
                v = re.sub(r"\[\d+\]$", "", v.strip())
                if v == "local":
                    continue
                try:
                    found.add(resolve_target(v).name)
                except TargetError:
                    found.add(v)
    return found
