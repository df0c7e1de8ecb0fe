"""An on-disk, content-addressed cache of compiled ``.vmfb`` modules.

The key is a SHA-256 over what decides the compiled bytes: the IR bytes, the compile flags (in
order), the compiler version and revision, the revision of turbine's compile-time rewrites
(``rewrites.REVISION``), and the compile target(s) (``llvm-cpu``, ...) — never
the runtime driver or device URI, so a module loaded on ``local-task`` and on ``local-sync``
(the same llvm-cpu target and flags) is compiled once. Each entry is one file ``<key[:2]>/<key>.vmfb`` holding a small header
(magic, payload CRC-32, payload length) and the payload; a read that finds a wrong magic, length
or hash treats the entry as missing, deletes it and compiles again. Entries are written to a
temporary file in the same directory, fsynced, and renamed into place, so concurrent readers see
a whole entry or none and concurrent writers of one key write the same bytes. The total size is
bounded: after a write, least recently used entries (by mtime, refreshed on every hit) are evicted.

Location: ``$TURBINE_COMPILE_CACHE_DIR``, else ``$XDG_CACHE_HOME/turbine/compile``, else
``~/.cache/turbine/compile``. ``TURBINE_COMPILE_CACHE=0`` turns the default cache off.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turbine_params import atomic_output_file

from .._errors import CompileError as _AotCompileError
from .._errors import Diagnostic
from . import rewrites
from .bf16 import strip_precision_flags
from .host import host_fingerprint
from .targets import flag_targets

__all__ = [
    "CacheStats",
    "CompileCache",
    "CompileError",
    "compile_mlir",
    "compiler_version",
    "default_compile_cache",
    "resolve_cache",
]

logger = logging.getLogger("turbine.aot.compile_cache")

_MAGIC = b"TRBNVMF2"  # 8 bytes
# magic, CRC-32 of the payload, payload length. The key is already a SHA-256 of the inputs; the
# stored CRC detects a damaged or truncated payload at a fifth of SHA-256's cost on a hit (a
# 100 MB module: 0.2 s instead of 0.4 s), which keeps a hit far below a compile.
_HEADER = struct.Struct("<8sIQ")
_DEFAULT_MAX_BYTES = 4 << 30


# One CompileError for the whole package: ``turbine_aot.runtime.CompileError`` (raised by
# compile_mlir) is ``turbine_aot.CompileError`` (raised by ExportOutput.compile, and so by
# load_module of an ExportOutput), so one ``except`` catches a failed compile on either path.
CompileError = _AotCompileError


@dataclass
class CacheStats:
    """Counters of one :class:`CompileCache` instance (this process only)."""

    hits: int = 0
    misses: int = 0
    corrupted: int = 0
    evicted: int = 0
    stores: int = 0


def _host_tuned(flags: Sequence[str]) -> bool:
    """Whether a compile with ``flags`` may depend on the CPU that runs it: an llvm-cpu build
    (``--iree-llvmcpu-target-cpu=host`` by default; and the CPU rewrites read the host's
    features, cache sizes and vendor whatever the target CPU)."""
    return "llvm-cpu" in flag_targets(flags) or any(
        f.startswith(("--iree-llvmcpu-", "--turbine-cpu-")) for f in flags
    )


def compiler_version() -> str:
    """The installed iree-base-compiler version and revision, e.g. ``3.13.0rc2026@89ece87``."""
    from iree.compiler import version

    revs = ",".join(f"{k}@{v}" for k, v in sorted(getattr(version, "REVISIONS", {}).items()))
    return f"{version.VERSION}+{revs}"


def _default_dir() -> Path:
    env = os.environ.get("TURBINE_COMPILE_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "turbine" / "compile"


class CompileCache:
    """A size-bounded, content-addressed directory of compiled modules.

    Args:
        directory: where entries live (created on first write); default: see module docs.
        max_bytes: total size bound; least recently used entries are evicted beyond it.
        enabled: a disabled cache never reads or writes (every lookup is a miss).

    Example:
        >>> cache = CompileCache(tmp_path, max_bytes=1 << 30)  # doctest: +SKIP
        >>> vmfb = compile_mlir(mlir_text, flags, cache=cache)  # doctest: +SKIP
    """

    def __init__(
        self,
        directory: str | os.PathLike | None = None,
        *,
        max_bytes: int = _DEFAULT_MAX_BYTES,
        enabled: bool = True,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive; got {max_bytes}")
        self.directory = Path(directory) if directory is not None else _default_dir()
        self.max_bytes = max_bytes
        self.enabled = enabled
        self.stats = CacheStats()

    @staticmethod
    def key(
        ir: bytes, flags: Sequence[str], *, target: str = "", version: str | None = None
    ) -> str:
        """The content address of one compilation.

        ``target`` names compile targets (``"llvm-cpu"``), not runtime drivers: it must only
        ever vary with the compiled bytes.
        """
        h = hashlib.sha256()
        h.update(b"turbine-compile-cache-v1\0")
        h.update((version or compiler_version()).encode() + b"\0")
        h.update(f"rewrites-{rewrites.REVISION}-{rewrites.environment_key()}".encode() + b"\0")
        h.update(json.dumps(list(flags)).encode() + b"\0")
        if _host_tuned(flags):  # the build is this CPU's: another CPU must not be served it
            h.update(f"host-{host_fingerprint()}".encode() + b"\0")
        h.update(target.encode() + b"\0")
        h.update(ir)
        return h.hexdigest()

    def path_for(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.vmfb"

    def get(self, key: str) -> bytes | None:
        """Returns the cached module, or None on a miss or a corrupted entry (then removed)."""
        if not self.enabled:
            return None
        path = self.path_for(key)
        try:
            with open(path, "rb") as f:
                header = f.read(_HEADER.size)
                payload = f.read()  # one copy, no slicing of a header+payload buffer
        except (FileNotFoundError, NotADirectoryError):
            self.stats.misses += 1
            return None
        except OSError as e:  # unreadable cache: compile as if it were empty
            logger.warning("could not read compile cache entry %s (%s); recompiling", path, e)
            self.stats.misses += 1
            return None
        verified = self._verify(header, payload)
        if verified is None:
            logger.warning("compile cache entry %s is corrupted; removing and recompiling", path)
            self.stats.corrupted += 1
            self.stats.misses += 1
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # LRU: a hit refreshes the entry
        self.stats.hits += 1
        return verified

    @staticmethod
    def _verify(header: bytes, payload: bytes) -> bytes | None:
        if len(header) < _HEADER.size:
            return None
        magic, crc, length = _HEADER.unpack_from(header)
        if magic != _MAGIC or length != len(payload) or zlib.crc32(payload) != crc:
            return None
        return payload

    def put(self, key: str, vmfb: bytes) -> None:
        """Stores a module atomically, then evicts beyond the size bound."""
        if not self.enabled:
            return
        path = self.path_for(key)
        header = _HEADER.pack(_MAGIC, zlib.crc32(vmfb), len(vmfb))
        try:
            with atomic_output_file(path, parents=True) as tmp, open(tmp, "wb") as f:
                f.write(header)
                f.write(vmfb)
        except OSError as e:
            # The cache only saves time: an unwritable or full cache directory must not fail a
            # compile that succeeded.
            logger.warning("compile cache %s is not writable (%s); not caching", self.directory, e)
            return
        self.stats.stores += 1
        self.evict()

    def entries(self) -> list[tuple[Path, int, float]]:
        """(path, size, mtime) of every entry."""
        out: list[tuple[Path, int, float]] = []
        if not self.directory.is_dir():
            return out
        for p in self.directory.glob("??/*.vmfb"):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue  # evicted by another process meanwhile
            out.append((p, st.st_size, st.st_mtime))
        return out

    def size_bytes(self) -> int:
        return sum(s for _, s, _ in self.entries())

    def evict(self) -> int:
        """Removes least recently used entries until the total fits; returns how many."""
        entries = sorted(self.entries(), key=lambda e: e[2])
        total = sum(s for _, s, _ in entries)
        removed = 0
        for p, size, _ in entries:
            if total <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed += 1
            total -= size
        self.stats.evicted += removed
        return removed

    def clear(self) -> None:
        for p, _, _ in self.entries():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


_DEFAULT: CompileCache | None = None


def default_compile_cache() -> CompileCache:
    """The process-wide default cache (honours ``TURBINE_COMPILE_CACHE[_DIR]``)."""
    global _DEFAULT
    enabled = os.environ.get("TURBINE_COMPILE_CACHE", "1").lower() not in ("0", "false", "off")
    if _DEFAULT is None or _DEFAULT.directory != _default_dir() or _DEFAULT.enabled != enabled:
        _DEFAULT = CompileCache(enabled=enabled)
    return _DEFAULT


def resolve_cache(cache: Any) -> CompileCache | None:
    """The cache a ``cache=`` argument names: True / None the default one, False none, a
    :class:`CompileCache`, or a directory. A disabled cache is none."""
    if cache is True or cache is None:
        c = default_compile_cache()
        return c if c.enabled else None
    if cache is False:
        return None
    if isinstance(cache, CompileCache):
        return cache if cache.enabled else None
    return CompileCache(cache)  # a directory


def compile_mlir(
    ir: str | bytes,
    flags: Sequence[str],
    *,
    input_type: str = "auto",
    target: str = "",
    cache: Any = True,
    rewrite: bool = True,
) -> bytes:
    """Compiles MLIR (text or bytecode) to ``.vmfb`` bytes, through the compile cache.

    On a miss, IREE gets the copy ``ExportOutput.compile`` would give it: the compile-time
    rewrites for ``flags`` applied (:func:`.rewrites.source_for_compile`: attention on CPUs,
    float -> integer casts, mutable globals sharing an initial value).

    Args:
        ir: the module as MLIR text or bytecode.
        flags: ``iree-compile`` flags (target device, optimisation).
        input_type: ``--iree-input-type`` (``"torch"`` for torch-dialect IR).
        target: a label of the target for log messages, not part of the key: the flags select
            the target, and the driver that will run the module (``local-task``,
            ``local-sync``) does not change its bytes.
        cache: True (the default cache), False (off), a :class:`CompileCache` or a directory.
        rewrite: ``False`` hands IREE ``ir`` as it is (for a caller that applied the rewrites
            itself, such as ``turbine-aot compile``).

    Returns:
        The compiled module.

    Raises:
        CompileError: the compiler failed; its diagnostics are in the message.
    """
    import iree.compiler as ic

    data = ir.encode() if isinstance(ir, str) else bytes(ir)
    all_flags = [f"--iree-input-type={input_type}", *flags]
    c = resolve_cache(cache)
    key = CompileCache.key(data, all_flags) if c else ""
    if c:
        hit = c.get(key)
        if hit is not None:
            logger.info("compile cache hit %s%s", key[:16], f" ({target})" if target else "")
            return hit
    t0 = time.perf_counter()
    try:
        source = rewrites.source_for_compile(data, flags) if rewrite else data
        iree_flags = strip_precision_flags(flags)  # turbine's own flag: the rewrites read it
        vmfb = ic.compile_str(source, input_type=input_type, extra_args=iree_flags)
    except ic.CompilerToolError as e:
        text = str(e).strip()
        first = next((ln.strip() for ln in text.splitlines() if "error:" in ln), "")
        if not first:
            code = next((ln.strip() for ln in text.splitlines() if "Error code" in ln), "")
            first = f"the compiler crashed ({code or 'no diagnostic'})"
        raise CompileError(
            "compile (iree-compile)",
            [Diagnostic("error", f"iree-compile failed: {first}\n{text[:4000]}")],
            flags=list(flags),
        ) from e
    logger.info("compiled in %.2fs (%d bytes)", time.perf_counter() - t0, len(vmfb))
    if c:
        c.put(key, vmfb)
    return vmfb
