"""Shared helpers for turbine_fx tests: build a module, import programs, compile and run."""

from __future__ import annotations

import numpy as np
import torch

from turbine_ir import ModuleBuilder
from turbine_ir.ir import Context, Location, Module


class Built:
    """A module under construction with its ModuleBuilder (keeps the MLIR context alive)."""

    def __init__(self):
        self.context = Context()
        with self.context, Location.unknown():
            self.module = Module.create()
            self.mb = ModuleBuilder(self.module.operation)

    def asm(self) -> str:
        with self.context:
            return str(self.module)

    def __enter__(self):
        self._ctx = self.context.__enter__()
        self._loc = Location.unknown(self.context)
        self._loc.__enter__()
        return self

    def __exit__(self, *exc):
        self._loc.__exit__(*exc)
        self.context.__exit__(*exc)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        raise TypeError("use float32 inputs in tests")
    return t.detach().contiguous().numpy()


def results_to_torch(results) -> list[torch.Tensor]:
    if not isinstance(results, (tuple, list)):
        results = [results]
    out = []
    for r in results:
        host = r.to_host() if hasattr(r, "to_host") else r
        out.append(torch.from_numpy(np.asarray(host)))
    return out


def run_module(iree_device, asm: str, fn: str, calls, *, parameters=None):
    """Compiles ``asm`` for the test device and calls ``fn`` once per args tuple in ``calls``."""
    vmfb = iree_device.compile(asm, extra_args=["--iree-input-type=torch"])
    module = iree_device.load(vmfb, parameters=parameters)
    f = getattr(module, fn)
    return [
        results_to_torch(f(*[to_numpy(a) if isinstance(a, torch.Tensor) else a for a in args]))
        for args in calls
    ]
