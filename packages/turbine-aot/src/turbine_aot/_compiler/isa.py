"""Which vector instruction set turbine's fp32 CPU kernels are blocked for: AVX-512 or AVX2.

The kernels (:mod:`.avx512` matmuls, :mod:`.avx512_conv` direct convolutions, the Winograd
matmuls) are MLIR ``vector`` code over ``vector<16xf32>``. On an AVX-512 CPU a vector is one
zmm register (32 of them); on an AVX2 + FMA CPU (AMD Zen 1-3, Intel client cores since Alder
Lake, older Xeons) LLVM splits it into two ymm registers (16 of them), so the same text runs
there, and only the register blocking must change: 4 x 64 accumulators are 16 zmm registers
but 32 ymm ones, which spill. :func:`kernel_isa` is the instruction set the blocking is chosen
for (docs/performance.md, section 19):

- ``avx512``: 4-6 rows x 64 columns (16-24 zmm accumulators);
- ``avx2``: 6 rows x 16 columns (12 ymm accumulators, two weight vectors and a broadcast: 15
  of the 16 registers).

``--turbine-cpu-matmul=avx512`` / ``avx2`` (:func:`.matmuls.cpu_matmul_kernel`, the host's by
default) chooses it for a compile: ``rewrites.module_for_compile`` rewrites under
:func:`kernels_for`, and the kernels' blocking functions read :func:`kernel_isa`.

The blocking is not the target: ``--turbine-cpu-matmul=avx512`` on an AVX2 CPU (the tests'
way of comparing the two blockings) builds the AVX-512 blocking for a CPU without AVX-512, and
plain ``vector`` code is right there. Instructions only AVX-512 has (the weight-only int4
kernel's 16-entry ``vpermps`` lookup, reached as an LLVM intrinsic) are not: LLVM aborts on
them, in process. Such kernels read :func:`target_avx512`, which :func:`kernels_for` sets from
the compile's target (:func:`.matmuls.target_has_avx512`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from .host import cpu_flags

__all__ = [
    "AVX2_FEATURES",
    "AVX512_FEATURES",
    "KERNEL_ISAS",
    "host_isa",
    "isa_features",
    "kernel_features",
    "kernel_isa",
    "kernels_for",
    "target_avx512",
]

#: The ``/proc/cpuinfo`` flags each instruction set's kernels need.
AVX512_FEATURES = ("avx512f",)
AVX2_FEATURES = ("avx2", "fma")
#: The instruction sets the kernels are blocked for, fastest first.
KERNEL_ISAS = ("avx512", "avx2")
_FEATURES = {"avx512": AVX512_FEATURES, "avx2": AVX2_FEATURES}

_current: ContextVar[str | None] = ContextVar("turbine_kernel_isa", default=None)
_target_avx512: ContextVar[bool | None] = ContextVar("turbine_target_avx512", default=None)


def isa_features(isa: str) -> tuple[str, ...]:
    """The CPU flags the kernels of ``isa`` (one of :data:`KERNEL_ISAS`) need."""
    return _FEATURES[isa]


def host_isa() -> str:
    """The best instruction set of :data:`KERNEL_ISAS` this machine's CPU has, or ``""``."""
    flags = cpu_flags()
    return next((isa for isa in KERNEL_ISAS if set(_FEATURES[isa]) <= flags), "")


def kernel_isa() -> str:
    """The instruction set the kernels built now are blocked for: the one of the enclosing
    :func:`kernels_for`, else the host's (``avx512`` where it has neither)."""
    return _current.get() or host_isa() or "avx512"


@contextmanager
def kernels_for(isa: str, target_avx512: bool | None = None) -> Iterator[None]:
    """Kernels built inside are blocked for ``isa`` (one of :data:`KERNEL_ISAS`), for a target
    CPU with AVX-512 instructions or not (``target_avx512``; ``None``: as the enclosing one, or
    where there is none, the blocking's own: ``isa == "avx512"``)."""
    if isa not in _FEATURES:
        raise ValueError(f"no kernel instruction set {isa!r}; known: {', '.join(KERNEL_ISAS)}")
    token = _current.set(isa)
    target = _target_avx512.set(
        target_avx512 if target_avx512 is not None else _target_avx512.get()
    )
    try:
        yield
    finally:
        _target_avx512.reset(target)
        _current.reset(token)


def kernel_features() -> tuple[str, ...]:
    """The CPU flags the kernels built now need where they run (what they record in
    ``turbine.cpu_requires``, which turbine's runtime checks when it loads the module): AVX-512's
    where they are blocked for it and the target has it, else AVX2's. Kernels blocked for
    AVX-512 for a target without it keep to AVX2 instructions (LLVM splits their vectors), so a
    build on an AVX-512 machine for ``--iree-llvmcpu-target-cpu=x86-64-v3`` runs on any AVX2 CPU."""
    return AVX512_FEATURES if kernel_isa() == "avx512" and target_avx512() else AVX2_FEATURES


def target_avx512() -> bool:
    """Whether the kernels built now may use instructions only AVX-512 has: the target of the
    enclosing :func:`kernels_for` has them (where it did not say, the blocking is AVX-512's)."""
    given = _target_avx512.get()
    return kernel_isa() == "avx512" if given is None else given
