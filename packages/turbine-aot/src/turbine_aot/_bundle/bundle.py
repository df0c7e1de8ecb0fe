"""A bundle on disk: its directory and manifest (:class:`Bundle`), the files the manifest
records with their sizes and SHA-256, and :class:`BundleError`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turbine_aot._errors import TurbineRuntimeError
from turbine_aot._hashing import sha256_file
from turbine_aot._signatures.abi import FlatSignature

from .manifest import MANIFEST

__all__ = ["Bundle", "BundleError"]


class BundleError(TurbineRuntimeError):
    """A bundle is missing, malformed, or does not fit this machine."""


@dataclass(frozen=True)
class Bundle:
    """A bundle on disk (a directory; archives are unpacked to one) and its manifest."""

    path: Path
    manifest: dict[str, Any]

    @property
    def module_path(self) -> Path:
        return self.path / self.manifest["module"]

    @property
    def functions(self) -> dict[str, FlatSignature]:
        return {k: FlatSignature.from_json(k, v) for k, v in self.manifest["functions"].items()}

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
            if hashes and sha256_file(f) != rec.get("sha256"):
                raise BundleError(
                    f"bundle file {rel!r} of {str(self.path)!r} does not match the manifest's "
                    "sha256: it was altered (or corrupted) after the bundle was written; rebuild "
                    "the bundle"
                )
