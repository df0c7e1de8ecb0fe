"""The combinations of program and target IREE 3.13 compiles into wrong code (or cannot
compile), refused before compiling with an error naming the flag to add."""

from __future__ import annotations

from collections.abc import Sequence

from .flags import KEEP_FLOAT64_FLAG
from .targets import TargetError, flag_targets
from .traits import float_types, narrow_int_types, uses_float16

__all__ = ["check_program_for_target"]


def check_program_for_target(module: object, flags: Sequence[str]) -> None:
    """Refuses combinations IREE 3.13 compiles into wrong code, before compiling.

    fp16 or 8/4-bit integer tensors on Vulkan without a ``--iree-vulkan-target``, and 4-bit
    integer globals on vmvx. IREE's default (baseline) SPIR-V target has no 16-bit float
    arithmetic and only 32-bit storage: fp16 programs built for it compute NaN or garbage
    (``x * 2 + 1`` gave NaN on Mesa lavapipe; a 3x3 convolution was off by 5e2) or fail to
    compile (``vector.bitcast``), and so do int8/int4 ones (``x * w.float()`` with an int8
    ``w`` off by 6e2, int4 weight-only linear layers off by 85); with a named target (``rdna3``,
    ``valhall4``, ``ampere``) the same programs are right on lavapipe too. vmvx fails to compile
    ``i4`` tensors ("failed to emulate bit width"). A program that takes, returns or holds
    float64 tensors, compiled with IREE's float64 demotion (every target but llvm-cpu, where
    turbine keeps float64): its calls fail ("buffer view byte length 256 exceeds backing buffer
    byte length 128"). fp16 counts wherever the program holds it: a ``.half()`` between fp32
    inputs and outputs was wrong too (an fp32 -> fp16 -> fp32 round trip of 24 values on
    lavapipe).

    Raises:
        TargetError: naming the problem and the flag to add.
    """
    vulkan = any(
        f.startswith("--iree-hal-target-device=vulkan")
        or (f.startswith("--iree-hal-target-backends=") and "vulkan" in f)
        for f in flags
    )
    chosen = any(
        f.startswith(("--iree-vulkan-target=", "--iree-vulkan-target-features=")) for f in flags
    )
    narrow = narrow_int_types(module) if vulkan or "vmvx" in flag_targets(flags) else set()
    if vulkan and not chosen and narrow:
        raise TargetError(
            f"this program reads {_bits(narrow)} integer tensors (quantized weights, int8 "
            "inputs), and IREE 3.13's default Vulkan target (baseline SPIR-V, 32-bit storage only) "
            "computes them wrong or fails to compile them (on Mesa lavapipe: x * int8_buffer "
            "off by 6e2, an int4 matmul off by 85, an int8 matmul 'failed to legalize "
            "vector.bitcast'). Name the GPU's Vulkan target, e.g. --iree-vulkan-target=rdna3 "
            "(AMD RDNA3), =ampere (NVIDIA), =valhall4 (Arm), in extra_args in Python or with "
            "--flag on the command line, or compile for llvm-cpu."
        )
    if "vmvx" in flag_targets(flags) and any(t.endswith("i4") for t in narrow):
        raise TargetError(
            "this program reads 4-bit integer weights (tensor<...xi4> globals: torchao int4 "
            "weights in a parameter archive), which IREE 3.13's vmvx backend cannot compile "
            "('failed to emulate bit width'). Compile for llvm-cpu, or keep the int4 weights "
            "inline (do not externalize them: they are then one value per byte)."
        )
    if KEEP_FLOAT64_FLAG not in flags and "f64" in float_types(module):
        targets = ", ".join(sorted(flag_targets(flags))) or "this target"
        raise TargetError(
            f"this program takes, returns or holds float64 tensors, and IREE demotes float64 to "
            f"float32 when compiling for {targets}: its calls would fail (the results' buffers "
            "are float32). Convert them to float32 at the boundary (export the model in "
            "float32), compile for llvm-cpu (turbine keeps float64 there), or, for a "
            f"target that computes float64, pass {KEEP_FLOAT64_FLAG}."
        )
    if vulkan and not chosen and uses_float16(module):
        raise TargetError(
            "this program computes in float16, and IREE's default Vulkan target (baseline "
            "SPIR-V, no 16-bit float arithmetic) would compile it into code that returns NaN or "
            "wrong values. Name the GPU's Vulkan target, e.g. --iree-vulkan-target=rdna3 "
            "(AMD RDNA3), =ampere (NVIDIA), =valhall4 (Arm), in extra_args in Python or with "
            "--flag on the command line (https://iree.dev/guides/deployment-configurations/"
            "gpu-vulkan/), or export the model in float32."
        )


def _bits(types: set[str]) -> str:
    return " and ".join(f"{b}-bit" for b in ("8", "4") if any(t.endswith(b) for t in types))
