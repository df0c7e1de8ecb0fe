"""``turbine_aot.params``: the reference path of the parameter-archive API (implemented in
``turbine_params``)."""

from __future__ import annotations

from turbine_params import (
    ParameterArchive,
    ParameterArchiveBuilder,
    ParameterArchiveEntry,
    externalize_module_parameters,
    save_module_parameters,
)

__all__ = [
    "ParameterArchive",
    "ParameterArchiveBuilder",
    "ParameterArchiveEntry",
    "externalize_module_parameters",
    "save_module_parameters",
]
