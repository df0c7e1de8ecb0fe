"""IREE devices for a load: device URIs checked against the runtime's drivers, the devices
created (a second device of one URI is a distinct device; CPU devices with turbine's allocator,
:mod:`.cpu_devices`), and devices lost for good replaced at the next load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turbine_aot._errors import TurbineRuntimeError

from .cpu_devices import cpu_device
from .tensors import LOCAL_DRIVERS

__all__ = ["create_devices", "device_lost", "driver_of", "forget_lost_devices", "normalize_devices"]


def normalize_devices(device: str | Sequence[str]) -> list[str]:
    uris = [device] if isinstance(device, str) else list(device)
    if not uris:
        raise TurbineRuntimeError("no device given; pass a URI such as 'local-task'")
    import iree.runtime as rt

    available = rt.query_available_drivers()
    for uri in uris:
        driver = uri.split("://", 1)[0].split(":", 1)[0]
        if driver not in available:
            raise TurbineRuntimeError(
                f"unknown or unavailable IREE device {uri!r}; this runtime has the drivers: "
                f"{', '.join(available)} (e.g. 'local-task', 'local-sync', 'vulkan', 'cuda')"
            )
    return uris


def driver_of(uri: str) -> str:
    return uri.split("://", 1)[0].split(":", 1)[0]


#: Devices made to replace one of IREE's cached devices that was lost, by URI (None: make one at
#: the next load). IREE's cache (``iree.runtime.get_device``) keeps handing out a lost device.
_replacement_devices: dict[str, Any] = {}

#: What IREE's drivers say when a device is gone for good (every later use fails the same way).
_DEVICE_LOST = ("DEVICE_LOST",)
#: A queue fence that failed: ``DATA_LOSS`` from ``hal.fence.await`` (with or without the
#: driver's ``VK_ERROR_DEVICE_LOST``).
_FENCE_FAILED = ("DATA_LOSS", "hal.fence.await")


def device_lost(error: BaseException | str) -> bool:
    """Whether an IREE error says the device was lost: ``VK_ERROR_DEVICE_LOST``, or a call's
    fence that failed with ``DATA_LOSS`` (the device's queue did not finish the work and its
    timeline cannot be trusted again; on Mesa lavapipe IREE 3.13's semaphore race shows both
    ways, the second without the Vulkan error in the message)."""
    text = str(error)
    return any(m in text for m in _DEVICE_LOST) or all(m in text for m in _FENCE_FAILED)


def forget_lost_devices(devices: Sequence[Any], uris: Sequence[str]) -> None:
    """After ``devices`` (created for ``uris``) were lost: the next load of each URI creates a
    new device instead of reusing the lost one."""
    for device, uri in zip(devices, uris):
        current = _replacement_devices.get(uri)
        if current is None or current is device:
            _replacement_devices[uri] = None


def create_devices(uris: list[str]) -> list[Any]:
    import iree.runtime as rt

    devices, seen = [], set()
    for uri in uris:
        try:
            if uri in seen:
                # A second device with the same URI must be a distinct device (multi-device).
                devices.append(rt.get_device(uri, cache=False))
            elif uri in _replacement_devices:
                if _replacement_devices[uri] is None:
                    _replacement_devices[uri] = rt.get_device(uri, cache=False)
                devices.append(_replacement_devices[uri])
            elif (driver := driver_of(uri)) in LOCAL_DRIVERS:
                devices.append(cpu_device(uri, driver))
            else:
                devices.append(rt.get_device(uri, cache=True))
        except TurbineRuntimeError:
            raise
        except Exception as e:
            raise TurbineRuntimeError(
                f"could not create IREE device {uri!r}: {str(e).splitlines()[0]}; check the "
                "driver is installed (e.g. Vulkan needs a loader and an ICD such as Mesa "
                "lavapipe) or choose another device"
            ) from e
        seen.add(uri)
    return devices
