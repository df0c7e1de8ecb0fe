"""What the compile path hands IREE: a copy of the exported module with target fixes applied.

The exported IR stays target-neutral (and the reference's); each compile rewrites a copy for its
flags:

- CPU targets: gathers whose indices are aranges over whole dimensions, over dynamic shapes
  (Hugging Face's padding masks), as the views they are (:mod:`.gathers`); on ``llvm-cpu``,
  gathers over the last two dimensions by an outer product of indices (bilinear and nearest
  upsampling) as two one-dimension gathers (``TURBINE_CPU_OUTER_GATHERS=keep`` skips it).
- CPU targets: attention as matmul + softmax (:mod:`.attention`; IREE's CPU attention is
  ~50x slower), a mask over dynamic sizes computed once. ``TURBINE_CPU_ATTENTION=keep`` skips
  it.
- ``llvm-cpu`` targets where the AVX-512 fp32 matmul kernel is the choice (below; with
  ``precision="bf16"`` too): every static 2-D fp32 convolution on turbine's AVX-512
  direct-convolution kernel (:mod:`.avx512_conv`, :mod:`.direct_convs`), its bias, a following eval-mode batch norm,
  residual add and ReLU in the kernel's store (:mod:`.epilogues`). The others (and all of
  them with ``TURBINE_CPU_CONV_MATMUL=iree``): image stems (few input channels) and 1x1 convolutions as im2col + matmul (:mod:`.convs`;
  IREE 3.13's data-tiled convolution is slow on both; the matmul on the AVX-512 kernel where
  it is the choice). ``TURBINE_CPU_CONV_MATMUL=keep`` skips both. Among the direct ones, 3x3
  stride-1 convolutions of many channels and large enough outputs run in Winograd form
  (:mod:`.winograd`; ``TURBINE_CPU_WINOGRAD=off|2|4``), and depthwise convolutions run on the
  AVX-512 depthwise kernel (:mod:`.depthwise`).
- ``llvm-cpu`` targets: torch's f32 GELU (exact and tanh form) by rational functions of
  turbine's own instead of IREE's ``math.erf`` / ``math.tanh`` expansions (:mod:`.gelu`;
  ``TURBINE_CPU_GELU=iree`` keeps IREE's). Every target: the tanh-form GELUs left written out
  as eager's formula, with the ``sqrt(2 / pi)`` torch-mlir gets wrong (a correctness fix).
- ``llvm-cpu`` targets: f32 ``sin`` / ``cos`` / ``tan`` with a range reduction by ``pi / 2``
  in three parts (:mod:`.trig`; IREE's one-constant reduction is off by ~2.8e-8 * |x|: rotary
  embeddings at long positions, ``tan`` near its poles), f32 ``atan`` / ``atan2`` / ``asin`` by
  turbine's own polynomial (IREE's are 4e-6 / 5e-7 off, its ``atan2(0, 0)`` NaN; Vulkan too);
  ``TURBINE_CPU_TRIG=iree`` keeps IREE's; vmvx: f32 ``tan`` as ``sin / cos``, ``asin`` by
  ``atan2`` (:mod:`.op_forms`: IREE 3.13 has no vmvx lowering of ``math.tan`` /
  ``math.asin``); CPU targets and Vulkan: f32 ``elu`` / ``selu`` / ``celu`` with ``expm1``
  (torch-mlir's ``exp(x) - 1`` cancels near 0); CPU targets: f32 ``sinh`` / ``atanh`` /
  ``acosh`` / ``log_sigmoid`` in forms without IREE's cancellation.
- ``llvm-cpu`` targets: f32 ``log10`` as ``log(x) * (1 / ln 10)`` (:mod:`.op_forms`; IREE 3.13
  lowers it to a ``log10f`` call its executables cannot link); every target: ``fmod`` by a
  scalar as ``fmod`` by a 0-d tensor (torch-mlir lowers only that), ``isfinite`` / ``signbit``
  / ``copysign`` in ops it lowers; CPU targets: f32 ``asinh``
  without IREE's cancellation for negative arguments.
- every target: float -> unsigned integer casts through a signed type, and on ``vmvx`` float ->
  integer casts truncated first (:mod:`.casts`; IREE 3.13 computes wrong values
  otherwise).
- every target: mutable globals of the same type and initial value (per-layer KV caches) get
  their own salted initializers (:mod:`.globals`; IREE 3.13 gives them one shared buffer).
- every target: ``maximum`` / ``minimum`` / ``clamp`` / ``relu6`` / ``hardtanh`` keep a NaN
  operand's NaN, ``argmax`` / ``argmin`` and ``max.dim`` / ``min.dim`` indices point at the
  first NaN (:mod:`.nan_forms`; torch-mlir's lowering drops NaN). Applied last but one.
- Vulkan: ``argmax`` / ``argmin`` (and ``max.dim`` / ``min.dim`` indices) over a dimension
  that is not the innermost, over the innermost of the operand permuted (:mod:`.op_forms`;
  IREE 3.13 gives zeros). Applied last.
- CPU targets: a function that stores mutable globals returns after they are written
  (:mod:`.stored_state`; IREE's synchronous calls wait for results only, and the work writing
  the state may still read an argument the caller then overwrites).
- ``llvm-cpu`` with ``precision="bf16"`` (the ``--turbine-precision=bf16`` flag): fp32 matmuls
  as calls of a bf16 kernel (AMX, else AVX512-BF16: :mod:`.bf16`, :mod:`.matmuls`); refused
  where the host has neither. Otherwise, for host builds with turbine's fast-matmul defaults on an AVX-512
  CPU: fp32 matmuls as calls of turbine's AVX-512 fp32 kernel (:mod:`.matmuls`,
  :mod:`.avx512`; 1.2-2.5x IREE's matmul code), a ``[N]`` bias and a following ReLU in the
  kernel's store (:mod:`.epilogues`; ``TURBINE_CPU_EPILOGUES=keep``: separate dispatches).
  ``TURBINE_CPU_MATMUL=iree`` or ``--turbine-cpu-matmul=iree`` keeps IREE's.
- ``llvm-cpu`` with turbine's AVX-512 kernel chosen (as above): torchao weight-only int8 /
  int4 matmuls as calls of the AVX-512 quantized kernel, which reads the integer weights as
  stored (:mod:`.quant_matmuls`, :mod:`.avx512_quant`); and, where the CPU also has AVX-512
  VNNI, the int8 x int8 products of torchao's dynamic-activation configs as calls of the VNNI
  kernel (:mod:`.quant_int8_matmuls`, :mod:`.avx512_vnni`). ``TURBINE_CPU_INT8_MATMUL=iree``
  keeps IREE's code for those products only. There too, the int4-weight x int8-activation
  products of torchao's ``Int8DynamicActivationIntxWeightConfig`` (fake quantization) as calls
  of the VNNI w4a8 kernel on the packed int4 weights (:mod:`.quant_w4a8_matmuls`,
  :mod:`.avx512_w4a8`); ``TURBINE_CPU_INT8_MATMUL=iree`` keeps them on the weight-only int4
  kernel (f32 activations), as before. The VNNI kernels need the kernels built for AVX-512;
  built for AVX2 (:mod:`.isa`), the w4a8 products take that kernel's AVX2 form
  (``vpmaddubsw``), and the int8 x int8 ones stay IREE's.
- ``llvm-cpu`` with turbine's fp32 kernels chosen (as above): the fp32 products of two
  activations the static kernel leaves (a dynamic reduction or width: attention over a dynamic
  sequence) as calls of the dynamic-size kernel (:mod:`.dynamic_matmuls`,
  :mod:`.avx512_dynamic`); ``TURBINE_CPU_DYNAMIC_MATMUL=iree`` keeps IREE's code for them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from . import softmax as softmax_rules  # its DYNAMIC_SOFTMAX_ISAS, read per compile
from .activations import SILU_ENV
from .amx_conv import AMX_CONV_ENV, amx_conv_enabled
from .amx_quant import QUANT_AMX_ENV, quant_amx_enabled
from .attention import decompose_attention, has_attention, targets_only_cpu
from .avx512 import (
    AVX512_BF16_FEATURES,
    MATMUL_PREFETCH_ENV,
    MATMUL_ROWS_ENV,
    Avx512Gemm,
    host_avx512_bf16_missing,
)
from .avx512_conv import CONV_BLOCKING_ENV
from .avx512_vnni import host_vnni_missing
from .bf16 import bf16_kernel_kind, check_precision, precision_of, rewrite_matmuls_bf16
from .casts import fix_float_to_int_casts, float_to_int_casts
from .conv_forms import GROUPED_ENV, convs_to_reform, reform_convs
from .convs import convs_as_matmuls, rewrite_convs_as_matmuls
from .direct_convs import depthwise_convs, direct_convs, rewrite_convs_avx512
from .dynamic_matmuls import (
    DYNAMIC_MATMUL_ENV,
    dynamic_matmul_enabled,
    rewritable_dynamic_matmuls,
    rewrite_dynamic_matmuls,
)
from .epilogues import EPILOGUE_ENV
from .few_row_products import (
    FEW_ROW_PRODUCTS_ENV,
    few_row_products_enabled,
    rewrite_few_row_products,
)
from .gathers import (
    OUTER_GATHERS_ENV,
    arange_gathers,
    outer_gathers,
    rewrite_arange_gathers,
    rewrite_outer_gathers,
)
from .gelu import (
    GELU_ENV,
    fast_gelu_enabled,
    rewritable_gelus,
    rewrite_gelus,
    rewrite_tanh_gelus_as_ops,
    tanh_gelus,
)
from .globals import separate_shared_globals, shared_mutable_globals
from .isa import KERNEL_ISAS, kernel_features, kernel_isa, kernels_for
from .matmuls import (
    CPU_MATMUL_ENV,
    cpu_matmul_kernel,
    cpu_quant_kernel,
    rewritable_matmuls,
    rewrite_matmuls_avx512,
    target_has_avx512,
)
from .nan_forms import nan_ops, rewrite_nan_forms
from .op_forms import (
    asinh_ops,
    cancelling_ops,
    elu_ops,
    fmod_scalars,
    inner_index_reductions,
    log10_ops,
    rewrite_asinh,
    rewrite_cancelling_ops,
    rewrite_elus,
    rewrite_fmod_scalars,
    rewrite_inner_index_reductions,
    rewrite_log10,
    rewrite_sign_ops,
    rewrite_vmvx_trig,
    sign_ops,
    vmvx_trig_ops,
)
from .pools import (
    CPU_POOLS_ENV,
    global_avg_pools,
    max_pools,
    rewrite_global_avg_pools,
    rewrite_max_pools_nhwc,
)
from .quant_absmax import abs_max_patterns, rewrite_abs_max
from .quant_int8_matmuls import (
    CPU_INT8_MATMUL_ENV,
    rewritable_int8_matmuls,
    rewrite_int8_matmuls_vnni,
)
from .quant_matmuls import rewritable_quant_matmuls, rewrite_quant_matmuls_avx512
from .quant_w4a8_matmuls import rewritable_w4a8_matmuls, rewrite_w4a8_matmuls
from .softmax import (
    CPU_SOFTMAX_ENV,
    reciprocal_forms,
    rewrite_reciprocal_forms,
    rewrite_softmaxes,
    softmax_enabled,
    softmaxes,
)
from .stored_state import functions_storing_state, wait_for_stored_state
from .targets import flag_targets
from .trig import TRIG_ENV, rewritable_trig, rewrite_trig, trig_enabled
from .winograd import WINOGRAD_ENV

__all__ = ["REVISION", "environment_key", "module_for_compile", "source_for_compile"]

#: What the rewrites hand IREE, as a number the compile cache keys on: bump it whenever a rewrite
#: changes its output, so that no module compiled under an older rewrite (an older, maybe wrong,
#: cast lowering) is served from the cache. 1: CPU attention; 2: float -> integer casts;
#: 3: mutable globals sharing an initial value; 4: stem and 1x1 convolutions as matmuls on
#: llvm-cpu; 5: bf16 matmuls on AMX; 6: fp32 matmuls on the AVX-512 kernel by default;
#: 7: torchao weight-only int8 / int4 matmuls on the AVX-512 quantized kernel; 8: fp32
#: convolutions on the AVX-512 direct-convolution kernel (and the im2col matmuls of ``convs`` on
#: the matmul kernel) where the matmul kernel is the choice; 9: the quantized kernel's int4
#: blocks of 8 channels with zero points converted per block (``TURBINE_CPU_QUANT_KERNEL=v1``:
#: the first version); 10: the quantized kernel's software prefetch of the next block's rows;
#: 11: 1-D and few-group convolutions made 2-D and dense for the direct-convolution kernel;
#: 12: max poolings channels-last beside those convolutions, and that convolution kernel with
#: reduction blocks of 256 (on their branch, 9 to 11); 13: ``precision="bf16"`` convolutions
#: on that kernel's bf16 form, and bf16 matmuls on the AVX512-BF16 kernel where there is no AMX;
#: 14: torchao's int8 x int8 products (dynamic-activation configs) on the AVX-512 VNNI kernel;
#: 15: that kernel one channel at a time; 16: the weight-only int8 (per channel) kernel one
#: channel at a time too; 17: bias and ReLU after an fp32 matmul, bias, batch norm, residual add
#: and ReLU after a direct convolution, in the AVX-512 kernels' store (:mod:`.epilogues`); 18: a
#: direct convolution whose output is read only by another one with padding writes it
#: zero-padded as that one reads it (no padding copy between them); 19: per-channel sub / mul /
#: add chains after a direct convolution (a batch norm as torch.export decomposes it) in its
#: store too (on their branches: 13-15 and 13-15); 20: torchao's int4-weight x int8-activation
#: products (``Int8DynamicActivationIntxWeightConfig``, fake-quantized) on the AVX-512 VNNI
#: w4a8 kernel instead of the weight-only int4 kernel; 21: the weight-only int4 kernel in
#: blocks of 2 channels where ``M`` is statically 1 (on their branches: 20 and 20); 22: the
#: VNNI int8 and w4a8 kernels without software prefetch; 23: grouped-query attention in its
#: grouped form (the keys and values not repeated); 24: the weight-only int4 kernel's
#: ``nibble_shifts`` form at one row for groups of 128s; 25: torchao's activation scale
#: ``max(-min(amin(x), 0), max(amax(x), 0))`` as ``amax(|x|)`` on CPUs; 26: ``precision="bf16"``
#: convolutions on the AMX convolution kernel where there is AMX; 27: its epilogue (bias, batch
#: norm or per-channel steps, ReLU); 28: fp32 softmaxes as ``exp(x - max) * (1 / sum)`` on
#: llvm-cpu (:mod:`.softmax`); 29: and a model's own softmax spelled that way over a dynamic
#: shape handed to IREE as a softmax (IREE 3.13 miscomputes it); 30: one-row torchao
#: weight-only int8 / int4 products on the AMX-INT8 kernel where there is AMX (:mod:`.amx_quant`);
#: 31: that kernel gives zeros, not garbage, for a row whose largest magnitude is below 3.7e-37;
#: 32: int4 on it only where the module's int4 weights fit in half the host's L3; 33: torchao
#: weights with one group per channel (no group axis) on the quantized kernels too; 34: the
#: direct-convolution kernel's blocking per CPU vendor (Intel: 6 x 64 blocks, 96-row
#: workgroups, blocks of 128, the next block prefetched into L2); 35: fp32 / bf16 matmuls of at
#: most 8 register blocks of static rows prefetch their weight's next K block into L2; 36: 3x3
#: stride-1 fp32 convolutions of at least 64 channels and 7 x 7 outputs in Winograd form
#: (:mod:`.winograd`), the transformed weight computed by an initializer of the compile copy;
#: 37: depthwise fp32 convolutions, and grouped ones of up to 16 channels a group, on the
#: AVX-512 depthwise kernel (:mod:`.depthwise`); 38: global average poolings as means
#: (:mod:`.pools`); 39: hardswish and SiLU in the direct and depthwise kernels' stores; 40:
#: the direct kernel's panels 16 or 32 wide for few output channels (:mod:`.avx512_conv`); 41:
#: the AMX convolution kernel adds a residual in its epilogue and writes the next stride-1 AMX
#: convolution's padded bf16 input itself (:mod:`.amx_conv`); 42: and a max pooling's padded
#: f32 input (:mod:`.pools`); 43: AMX convolutions of 16 input channels (RGB stems in
#: space-to-depth form) read two taps a tile row; 44: AMX results read only by convolutions
#: and residual adds kept in bf16 (:mod:`.direct_convs`); 45: the fp32 kernels on AVX2 CPUs,
#: blocked for them (:mod:`.isa`); 46: and the weight-only quantized kernel there, without
#: table lookups; 47: no L2 prefetch in one-row AVX2 products; 48: torchao's w4a8 products
#: on the w4a8 kernel's AVX2 form where the kernels are built for AVX2, and the VNNI kernels
#: only where they are built for AVX-512; 49: fp32 products of two activations with a dynamic
#: reduction or width (attention over a dynamic sequence) on the dynamic-size kernel
#: (:mod:`.dynamic_matmuls`), attention masks over dynamic sizes computed once, and on AVX2
#: builds softmaxes over dynamic shapes that feed only that kernel in the reciprocal form; 50:
#: gathers by aranges over whole dimensions (dynamic shapes, CPU targets) as views
#: (:mod:`.gathers`); 51: the causal masks over dynamic sizes that the attention rewrite
#: builds computed once a layer; 52: those softmaxes in the reciprocal form on AVX-512 builds too;
#: 53: products over a dynamic batch on the dynamic-size kernel too; 54: the kernels' epilogues
#: stored in their branch (no values yielded across it); 55: one-row int4 weight-only products
#: on AVX2 in the nibble-masks form; 56: products of two activations with few rows per batch
#: entry (a decode step's attention) read their operands in place (:mod:`.few_row_products`);
#: 57: the nibble-masks form reads its row prepared once per call (``avx2_quant.row_executable``);
#: 58: AVX2 products of few static rows choose their register block's rows
#: (``avx512.avx2_row_block``); 59: the rows spread evenly over the blocks, convolutions'
#: pixels too; 60: direct convolutions write their output padded for a depthwise one reading
#: it, the kernels' stores take sigmoids and hardsigmoids (squeeze-excitation gates), and on
#: AVX2 few-group convolutions the depthwise kernel takes are no longer made dense; 61: gathers
#: by an outer product of indices (upsamplings) as two one-dimension gathers on llvm-cpu; 62:
#: and their negative indices wrapped; 63: the kernels' SiLU computes exp by turbine's own
#: polynomial; 64: f32 GELUs by turbine's rational ``erf`` on llvm-cpu (:mod:`.gelu`); 65: and
#: tanh-form ones by a rational ``tanh``, and on every target the tanh-form GELUs left written
#: out with the right ``sqrt(2 / pi)`` (torch-mlir's is off in the fourth digit); 66: f32 sin /
#: cos on llvm-cpu with a three-part ``pi / 2`` (:mod:`.trig`); 67: f32 log10 as ``log * (1 /
#: ln 10)`` on llvm-cpu (:mod:`.op_forms`: IREE 3.13 cannot link ``log10f``); 68: ``fmod`` by
#: a scalar as ``fmod`` by a 0-d tensor on every target (torch-mlir lowers only that); 69: f32
#: ``asinh`` without IREE's cancellation for negative arguments on CPU targets; 70: f32 ``tan``
#: on llvm-cpu by the same reduction as sin / cos, and on vmvx as ``sin / cos``; 71: f32
#: ``atan`` on llvm-cpu by turbine's own reduction and polynomial; 72: and ``atan2``; 73: both
#: on Vulkan too; 74: f32 ELU / SELU / CELU with ``expm1`` on CPU targets and Vulkan; 75: f32
#: sinh / atanh / acosh / log_sigmoid without cancellation on CPU targets; 76: f32 asin as
#: ``atan2(x, sqrt((1 - x) (1 + x)))`` (turbine's atan2 on llvm-cpu and Vulkan, IREE's on vmvx);
#: 77: turbine's GELU of -inf is 0 (was NaN); weight-only products built for AVX2
#: (``--turbine-cpu-matmul=avx2``) never on AMX; 78: a max pooling after an AMX convolution in
#: bf16, writing the next AMX convolution's input and the residual's bf16 copy; 79: the input of
#: every AMX convolution reading the pooled result at stride 1; 80: only where AMX kernels alone
#: read the pooled result; 81: strided AMX convolutions leave out the space-to-depth
#: blocks whose weights are zero; 82: a kernel writes a strided AMX convolution's space-to-depth
#: input; 83: products split into workgroups the host's IREE workers share evenly; 84: on CPU
#: targets, functions storing mutable globals wait for them before returning; 85: NaN kept by
#: maximum / minimum / clamp, and first in argmax / argmin, on every target; on Vulkan,
#: argmax / argmin over the innermost dimension; 86: isfinite / signbit / copysign in ops IREE
#: lowers, sinh / cosh finite up to their overflow on CPU targets; 87: max poolings of a kernel's
#: result without a barrier; 88: the fp32 AVX-512 convolution writes a following max pooling's
#: padded input; 96: ReLU in the kernels' stores as ``v < 0 ? 0 : v`` in plain arith (was an
#: AVX-512 instruction in inline assembly, wrong in builds for CPUs without AVX-512); 97: the
#: quantized products of a build for a CPU without AVX-512 on the AVX2 forms, whatever the
#: blocking (the lookup's AVX-512 intrinsic made LLVM abort), and never on the VNNI kernels; 98:
#: ``turbine.cpu_requires`` names what the kernels need on the target (AVX2's where it lacks
#: AVX-512, whatever the blocking), which the runtime now checks; no AMX products for it; 99:
#: weight-only int8 products without scales accumulate in up to four FMA chains per output;
#: AVX2's one-row int4 products in groups of 64s take four channels a block, one chain each;
#: 100: builds for a named CPU with AVX2 and FMA run quantized products on turbine's kernels;
#: 101: the quantized products of static rows cut their workgroup columns so that IREE's workers
#: share them evenly (no more 24 workgroups on two workers).
REVISION = 101

_log = logging.getLogger("turbine.aot")

#: The environment variables that change what the rewrites hand IREE.
_ENVIRONMENT = (
    "TURBINE_CPU_ATTENTION",
    "TURBINE_CPU_CONV_MATMUL",
    CPU_MATMUL_ENV,
    "TURBINE_CPU_QUANT_KERNEL",
    CPU_INT8_MATMUL_ENV,
    CONV_BLOCKING_ENV,
    CPU_POOLS_ENV,
    EPILOGUE_ENV,
    SILU_ENV,
    GELU_ENV,
    TRIG_ENV,
    GROUPED_ENV,
    OUTER_GATHERS_ENV,
    AMX_CONV_ENV,
    CPU_SOFTMAX_ENV,
    QUANT_AMX_ENV,
    MATMUL_PREFETCH_ENV,
    MATMUL_ROWS_ENV,
    WINOGRAD_ENV,
    DYNAMIC_MATMUL_ENV,
    FEW_ROW_PRODUCTS_ENV,
)


def environment_key() -> str:
    """The rewrite choices the environment makes (``TURBINE_CPU_ATTENTION``,
    ``TURBINE_CPU_CONV_MATMUL``, ``TURBINE_CPU_MATMUL``, ``TURBINE_CPU_QUANT_KERNEL``,
    ``TURBINE_CPU_INT8_MATMUL``, ``TURBINE_CPU_CONV_BLOCKING``, ``TURBINE_CPU_POOLS``,
    ``TURBINE_CPU_EPILOGUES``, ``TURBINE_CPU_SILU``, ``TURBINE_CPU_GELU``, ``TURBINE_CPU_TRIG``,
    ``TURBINE_CPU_GROUPED``, ``TURBINE_CPU_OUTER_GATHERS``, ``TURBINE_CPU_AMX_CONV``,
    ``TURBINE_CPU_SOFTMAX``, ``TURBINE_CPU_QUANT_AMX``, ``TURBINE_CPU_MATMUL_PREFETCH``,
    ``TURBINE_CPU_MATMUL_ROWS``, ``TURBINE_CPU_WINOGRAD``, ``TURBINE_CPU_DYNAMIC_MATMUL``,
    ``TURBINE_CPU_FEW_ROW_PRODUCTS``), for the compile cache's keys: a module compiled under one
    choice is not served for another."""
    return ";".join(f"{k}={os.environ.get(k, '').strip().lower()}" for k in _ENVIRONMENT)


def _avx512_gemm(k: int, n: int, batched: bool) -> Avx512Gemm:
    return Avx512Gemm.for_shape(k, n, batch_b=batched)


def _avx512_bf16_gemm(k: int, n: int, batched: bool) -> Avx512Gemm:
    return Avx512Gemm.for_shape(k, n, batch_b=batched, bf16=True)


def module_for_compile(module_op: Any, flags: Sequence[str]) -> tuple[Any, bool]:
    """The module to hand to IREE for ``flags``: a rewritten copy when a fix applies.

    Returns:
        ``(module, owned)``: ``owned`` is True when ``module`` is a new copy the caller erases
        after use; otherwise it is ``module_op`` itself (unchanged).
    """
    op = getattr(module_op, "operation", module_op)
    keep = os.environ.get("TURBINE_CPU_ATTENTION", "").strip().lower() == "keep"
    attention = not keep and targets_only_cpu(flags) and has_attention(op)
    targets = flag_targets(flags)
    vmvx = "vmvx" in targets
    casts = bool(float_to_int_casts(op, vmvx))
    # gathers by aranges over whole dimensions (Hugging Face's padding masks) as views
    gathers = targets_only_cpu(flags) and bool(arange_gathers(op))
    # gathers by an outer product of indices (upsamplings) as two one-dimension gathers, unless
    # TURBINE_CPU_OUTER_GATHERS=keep
    outer = (
        targets == {"llvm-cpu"}
        and os.environ.get(OUTER_GATHERS_ENV, "").strip().lower() != "keep"
        and bool(outer_gathers(op))
    )
    shared_globals = bool(shared_mutable_globals(op))
    # every target: maximum / minimum / clamp / argmax keep torch's NaN (a correctness fix:
    # torch-mlir lowers them with ordered compares that drop it)
    nans = bool(nan_ops(op))
    # Vulkan: argmax / argmin over a dimension that is not the innermost over the innermost one
    # of the operand permuted (a correctness fix: IREE 3.13 gives zeros); after the NaN forms,
    # which add such reductions
    inner_index = targets == {"vulkan-spirv"} and (nans or bool(inner_index_reductions(op)))
    # CPU targets: calls wait for the module state they store, which may read their arguments
    # (a correctness fix: IREE's synchronous calls wait for their results only)
    stored_state = targets_only_cpu(flags) and bool(functions_storing_state(op))
    conv_choice = os.environ.get("TURBINE_CPU_CONV_MATMUL", "").strip().lower()
    keep_convs = conv_choice == "keep"
    convs = not keep_convs and targets == {"llvm-cpu"} and bool(convs_as_matmuls(op))
    bf16 = precision_of(flags) == "bf16"
    if bf16:
        check_precision(flags)
    kernel = cpu_matmul_kernel(flags)
    # turbine's fp32 kernels, blocked for the chosen instruction set (isa.py)
    fp32_kernel = targets == {"llvm-cpu"} and kernel in KERNEL_ISAS
    # turbine's quantized kernels: where its fp32 ones are, and in builds for a named CPU with
    # AVX2 and FMA (their AVX2 forms; the fp32 matmuls stay IREE's there)
    quant_kernel = cpu_quant_kernel(flags)
    quant_kernels = targets == {"llvm-cpu"} and quant_kernel in KERNEL_ISAS
    # the weight-only quantized kernel (on AVX2: its form without table lookups)
    quant = quant_kernels and bool(rewritable_quant_matmuls(op))
    named_quant = quant_kernels and not fp32_kernel and (quant or bool(rewritable_w4a8_matmuls(op)))
    isa = kernel if kernel in KERNEL_ISAS else quant_kernel if named_quant else kernel_isa()
    avx512 = not bf16 and fp32_kernel
    matmul = bf16 or avx512
    # products of two activations with a dynamic reduction or width (attention over a
    # dynamic sequence) on the dynamic-size kernel, unless TURBINE_CPU_DYNAMIC_MATMUL=iree
    dynamic = (
        avx512 and dynamic_matmul_enabled() and (attention or bool(rewritable_dynamic_matmuls(op)))
    )
    # instructions only AVX-512 has where the target has them, whatever the blocking (isa.py)
    target_avx512 = target_has_avx512(flags)
    # int8 x int8 products on the VNNI kernel: the host builds of the AVX-512 kernels, on a
    # CPU with AVX-512 VNNI, for a target with AVX-512, unless TURBINE_CPU_INT8_MATMUL=iree
    keep_int8 = os.environ.get(CPU_INT8_MATMUL_ENV, "").strip().lower() == "iree"
    vnni = (
        fp32_kernel
        and isa == "avx512"
        and target_avx512
        and not keep_int8
        and not host_vnni_missing()
    )
    int8 = vnni and bool(rewritable_int8_matmuls(op))
    # int4 x int8 products (torchao's fake-quantized Int8DynamicActivationIntxWeightConfig) on
    # the w4a8 kernel: its VNNI form gated as int8, its AVX2 form where the kernels are built
    # for AVX2; otherwise they stay on the weight-only int4 kernel
    w4a8_isa = (
        "avx512" if vnni else "avx2" if quant_kernels and isa == "avx2" and not keep_int8 else ""
    )
    w4a8 = bool(w4a8_isa) and bool(rewritable_w4a8_matmuls(op))
    # the convolutions on the AVX-512 kernels unless TURBINE_CPU_CONV_MATMUL=iree (or keep);
    # with precision="bf16", in their bf16 form (AVX512-BF16: AMX CPUs have it too)
    conv_kernel = fp32_kernel and not keep_convs and conv_choice != "iree"
    bf16_convs = bf16 and not host_avx512_bf16_missing()
    # ... and those that are not dilated on the AMX kernel where there is AMX, unless
    # TURBINE_CPU_AMX_CONV=off
    amx_convs = bf16_convs and bf16_kernel_kind() == "amx" and amx_conv_enabled()
    # 1-D and few-group convolutions made 2-D and dense for that kernel (conv_forms)
    reform = conv_kernel and bool(convs_to_reform(op, isa))
    direct = conv_kernel and (reform or bool(direct_convs(op)) or bool(depthwise_convs(op)))
    # beside those convolutions (NHWC), the max poolings NHWC too unless TURBINE_CPU_POOLS=keep
    keep_pools = os.environ.get(CPU_POOLS_ENV, "").strip().lower() == "keep"
    pools = direct and not keep_pools and bool(max_pools(op))
    # global average poolings as means (torch-mlir's adaptive pooling gathers every element)
    means = targets == {"llvm-cpu"} and not keep_pools and bool(global_avg_pools(op))
    # torchao's activation scale as one reduction (exact) wherever the CPU compiles it
    absmax = targets_only_cpu(flags) and bool(abs_max_patterns(op))
    # fp32 softmaxes (the model's, and those the attention rewrite writes) in a form IREE does
    # not raise to its slow softmax op, unless TURBINE_CPU_SOFTMAX=keep
    # over dynamic shapes too where they feed only the dynamic-size kernel, on the builds where
    # that was verified (softmax.DYNAMIC_SOFTMAX_ISAS)
    dynamic_softmax = dynamic and isa in softmax_rules.DYNAMIC_SOFTMAX_ISAS
    softmax = (
        targets == {"llvm-cpu"}
        and softmax_enabled()
        and (attention or bool(softmaxes(op, dynamic_softmax)))
    )
    # ... and a model's own softmax in that form over a dynamic shape, which IREE 3.13 computes
    # wrongly, handed to IREE as a softmax (always: a correctness fix)
    reciprocal = targets == {"llvm-cpu"} and bool(reciprocal_forms(op))
    # f32 GELUs by turbine's rational functions, unless TURBINE_CPU_GELU=iree
    gelu = targets == {"llvm-cpu"} and fast_gelu_enabled() and bool(rewritable_gelus(op))
    # ... and on every target, the tanh-form GELUs left with the right sqrt(2 / pi) (a
    # correctness fix: torch-mlir writes it 0.797724)
    tanh_fix = bool(tanh_gelus(op))
    # f32 log10 as log * (1 / ln 10): IREE 3.13's llvm-cpu executables lack log10f (a fix)
    log10 = targets == {"llvm-cpu"} and bool(log10_ops(op))
    # fmod by a scalar as fmod by a 0-d tensor: torch-mlir lowers only that (every target)
    fmod = bool(fmod_scalars(op))
    # isfinite / signbit / copysign, which torch-mlir cannot lower, in ops it lowers (every
    # target)
    signs = bool(sign_ops(op))
    # asinh without IREE's cancellation for negative x (CPU targets: a correctness fix)
    asinh = targets_only_cpu(flags) and bool(asinh_ops(op))
    # sinh / atanh / acosh / log_sigmoid without cancellation (CPU targets: a correctness fix)
    cancelling = targets_only_cpu(flags) and bool(cancelling_ops(op))
    # ELUs with expm1 rather than torch-mlir's exp - 1 (CPU targets and Vulkan: a correctness
    # fix; on lavapipe exp - 1 is 100 % off just below 0)
    elus = (targets_only_cpu(flags) or targets == {"vulkan-spirv"}) and bool(elu_ops(op))
    # f32 sin / cos / tan with an exact range reduction, atan / atan2 / asin by turbine's
    # polynomial, unless TURBINE_CPU_TRIG=iree; on Vulkan the inverse ones only (IREE's are 4e-6
    # off there too; the forward ones' reduction needs fused FMAs)
    inverse_only = targets == {"vulkan-spirv"}
    trig = (
        (targets == {"llvm-cpu"} or inverse_only)
        and trig_enabled()
        and bool(rewritable_trig(op, inverse_only))
    )
    # f32 tan as sin / cos and asin by atan2 on vmvx, which lowers neither (a fix)
    vmvx_trig = targets == {"vmvx"} and bool(vmvx_trig_ops(op))
    if not (
        attention
        or gathers
        or outer
        or softmax
        or reciprocal
        or casts
        or shared_globals
        or stored_state
        or nans
        or inner_index
        or convs
        or matmul
        or dynamic
        or quant
        or int8
        or w4a8
        or direct
        or means
        or absmax
        or gelu
        or tanh_fix
        or trig
        or log10
        or fmod
        or signs
        or asinh
        or elus
        or cancelling
        or vmvx_trig
    ):
        return module_op, False
    copy = op.clone()
    with kernels_for(isa, target_avx512=target_avx512):
        if gathers:  # before attention: the masks it reads are built from them
            count = rewrite_arange_gathers(copy)
            _log.info("CPU target: %d gather(s) by aranges written as views", count)
        if outer:
            count = rewrite_outer_gathers(copy)
            _log.info("llvm-cpu target: %d outer-product gather(s) as two gathers", count)
        if attention:
            count = decompose_attention(copy)
            _log.info("CPU target: %d attention op(s) written as matmul + softmax", count)
        if casts:
            count = fix_float_to_int_casts(copy, vmvx)
            _log.info("%d float -> integer cast(s) rewritten for IREE (vmvx: %s)", count, vmvx)
        if shared_globals:
            count = separate_shared_globals(copy)
            _log.info(
                "%d mutable global(s) sharing an initial value given their own storage", count
            )
        if stored_state:
            count = wait_for_stored_state(copy)
            _log.info("CPU target: %d function(s) return after the state they store", count)
        if means:
            count = rewrite_global_avg_pools(copy)
            _log.info("llvm-cpu target: %d global average pooling(s) as means", count)
        if reform:
            count = reform_convs(copy, isa)
            _log.info("llvm-cpu target: %d 1-D / grouped convolution(s) made 2-D", count)
        if direct:
            count = rewrite_convs_avx512(
                copy, bf16=bf16_convs, amx=bf16_convs and amx_convs, pools=pools
            )
            _log.info(
                "llvm-cpu target: %d convolution(s) on the %s convolution kernel%s",
                count,
                "AVX-512" if bf16_convs else isa,
                " (bf16)" if bf16_convs else "",
            )
        if pools:
            count = rewrite_max_pools_nhwc(copy)
            _log.info("llvm-cpu target: %d max pooling(s) channels-last", count)
        if convs and convs_as_matmuls(copy):  # the stems (and dynamic-batch 1x1s) left
            kernel_for = (
                (_avx512_bf16_gemm if bf16_convs else _avx512_gemm) if conv_kernel else None
            )
            features = AVX512_BF16_FEATURES if bf16_convs else kernel_features()
            count = rewrite_convs_as_matmuls(copy, kernel_for, features)
            _log.info("llvm-cpu target: %d stem / 1x1 convolution(s) as im2col + matmul", count)
        if w4a8:  # before the weight-only kernel, which would take the same mm
            count = rewrite_w4a8_matmuls(copy, w4a8_isa)
            _log.info(
                "llvm-cpu target: %d int4 x int8 matmul(s) on the %s w4a8 kernel",
                count,
                "AVX-512 VNNI" if w4a8_isa == "avx512" else w4a8_isa,
            )
        if quant:  # before the fp32 matmuls: a quantized weight's matmul is this kernel's
            # AMX only where the kernels are built for AVX-512 (every AMX CPU has it) and for
            # this host's CPU: a build asked for AVX2 (--turbine-cpu-matmul=avx2), or for a
            # target without AVX-512 (a named CPU, x86-64-v3), is for a CPU without AMX
            amx = isa == "avx512" and target_avx512 and quant_amx_enabled()
            count = rewrite_quant_matmuls_avx512(copy, amx=amx)
            _log.info(
                "llvm-cpu target: %d quantized matmul(s) on the %s int8/int4 kernel",
                count,
                f"AMX (one row) / {isa}" if amx else isa,
            )
        if int8:
            count = rewrite_int8_matmuls_vnni(copy)
            _log.info("llvm-cpu target: %d int8 x int8 matmul(s) on the AVX-512 VNNI kernel", count)
        if absmax:
            count = rewrite_abs_max(copy)
            _log.info("CPU target: %d activation scale(s) as one amax(|x|) reduction", count)
        if reciprocal:  # before the static softmaxes' rewrite, which writes this form
            count = rewrite_reciprocal_forms(copy)
            _log.info("llvm-cpu target: %d dynamic exp * reciprocal(sum) as softmax", count)
        if softmax:  # after attention: its softmaxes are rewritten too
            count = rewrite_softmaxes(copy, dynamic_softmax)
            _log.info(
                "llvm-cpu target: %d softmax(es) on the row kernel or as exp(x - max) * (1 / sum)",
                count,
            )
        if avx512 and few_row_products_enabled():
            # after attention, before the packed kernel: a decode step's q @ k^T and p @ v
            count = rewrite_few_row_products(copy)
            if count:
                _log.info(
                    "llvm-cpu target: %d product(s) of few rows reading their operands in place",
                    count,
                )
        if matmul and rewritable_matmuls(copy):  # after attention: its matmuls are rewritten too
            if bf16:
                count = rewrite_matmuls_bf16(copy)
                kind = "AMX" if bf16_kernel_kind() == "amx" else "AVX512-BF16"
                _log.info("precision bf16: %d matmul(s) on the %s kernel", count, kind)
            else:
                count = rewrite_matmuls_avx512(copy)
                _log.info("llvm-cpu target: %d fp32 matmul(s) on the %s kernel", count, isa)
        if dynamic and rewritable_dynamic_matmuls(copy):  # what the static kernel leaves
            count = rewrite_dynamic_matmuls(copy)
            _log.info(
                "llvm-cpu target: %d fp32 matmul(s) of dynamic sizes on the %s dynamic-size kernel",
                count,
                isa,
            )
        if gelu:
            count = rewrite_gelus(copy)
            _log.info("llvm-cpu target: %d GELU(s) by turbine's rational functions", count)
        if tanh_fix and (count := rewrite_tanh_gelus_as_ops(copy)):  # what the rational form left
            _log.info("%d tanh-form GELU(s) as ops with the right sqrt(2 / pi)", count)
        if fmod:
            count = rewrite_fmod_scalars(copy)
            _log.info("%d fmod(s) by a scalar as fmod by a 0-d tensor", count)
        if signs:
            count = rewrite_sign_ops(copy, by_bits=vmvx)
            _log.info("%d isfinite / signbit / copysign op(s) as ops IREE lowers", count)
        if asinh:
            count = rewrite_asinh(copy)
            _log.info("%d asinh op(s) without cancellation", count)
        if cancelling:
            count = rewrite_cancelling_ops(copy)
            _log.info("%d sinh / atanh / acosh / log_sigmoid op(s) without cancellation", count)
        if elus:
            count = rewrite_elus(copy)
            _log.info("%d elu / selu / celu op(s) with expm1", count)
        if log10:
            count = rewrite_log10(copy)
            _log.info("llvm-cpu target: %d log10 op(s) as log * (1 / ln 10)", count)
        if vmvx_trig:
            count = rewrite_vmvx_trig(copy)
            _log.info("vmvx target: %d tan / asin op(s) as sin / cos, atan2", count)
        if trig:
            count = rewrite_trig(copy, inverse_only)
            _log.info("%d trigonometric op(s) by turbine's own code", count)
        # last but one: after the kernels took theirs; vmvx compares NaN as a number
        if nans and (count := rewrite_nan_forms(copy, by_bits=vmvx)):
            _log.info("%d maximum / minimum / clamp / argmax op(s) keeping NaN", count)
        if inner_index and (count := rewrite_inner_index_reductions(copy)):
            _log.info("vulkan target: %d argmax / argmin over the innermost dimension", count)
    return copy, True


def source_for_compile(data: bytes, flags: Sequence[str]) -> bytes:
    """What to hand IREE for the MLIR ``data`` (text or bytecode) and ``flags``: the bytecode of
    :func:`module_for_compile`'s copy when a fix applies, else ``data`` itself (also when it
    does not parse here: the compiler then reports what is wrong)."""
    import io

    from turbine_ir import ir

    try:
        module = ir.Module.parse(data, context=ir.Context())
    except Exception:
        return data
    target, owned = module_for_compile(module.operation, flags)
    if not owned:
        return data
    try:
        buf = io.BytesIO()
        target.operation.write_bytecode(buf)
        return buf.getvalue()
    finally:
        target.operation.erase()
