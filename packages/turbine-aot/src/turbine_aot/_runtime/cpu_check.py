"""Refusing, before anything of it runs, a CPU module built for instructions this CPU lacks.

IREE compiles a module's CPU code for one target CPU (``--iree-llvmcpu-target-cpu``; turbine's
default is ``host``, the CPU that compiles) and IREE 3.13's runtime does not check it when it
loads the module: a ``.vmfb`` built on an AVX-512 machine and loaded on an AVX2 one dies of an
illegal instruction (SIGILL, the Python process with it) in its first dispatch, maybe already in
its initializers. Compiling on one machine and deploying on another is ordinary, so
:func:`check_module_cpu` compares the module's targets with this CPU first and raises a
:class:`~turbine_aot.runtime.TurbineRuntimeError` naming what is missing and how to rebuild
(docs/running.md, "A module built for another CPU").

Where the target is read: IREE 3.13 keeps each device's target, printed, in the module (the
text of the error it raises when no device matches): ``#hal.executable.target<"llvm-cpu",
"embedded-elf-x86_64", {cpu = "sapphirerapids", cpu_features = "+avx,+avx2,...", ...,
target_triple = "x86_64-..."}>``, with the CPU's features expanded (for ``host`` too: the
compiling CPU's). The features checked are the instruction-set extensions LLVM emits in compute
code (:data:`CPUINFO_FLAG`, LLVM's name -> Linux's ``/proc/cpuinfo`` flag); others (``+cx16``,
``+xsave``...) are ignored. No check is made where it cannot be (not Linux on x86-64, a module
without such a text, e.g. from another IREE version); ``TURBINE_CPU_CHECK=0`` turns it off.

turbine's own kernels are checked besides (:func:`check_kernel_features`): the CPU flags their
module's public functions record under ``turbine.cpu_requires``, which can say more than the
target does (VNNI kernels chosen for the compiling machine in a build given only
``--iree-llvmcpu-target-cpu-features=+avx512f``).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from turbine_aot._compiler.amx import AMX_FEATURES, CPU_REQUIRES_KEY
from turbine_aot._compiler.host import cpu_flags, is_x86_64_linux
from turbine_aot._errors import TurbineRuntimeError

from .tensors import LOCAL_DRIVERS

__all__ = [
    "CPUINFO_FLAG",
    "CpuTarget",
    "check_kernel_features",
    "check_module_cpu",
    "missing_features",
    "module_cpu_targets",
]

#: LLVM's x86 feature name -> the ``/proc/cpuinfo`` flag of the same instructions: the
#: extensions LLVM may use in compiled (vectorized) code.
CPUINFO_FLAG: dict[str, str] = {
    "sse3": "pni",
    "ssse3": "ssse3",
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "popcnt": "popcnt",
    "lzcnt": "abm",
    "bmi": "bmi1",
    "bmi2": "bmi2",
    "movbe": "movbe",
    "f16c": "f16c",
    "fma": "fma",
    "avx": "avx",
    "avx2": "avx2",
    "avxvnni": "avx_vnni",
    "avxifma": "avx_ifma",
    "avxneconvert": "avx_ne_convert",
    "avxvnniint8": "avx_vnni_int8",
    "avx512f": "avx512f",
    "avx512cd": "avx512cd",
    "avx512bw": "avx512bw",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "amx-tile": "amx_tile",
    "amx-bf16": "amx_bf16",
    "amx-int8": "amx_int8",
    "amx-fp16": "amx_fp16",
    "gfni": "gfni",
    "vaes": "vaes",
    "vpclmulqdq": "vpclmulqdq",
    "aes": "aes",
    "pclmul": "pclmulqdq",
    "sha": "sha_ni",
    "adx": "adx",
}

_TARGET = b'#hal.executable.target<"llvm-cpu", "'
_TEXT_LIMIT = 16384  # the most bytes one printed target takes (its features list ~2.5 KiB)
#: The printed targets lie together, in the module's small constants (7.6 KiB into a 33 MiB
#: module with its weights inline): searched for from the first up to this far past it, so that
#: a large module file is not read to its end.
_TARGETS_SPAN = 1 << 20
_NAMED = 8  # the missing features an error names (the rest counted)
#: How both errors end: what to do.
_REBUILD = (
    "Recompile it on this machine (turbine's default --iree-llvmcpu-target-cpu=host), or for a "
    "CPU every machine it runs on has (e.g. --iree-llvmcpu-target-cpu=x86-64-v3 for any AVX2 "
    "CPU); TURBINE_CPU_CHECK=0 skips this check"
)
_CPU = re.compile(rb'\bcpu = "([^"]*)"')
_FEATURES = re.compile(rb'\bcpu_features = "([^"]*)"')
_TRIPLE = re.compile(rb'\btarget_triple = "([^"]*)"')


@dataclass(frozen=True)
class CpuTarget:
    """One CPU target of a module: its CPU name (``""`` where only features were given), the
    features it enables (LLVM's names, the last ``+`` / ``-`` of each winning) and the target
    triple."""

    cpu: str
    features: frozenset[str]
    triple: str


def _parse(text: bytes) -> CpuTarget | None:
    end = text.find(b"}>")
    body = text[: end if end >= 0 else len(text)]
    cpu, features, triple = _CPU.search(body), _FEATURES.search(body), _TRIPLE.search(body)
    if features is None or triple is None:
        return None
    enabled: dict[str, bool] = {}
    for item in features.group(1).decode("ascii", "replace").split(","):
        item = item.strip()
        if item[:1] in ("+", "-") and item[1:]:
            enabled[item[1:]] = item[0] == "+"
    return CpuTarget(
        cpu=cpu.group(1).decode("ascii", "replace") if cpu else "",
        features=frozenset(f for f, on in enabled.items() if on),
        triple=triple.group(1).decode("ascii", "replace"),
    )


def module_cpu_targets(data: bytes | None, path: Path | None) -> list[CpuTarget]:
    """The ``llvm-cpu`` targets printed in a module (its bytes, or the file at ``path``), each
    once; empty where there is none (not a CPU module, or an IREE that does not keep them)."""
    found: dict[CpuTarget, None] = {}
    with _buffer(data, path) as buf:
        pos = first = buf.find(_TARGET)
        while pos >= 0:
            target = _parse(bytes(buf[pos + len(_TARGET) : pos + _TEXT_LIMIT]))
            if target is not None:
                found.setdefault(target)
            pos = buf.find(_TARGET, pos + len(_TARGET), first + _TARGETS_SPAN)
    return list(found)


@contextlib.contextmanager
def _buffer(data: bytes | None, path: Path | None) -> Iterator[bytes | mmap.mmap]:
    """The module's bytes as a buffer with ``find``: ``data`` itself, or ``path`` mapped."""
    if data is not None or path is None:
        yield data or b""
        return
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield b""
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            yield mapped


def missing_features(target: CpuTarget, flags: set[str]) -> list[str]:
    """The features of ``target`` (LLVM's names, in :data:`CPUINFO_FLAG`'s order: the older
    extensions first) that a CPU with ``/proc/cpuinfo`` ``flags`` lacks."""
    return [f for f, flag in CPUINFO_FLAG.items() if f in target.features and flag not in flags]


def _checked_flags(drivers: Sequence[str]) -> set[str]:
    """This CPU's flags where a load on ``drivers`` is checked (else empty: no check)."""
    if os.environ.get("TURBINE_CPU_CHECK", "1").strip().lower() in ("0", "false", "no", "off"):
        return set()
    if not any(d in LOCAL_DRIVERS for d in drivers):
        return set()
    return cpu_flags() if is_x86_64_linux() else set()


def check_kernel_features(
    reflections: Sequence[Mapping[str, str]], drivers: Sequence[str], name: str
) -> None:
    """Raises :class:`TurbineRuntimeError` where turbine's kernels in the module need CPU
    features this CPU lacks: the ``/proc/cpuinfo`` flags its public functions' reflections
    (``reflections``) record under ``turbine.cpu_requires`` (the AVX-512 VNNI or BF16 kernels,
    AVX-512 blockings for an AVX-512 target), besides AMX's, which the load checks with the
    tile permission it asks for. Kernels can need more than the printed target says (a
    build with ``--iree-llvmcpu-target-cpu-features=+avx512f`` on a VNNI machine)."""
    flags = _checked_flags(drivers)
    if not flags:
        return
    required: dict[str, None] = {}
    for reflection in reflections:
        for flag in str(reflection.get(CPU_REQUIRES_KEY, "")).split(","):
            if flag.strip() and flag.strip() not in AMX_FEATURES:
                required.setdefault(flag.strip())
    missing = [f for f in required if f not in flags]
    if missing:
        raise TurbineRuntimeError(
            f"module {name!r} holds turbine kernels built for a CPU with {', '.join(missing)}, "
            f"which this CPU lacks: they would stop the process with an illegal instruction. "
            f"{_REBUILD}"
        )


def check_module_cpu(
    data: bytes | None, path: Path | None, drivers: Sequence[str], where: str
) -> None:
    """Raises :class:`TurbineRuntimeError` where the module (bytes or file) has CPU code for
    instructions this CPU lacks and is loaded on a local CPU driver (one of ``drivers``): where
    none of its x86-64 targets runs here (a module with several, IREE's variants of one device,
    loads where one fits; the error names the one lacking least).

    Raises:
        TurbineRuntimeError: names the module (``where``), its target CPU, the missing
            instruction sets, and how to rebuild it for this CPU.
    """
    flags = _checked_flags(drivers)
    if not flags:
        return
    x86 = [t for t in module_cpu_targets(data, path) if t.triple.startswith(("x86_64", "amd64"))]
    # (another architecture's code IREE refuses with an error of its own)
    lacking = [(missing_features(t, flags), t) for t in x86]
    if not lacking or any(not missing for missing, _ in lacking):
        return  # nothing to check, or one variant runs here (IREE may pick among several)
    missing, target = min(lacking, key=lambda m: len(m[0]))
    built_for = f"CPU {target.cpu!r}" if target.cpu else "a CPU"
    named = ", ".join(missing[:_NAMED])
    if len(missing) > _NAMED:
        named += f" and {len(missing) - _NAMED} more"
    raise TurbineRuntimeError(
        f"{where} was compiled for {built_for} with {named}, which this CPU lacks: its code "
        f"would stop the process with an illegal instruction. {_REBUILD}"
    )
