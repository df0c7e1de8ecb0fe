"""Reading a bundle: its manifest validated (shape, format version, paths inside the bundle),
its files checked (sizes and the module's SHA-256; every SHA-256 when asked), and whether it
fits this runtime (IREE release) and the devices it is loaded on."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

from turbine_aot._hashing import sha256_file

from .archive import extract_archive, unpack_dir, unsafe_path
from .bundle import Bundle, BundleError
from .manifest import (
    BUNDLE_FORMAT,
    BUNDLE_FORMAT_VERSION,
    MANIFEST,
    check_manifest_shape,
    release,
    versions,
)

__all__ = ["check_compatible", "read_bundle"]

# Runtime drivers that can run modules built for each HAL device kind.
_DRIVERS_FOR_HAL_DEVICE = {
    "local": ("local-task", "local-sync"),
    "vulkan": ("vulkan",),
    "cuda": ("cuda",),
    "hip": ("hip",),
    "metal": ("metal",),
}


def read_bundle(
    path: str | os.PathLike,
    *,
    extract_to: str | os.PathLike | None = None,
    verify: bool = False,
) -> Bundle:
    """Reads and validates a bundle's manifest (unpacking an archive first).

    The module's SHA-256 and every file's size are checked; the parameter files' SHA-256 only
    with ``verify=True`` (see :meth:`Bundle.verify`).

    Args:
        path: the bundle directory or ``.tar``/``.tar.gz`` file.
        extract_to: where to unpack an archive (default: a new temporary directory).
        verify: also hash every parameter file and compare with the manifest.

    Raises:
        BundleError: not a bundle, an unknown format version, a missing or altered file.
    """
    src = Path(path)
    if not src.exists():
        raise BundleError(
            f"bundle {str(src)!r} does not exist; create it with `turbine-aot bundle`"
        )
    if src.is_file():
        if not tarfile.is_tarfile(src):
            raise BundleError(f"{str(src)!r} is neither a bundle directory nor a .tar archive")
        out = Path(extract_to) if extract_to else unpack_dir()
        try:
            with tarfile.open(src) as tf:
                extract_archive(tf, src, out)
            return _read_bundle_dir(out, verify=verify)
        except BaseException:
            if not extract_to:  # our temporary directory: do not leave an unusable copy behind
                shutil.rmtree(out, ignore_errors=True)
            raise
    return _read_bundle_dir(src, verify=verify)


def _read_bundle_dir(src: Path, *, verify: bool = False) -> Bundle:
    mpath = src / MANIFEST
    try:
        manifest = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise BundleError(f"{str(src)!r} has no {MANIFEST}; it is not a turbine bundle") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{str(mpath)!r} is not valid JSON: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{str(mpath)!r} is not a {BUNDLE_FORMAT} manifest")
    check_manifest_shape(manifest, mpath, BundleError)  # every field's type, before any use
    if manifest.get("format_version", 0) > BUNDLE_FORMAT_VERSION:
        raise BundleError(
            f"bundle format version {manifest.get('format_version')} is newer than this "
            f"turbine-aot reads ({BUNDLE_FORMAT_VERSION}); upgrade turbine-aot"
        )
    rel_paths = [("module", manifest.get("module"))] + [
        (f"parameter scope {scope!r}", p)
        for scope, ps in (manifest.get("parameters") or {}).items()
        for p in ps
    ]
    rel_paths += [("recorded", rel) for rel in (manifest.get("files") or {})]
    for what, rel in rel_paths:
        why = unsafe_path(rel) if isinstance(rel, str) else "not a path"
        if why is not None:
            raise BundleError(
                f"{str(mpath)!r}: the {what} file {rel!r} ({why}) is not inside the bundle; a "
                "manifest names files of its bundle only: rebuild it with `turbine-aot bundle`"
            )
    bundle = Bundle(src, manifest)
    if not bundle.module_path.is_file():
        raise BundleError(f"bundle {str(src)!r} is missing {manifest['module']}")
    if sha256_file(bundle.module_path) != manifest.get("module_sha256"):
        raise BundleError(
            f"{str(bundle.module_path)!r} does not match the manifest's sha256; the bundle was "
            "altered or truncated: rebuild it"
        )
    for scope, files in bundle.parameters().items():
        for f in files:
            if not f.is_file():
                raise BundleError(
                    f"bundle {str(src)!r} is missing parameter file {f.name} ({scope})"
                )
    if verify:
        bundle.verify()
    else:
        bundle._check_files(hashes=False)
    return bundle


def _check_versions(bundle: Bundle) -> None:
    """IREE's bytecode is compatible within a release (major.minor): the IREE compiler that
    built the module and the runtime it was bundled with must both be of this runtime's
    release. A version the manifest does not record (``null``) is not checked."""
    recorded = bundle.manifest.get("versions")
    if recorded is None:
        return
    if not isinstance(recorded, dict):
        raise BundleError(
            f"{str(bundle.path / MANIFEST)!r}: 'versions' is not an object; rebuild the bundle"
        )
    here = versions()["iree_runtime"]
    for key, what in (("iree_compiler", "IREE compiler"), ("iree_runtime", "IREE runtime")):
        built = recorded.get(key)
        if built is None:
            continue
        if not isinstance(built, str) or not release(built):
            raise BundleError(
                f"{str(bundle.path / MANIFEST)!r}: versions.{key} is {built!r}, not a version; "
                "rebuild the bundle"
            )
        if release(here) and release(built) != release(here):
            raise BundleError(
                f"bundle {str(bundle.path)!r} was built with IREE {built} but this runtime is "
                f"IREE {here} (the manifest's {what} version): IREE modules load only under the "
                f"release that built them ({release(built)}). Rebuild it with `turbine-aot bundle` under IREE "
                f"{release(here)}, install iree-base-runtime=={built}, or load it anyway with "
                "check_versions=False (CLI: --ignore-versions)"
            )


def check_compatible(bundle: Bundle, devices: list[str], *, check_versions: bool = True) -> None:
    if check_versions:
        _check_versions(bundle)
    records = bundle.manifest.get("devices", [])
    if len(devices) != len(records):
        raise BundleError(
            f"bundle {str(bundle.path)!r} is built for {len(records)} device(s) "
            f"({', '.join(r['uri'] for r in records)}); got {len(devices)}: {', '.join(devices)}"
        )
    for uri, rec in zip(devices, records):
        driver = uri.split("://", 1)[0].split(":", 1)[0]
        ok = _DRIVERS_FOR_HAL_DEVICE.get(rec.get("hal_device"), (rec.get("driver"),))
        if driver not in ok:
            raise BundleError(
                f"bundle {str(bundle.path)!r} is built for {rec.get('target') or rec['driver']} "
                f"(runs on {', '.join(ok)}), not for device {uri!r}; rebuild it with "
                f"`turbine-aot bundle --device {uri}` or load it with device={ok[0]!r}"
            )
