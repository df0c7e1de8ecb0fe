"""The compile-flag policy of the compiler layer: target and device resolution, and turbine's IREE
compile flags for every target and program trait.

One place decides what a user gets when they name no flags: ``ExportOutput.compile``
(:func:`compile_flags_for`), the runner, bundles and the CLI (:func:`device_compile_flags`) all
build on :func:`default_compile_flags` (and :func:`resolve_target` to map a target or driver
name to the pair IREE needs); :func:`program_traits` reads what a program needs
(dynamic dims, fp32 only), :func:`check_program_for_target` refuses what cannot work, and
:func:`retry_flags` says which optional defaults a failed compile drops. The defaults are chosen for speed on the machine that compiles
(``host=True``); a portable build is one flag away (``host=False``), and every default can be
overridden by passing the same ``--flag=value`` in ``overrides`` / ``extra_args`` (the later value
replaces the default, see :func:`merge_flags`).

What each default buys is measured by ``benchmarks/models_bench.py`` and recorded in
``docs/performance.md``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .torch_ir import walk

T = TypeVar("T")

__all__ = [
    "CUDA_FP32_SPLIT_K_FLAG",
    "SPEED_ONLY_GROUPS",
    "TARGETS",
    "SpeedOnlyGroup",
    "Target",
    "TargetError",
    "as_list",
    "check_program_for_target",
    "compile_flags_for",
    "compile_with_fallback",
    "default_compile_flags",
    "default_runtime_flags",
    "device_compile_flags",
    "fallback_flags",
    "flag_targets",
    "float_types",
    "has_dynamic_shapes",
    "merge_flags",
    "narrow_int_types",
    "narrow_matmuls",
    "program_traits",
    "public_functions",
    "resolve_target",
    "retry_flags",
    "target_device_flags",
    "uses_float16",
]

#: Environment variable with extra compile flags appended after turbine's defaults (and so
#: overriding them), e.g. ``TURBINE_COMPILE_FLAGS="--iree-opt-data-tiling=false"``.
COMPILE_FLAGS_ENV = "TURBINE_COMPILE_FLAGS"


class TargetError(ValueError):
    """A target, driver or flag given to turbine's target resolution is invalid."""


@dataclass(frozen=True)
class Target:
    """A compile target together with the runtime driver that runs it.

    Attributes:
        name: turbine's name for the target (``"llvm-cpu"``, ``"vmvx"``, ``"vulkan-spirv"``,
            ``"cuda"``, ``"rocm"``, ``"metal-spirv"``).
        hal_device: the ``--iree-hal-target-device`` value.
        local_backend: for ``hal_device == "local"``, the
            ``--iree-hal-local-target-device-backends`` value; else ``None``.
        driver: the default ``iree.runtime`` driver for modules built for this target.
        gpu: whether the target is a GPU.
    """

    name: str
    hal_device: str
    local_backend: str | None
    driver: str
    gpu: bool = False

    @property
    def device_flags(self) -> list[str]:
        """The flags that select this target device (no optimisation flags)."""
        flags = [f"--iree-hal-target-device={self.hal_device}"]
        if self.local_backend:
            flags.append(f"--iree-hal-local-target-device-backends={self.local_backend}")
        return flags


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("llvm-cpu", "local", "llvm-cpu", "local-task"),
        Target("vmvx", "local", "vmvx", "local-task"),
        Target("vulkan-spirv", "vulkan", None, "vulkan", gpu=True),
        Target("cuda", "cuda", None, "cuda", gpu=True),
        Target("rocm", "hip", None, "hip", gpu=True),
        Target("metal-spirv", "metal", None, "metal", gpu=True),
    )
}

# Other names users write for the same targets (IREE backend names, driver names).
_ALIASES: dict[str, str] = {
    "cpu": "llvm-cpu",
    "host": "llvm-cpu",
    "local-task": "llvm-cpu",
    "local-sync": "llvm-cpu",
    "local": "llvm-cpu",
    "vulkan": "vulkan-spirv",
    "hip": "rocm",
    "metal": "metal-spirv",
}


def resolve_target(name: str | None = None) -> Target:
    """Resolves a target, backend or driver name to a :class:`Target`.

    Args:
        name: ``"llvm-cpu"`` (default when ``None``), ``"vmvx"``, ``"vulkan-spirv"``, ``"cuda"``,
            ``"rocm"``, ``"metal-spirv"``, or an alias (``"cpu"``, ``"local-task"``,
            ``"vulkan"``, ``"hip"``, ...).

    Returns:
        The target. For ``"local-sync"`` the driver is ``local-sync``.

    Raises:
        TargetError: the name is not known; the message lists the valid names.
    """
    raw = (name or "llvm-cpu").strip()
    key = _ALIASES.get(raw, raw)
    try:
        target = TARGETS[key]
    except KeyError:
        valid = ", ".join([*TARGETS, *_ALIASES])
        raise TargetError(f"unknown IREE target {name!r}; choose one of: {valid}") from None
    if raw == "local-sync":
        target = Target(target.name, target.hal_device, target.local_backend, "local-sync")
    return target


def target_device_flags(hal_devices: Sequence[str]) -> list[str]:
    """One ``--iree-hal-target-device`` per device, in ``__device_N`` order.

    IREE merges identical target specifications into one device, so a repeated target gets an
    ordinal (``local[0]``, ``local[1]``): two CPU devices are then ``@__device_0`` and
    ``@__device_1``. (Named devices such as ``__device_1=local`` are merged too; a
    ``#hal.device.promise<@__device_1>`` then points at a device that does not exist, which
    crashes iree-compile 3.13.)
    """
    counts: dict[str, int] = {}
    for d in hal_devices:
        counts[d] = counts.get(d, 0) + 1
    seen: dict[str, int] = {}
    flags = []
    for d in hal_devices:
        if counts[d] > 1:
            k = seen.get(d, 0)
            seen[d] = k + 1
            flags.append(f"--iree-hal-target-device={d}[{k}]")
        else:
            flags.append(f"--iree-hal-target-device={d}")
    return flags


def _flag_key(flag: str) -> str:
    """``--iree-foo=bar`` -> ``--iree-foo``; a bare ``--iree-foo`` is its own key."""
    return flag.split("=", 1)[0]


def merge_flags(defaults: Iterable[str], overrides: Iterable[str] = ()) -> list[str]:
    """Merges override flags into defaults: a flag in ``overrides`` replaces the default of the
    same name (``--name=value`` or bare ``--name``); other overrides are appended in order.

    Args:
        defaults: the default flags.
        overrides: the user's flags, which win.

    Returns:
        One flag list with each flag name at most once (except repeated overrides, kept as given).
    """
    overrides = list(overrides)
    override_keys = {_flag_key(f) for f in overrides}
    return [f for f in defaults if _flag_key(f) not in override_keys] + overrides


# What each llvm-cpu default bought is measured in docs/performance.md (benchmarks/models_bench.py).
# Tune code generation for the CPU that compiles (AVX-512 here): 3-7x over a generic x86-64 build.
_CPU_HOST_FLAGS: tuple[str, ...] = ("--iree-llvmcpu-target-cpu=host",)
# Generic (portable) build: runs on any CPU of the architecture.
_CPU_GENERIC_FLAGS: tuple[str, ...] = ("--iree-llvmcpu-target-cpu=generic",)
# Data tiling + ukernels: matmuls become mmt4d ukernels on packed operands (weights packed once
# at compile time); about 2x on the matmuls of the GPT shape.
_CPU_FAST_MATMUL_FLAGS: tuple[str, ...] = (
    "--iree-opt-data-tiling=true",
    "--iree-llvmcpu-enable-ukernels=all",
)
# Convolutions: PyTorch hands IREE NCHW convolutions; converting them to channels-last (NHWC)
# before global optimization and data-tiling them like matmuls took the ResNet-18 shape from
# 3.5x eager to 0.9x (single thread, CPU time). Without the layout change im2col reached 1.6x.
_CHANNELS_LAST_PIPELINE = (
    "builtin.module(util.func(iree-preprocessing-convert-conv-to-channels-last))"
)
_CHANNELS_LAST_FLAG = f"--iree-preprocessing-pass-pipeline={_CHANNELS_LAST_PIPELINE}"
# CUDA gets the same layout change. On an H200 (IREE 3.13, sm_80 code) NCHW fp16 convolutions
# compute WRONG results (ResNet-18 shape: max abs error 0.25 on outputs <= 0.54, against 1.9e-4
# for eager fp16; the same with igemm off or the tile-and-fuse conv pipeline), NHWC ones are
# right (6.3e-4) and faster: ResNet fp16 1.95 -> 0.97 ms (0.28x eager), fp32 3.22 -> 2.02 ms.
# A list option: naming any value replaces IREE's default {matmul, scaled_matmul}, so all three
# are repeated (naming only `convolution` silently turns data tiling off for matmuls).
_CPU_CONV_DATA_TILING_FLAGS: tuple[str, ...] = tuple(
    f"--iree-dispatch-creation-experimental-set-data-tiling-ops={ops}"
    for ops in ("matmul", "scaled_matmul", "convolution")
)
# Stems (1-4 input channels) and 1x1 convolutions are slow as data-tiled convolutions in IREE
# 3.13; the compile copy for llvm-cpu has them as matmuls instead (_compiler.convs), so the
# flags need no per-program exception (ResNet-50, 1 thread: 117 -> 91.5 ms, eager 99).
# Programs whose matmuls all have few rows (M <= NARROW_MATMUL_ROWS: an MLP at batch 8, a decode
# step) and no convolution: IREE 3.13's data-tiled mmt4d path is slower there than its plain
# matmul code generation (MLP 3x1024 at batch 8, 1 thread: 1.55 -> 1.02 ms; batch 16 2.03 ->
# 1.74; at batch 32 they are even and at 64 data tiling wins, 4.31 vs 5.05 ms), so data tiling
# is left off for them (ukernels stay on: they cost nothing without packed operands).
NARROW_MATMUL_ROWS = 16
# Programs with dynamic dimensions: vector dimensions of unknown size are peeled (a vector main
# loop + a remainder) instead of masked. A dynamic attention's softmax is vectorized better:
# GPT shape, dynamic sequence 1.03x -> 0.98x eager (softmax dispatches 8.6 -> 5.4 ms per call);
# on static shapes the same flag cost 4 % (GPT 0.96x -> 1.00x), so it is for dynamic programs only.
_CPU_DYNAMIC_SHAPE_FLAGS: tuple[str, ...] = ("--iree-llvmcpu-vector-pproc-strategy=peel",)
# CUDA, static fp32 programs: IREE 3.13's fp32 matmul kernels walk K serially with too few
# workgroups at small M (on an H200 three K = 512 matmuls took 277 us whatever N was, K = 2048
# 1085 us). Splitting the reduction 32 ways: GPT shape batch 1 12.8 -> 2.3 ms (3.9x -> 0.77x
# eager), batch 8 25.7 -> 13.5 ms, MLP batch 8 0.43 -> 0.09 ms; MLP batch 4096 13.5 -> 14.3 ms
# (-5 %). Not for fp16/bf16 (halves throughput at large M: MLP batch 4096 fp16 0.56 -> 1.78 ms)
# nor for dynamic programs (IREE 3.13 fails: "'tensor.empty' op incorrect number of dynamic
# sizes"); like every speed-only default (SPEED_ONLY_GROUPS), it is dropped if the compile fails.
CUDA_FP32_SPLIT_K_FLAG = "--iree-dispatch-creation-split-matmul-reduction=32"
_OPT_LEVELS = ("O0", "O1", "O2", "O3")
# --iree-opt-level=O3 fuses more (layer norms into their neighbours): 18 % faster on the static
# GPT shape before turbine's SDPA/linear decompositions, no gain after them (0.864x vs 0.857x
# eager); its dispatches exceed IREE's 32 KiB stack limit (64 KiB static, 128 KiB with a dynamic
# sequence, which is the whole default worker stack). So O3 is opt-in, and when asked for, it
# comes with a 64 KiB stack limit (the static shapes then compile).
_O3_CPU_FLAGS: tuple[str, ...] = ("--iree-llvmcpu-stack-allocation-limit=65536",)


# CUDA targets iree-base-compiler 3.13 compiles our models for. It rejects `sm_90`, `sm_90a` and
# `sm_100` ("missing GPU target in #hal.executable.target"); those GPUs run `sm_80` code (PTX,
# compiled by the driver), so newer or unknown GPUs get `sm_80`.
_IREE_CUDA_TARGETS = ("sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_89", "sm_120")


def _cuda_arch() -> str:
    """The CUDA target for device 0 (``sm_XY``) if IREE accepts it; ``sm_80`` otherwise."""
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            arch = f"sm_{major}{minor}"
            return arch if arch in _IREE_CUDA_TARGETS else "sm_80"
    except Exception:  # torch absent or CUDA init failure: fall back to a common target
        pass
    return "sm_80"


def default_compile_flags(
    target: str = "llvm-cpu",
    *,
    host: bool = True,
    fast_matmul: bool | None = None,
    channels_last_conv: bool = True,
    opt_level: str | None = None,
    dynamic_shapes: bool = False,
    fp32_only: bool = False,
    narrow_matmuls: bool = False,
    overrides: Sequence[str] = (),
    use_env: bool = True,
) -> list[str]:
    """turbine's default ``iree-compile`` flags for a target.

    These select the target device and the optimisation flags turbine measured to be best on the
    target (see ``docs/performance.md``). ``--iree-input-type`` is not included: callers pass it
    (``torch`` for torch-dialect input).

    For ``llvm-cpu`` the defaults are: tune for the host CPU, data tiling with ukernels for
    matmuls and convolutions, and convolutions converted to channels-last. For ``cuda``: the
    visible GPU's ``sm_XY`` (``sm_80`` where IREE 3.13 has no target for it), channels-last
    convolutions (NCHW fp16 convolutions are miscompiled by IREE 3.13's CUDA backend) and, for
    static fp32 programs (``fp32_only`` without ``dynamic_shapes``), split matmul reductions.

    Args:
        target: target or driver name, see :func:`resolve_target`.
        host: for CPU targets, tune for the CPU that compiles (``--iree-llvmcpu-target-cpu=host``).
            ``False`` gives a portable build (``generic`` CPU) that runs on any CPU of the same
            architecture.
        fast_matmul: for CPU targets, data tiling and ukernels (mmt4d) for matmuls (and, with
            ``channels_last_conv``, convolutions). ``None`` (default): on for ``host=True``, off
            for the portable build, where IREE 3.13 fails to compile a GPT-shaped attention with
            them ("operations with large vector sizes").
        channels_last_conv: for CPU and CUDA targets, convert NCHW convolutions to NHWC before
            global optimization (on CPU, data-tile them too when ``fast_matmul``).
        opt_level: ``"O0"``..``"O3"`` for ``--iree-opt-level``; ``None`` keeps IREE's default.
        dynamic_shapes: the program has dynamic dimensions (:func:`has_dynamic_shapes`); for
            CPU targets this peels vector loops of unknown trip count instead of masking them
            (measured faster on dynamic programs only). ``ExportOutput.compile`` sets it from
            the module.
        fp32_only: the program's floating-point tensors are all fp32 (:func:`float_types`);
            for CUDA, with static shapes, matmul reductions are split (fp32 matmuls at small
            batch were 4-5x faster). ``ExportOutput.compile`` sets it from the module.
        narrow_matmuls: every matmul has at most :data:`NARROW_MATMUL_ROWS` rows and there is
            no convolution (:func:`narrow_matmuls`); on CPUs data tiling is left off.
        overrides: flags that replace defaults of the same name or are appended
            (:func:`merge_flags`).
        use_env: also apply flags from ``$TURBINE_COMPILE_FLAGS`` (after the defaults, before
            ``overrides``).

    Returns:
        The flag list.

    Raises:
        TargetError: unknown target or invalid ``opt_level``.

    Example:
        >>> default_compile_flags("llvm-cpu", host=False)[:3]  # doctest: +NORMALIZE_WHITESPACE
        ['--iree-hal-target-device=local', '--iree-hal-local-target-device-backends=llvm-cpu',
         '--iree-llvmcpu-target-cpu=generic']
    """
    t = resolve_target(target)
    if opt_level is not None and opt_level not in _OPT_LEVELS:
        raise TargetError(
            f"opt_level must be one of {', '.join(_OPT_LEVELS)} (or None); got {opt_level!r}"
        )
    flags = list(t.device_flags)
    cpu = t.local_backend == "llvm-cpu"
    if fast_matmul is None:
        fast_matmul = host
    if cpu:
        flags += _CPU_HOST_FLAGS if host else _CPU_GENERIC_FLAGS
        # Narrow programs (no convolution, few rows per matmul) keep ukernels, not data tiling.
        data_tiling = fast_matmul and not narrow_matmuls
        if data_tiling:
            flags += _CPU_FAST_MATMUL_FLAGS
        elif fast_matmul:
            flags += [f for f in _CPU_FAST_MATMUL_FLAGS if "ukernels" in f]
        if channels_last_conv:
            flags.append(_CHANNELS_LAST_FLAG)
            if data_tiling:
                flags += _CPU_CONV_DATA_TILING_FLAGS
        if dynamic_shapes:
            flags += _CPU_DYNAMIC_SHAPE_FLAGS
    elif t.name == "cuda":
        flags.append(f"--iree-cuda-target={_cuda_arch() if host else 'sm_80'}")
        if channels_last_conv:
            flags.append(_CHANNELS_LAST_FLAG)
        if fp32_only and not dynamic_shapes:
            flags.append(CUDA_FP32_SPLIT_K_FLAG)
    elif t.name == "rocm":
        flags.append("--iree-hip-target=gfx942")
    if opt_level is not None:
        flags.append(f"--iree-opt-level={opt_level}")
        if cpu and opt_level == "O3":
            flags += _O3_CPU_FLAGS
    env_flags = os.environ.get(COMPILE_FLAGS_ENV, "").split() if use_env else []
    return merge_flags(merge_flags(flags, env_flags), overrides)


def _top_level_ops(module: object) -> list:
    """The operations in a module's body (``ExportOutput``, ``ir.Module`` or its operation);
    empty when ``module`` is not a module."""
    op = getattr(module, "mlir_module", module)
    op = getattr(op, "operation", op)
    try:
        return [getattr(o, "operation", o) for o in op.regions[0].blocks[0].operations]
    except Exception:
        return []


def public_functions(module: object, kinds: Sequence[str] = ("func.func", "util.func")) -> list:
    """The public function operations at the top level of an MLIR module.

    Args:
        module: an ``ir.Module``, its operation, or an object with ``mlir_module``
            (``ExportOutput``).
        kinds: operation names that count as functions.

    Returns:
        The operations (empty when ``module`` is not a module).
    """
    out = []
    for f in _top_level_ops(module):
        if f.name not in kinds:
            continue
        attrs = f.attributes
        if "sym_visibility" in attrs and str(attrs["sym_visibility"]).strip('"') != "public":
            continue
        out.append(f)
    return out


def has_dynamic_shapes(module: object) -> bool:
    """Whether a module's public functions take or return tensors with dynamic dimensions.

    Args:
        module: an MLIR module (``ExportOutput``, its ``mlir_module``, an ``ir.Module`` or its
            operation). Only the function signatures are read: the weights in the body are
            never printed.

    Returns:
        ``True`` when a public ``func.func`` / ``util.func`` has a ``?`` dimension in an argument
        or result type (``!torch.vtensor<[1,?],si64>``, ``tensor<?x512xf32>``).
    """
    return any(
        "function_type" in f.attributes and "?" in str(f.attributes["function_type"])
        for f in public_functions(module)
    )


def _signature_and_global_types(module: object) -> list[str]:
    """The type strings of the public function signatures and top-level globals."""
    types = [str(f.attributes["function_type"]) for f in public_functions(module)]
    types += [
        str(g.attributes["type"])
        for g in _top_level_ops(module)
        if g.name in ("util.global", "ml_program.global") and "type" in g.attributes
    ]
    return types


# An element type on its own (`,f32>`, `(f32)`) or after a shape (`4x64xf16`).
_FLOAT_TYPE = re.compile(r"(?:(?<=x)|(?<![A-Za-z0-9_]))(bf16|f16|f32|f64|f8E\w+)(?![A-Za-z0-9_])")


def float_types(module: object) -> set[str]:
    """The floating-point element types (``"f32"``, ``"f16"``, ``"bf16"``, ...) of a module's
    public function signatures and top-level globals (its inputs, outputs and weights)."""
    found: set[str] = set()
    for t in _signature_and_global_types(module):
        found.update(m.group(1) for m in _FLOAT_TYPE.finditer(t))
    return found


_CONV_OPS = frozenset({"torch.aten.convolution", "torch.aten.conv2d"})
_VTENSOR_SIZES = re.compile(r"^!torch\.vtensor<\[([^\]]*)\]")


# Matmul-like torch ops and the operand whose rows are the matmul's M (addmm/baddbmm: the
# second; scaled_dot_product_attention: the query, whose rows are its sequence length).
_MATMUL_LHS = {
    "torch.aten.mm": 0,
    "torch.aten.bmm": 0,
    "torch.aten.matmul": 0,
    "torch.aten.linear": 0,
    "torch.aten.addmm": 1,
    "torch.aten.baddbmm": 1,
    "torch.aten.scaled_dot_product_attention": 0,
}


def _matmul_rows(op: object) -> int | None:
    """The number of rows (M) of a matmul-like op's product; ``None`` when dynamic or unknown.
    For ``linear`` every leading dimension counts (it is flattened to a 2-D matmul)."""
    index = _MATMUL_LHS[op.name]  # type: ignore[attr-defined]
    operands = op.operands  # type: ignore[attr-defined]
    if len(operands) <= index:
        return None
    m = _VTENSOR_SIZES.match(str(operands[index].type))
    if m is None:
        return None
    dims = [d.strip() for d in m.group(1).split(",") if d.strip()]
    if any(not d.lstrip("-").isdigit() or int(d) < 0 for d in dims):
        return None
    sizes = [int(d) for d in dims]
    if not sizes:
        return None
    if len(sizes) == 1:
        return 1  # a vector times a matrix
    if op.name == "torch.aten.linear":  # type: ignore[attr-defined]
        rows = 1
        for d in sizes[:-1]:
            rows *= d
        return rows
    return sizes[-2]


def narrow_matmuls(module: object) -> bool:
    """Whether every matmul of a module has at most :data:`NARROW_MATMUL_ROWS` static rows, there
    is at least one, and there is no convolution (torch dialect; read from operand types)."""
    op = getattr(module, "mlir_module", module)
    op = getattr(op, "operation", op)
    try:
        ops = list(walk(op))
    except Exception:  # not a module
        return False
    found = False
    for o in ops:
        if o.name in _CONV_OPS:
            return False
        if o.name in _MATMUL_LHS:
            rows = _matmul_rows(o)
            if rows is None or rows > NARROW_MATMUL_ROWS:
                return False
            found = True
    return found


def program_traits(module: object) -> dict[str, bool]:
    """What turbine's defaults depend on in a program, as ``default_compile_flags`` keywords:
    ``dynamic_shapes`` (:func:`has_dynamic_shapes`), ``fp32_only`` (every floating-point
    type in :func:`float_types` is ``f32``, and there is one) and ``narrow_matmuls``
    (:func:`narrow_matmuls`)."""
    floats = float_types(module)
    return {
        "dynamic_shapes": has_dynamic_shapes(module),
        "fp32_only": floats == {"f32"},
        "narrow_matmuls": narrow_matmuls(module),
    }


# An 8- or 4-bit integer element type, signless (globals: `xi8>`) or signed (`,si8>`, `ui8`).
_NARROW_INT_TYPE = re.compile(r"(?:(?<=x)|(?<![A-Za-z0-9_]))([su]?i(?:8|4))(?![A-Za-z0-9_])")


def narrow_int_types(module: object) -> set[str]:
    """The 8- and 4-bit integer element types (``"i8"``, ``"si8"``, ``"i4"``, ...) a module
    reads: of its public functions' arguments and its top-level globals (quantized weights are
    ``i8`` / ``i4`` globals). Results do not count."""
    types = []
    for f in public_functions(module):
        ftype = f.attributes["function_type"]
        inputs = getattr(getattr(ftype, "value", ftype), "inputs", None)
        if inputs is None:  # not a FunctionType attribute: the whole signature
            types.append(str(ftype))
        else:
            types += [str(t) for t in inputs]
    types += [
        str(g.attributes["type"])
        for g in _top_level_ops(module)
        if g.name in ("util.global", "ml_program.global") and "type" in g.attributes
    ]
    found: set[str] = set()
    for t in types:
        found.update(m.group(1) for m in _NARROW_INT_TYPE.finditer(t))
    return found


def uses_float16(module: object) -> bool:
    """Whether a module's public function signatures or top-level globals hold fp16 tensors
    (``f16``; ``bf16`` does not count)."""
    return "f16" in float_types(module)


def check_program_for_target(module: object, flags: Sequence[str]) -> None:
    """Refuses combinations IREE 3.13 compiles into wrong code, before compiling.

    fp16 or 8/4-bit integer tensors on Vulkan without a ``--iree-vulkan-target``, and 4-bit
    integer globals on vmvx. IREE's default (baseline) SPIR-V target has no 16-bit float
    arithmetic and only 32-bit storage: fp16 programs built for it compute NaN or garbage
    (``x * 2 + 1`` gave NaN on Mesa lavapipe; a 3x3 convolution was off by 5e2) or fail to
    compile (``vector.bitcast``), and so do int8/int4 ones (``x * w.float()`` with an int8
    ``w`` off by 6e2, int4 weight-only linear layers off by 85); with a named target (``rdna3``,
    ``valhall4``, ``ampere``) the same programs are right on lavapipe too. vmvx fails to compile
    ``i4`` tensors ("failed to emulate bit width").

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


@dataclass(frozen=True)
class SpeedOnlyGroup:
    """Default flags that only make a module faster: dropped when a compile with them fails.

    Attributes:
        name: what the group does, for the warning (``"data tiling + ukernels"``).
        flags: the flags, exactly as :func:`default_compile_flags` writes them.
        targets: the target names for which the group is speed only (on another target the same
            flags may be needed for correct results: channels-last convolutions on CUDA).
    """

    name: str
    flags: tuple[str, ...]
    targets: tuple[str, ...]


#: turbine's speed-only defaults, by group. When a compile with turbine's defaults fails, it is
#: compiled again without every group it holds (unless the user named the flags): a default that
#: is only a speed-up must never turn a working compile into a failure. Target selection
#: (device, ``--iree-llvmcpu-target-cpu``, ``--iree-cuda-target``) is not speed only and stays.
SPEED_ONLY_GROUPS: tuple[SpeedOnlyGroup, ...] = (
    SpeedOnlyGroup(
        "data tiling + ukernels",
        _CPU_FAST_MATMUL_FLAGS + _CPU_CONV_DATA_TILING_FLAGS,
        ("llvm-cpu",),
    ),
    SpeedOnlyGroup("channels-last convolutions", (_CHANNELS_LAST_FLAG,), ("llvm-cpu",)),
    SpeedOnlyGroup("peeled dynamic vector loops", _CPU_DYNAMIC_SHAPE_FLAGS, ("llvm-cpu",)),
    SpeedOnlyGroup("split-K fp32 matmuls", (CUDA_FP32_SPLIT_K_FLAG,), ("cuda",)),
)


def flag_targets(flags: Sequence[str]) -> set[str]:
    """turbine target names that a flag list compiles for (from the device/backend flags)."""
    found: set[str] = set()
    for f in flags:
        key, _, value = f.partition("=")
        if key in (
            "--iree-hal-target-device",
            "--iree-hal-local-target-device-backends",
            "--iree-hal-target-backends",
        ):
            for v in value.split(","):
                v = re.sub(r"\[\d+\]$", "", v.strip())
                if v == "local":
                    continue
                try:
                    found.add(resolve_target(v).name)
                except TargetError:
                    found.add(v)
    return found


def fallback_flags(
    flags: Sequence[str], user_flags: Sequence[str] = ()
) -> tuple[list[str], list[SpeedOnlyGroup]] | None:
    """The flags to compile with again after ``flags`` failed, and the groups dropped.

    Every :data:`SPEED_ONLY_GROUPS` group that is speed only for a target the flags compile for
    is removed, except flags the user named (``user_flags``, by flag name).

    Returns:
        ``(flags, dropped groups)``, or ``None`` when nothing can be dropped (the failure is not
        a speed-only default's).
    """
    targets = flag_targets(flags)
    user_keys = {_flag_key(f) for f in user_flags}
    dropped: list[SpeedOnlyGroup] = []
    drop: set[str] = set()
    for group in SPEED_ONLY_GROUPS:
        if not targets.intersection(group.targets):
            continue
        present = [f for f in group.flags if f in flags and _flag_key(f) not in user_keys]
        if present:
            dropped.append(group)
            drop.update(present)
    if not dropped:
        return None
    return [f for f in flags if f not in drop], dropped


def retry_flags(flags: Sequence[str], user_flags: Sequence[str]) -> list[str] | None:
    """The flags to compile with again after ``flags`` failed, or ``None``
    (:func:`fallback_flags` without the dropped groups)."""
    fb = fallback_flags(flags, user_flags)
    return None if fb is None else fb[0]


def compile_with_fallback(
    compile_fn: Callable[[list[str]], T],
    flags: Sequence[str],
    user_flags: Sequence[str] = (),
    *,
    errors: tuple[type[BaseException], ...] = (Exception,),
    logger: logging.Logger | None = None,
) -> tuple[T, list[str]]:
    """Calls ``compile_fn(flags)``; if it fails, once more without the speed-only defaults.

    The rule for every compile path (``ExportOutput.compile``, ``turbine-aot compile``/``bundle``,
    the compile cache): a speed-only default (:data:`SPEED_ONLY_GROUPS`) must never turn a
    working compile into a failure. The retry logs a warning naming the groups and flags dropped.
    When the retry fails too, the first error is raised (it is the one for the flags asked for).

    Args:
        compile_fn: compiles with the given flags; raises one of ``errors`` on failure.
        flags: turbine's defaults merged with the user's flags.
        user_flags: the flags the user named (never dropped).
        errors: the exceptions that mean "the compiler failed".
        logger: where the warning goes (``turbine.aot`` by default).

    Returns:
        ``(result, the flags it was compiled with)``.
    """
    flags = list(flags)
    try:
        return compile_fn(flags), flags
    except errors as first:
        fb = fallback_flags(flags, user_flags)
        if fb is None:
            raise
        retry, dropped = fb
        (logger or logging.getLogger("turbine.aot")).warning(
            "compiling with turbine's default flags failed (%s); compiling again without the "
            "speed-only defaults %s (%s). The module works but may be slower; pass those flags "
            "yourself to see the failure.",
            _first_line(first),
            ", ".join(g.name for g in dropped),
            " ".join(f for f in flags if f not in retry),
        )
        try:
            return compile_fn(retry), retry
        except errors:
            raise first from None


def _first_line(error: BaseException) -> str:
    text = str(error)
    for line in text.splitlines():
        if "error:" in line:
            return line.strip()[:300]
    return (text.splitlines() or [type(error).__name__])[0][:300]


def default_runtime_flags(target: str = "llvm-cpu", *, workers: int | None = None) -> list[str]:
    """Runtime flags (for ``iree.runtime.flags.parse_flags``) turbine uses for a target.

    Args:
        target: target or driver name.
        workers: for the ``local-task`` driver, the number of worker threads; ``None`` keeps
            IREE's default (one per physical core).

    Returns:
        The flag list (may be empty).
    """
    t = resolve_target(target)
    flags: list[str] = []
    if t.driver == "local-task" and workers is not None:
        if workers < 1:
            raise TargetError(f"workers must be >= 1; got {workers}")
        flags.append(f"--task_topology_max_group_count={workers}")
    return flags


def as_list(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def compile_flags_for(
    *,
    target_backends: str | Sequence[str] | None = ("llvm-cpu",),
    target_device: str | Sequence[str] | None = None,
    host_cpu: bool = True,
    extra_args: Sequence[str] = (),
    dynamic_shapes: bool = False,
    fp32_only: bool = False,
    narrow_matmuls: bool = False,
) -> list[str]:
    """The IREE flags :meth:`ExportOutput.compile` uses for a target selection.

    ``target_device`` (one name or several, for multi-device programs) wins over
    ``target_backends``. Each known target (``llvm-cpu``, ``vmvx``, ``vulkan-spirv``, ``cuda``,
    ``rocm``, ...) gets turbine's default flags from ``turbine_aot._compiler.targets`` (for ``llvm-cpu``:
    tuned for the host CPU unless ``host_cpu=False``); an unknown backend name is passed on as
    ``--iree-hal-target-backends``. ``extra_args`` come last and replace defaults of the same flag.
    ``dynamic_shapes`` (the program has dynamic dimensions), ``fp32_only`` (its floating-point
    tensors are all fp32) and ``narrow_matmuls`` (every matmul has few rows, no convolution)
    select the defaults measured for such programs (see
    ``default_compile_flags``; ``targets.program_traits`` reads both from a module).
    """
    devices = as_list(target_device)
    backends = as_list(target_backends) if not devices else []
    flags: list[str] = []
    if devices:
        targets = [resolve_target(d) for d in devices]
        if len(targets) == 1:
            flags = default_compile_flags(
                targets[0].name,
                host=host_cpu,
                dynamic_shapes=dynamic_shapes,
                fp32_only=fp32_only,
                narrow_matmuls=narrow_matmuls,
                use_env=False,
            )
        else:
            # Several devices: one --iree-hal-target-device per device (IREE names them
            # __device_0, __device_1, ... in order), one set of backend/optimization flags.
            flags = target_device_flags([t.hal_device for t in targets])
            backends_local = sorted({t.local_backend for t in targets if t.local_backend})
            if backends_local:
                flags.append("--iree-hal-local-target-device-backends=" + ",".join(backends_local))
            for t in dict.fromkeys(t.name for t in targets):
                flags = merge_flags(
                    flags,
                    [
                        f
                        for f in default_compile_flags(
                            t,
                            host=host_cpu,
                            dynamic_shapes=dynamic_shapes,
                            fp32_only=fp32_only,
                            narrow_matmuls=narrow_matmuls,
                            use_env=False,
                        )
                        if not f.startswith(
                            (
                                "--iree-hal-target-device=",
                                "--iree-hal-local-target-device-backends=",
                            )
                        )
                    ],
                )
    elif backends:
        known = [b for b in backends if b in TARGETS or b in ("cpu", "host")]
        unknown = [b for b in backends if b not in known]
        if len(known) == 1 and not unknown:
            flags = default_compile_flags(
                known[0],
                host=host_cpu,
                dynamic_shapes=dynamic_shapes,
                fp32_only=fp32_only,
                narrow_matmuls=narrow_matmuls,
                use_env=False,
            )
        else:
            flags = [f"--iree-hal-target-backends={','.join(backends)}"]
            if "llvm-cpu" in backends:
                flags.append(
                    "--iree-llvmcpu-target-cpu=host"
                    if host_cpu
                    else "--iree-llvmcpu-target-cpu=generic"
                )
    env_flags = os.environ.get("TURBINE_COMPILE_FLAGS", "").split()
    return merge_flags(merge_flags(flags, env_flags), list(extra_args))


def device_compile_flags(
    devices: Sequence[str],
    extra: Sequence[str] | None = None,
    *,
    dynamic_shapes: bool = False,
    fp32_only: bool = False,
    narrow_matmuls: bool = False,
) -> list[str]:
    """turbine's default compile flags for one device URI or several (``__device_N`` order).

    One device: ``targets.default_compile_flags`` for its driver (``dynamic_shapes``,
    ``fp32_only``: what ``targets.program_traits`` says of the program). Several: the same, with one
    ``--iree-hal-target-device`` per device (``targets.target_device_flags``), which IREE names
    ``__device_0``, ``__device_1``, ... — the names the exporter's
    ``#hal.device.promise<@__device_N>`` affinities refer to.
    """
    drivers = [d.split("://", 1)[0].split(":", 1)[0] for d in devices]
    base = default_compile_flags(
        drivers[0],
        dynamic_shapes=dynamic_shapes,
        fp32_only=fp32_only,
        narrow_matmuls=narrow_matmuls,
    )
    if len(drivers) > 1:
        targets = [resolve_target(d) for d in drivers]
        backends = sorted({t.local_backend for t in targets if t.local_backend})
        base = [f for f in base if not f.startswith("--iree-hal-target-device=")]
        dev_flags = target_device_flags([t.hal_device for t in targets])
        if backends:
            base = [f for f in base if not f.startswith("--iree-hal-local-target-device-backends")]
            dev_flags.append(f"--iree-hal-local-target-device-backends={','.join(backends)}")
        base = dev_flags + base
    return merge_flags(base, extra or ())
