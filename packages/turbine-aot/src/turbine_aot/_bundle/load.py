"""``load_bundle``: a bundle read, checked against this runtime and the devices, and its module
loaded with the bundle's parameter archives."""

from __future__ import annotations

import os
import shutil
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from turbine_aot._runtime.loaded_module import LoadedModule
from turbine_aot._runtime.loading import load_module

from .archive import unpack_dir
from .read import check_compatible, read_bundle

__all__ = ["load_bundle"]


def load_bundle(
    path: str | os.PathLike,
    *,
    device: str | Sequence[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
    copy_results: bool = False,
    verify: bool = False,
    check_versions: bool = True,
    check_in_child: bool | str = False,
    parameter_memory: str | None = None,
) -> LoadedModule:
    """Loads a bundle with one call.

    Args:
        path: bundle directory or archive.
        device: device URI(s); default: those recorded in the manifest.
        parameters: scope -> path(s) replacing the bundle's archives for those scopes.
        copy_results: see :func:`~turbine_aot.runtime.load_module`.
        verify: check every file's SHA-256 against the manifest first (see
            :meth:`Bundle.verify`; sizes and the module's hash are always checked).
        check_versions: refuse a bundle whose module was built, or which was bundled, under
            another IREE release (major.minor) than this runtime's. ``False`` loads it anyway
            (IREE may then reject or misrun the module).
        check_in_child: load (and call) the bundle's module in a child process first, as
            :func:`~turbine_aot.runtime.load_module` does: for a bundle from someone you cannot
            vouch for (the hashes say the files are the ones bundled, not that they are safe).
        parameter_memory: where the archives' bytes live (``"auto"``, ``"mmap"``,
            ``"huge-pages"``; None: ``$TURBINE_PARAMETER_MEMORY``, else ``"auto"``); see
            :func:`~turbine_aot.runtime.load_module`.

    Returns:
        The loaded module; its functions are attributes.

    Raises:
        BundleError: see :func:`read_bundle`, and a bundle built for another device kind or IREE
            release.
    """
    # An archive is unpacked into a temporary directory that lives as long as the module.
    unpacked = unpack_dir() if Path(path).is_file() else None
    try:
        bundle = read_bundle(path, extract_to=unpacked, verify=verify)
        devices = (
            bundle.devices
            if device is None
            else ([device] if isinstance(device, str) else list(device))
        )
        check_compatible(bundle, devices, check_versions=check_versions)
        params: dict[str, Any] = {s: [str(p) for p in ps] for s, ps in bundle.parameters().items()}
        params.update(parameters or {})
        module = load_module(
            bundle.module_path,
            device=devices,
            parameters=params or None,
            copy_results=copy_results,
            signatures=bundle.functions,
            check_in_child=check_in_child,
            parameter_memory=parameter_memory,
        )
    except BaseException:
        if unpacked is not None:
            shutil.rmtree(unpacked, ignore_errors=True)
        raise
    if unpacked is not None:
        weakref.finalize(module, shutil.rmtree, unpacked, ignore_errors=True)
    return module
