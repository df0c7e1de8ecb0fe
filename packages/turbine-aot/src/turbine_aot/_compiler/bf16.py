"""``precision="bf16"`` on llvm-cpu: what it asks for, where it is refused, and the rewrite that
gives it (the fp32 matmuls of the compile copy on a bf16 kernel through :mod:`.matmuls`:
activations cast per call, weights converted and packed once, f32 accumulation; the exported
program stays fp32). The kernel is the AMX one (:mod:`.amx`) on a CPU with AMX-BF16, else the
AVX512-BF16 form of the AVX-512 kernel (:mod:`.avx512`, ``vdpbf16ps``: AMD Zen 4 and later,
Intel Cooper Lake); see docs/performance.md, section 8.

The choice travels as a compile flag, ``--turbine-precision=bf16``, so that every compile path
carries it unchanged (the compile cache's keys, bundle manifests and the module's recorded
compile flags include it); turbine reads it in ``rewrites.module_for_compile`` and removes it
before IREE sees the flags (:func:`strip_precision_flags`). Rewritten modules are marked as
needing the kernel's CPU features (``turbine.cpu_requires``: ``amx_tile,amx_bf16`` or
``avx512f,avx512_bf16``).
"""

from __future__ import annotations

from typing import Any

from .amx import AMX_FEATURES, AmxGemm, host_amx_missing
from .avx512 import AVX512_BF16_FEATURES, Avx512Gemm, host_avx512_bf16_missing
from .epilogues import fusion_enabled
from .matmuls import rewritable_matmuls, rewrite_matmuls, target_cpu
from .targets import TargetError, flag_targets

__all__ = [
    "AVX512_BF16_FEATURES",
    "PRECISIONS",
    "PRECISION_FLAG",
    "TURBINE_FLAG_PREFIX",
    "bf16_kernel_kind",
    "bf16_matmuls",
    "check_precision",
    "precision_flags",
    "precision_of",
    "rewrite_matmuls_bf16",
    "strip_precision_flags",
]

#: The precisions ``ExportOutput.compile(precision=...)`` accepts.
PRECISIONS = ("fp32", "bf16")
#: The compile flag carrying ``precision="bf16"`` through every compile path (the compile
#: cache keys, bundle manifests and the module's compile record see it); turbine reads it and
#: removes it before IREE sees the flags (:func:`strip_precision_flags`).
PRECISION_FLAG = "--turbine-precision"

_REFLECTION_ATTR = "iree.reflection"
_FUNC_PREFIX = "__turbine_bf16_matmul"
_MATMUL_OPS = frozenset(
    {
        "torch.aten.mm",
        "torch.aten.addmm",
        "torch.aten.linear",
        "torch.aten.matmul",
        "torch.aten.bmm",
    }
)


def precision_of(flags: Any) -> str:
    """The precision the flags ask for (the last ``--turbine-precision=``; default fp32)."""
    value = "fp32"
    for f in flags:
        if f.startswith(PRECISION_FLAG + "="):
            value = f.split("=", 1)[1].strip().lower()
    return value


def precision_flags(precision: str) -> list[str]:
    """The flags asking for ``precision`` (none for fp32).

    Raises:
        TargetError: ``precision`` is not one of :data:`PRECISIONS`.
    """
    value = str(precision).strip().lower()
    if value not in PRECISIONS:
        raise TargetError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return [] if value == "fp32" else [f"{PRECISION_FLAG}={value}"]


#: The prefix of turbine's own compile flags (``--turbine-precision``, ``--turbine-cpu-matmul``):
#: read by the rewrites, removed before IREE sees the flags.
TURBINE_FLAG_PREFIX = "--turbine-"


def strip_precision_flags(flags: Any) -> list[str]:
    """``flags`` without turbine's own flags (:data:`TURBINE_FLAG_PREFIX`): what IREE is given."""
    return [f for f in flags if not f.startswith(TURBINE_FLAG_PREFIX)]


def bf16_kernel_kind() -> str | None:
    """The bf16 kernel this machine runs: ``"amx"`` (AMX-BF16), ``"avx512"`` (AVX512-BF16), or
    ``None`` (neither)."""
    if not host_amx_missing():
        return "amx"
    if not host_avx512_bf16_missing():
        return "avx512"
    return None


def check_precision(flags: Any) -> None:
    """Refuses a precision the flags' target cannot give.

    ``bf16`` needs the llvm-cpu target built for this machine (``--iree-llvmcpu-target-cpu=host``,
    turbine's default) on a CPU with AMX-BF16 or AVX512-BF16: the kernels are hand-written for
    those instructions, and IREE 3.13's own bf16 path is slower than fp32 (docs/performance.md).

    Raises:
        TargetError: an unknown precision, another target, a portable build, or a host CPU
            with neither (the message names what is missing and what to use instead).
    """
    precision = precision_of(flags)
    if precision not in PRECISIONS:
        raise TargetError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return
    targets = flag_targets(flags)
    if targets != {"llvm-cpu"}:
        raise TargetError(
            f"precision='bf16' is implemented for the llvm-cpu target only (this compile targets "
            f"{', '.join(sorted(targets)) or 'nothing'}); on GPUs export the model in bf16 "
            "instead (model.to(torch.bfloat16))"
        )
    cpu = target_cpu(flags)
    if cpu != "host":
        raise TargetError(
            f"precision='bf16' runs AMX or AVX512-BF16 code and needs a module built for this machine's CPU "
            f"(--iree-llvmcpu-target-cpu=host, the default), not {cpu!r}; drop host_cpu=False / "
            "the target CPU flag, or use precision='fp32' for a portable module"
        )
    if bf16_kernel_kind() is None:
        missing = [*host_amx_missing(), *host_avx512_bf16_missing()]
        raise TargetError(
            f"precision='bf16' needs a CPU with AMX-BF16 (Intel Xeon 4th generation or newer) "
            f"or AVX512-BF16 (AMD Zen 4 or newer, Intel Cooper Lake); this machine lacks "
            f"{', '.join(missing)}. Use precision='fp32' (the default): IREE 3.13's own bf16 "
            "code is slower than its fp32 code on such CPUs"
        )


def bf16_matmuls(module_op: Any) -> list[Any]:
    """The ops of ``module_op`` that :func:`rewrite_matmuls_bf16` rewrites."""
    return rewritable_matmuls(module_op)


def rewrite_matmuls_bf16(module_op: Any, kind: str | None = None) -> int:
    """Rewrites, in place, each fp32 matmul :mod:`.matmuls` handles as a call of a bf16 kernel,
    and marks the module as needing its CPU features.

    Args:
        kind: ``"amx"`` or ``"avx512"``; default: this machine's (:func:`bf16_kernel_kind`; AMX
            where there is no bf16 kernel at all, for rewriting without running).

    Returns:
        How many matmuls were rewritten.
    """
    kind = kind or bf16_kernel_kind() or "amx"
    if kind == "avx512":

        def avx512(k: int, n: int, batched: bool) -> Avx512Gemm:
            return Avx512Gemm.for_shape(k, n, batch_b=batched, bf16=True)

        # the kernel's epilogues (bias, ReLU: :mod:`.epilogues`) act on its f32 accumulators,
        # so they hold for the bf16 form as they are
        return rewrite_matmuls(
            module_op,
            avx512,
            prefix=_FUNC_PREFIX,
            cpu_requires=AVX512_BF16_FEATURES,
            epilogues=fusion_enabled(),
        )

    def amx(k: int, n: int, batched: bool) -> AmxGemm:
        return AmxGemm.for_shape(k, n, batch_b=batched)

    return rewrite_matmuls(module_op, amx, prefix=_FUNC_PREFIX, cpu_requires=AMX_FEATURES)
