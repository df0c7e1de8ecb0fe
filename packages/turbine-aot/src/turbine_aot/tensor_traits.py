"""``turbine_aot.tensor_traits``: the reference path of the tensor traits (implemented in
``turbine_params``)."""

from __future__ import annotations

from turbine_params import DeviceAffinity, DeviceTensorTrait, ExternalTensorTrait

__all__ = ["DeviceAffinity", "DeviceTensorTrait", "ExternalTensorTrait"]
