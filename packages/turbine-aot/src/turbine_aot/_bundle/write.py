"""Writing a bundle: the module (compiled here from an ``ExportOutput``), its parameter
archives (checked, hard-linked or copied), the manifest and the ``iree-run-module`` flag file,
into a work directory published as the bundle directory or archive in one step."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from turbine_aot._errors import TurbineRuntimeError
from turbine_aot._hashing import sha256_file
from turbine_aot._runtime.loading import LoadableExport, module_bytes_or_path
from turbine_aot._runtime.parameters import DEFAULT_PARAMETER_SCOPE
from turbine_aot._signatures.abi import FlatSignature
from turbine_aot._signatures.reflection import (
    compiled_with_flags,
    function_signature,
    module_functions,
    module_name,
)
from turbine_params import ParameterArchive, ParameterArchiveError, make_owned_temp

from .archive import publish_archive
from .bundle import Bundle, BundleError
from .manifest import (
    BUNDLE_FORMAT,
    BUNDLE_FORMAT_VERSION,
    FLAGFILE,
    MANIFEST,
    MODULE_FILE,
    device_records,
    versions,
)

__all__ = ["check_parameter_file", "save_bundle"]


def _module_records(vmfb: bytes) -> tuple[str, dict[str, FlatSignature], list[str] | None]:
    """The module's name, its functions' signatures and the compile flags it records having been
    built with (``None`` when it records none: not compiled by turbine)."""
    import iree.runtime as rt

    instance = rt.VmInstance()
    try:
        mod = rt.VmModule.copy_buffer(instance, vmfb)
    except Exception as e:
        raise BundleError(f"the module to bundle is not a loadable .vmfb: {e}") from e
    sigs = {}
    built_with: list[str] | None = None
    where = "the module to bundle"
    try:
        for name, _fn, reflection in module_functions(mod, where):
            # The flat ABI and the call signature (trees, names, dim ranges) the module records.
            sigs[name] = function_signature(name, reflection, where=where)
            if built_with is None:
                built_with = compiled_with_flags(reflection)
        return module_name(mod, where), sigs, built_with
    except TurbineRuntimeError as e:
        raise BundleError(str(e)) from e


def _normalize_parameters(parameters: Any) -> dict[str, list[Path]]:
    if parameters is None:
        return {}
    if isinstance(parameters, (str, os.PathLike)):
        parameters = {DEFAULT_PARAMETER_SCOPE: parameters}
    out: dict[str, list[Path]] = {}
    for scope, src in parameters.items():
        paths = [src] if isinstance(src, (str, os.PathLike)) else list(src)
        out[scope] = []
        for p in paths:
            path = Path(p)
            if not path.is_file():
                raise BundleError(
                    f"parameter archive {str(path)!r} (scope {scope!r}) does not exist; bundles "
                    "hold parameter files (.irpa, .safetensors, .gguf), not in-memory tensors"
                )
            check_parameter_file(path, scope)
            out[scope].append(path)
    return out


def check_parameter_file(path: Path, scope: str) -> None:
    """Refuses a file that is not a parameter archive IREE can read (``.irpa`` and
    ``.safetensors`` are parsed with turbine_params' checked reader, ``.gguf`` by its magic), so
    that random bytes are refused when bundling, not when IREE's loader meets them.

    Raises:
        BundleError: naming the file, its scope and what is wrong.
    """
    if path.name.endswith(".gguf"):
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise BundleError(
                f"parameter file {str(path)!r} (scope {scope!r}) is not a GGUF file (it starts "
                f"with {magic!r}, not b'GGUF'); give an .irpa, .safetensors or .gguf archive"
            )
        return
    try:
        ParameterArchive(path, mmap=False).close()
    except ParameterArchiveError as e:
        raise BundleError(
            f"parameter file {str(path)!r} (scope {scope!r}) is not a readable parameter "
            f"archive: {e.reason}"
        ) from e


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # same filesystem: no copy of large weights
    except OSError:
        shutil.copyfile(src, dst)


def save_bundle(
    path: str | os.PathLike,
    module: Any,
    *,
    parameters: Any = None,
    device: str | Sequence[str] = "local-task",
    compile_flags: Sequence[str] | None = None,
    overwrite: bool = False,
    cache: Any = True,
    signatures: Mapping[str, FlatSignature] | None = None,
) -> Bundle:
    """Writes a deployable bundle.

    Args:
        path: a directory to create, or a file ending in ``.tar`` / ``.tar.gz`` / ``.tgz``.
        module: ``.vmfb`` bytes or path, a compiler ``Output``, or an ``ExportOutput`` (compiled
            here for ``device``).
        parameters: a parameter file (scope ``"model"``) or a mapping scope -> path(s).
        device: the device URI(s) the module is built for (recorded; used to compile an
            ``ExportOutput``).
        compile_flags: the flags the module was (or is to be) compiled with, recorded.
        overwrite: replace an existing bundle at ``path``.
        cache: compile cache setting when compiling an ``ExportOutput``.
        signatures: entry-point signatures for modules without ABI reflection (taken from an
            ``ExportOutput``'s IR automatically).

    Returns:
        The :class:`Bundle` (for an archive, the manifest and the archive path).

    Raises:
        BundleError: ``path`` exists (without ``overwrite``), a parameter file is missing, or
            the module is not a ``.vmfb``.
    """
    devices = [device] if isinstance(device, str) else list(device)
    dest = Path(path)
    _check_destination(dest, overwrite)
    vmfb, module_name, sigs, recorded_flags = _compiled_contents(
        module, devices, compile_flags, cache, signatures
    )
    params = _normalize_parameters(parameters)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # A work directory named for its owner (turbine_params.make_owned_temp: a later save to
    # `dest` removes it if this process is killed) and made with mkdir, not mkdtemp (0700): the
    # bundle gets the usual permissions (umask), so others can read what was deployed.
    work = make_owned_temp(dest, directory=True)
    try:
        manifest = _fill_bundle(work, vmfb, params, devices, module_name, sigs, recorded_flags)
        if dest.name.endswith((".tar", ".tar.gz", ".tgz")):
            publish_archive(work, dest)
        else:
            _publish_directory(work, dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Bundle(dest, manifest)


def _check_destination(dest: Path, overwrite: bool) -> None:
    if dest.exists() and not overwrite:
        raise BundleError(
            f"{str(dest)!r} already exists; pass overwrite=True (--force) to replace it"
        )
    if dest.is_dir() and not dest.is_symlink() and not (dest / MANIFEST).is_file():
        # overwrite=True replaces a bundle, never deletes an arbitrary directory tree.
        raise BundleError(
            f"{str(dest)!r} is a directory but not a bundle (no {MANIFEST}); refusing to "
            "replace it: give the bundle a new path"
        )


def _compiled_contents(
    module: Any,
    devices: list[str],
    compile_flags: Sequence[str] | None,
    cache: Any,
    signatures: Mapping[str, FlatSignature] | None,
) -> tuple[bytes, str, dict[str, FlatSignature], list[str] | None]:
    """The ``.vmfb`` bytes (an ``ExportOutput`` compiles itself here), its module name, its
    entry-point signatures and the compile flags to record: those the module records having
    been built with (without the speed-only defaults when those failed), else the given
    ``compile_flags`` of a module turbine did not compile."""
    data, mpath = module_bytes_or_path(
        module, device=devices, compile_flags=compile_flags, cache=cache
    )
    vmfb = data if data is not None else Path(mpath).read_bytes()  # type: ignore[arg-type]
    module_name, sigs, built_with = _module_records(vmfb)
    is_export = isinstance(module, LoadableExport)
    if signatures is None and is_export:
        signatures = module._flat_signatures()
    for name, sig in (signatures or {}).items():
        if name in sigs and not sigs[name].inputs and not sigs[name].outputs:
            sigs[name] = sig
    recorded_flags = built_with if is_export or not compile_flags else list(compile_flags)
    return vmfb, module_name, sigs, recorded_flags or None


def _fill_bundle(
    work: Path,
    vmfb: bytes,
    params: dict[str, list[Path]],
    devices: list[str],
    module_name: str,
    sigs: dict[str, FlatSignature],
    recorded_flags: list[str] | None,
) -> dict[str, Any]:
    """Writes the module, parameter files, manifest and flag file into ``work``; returns the
    manifest."""
    (work / MODULE_FILE).write_bytes(vmfb)
    param_rel: dict[str, list[str]] = {}
    if params:
        (work / "params").mkdir()
    for scope, files in params.items():
        param_rel[scope] = []
        for i, f in enumerate(files):
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in scope) or "default"
            rel = f"params/{safe}{'' if i == 0 else f'-{i}'}{''.join(f.suffixes) or '.irpa'}"
            _link_or_copy(f, work / rel)
            param_rel[scope].append(rel)
    # Per-file size + SHA-256 (hashing reads the weights once, ~1-2 s per GB): every load
    # checks the sizes, Bundle.verify()/verify=True the hashes.
    records = {
        rel: {"size": (work / rel).stat().st_size, "sha256": sha256_file(work / rel)}
        for rel in [p for ps in param_rel.values() for p in ps]
    }
    module_sha256 = hashlib.sha256(vmfb).hexdigest()
    records[MODULE_FILE] = {"size": len(vmfb), "sha256": module_sha256}
    run_flags = [f"--module={MODULE_FILE}"]
    run_flags += [f"--device={d}" for d in devices]
    run_flags += [f"--parameters={s}={p}" for s, ps in param_rel.items() for p in ps]
    manifest = {
        "format": BUNDLE_FORMAT,
        "format_version": BUNDLE_FORMAT_VERSION,
        "module": MODULE_FILE,
        "module_name": module_name,
        "module_sha256": module_sha256,
        "files": records,
        "functions": {k: s.to_json() for k, s in sigs.items()},
        "parameters": param_rel,
        "devices": device_records(devices),
        "compile_flags": recorded_flags,
        "versions": versions(),
        "iree_run_module": {
            "flags": run_flags,
            "flagfile": FLAGFILE,
            "example": (
                f"cd <bundle> && iree-run-module --flagfile={FLAGFILE} "
                f"--function={next(iter(sigs), 'main')} --input=..."
            ),
        },
    }
    (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    (work / FLAGFILE).write_text("\n".join(run_flags) + "\n")
    for f in (work / MODULE_FILE, work / MANIFEST):
        with open(f, "rb+") as fh:
            os.fsync(fh.fileno())
    return manifest


def _publish_directory(work: Path, dest: Path) -> None:
    """The directory form: ``work`` renamed to ``dest`` (replacing a previous bundle there)."""
    if dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest)
    elif dest.exists() or dest.is_symlink():
        dest.unlink()
    os.replace(work, dest)
