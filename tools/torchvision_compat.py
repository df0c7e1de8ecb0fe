"""Makes ``torchvision`` (and so ``transformers``) importable against the CPU torch wheel.

The ``torchvision==0.28.0`` wheel the registry serves for torch 2.13 is CUDA-linked: its C++
extension (``torchvision/_C.so``) does not load against the CPU torch, and the Python package then
fails on import with ``operator torchvision::nms does not exist`` (its fake-tensor registrations
need the op schemas). ``transformers`` imports torchvision when it is installed, so
``from transformers import LlamaConfig`` fails the same way.

Classification and segmentation models never call those C++ ops (NMS, RoIAlign, deformable
convolution are detection ops). :func:`install` therefore defines stand-in *schemas* for the ops
torchvision's Python code registers against at import time, with kernels that raise a clear error
if anything does call them. It must run before the first ``import torchvision`` or
``import transformers``; it is a no-op when torchvision is absent or its extension loads.
Test and benchmark code only: nothing in the packages depends on torchvision.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# The ops torchvision's Python modules reference by name during import (torchvision 0.28).
_STAND_IN_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}

_state: dict[str, object] = {}


def _extension_loads() -> bool:
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return True  # nothing to fix: torchvision is not installed
    for location in spec.submodule_search_locations:
        for lib in Path(location).glob("_C*.so"):
            try:
                torch.ops.load_library(str(lib))
            except (OSError, RuntimeError):
                return False
            return True
    return False


def install() -> bool:
    """Defines the stand-in schemas when needed; returns True if it did (idempotent)."""
    if "installed" in _state:
        return bool(_state["installed"])
    if importlib.util.find_spec("torch") is None:
        _state["installed"] = False
        return False
    import torch

    if _extension_loads():
        _state["installed"] = False
        return False
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for name, schema in _STAND_IN_SCHEMAS.items():
        lib.define(schema)

        def _unavailable(*args, _name=name, **kwargs):
            raise NotImplementedError(
                f"torchvision::{_name} is a stand-in (tools/torchvision_compat.py): the installed "
                "torchvision's C++ extension does not load against this torch build"
            )

        lib.impl(name, _unavailable, "CompositeExplicitAutograd")
    _state["installed"] = True
    _state["lib"] = lib  # keep the library alive: dropping it removes the definitions
    return True
