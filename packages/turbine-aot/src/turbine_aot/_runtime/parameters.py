"""Parameter archives for a load: what ``parameters=`` accepts (a path, or per scope paths, an
``iree.runtime.ParameterIndex`` or in-memory tensors) as one ``io_parameters`` module. Where an
archive file's bytes live (IREE's memory map, or a huge-page copy on CPU devices) is decided by
:mod:`turbine_aot._runtime.parameter_memory`."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from turbine_aot._errors import TurbineRuntimeError

from .parameter_memory import (
    HUGE_PAGE_FORMATS,
    HostMemory,
    host_memory,
    read_archive,
    thp_unavailable_reason,
    use_huge_pages,
)

__all__ = ["DEFAULT_PARAMETER_SCOPE", "ParametersArg", "parameter_modules"]

#: The scope a bare parameter file is bound to: ``externalize_module_parameters`` writes an empty
#: scope as ``"model"`` (docs/design.md, "Parameters: scopes and keys").
DEFAULT_PARAMETER_SCOPE = "model"

ParametersArg = (
    None | str | os.PathLike | Mapping[str, "str | os.PathLike | Sequence[str | os.PathLike] | Any"]
)


def parameter_modules(
    instance: Any,
    parameters: Any,
    *,
    device_uris: Sequence[str] = (),
    parameter_memory: str = "mmap",
) -> tuple[list[Any], list[Any]]:
    """Builds one io_parameters module per scope; returns (modules, objects to keep alive).

    ``parameter_memory`` (a resolved policy of :mod:`.parameter_memory`) and ``device_uris``
    decide, per archive file, between IREE's memory map and a huge-page copy."""
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
    providers: list[Any] = []
    keep: list[Any] = []
    host: list[HostMemory] = []  # read at the first archive file; less each copy
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
                memory = None
                try:
                    if _huge_pages_for(path, parameter_memory, device_uris, host):
                        memory = read_archive(path)
                        index.load_from_file_handle(memory.handle, path.suffix[1:])
                        keep.append(memory)
                        _count_copy(host, memory.size)
                    else:
                        index.load(str(path))
                except Exception as e:
                    if memory is not None:
                        memory.close()
                    raise TurbineRuntimeError(
                        f"could not read parameter archive {str(path)!r} for scope {scope!r}: "
                        f"{str(e).splitlines()[0]} (IREE reads .irpa, .safetensors and .gguf)"
                    ) from e
        keep.append(index)
        providers.append(index.create_provider(scope=scope))
    return [rt.create_io_parameters_module(instance, *providers)], keep


def _huge_pages_for(
    path: Path, policy: str, device_uris: Sequence[str], host: list[HostMemory]
) -> bool:
    """Whether the archive at ``path`` is read into huge-page memory (an archive of a format IREE
    does not parse from memory is left to IREE's load, which names the formats it reads)."""
    if policy == "mmap" or path.suffix[1:].lower() not in HUGE_PAGE_FORMATS:
        return False
    if not host:
        host.append(host_memory())
    chosen = use_huge_pages(
        policy, archive_bytes=path.stat().st_size, device_uris=device_uris, host=host[0]
    )
    reason = thp_unavailable_reason(host[0])
    if chosen and policy == "huge-pages" and reason is not None:
        warnings.warn(
            f"parameter_memory='huge-pages': {reason}; {str(path)!r} is read into ordinary "
            "anonymous memory (4 KiB pages). Use parameter_memory='mmap' (or 'auto') here",
            RuntimeWarning,
            stacklevel=4,
        )
    return chosen


def _count_copy(host: list[HostMemory], size: int) -> None:
    """The next archives of this load are judged against the memory this copy left."""
    if host and host[0].mem_available is not None:
        host[0] = replace(host[0], mem_available=max(0, host[0].mem_available - size))


def _tensor_bytes(tensor: Any) -> Any:
    import torch

    if isinstance(tensor, np.ndarray):
        return np.ascontiguousarray(tensor).view(np.uint8).reshape(-1)
    t = tensor.detach().cpu().contiguous()
    return t.view(torch.uint8).reshape(-1).numpy() if t.numel() else np.empty(0, np.uint8)
