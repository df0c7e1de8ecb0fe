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
from ._file_operations import convert_parameters, describe_archive, strip_archive, verify_archive
from ._index import ParameterIndex, ParameterIndexEntry, max_splat_bytes
from ._io import atomic_output_file, atomic_write_bytes, make_owned_temp, remove_stale_temps
from ._irpa_format import EntryType
from ._nn_module import externalize_module_parameters
from ._safetensors import write_safetensors
from ._subclasses import (
    archive_tensors,
    int4_values,
    is_wrapper_subclass,
    mark_int4,
    pack_int4,
    subclass_inner_tensors,
    unpack_int4,
)
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
    "archive_tensors",
    "atomic_output_file",
    "atomic_write_bytes",
    "convert_parameters",
    "describe_archive",
    "dtype_info",
    "externalize_module_parameters",
    "int4_values",
    "irpa_to_safetensors",
    "is_wrapper_subclass",
    "known_dtype_names",
    "make_owned_temp",
    "mark_int4",
    "max_splat_bytes",
    "pack_int4",
    "remove_stale_temps",
    "safetensors_to_irpa",
    "save_module_parameters",
    "strip_archive",
    "subclass_inner_tensors",
    "torch_checkpoint_to_irpa",
    "unpack_int4",
    "verify_archive",
    "versions_text",
    "write_safetensors",
]
__version__ = "0.1.0"
