"""turbine_params: IREE parameter archives (.irpa), tensor traits and weight tooling.

numpy is the only hard dependency; torch is imported lazily by the functions that take modules or
return torch tensors, and IREE is never imported (``ParameterIndex.to_iree()`` loads
``iree.runtime`` dynamically when it is installed).
"""

from __future__ import annotations

from ._archive import ParameterArchive, ParameterArchiveEntry
from ._builder import ParameterArchiveBuilder, save_module_parameters
from ._convert import irpa_to_safetensors, safetensors_to_irpa, torch_checkpoint_to_irpa
from ._dtypes import DTypeInfo, TensorMetadata, dtype_info, known_dtype_names
from ._errors import ParameterArchiveError
from ._format import EntryType
from ._index import ParameterIndex, ParameterIndexEntry, max_splat_bytes
from ._io import atomic_output_file, atomic_write_bytes, make_owned_temp, remove_stale_temps
from ._module import externalize_module_parameters
from ._safetensors import write_safetensors
from ._tools import convert_parameters, describe_archive, strip_archive, verify_archive
from ._traits import DeviceAffinity, DeviceTensorTrait, ExternalTensorTrait
from ._versions import versions_text

__all__ = [
    "DTypeInfo",
    "DeviceAffinity",
    "DeviceTensorTrait",
    "EntryType",
    "ExternalTensorTrait",
    "ParameterArchive",
    "ParameterArchiveBuilder",
    "ParameterArchiveEntry",
    "ParameterArchiveError",
    "ParameterIndex",
    "ParameterIndexEntry",
    "TensorMetadata",
    "atomic_output_file",
    "atomic_write_bytes",
    "convert_parameters",
    "describe_archive",
    "dtype_info",
    "externalize_module_parameters",
    "irpa_to_safetensors",
    "known_dtype_names",
    "make_owned_temp",
    "max_splat_bytes",
    "remove_stale_temps",
    "safetensors_to_irpa",
    "save_module_parameters",
    "strip_archive",
    "torch_checkpoint_to_irpa",
    "verify_archive",
    "versions_text",
    "write_safetensors",
]
__version__ = "0.1.0"
