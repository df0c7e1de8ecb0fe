"""turbine_params: IREE parameter archives (.irpa), tensor traits and weight tooling.

numpy is the only hard dependency; torch is imported lazily by the functions that take modules or
return torch tensors, and IREE is never imported.
"""

from __future__ import annotations

from ._module import externalize_module_parameters
from ._traits import DeviceAffinity, DeviceTensorTrait, ExternalTensorTrait

__all__ = [
    "DeviceAffinity",
    "DeviceTensorTrait",
    "ExternalTensorTrait",
    "externalize_module_parameters",
]
__version__ = "0.1.0"
