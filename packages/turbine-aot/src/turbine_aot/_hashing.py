"""SHA-256 of files, read in chunks (the bundles' and the build actions' records of what they
wrote)."""

from __future__ import annotations

import hashlib
import os

__all__ = ["sha256_file"]


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's contents, as hex (read 1 MiB at a time: weights larger than
    memory are fine)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
