"""A bundle's manifest: the format constants and file names, the versions and device records
it holds, and its shape, checked before any field of it is used.

A manifest comes from a file that may have been edited or damaged: every field the loader reads
is checked here for its JSON type first, so that a tampered manifest is a ``BundleError`` naming
the field, never a ``KeyError`` / ``TypeError`` / ``AttributeError`` from deep in the loader.
What the fields mean (paths inside the bundle, hashes, versions) is checked by :mod:`.read`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from turbine_aot._compiler.targets import resolve_target
from turbine_aot._version import __version__ as turbine_aot_version

__all__ = [
    "BUNDLE_FORMAT",
    "BUNDLE_FORMAT_VERSION",
    "FLAGFILE",
    "MANIFEST",
    "MODULE_FILE",
    "check_manifest_shape",
    "device_records",
    "release",
    "versions",
]

BUNDLE_FORMAT = "turbine-bundle"

BUNDLE_FORMAT_VERSION = 1

MANIFEST = "manifest.json"

MODULE_FILE = "module.vmfb"

FLAGFILE = "iree-run-module.flags"


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    try:
        from iree.runtime import version as rv

        out["iree_runtime"] = rv.VERSION
    except Exception:
        out["iree_runtime"] = None
    try:
        from iree.compiler import version as cv

        out["iree_compiler"] = cv.VERSION
    except Exception:
        out["iree_compiler"] = None
    try:
        import torch

        out["torch"] = torch.__version__.split("+")[0]
    except Exception:
        out["torch"] = None
    out["turbine_aot"] = turbine_aot_version
    return out


def release(version: str | None) -> str | None:
    """``3.13.0rc20261016`` -> ``3.13`` (IREE's bytecode is compatible within a release)."""
    if not version:
        return None
    parts = version.split(".")
    return ".".join(parts[:2])


def device_records(devices: Sequence[str]) -> list[dict[str, Any]]:
    out: list[dict[str, str | None]] = []
    for uri in devices:
        driver = uri.split("://", 1)[0].split(":", 1)[0]
        try:
            t = resolve_target(driver)
            out.append({"uri": uri, "driver": driver, "target": t.name, "hal_device": t.hal_device})
        except Exception:
            out.append({"uri": uri, "driver": driver, "target": None, "hal_device": driver})
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _opt_str(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _tensor_spec(v: Any) -> bool:
    return (
        isinstance(v, dict)
        and _list_of(lambda d: d is None or (_is_int(d) and d >= 0))(v.get("shape"))
        and _is_str(v.get("dtype"))
        and isinstance(v.get("is_tensor", True), bool)
        and _opt_str(v.get("device"))
    )


def check_manifest_shape(manifest: Any, where: Path, error: type[Exception]) -> None:
    """Raises ``error`` naming ``where`` and the field when ``manifest`` does not have the
    JSON shape of a turbine bundle manifest (format version checked by the caller)."""

    def bad(field: str, expected: str) -> Exception:
        return error(
            f"{str(where)!r}: the manifest's {field} is not {expected}; the manifest was edited "
            "or damaged: rebuild the bundle with `turbine-aot bundle`"
        )

    if not isinstance(manifest, dict):
        raise error(f"{str(where)!r} does not hold a JSON object; it is not a bundle manifest")
    if not _is_int(manifest.get("format_version", 0)):
        raise bad("format_version", "an integer")
    for key in ("module", "module_sha256"):
        if not _is_str(manifest.get(key)):
            raise bad(key, "a string")
    files = manifest.get("files")
    if files is not None:
        if not isinstance(files, dict):
            raise bad("files", "an object of path -> {size, sha256}")
        for rel, rec in files.items():
            if not (
                isinstance(rec, dict) and _is_int(rec.get("size")) and _is_str(rec.get("sha256"))
            ):
                raise bad(f"files[{rel!r}]", "an object with an integer size and a sha256 string")
    functions = manifest.get("functions")
    if not isinstance(functions, dict):
        raise bad("functions", "an object of name -> signature")
    for name, sig in functions.items():
        if not (
            isinstance(sig, dict)
            and _list_of(_tensor_spec)(sig.get("inputs"))
            and _list_of(_tensor_spec)(sig.get("outputs"))
        ):
            raise bad(
                f"functions[{name!r}]",
                "a signature (inputs and outputs: lists of {shape, dtype})",
            )
    parameters = manifest.get("parameters", {})
    if not (
        isinstance(parameters, dict) and all(_list_of(_is_str)(v) for v in parameters.values())
    ):
        raise bad("parameters", "an object of scope -> list of paths")
    devices = manifest.get("devices")
    if not (
        isinstance(devices, list)
        and devices
        and all(
            isinstance(d, dict)
            and _is_str(d.get("uri"))
            and _is_str(d.get("driver"))
            and _opt_str(d.get("target"))
            and _opt_str(d.get("hal_device"))
            for d in devices
        )
    ):
        raise bad("devices", "a non-empty list of {uri, driver, target, hal_device}")
    flags = manifest.get("compile_flags")
    if flags is not None and not _list_of(_is_str)(flags):
        raise bad("compile_flags", "a list of strings")
    versions = manifest.get("versions")
    if versions is not None and not isinstance(versions, dict):
        raise bad("versions", "an object")
    run = manifest.get("iree_run_module")
    if run is not None and not (isinstance(run, dict) and _list_of(_is_str)(run.get("flags"))):
        raise bad("iree_run_module", "an object with a list of flags")
