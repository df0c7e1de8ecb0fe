"""The keys of the records turbine stores in a function's ``iree.reflection`` dictionary (they
survive compilation into the ``.vmfb``, where IREE's runtime returns them from
``VmFunction.reflection``)."""

from __future__ import annotations

__all__ = [
    "ARGS_SCHEMA",
    "COMPILE_KEY",
    "PARAMETERS_KEY",
    "REFLECTION_ATTR",
    "RETURN_SCHEMA",
    "SIGNATURE_FORMAT",
    "SIGNATURE_KEY",
]

REFLECTION_ATTR = "iree.reflection"

ARGS_SCHEMA = "torch.args_schema"

RETURN_SCHEMA = "torch.return_schema"

SIGNATURE_KEY = "turbine.signature"

#: the version of the ``turbine.signature`` JSON; a newer one is ignored (flat calls)
SIGNATURE_FORMAT = 1

#: the parameters the module reads (JSON list), recorded on its first public function
PARAMETERS_KEY = "turbine.parameters"

#: the compile flags and compiler version (JSON), recorded on the first public function while
#: compiling (the exported IR is left as it was)
COMPILE_KEY = "turbine.compile"
