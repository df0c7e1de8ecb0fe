"""Deployable bundles: one directory (or ``.tar``/``.tar.gz``) with a ``.vmfb``, its parameter
archives and a manifest.

Layout::

    my_bundle/
      manifest.json            what is inside, how to run it, which versions built it
      module.vmfb              the compiled module
      params/<scope>[-N].<ext> the parameter archives, one or more per scope
      iree-run-module.flags    a flag file: iree-run-module --flagfile=iree-run-module.flags ...

The manifest records the entry points with argument/result shapes (``null`` for dynamic dims)
and dtypes, the parameter scopes, the target devices, the compile flags and the versions of IREE,
torch and turbine used; :func:`load_bundle` refuses a bundle built for another device kind or
another IREE release with a message saying what to rebuild or install.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turbine_aot._bundle_manifest import check_manifest_shape
from turbine_aot._compiler.flags import device_compile_flags
from turbine_aot._compiler.targets import resolve_target
from turbine_aot._compiler.traits import program_traits
from turbine_aot._errors import TurbineRuntimeError
from turbine_aot._runtime.loaded_module import LoadedModule
from turbine_aot._runtime.loading import load_module, module_bytes_or_path
from turbine_aot._runtime.parameters import DEFAULT_PARAMETER_SCOPE
from turbine_aot._signatures.abi import FunctionSignature, signatures_from_mlir
from turbine_aot._signatures.reflection import function_signature, module_functions, module_name
from turbine_aot._version import __version__ as turbine_aot_version
from turbine_params import (
    ParameterArchive,
    ParameterArchiveError,
    atomic_output_file,
    make_owned_temp,
)

__all__ = [
    "BUNDLE_FORMAT",
    "BUNDLE_FORMAT_VERSION",
    "Bundle",
    "BundleError",
    "load_bundle",
    "read_bundle",
    "save_bundle",
]

BUNDLE_FORMAT = "turbine-bundle"
BUNDLE_FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MODULE_FILE = "module.vmfb"
FLAGFILE = "iree-run-module.flags"

# Runtime drivers that can run modules built for each HAL device kind.
_DRIVERS_FOR_HAL_DEVICE = {
    "local": ("local-task", "local-sync"),
    "vulkan": ("vulkan",),
    "cuda": ("cuda",),
    "hip": ("hip",),
    "metal": ("metal",),
}


class BundleError(TurbineRuntimeError):
    """A bundle is missing, malformed, or does not fit this machine."""


def _versions() -> dict[str, str | None]:
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


def _release(version: str | None) -> str | None:
    """``3.13.0rc20261016`` -> ``3.13`` (IREE's bytecode is compatible within a release)."""
    if not version:
        return None
    parts = version.split(".")
    return ".".join(parts[:2])


def _signatures_of(vmfb: bytes) -> tuple[str, dict[str, FunctionSignature]]:
    import iree.runtime as rt

    instance = rt.VmInstance()
    try:
        mod = rt.VmModule.copy_buffer(instance, vmfb)
    except Exception as e:
        raise BundleError(f"the module to bundle is not a loadable .vmfb: {e}") from e
    sigs = {}
    where = "the module to bundle"
    try:
        for name, _fn, reflection in module_functions(mod, where):
            # The flat ABI and the call signature (trees, names, dim ranges) the module records.
            sigs[name] = function_signature(name, reflection, where=where)
        return module_name(mod, where), sigs
    except TurbineRuntimeError as e:
        raise BundleError(str(e)) from e


def _device_records(devices: Sequence[str]) -> list[dict[str, Any]]:
    out = []
    for uri in devices:
        driver = uri.split("://", 1)[0].split(":", 1)[0]
        try:
            t = resolve_target(driver)
            out.append({"uri": uri, "driver": driver, "target": t.name, "hal_device": t.hal_device})
        except Exception:
            out.append({"uri": uri, "driver": driver, "target": None, "hal_device": driver})
    return out


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


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Bundle:
    """A bundle on disk (a directory; archives are unpacked to one) and its manifest."""

    path: Path
    manifest: dict[str, Any]

    @property
    def module_path(self) -> Path:
        return self.path / self.manifest["module"]

    @property
    def functions(self) -> dict[str, FunctionSignature]:
        return {k: FunctionSignature.from_json(k, v) for k, v in self.manifest["functions"].items()}

    @property
    def devices(self) -> list[str]:
        return [d["uri"] for d in self.manifest["devices"]]

    def parameters(self) -> dict[str, list[Path]]:
        return {
            s: [self.path / p for p in ps] for s, ps in self.manifest.get("parameters", {}).items()
        }

    def iree_run_module_args(self) -> list[str]:
        """``iree-run-module`` flags (paths relative to the bundle) that load this bundle."""
        return list(self.manifest["iree_run_module"]["flags"])

    def verify(self) -> None:
        """Checks every file of the bundle against the SHA-256 its manifest records.

        Reads all the weights (about 1-2 s per GB here), which is why loading checks only the
        sizes (and the module's hash); call this, or pass ``verify=True`` to
        :func:`read_bundle` / :func:`load_bundle`, after copying a bundle or before deploying it.

        Raises:
            BundleError: a file is missing, has another size or content than when the bundle
                was written, or the bundle has no per-file hashes (written before they existed).
        """
        files = self.manifest.get("files")
        if not isinstance(files, dict):
            raise BundleError(
                f"bundle {str(self.path)!r} records no per-file SHA-256 (written by an older "
                "turbine-aot); rebuild it with `turbine-aot bundle` to verify it"
            )
        self._check_files(hashes=True)

    def _check_files(self, *, hashes: bool) -> None:
        for rel, rec in (self.manifest.get("files") or {}).items():
            f = self.path / rel
            if not isinstance(rec, dict):
                raise BundleError(
                    f"{str(self.path / MANIFEST)!r}: the record of {rel!r} is not an object "
                    "with size and sha256; rebuild the bundle"
                )
            try:
                size = f.stat().st_size
            except FileNotFoundError:
                raise BundleError(f"bundle {str(self.path)!r} is missing {rel}") from None
            if size != rec.get("size"):
                raise BundleError(
                    f"bundle file {rel!r} of {str(self.path)!r} is {size} bytes but the manifest "
                    f"says {rec.get('size')}: it was truncated or replaced; rebuild the bundle"
                )
            if hashes and _sha256_file(f) != rec.get("sha256"):
                raise BundleError(
                    f"bundle file {rel!r} of {str(self.path)!r} does not match the manifest's "
                    "sha256: it was altered (or corrupted) after the bundle was written; rebuild "
                    "the bundle"
                )


def save_bundle(
    path: str | os.PathLike,
    module: Any,
    *,
    parameters: Any = None,
    device: str | Sequence[str] = "local-task",
    compile_flags: Sequence[str] | None = None,
    overwrite: bool = False,
    cache: Any = True,
    signatures: Mapping[str, FunctionSignature] | None = None,
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
            _publish_archive(work, dest)
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
    signatures: Mapping[str, FunctionSignature] | None,
) -> tuple[bytes, str, dict[str, FunctionSignature], list[str] | None]:
    """The ``.vmfb`` bytes (compiled here from an ``ExportOutput``), its module name, its
    entry-point signatures and the compile flags to record."""
    is_export = hasattr(module, "mlir_module") and hasattr(module, "compile")
    if is_export:
        module._last_compile_flags = None  # set by ExportOutput.compile if it compiles now
    data, mpath = module_bytes_or_path(
        module, device=devices, compile_flags=compile_flags, cache=cache
    )
    vmfb = data if data is not None else Path(mpath).read_bytes()  # type: ignore[arg-type]
    module_name, sigs = _signatures_of(vmfb)
    if signatures is None and is_export:
        signatures = signatures_from_mlir(module)
    for name, sig in (signatures or {}).items():
        if name in sigs and not sigs[name].inputs and not sigs[name].outputs:
            sigs[name] = sig
    recorded_flags: list[str] | None
    if is_export:
        traits = program_traits(module)
        # The flags it was compiled with: without the speed-only defaults when those failed
        # (a compile-cache hit records the defaults it was looked up with).
        recorded_flags = getattr(module, "_last_compile_flags", None) or device_compile_flags(
            devices, compile_flags, traits=traits
        )
    else:
        recorded_flags = list(compile_flags or [])
    return vmfb, module_name, sigs, recorded_flags or None


def _fill_bundle(
    work: Path,
    vmfb: bytes,
    params: dict[str, list[Path]],
    devices: list[str],
    module_name: str,
    sigs: dict[str, FunctionSignature],
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
        rel: {"size": (work / rel).stat().st_size, "sha256": _sha256_file(work / rel)}
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
        "devices": _device_records(devices),
        "compile_flags": recorded_flags,
        "versions": _versions(),
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


def _publish_archive(work: Path, dest: Path) -> None:
    """The bundle form ``.tar`` / ``.tar.gz``: ``work`` packed into ``dest``, then removed."""
    # turbine_params.atomic_output_file: fsynced, renamed, never a half-written archive.
    mode = "w:gz" if dest.name.endswith(("gz", "tgz")) else "w"
    with atomic_output_file(dest) as tmp_tar, tarfile.open(tmp_tar, mode) as tf:
        for p in sorted(work.rglob("*")):
            tf.add(p, arcname=str(p.relative_to(work)), recursive=False)
    shutil.rmtree(work)


def _publish_directory(work: Path, dest: Path) -> None:
    """The directory form: ``work`` renamed to ``dest`` (replacing a previous bundle there)."""
    if dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest)
    elif dest.exists() or dest.is_symlink():
        dest.unlink()
    os.replace(work, dest)


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
        out = Path(extract_to) if extract_to else _unpack_dir()
        try:
            with tarfile.open(src) as tf:
                _extract_archive(tf, src, out)
            return _read_bundle_dir(out, verify=verify)
        except BaseException:
            if not extract_to:  # our temporary directory: do not leave an unusable copy behind
                shutil.rmtree(out, ignore_errors=True)
            raise
    return _read_bundle_dir(src, verify=verify)


def _unpack_dir() -> Path:
    """A new private (0700) directory in the system temp directory to unpack an archive into,
    named for its owner: one that a process killed while holding a bundle left behind is
    removed by the next unpack (``turbine_params.make_owned_temp``), so copies of weights do
    not pile up in /tmp."""
    tmp = make_owned_temp(Path(tempfile.gettempdir()) / "turbine-bundle", directory=True)
    os.chmod(tmp, 0o700)
    return tmp


def _unsafe_path(name: str) -> str | None:
    """Why an archive member name or manifest path would leave the bundle, or None if it stays."""
    if not name:
        return "an empty path"
    if name.startswith(("/", "\\")) or os.path.isabs(name) or name[1:2] == ":":
        return "an absolute path"
    if ".." in name.replace("\\", "/").split("/"):
        return "a '..' component"
    if "\0" in name:
        return "a NUL byte"
    return None


def _check_members(members: list[tarfile.TarInfo], src: Path) -> None:
    """Refuses an archive any of whose members would be written outside the extraction
    directory or is not a plain file, directory or link that stays inside it.

    Done on every Python version before anything is extracted (``filter="data"`` exists only
    from Python 3.10.12 / 3.11.4, and then is used as well)."""
    names = {m.name.rstrip("/") for m in members}
    links = {m.name.rstrip("/") for m in members if m.issym() or m.islnk()}
    for m in members:
        name = m.name.rstrip("/")
        why = _unsafe_path(m.name)
        if why is None and not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            why = "not a regular file, directory or link (a device, FIFO or other special file)"
        if why is None and m.issym():
            target = m.linkname
            joined = os.path.normpath(os.path.join(os.path.dirname(name), target))
            if (
                _unsafe_path(target) == "an absolute path"
                or joined == ".."
                or joined.startswith("../")
            ):
                why = f"a symbolic link to {target!r}, outside the bundle"
        if (
            why is None
            and m.islnk()
            and (_unsafe_path(m.linkname) is not None or m.linkname.rstrip("/") not in names)
        ):
            why = f"a hard link to {m.linkname!r}, which is not a file of the archive"
        if why is None:
            parts = name.split("/")
            through = next(
                ("/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) in links),
                None,
            )
            if through is not None:
                why = f"a path through the link {through!r}"
        if why is not None:
            raise BundleError(
                f"bundle archive {str(src)!r} has an unsafe member {m.name!r} ({why}); refusing "
                "to unpack it: a bundle archive holds only files inside the bundle. Rebuild it "
                "with `turbine-aot bundle`"
            )


def _extract_archive(tf: tarfile.TarFile, src: Path, out: Path) -> None:
    try:
        members = tf.getmembers()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise BundleError(f"bundle archive {str(src)!r} is damaged or truncated: {e}") from e
    _check_members(members, src)
    try:
        if hasattr(tarfile, "data_filter"):
            tf.extractall(out, members=members, filter="data")
        else:  # pragma: no cover - Python < 3.10.12: the checks above are the only guard
            tf.extractall(out, members=members)
    except (tarfile.TarError, EOFError) as e:  # incl. the data filter's FilterError
        raise BundleError(f"bundle archive {str(src)!r} cannot be unpacked: {e}") from e


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
        why = _unsafe_path(rel) if isinstance(rel, str) else "not a path"
        if why is not None:
            raise BundleError(
                f"{str(mpath)!r}: the {what} file {rel!r} ({why}) is not inside the bundle; a "
                "manifest names files of its bundle only: rebuild it with `turbine-aot bundle`"
            )
    bundle = Bundle(src, manifest)
    if not bundle.module_path.is_file():
        raise BundleError(f"bundle {str(src)!r} is missing {manifest['module']}")
    if _sha256_file(bundle.module_path) != manifest.get("module_sha256"):
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
    here = _versions()["iree_runtime"]
    for key, what in (("iree_compiler", "IREE compiler"), ("iree_runtime", "IREE runtime")):
        built = recorded.get(key)
        if built is None:
            continue
        if not isinstance(built, str) or not _release(built):
            raise BundleError(
                f"{str(bundle.path / MANIFEST)!r}: versions.{key} is {built!r}, not a version; "
                "rebuild the bundle"
            )
        if _release(here) and _release(built) != _release(here):
            raise BundleError(
                f"bundle {str(bundle.path)!r} was built with IREE {built} but this runtime is "
                f"IREE {here} (the manifest's {what} version): IREE modules load only under the "
                f"release that built them ({_release(built)}). Rebuild it with `turbine-aot bundle` under IREE "
                f"{_release(here)}, install iree-base-runtime=={built}, or load it anyway with "
                "check_versions=False (CLI: --ignore-versions)"
            )


def _check_compatible(bundle: Bundle, devices: list[str], *, check_versions: bool = True) -> None:
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


def load_bundle(
    path: str | os.PathLike,
    *,
    device: str | Sequence[str] | None = None,
    parameters: Mapping[str, Any] | None = None,
    copy_results: bool = False,
    verify: bool = False,
    check_versions: bool = True,
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

    Returns:
        The loaded module; its functions are attributes.

    Raises:
        BundleError: see :func:`read_bundle`, and a bundle built for another device kind or IREE
            release.
    """
    # An archive is unpacked into a temporary directory that lives as long as the module.
    unpacked = _unpack_dir() if Path(path).is_file() else None
    try:
        bundle = read_bundle(path, extract_to=unpacked, verify=verify)
        devices = (
            bundle.devices
            if device is None
            else ([device] if isinstance(device, str) else list(device))
        )
        _check_compatible(bundle, devices, check_versions=check_versions)
        params: dict[str, Any] = {s: [str(p) for p in ps] for s, ps in bundle.parameters().items()}
        params.update(parameters or {})
        module = load_module(
            bundle.module_path,
            device=devices,
            parameters=params or None,
            copy_results=copy_results,
            signatures=bundle.functions,
        )
    except BaseException:
        if unpacked is not None:
            shutil.rmtree(unpacked, ignore_errors=True)
        raise
    if unpacked is not None:
        weakref.finalize(module, shutil.rmtree, unpacked, ignore_errors=True)
    return module
