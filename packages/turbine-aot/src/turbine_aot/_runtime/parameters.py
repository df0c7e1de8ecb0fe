"""Parameter archives for a load: what ``parameters=`` accepts (a path, or per scope paths, an
``iree.runtime.ParameterIndex`` or in-memory tensors) as one ``io_parameters`` module."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from turbine_aot._errors import TurbineRuntimeError

__all__ = ["DEFAULT_PARAMETER_SCOPE", "ParametersArg", "parameter_modules"]

#: The scope a bare parameter file is bound to: ``externalize_module_parameters`` writes an empty
#: scope as ``"model"`` (docs/design.md, "Parameters: scopes and keys").
DEFAULT_PARAMETER_SCOPE = "model"

ParametersArg = (
    None | str | os.PathLike | Mapping[str, "str | os.PathLike | Sequence[str | os.PathLike] | Any"]
)


def parameter_modules(instance: Any, parameters: Any) -> tuple[list[Any], list[Any]]:
    """Builds one io_parameters module per scope; returns (modules, objects to keep alive)."""
    import iree.runtime as rt

    if parameters is None:
        return [], []
    if isinstance(parameters, (str, os.PathLike)):
        parameters = {DEFAULT_PARAMETER_SCOPE: parameters}
    if not isinstance(parameters, Mapping):
        raise TurbineRuntimeError(
            "parameters must be a path (bound to scope 'model') or a mapping of scope -> "
            f"path(s) / ParameterIndex / dict of tensors; got {type(parameters).__name__}"
        )
    providers, keep = [], []
    for scope, source in parameters.items():
        if isinstance(source, rt.ParameterIndex):
            index = source
        else:
            index = rt.ParameterIndex()
            if isinstance(source, (str, os.PathLike)):
                sources: list[Any] = [source]
            elif isinstance(source, Mapping):
                sources = [source]
            else:
                sources = list(source)
            for src in sources:
                if isinstance(src, Mapping):  # in-memory tensors by name
                    for key, tensor in src.items():
                        data = _tensor_bytes(tensor)
                        keep.append(data)
                        index.add_buffer(key, data)
                    continue
                path = Path(src)
                if not path.is_file():
                    raise TurbineRuntimeError(
                        f"parameter archive {str(path)!r} for scope {scope!r} does not exist; "
                        "write it with turbine_params.save_module_parameters or pass the "
                        "right path"
                    )
                try:
                    index.load(str(path))
                except Exception as e:
                    raise TurbineRuntimeError(
                        f"could not read parameter archive {str(path)!r} for scope {scope!r}: "
                        f"{str(e).splitlines()[0]} (IREE reads .irpa, .safetensors and .gguf)"
                    ) from e
        keep.append(index)
        providers.append(index.create_provider(scope=scope))
    return [rt.create_io_parameters_module(instance, *providers)], keep


def _tensor_bytes(tensor: Any) -> Any:
    import torch

    if isinstance(tensor, np.ndarray):
        return np.ascontiguousarray(tensor).view(np.uint8).reshape(-1)
    t = tensor.detach().cpu().contiguous()
    return t.view(torch.uint8).reshape(-1).numpy() if t.numel() else np.empty(0, np.uint8)
