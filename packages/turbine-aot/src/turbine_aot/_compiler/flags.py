"""The compile-flag policy of the compiler layer: turbine's IREE compile flags for every target
and program trait, and the runtime flags.

One place decides what a user gets when they name no flags: ``ExportOutput.compile``
(:func:`compile_flags_for`), the runner, bundles and the CLI (:func:`device_compile_flags`) all
build on :func:`default_compile_flags` (with :func:`.targets.resolve_target` to map a target or
driver name to the pair IREE needs, and the :class:`.traits.ProgramTraits` a program has). The
defaults are chosen for speed on the machine that compiles (``host=True``); a portable build is
one flag away (``host=False``), and every default can be overridden by passing the same
``--flag=value`` in ``overrides`` / ``extra_args`` (the later value replaces the default, see
:func:`merge_flags`). :data:`SPEED_ONLY_GROUPS` names the defaults that only buy speed (what
:mod:`.fallback` drops when a compile with them fails).

What each default buys is measured by ``benchmarks/models_bench.py`` and recorded in
``docs/performance.md``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .host import cpu_flags
from .isa import AVX512_FEATURES
from .targets import TARGETS, TargetError, resolve_target, target_device_flags
from .traits import NO_TRAITS, ProgramTraits

__all__ = [
    "COMPILE_FLAGS_ENV",
    "CPU_PEEL_ENV",
    "CUDA_FP32_SPLIT_K_FLAG",
    "DATA_TILING_GROUP",
    "KEEP_FLOAT64_FLAG",
    "SPEED_ONLY_GROUPS",
    "SpeedOnlyGroup",
    "as_list",
    "compile_flags_for",
    "default_compile_flags",
    "default_runtime_flags",
    "device_compile_flags",
    "driver_of",
    "flag_key",
    "merge_flags",
    "peel_static_programs",
]

#: overriding them), e.g. ``TURBINE_COMPILE_FLAGS="--iree-opt-data-tiling=false"``.
COMPILE_FLAGS_ENV = "TURBINE_COMPILE_FLAGS"


def flag_key(flag: str) -> str:
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
    override_keys = {flag_key(f) for f in overrides}
    return [f for f in defaults if flag_key(f) not in override_keys] + overrides


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
# Programs with dynamic dimensions: vector dimensions of unknown size are peeled (a vector main
# loop + a remainder) instead of masked. A dynamic attention's softmax is vectorized better:
# GPT shape, dynamic sequence 1.03x -> 0.98x eager (softmax dispatches 8.6 -> 5.4 ms per call);
# on static shapes the same flag cost 4 % on an AVX-512 CPU (GPT 0.96x -> 1.00x), so there it
# is for dynamic programs only. On CPUs without AVX-512 masked vector tails are vmaskmovps (no
# mask registers; on AMD Zen 3 a masked store is microcoded), and peeling static programs too
# won: Whisper's encoder 0.88x, wav2vec2 0.89x, ViT 0.94x the time, the rest of the zoo
# 0.95-1.04x (docs/performance.md, section 19); :func:`peel_static_programs`.
_CPU_PEEL_FLAGS: tuple[str, ...] = ("--iree-llvmcpu-vector-pproc-strategy=peel",)
#: Environment variable: ``dynamic`` peels vector loops of programs with dynamic dimensions only,
#: on every CPU (the rule of AVX-512 CPUs; for A/B measurements).
CPU_PEEL_ENV = "TURBINE_CPU_PEEL"
# CUDA, static fp32 programs: IREE 3.13's fp32 matmul kernels walk K serially with too few
# workgroups at small M (on an H200 three K = 512 matmuls took 277 us whatever N was, K = 2048
# 1085 us). Splitting the reduction 32 ways: GPT shape batch 1 12.8 -> 2.3 ms (3.9x -> 0.77x
# eager), batch 8 25.7 -> 13.5 ms, MLP batch 8 0.43 -> 0.09 ms; MLP batch 4096 13.5 -> 14.3 ms
# (-5 %). Not for fp16/bf16 (halves throughput at large M: MLP batch 4096 fp16 0.56 -> 1.78 ms)
# nor for dynamic programs (IREE 3.13 fails: "'tensor.empty' op incorrect number of dynamic
# sizes"); like every speed-only default (SPEED_ONLY_GROUPS), it is dropped if the compile fails.
CUDA_FP32_SPLIT_K_FLAG = "--iree-dispatch-creation-split-matmul-reduction=32"
#: IREE demotes float64 to float32 unless told not to; llvm-cpu computes float64 natively.
KEEP_FLOAT64_FLAG = "--iree-input-demote-f64-to-f32=false"
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


def peel_static_programs() -> bool:
    """Whether llvm-cpu host builds peel the vector loops of static programs too: on a CPU
    without AVX-512 (its masked tails are ``vmaskmovps``, slow; docs/performance.md, section
    19), unless ``TURBINE_CPU_PEEL=dynamic``."""
    if os.environ.get(CPU_PEEL_ENV, "").strip().lower() == "dynamic":
        return False
    return not set(AVX512_FEATURES) <= cpu_flags()


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
    float64: bool = False,
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
            (on AVX-512 CPUs measured faster on dynamic programs only; host builds on CPUs
            without AVX-512 peel every program: :func:`peel_static_programs`).
            ``ExportOutput.compile`` sets it from the module.
        fp32_only: the program's floating-point tensors are all fp32 (:func:`float_types`);
            for CUDA, with static shapes, matmul reductions are split (fp32 matmuls at small
            batch were 4-5x faster). ``ExportOutput.compile`` sets it from the module.
        narrow_matmuls: every matmul has at most :data:`NARROW_MATMUL_ROWS` rows and there is
            no convolution (:func:`narrow_matmuls`); on CPUs data tiling is left off.
        float64: the program has float64 tensors (:func:`uses_float64`); on llvm-cpu they
            stay float64 (:data:`KEEP_FLOAT64_FLAG`): IREE demotes them to float32 by default,
            which computes a float64 program in float32 and makes a float64 result fail at the
            call ("buffer view byte length 256 exceeds backing buffer byte length 128"). Other
            targets keep IREE's demotion (vmvx cannot compile float64 -> float32 casts:
            "failed to legalize operation 'arith.truncf'"); a float64 input, result or weight
            is refused there (:mod:`.refusals`).
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
        if dynamic_shapes or (host and peel_static_programs()):
            flags += _CPU_PEEL_FLAGS
    if float64 and cpu:
        flags.append(KEEP_FLOAT64_FLAG)
    if t.name == "cuda":
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
#: IREE's data tiling and ukernels, the group a failed compile drops first (:mod:`.fallback`).
DATA_TILING_GROUP = SpeedOnlyGroup(
    "data tiling + ukernels",
    _CPU_FAST_MATMUL_FLAGS + _CPU_CONV_DATA_TILING_FLAGS,
    ("llvm-cpu",),
)
SPEED_ONLY_GROUPS: tuple[SpeedOnlyGroup, ...] = (
    DATA_TILING_GROUP,
    SpeedOnlyGroup("channels-last convolutions", (_CHANNELS_LAST_FLAG,), ("llvm-cpu",)),
    SpeedOnlyGroup("peeled vector loops", _CPU_PEEL_FLAGS, ("llvm-cpu",)),
    SpeedOnlyGroup("split-K fp32 matmuls", (CUDA_FP32_SPLIT_K_FLAG,), ("cuda",)),
)


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


def _target_defaults(target: str, traits: ProgramTraits, *, host: bool) -> list[str]:
    """:func:`default_compile_flags` of one target for a program's traits (the environment's
    flags are merged by the caller, once)."""
    return default_compile_flags(
        target,
        host=host,
        dynamic_shapes=traits.dynamic_shapes,
        fp32_only=traits.fp32_only,
        narrow_matmuls=traits.narrow_matmuls,
        float64=traits.float64,
        use_env=False,
    )


#: The flags that select devices: one set for a multi-device compile, not one per target.
_DEVICE_SELECTION = ("--iree-hal-target-device=", "--iree-hal-local-target-device-backends=")


def compile_flags_for(
    *,
    target_backends: str | Sequence[str] | None = ("llvm-cpu",),
    target_device: str | Sequence[str] | None = None,
    host_cpu: bool = True,
    extra_args: Sequence[str] = (),
    traits: ProgramTraits = NO_TRAITS,
) -> list[str]:
    """The IREE flags :meth:`ExportOutput.compile` uses for a target selection.

    ``target_device`` (one name or several, for multi-device programs) wins over
    ``target_backends``. Each known target (``llvm-cpu``, ``vmvx``, ``vulkan-spirv``, ``cuda``,
    ``rocm``, ...) gets turbine's default flags (:func:`default_compile_flags`; for
    ``llvm-cpu``: tuned for the host CPU unless ``host_cpu=False``); an unknown backend name is
    passed on as ``--iree-hal-target-backends``. ``$TURBINE_COMPILE_FLAGS`` and then
    ``extra_args`` come last and replace defaults of the same flag. ``traits`` (what
    :func:`.traits.program_traits` reads from the module: dynamic dimensions, fp32 only, narrow
    matmuls) select the defaults measured for such programs.
    """
    devices = as_list(target_device)
    backends = as_list(target_backends) if not devices else []
    flags: list[str] = []
    if devices:
        targets = [resolve_target(d) for d in devices]
        if len(targets) == 1:
            flags = _target_defaults(targets[0].name, traits, host=host_cpu)
        else:
            # Several devices: one --iree-hal-target-device per device (IREE names them
            # __device_0, __device_1, ... in order), one set of backend/optimization flags.
            flags = target_device_flags([t.hal_device for t in targets])
            backends_local = sorted({t.local_backend for t in targets if t.local_backend})
            if backends_local:
                flags.append("--iree-hal-local-target-device-backends=" + ",".join(backends_local))
            for t in dict.fromkeys(t.name for t in targets):
                defaults = _target_defaults(t, traits, host=host_cpu)
                flags = merge_flags(
                    flags, [f for f in defaults if not f.startswith(_DEVICE_SELECTION)]
                )
    elif backends:
        known = [b for b in backends if b in TARGETS or b in ("cpu", "host")]
        unknown = [b for b in backends if b not in known]
        if len(known) == 1 and not unknown:
            flags = _target_defaults(known[0], traits, host=host_cpu)
        else:
            flags = [f"--iree-hal-target-backends={','.join(backends)}"]
            if "llvm-cpu" in backends:
                flags.append(
                    "--iree-llvmcpu-target-cpu=host"
                    if host_cpu
                    else "--iree-llvmcpu-target-cpu=generic"
                )
    env_flags = os.environ.get(COMPILE_FLAGS_ENV, "").split()
    return merge_flags(merge_flags(flags, env_flags), list(extra_args))


def driver_of(uri: str) -> str:
    """The runtime driver of a device URI: ``"cuda://0"`` -> ``"cuda"``, ``"local-task"``."""
    return uri.split("://", 1)[0].split(":", 1)[0]


def device_compile_flags(
    devices: Sequence[str],
    extra: Sequence[str] | None = None,
    *,
    traits: ProgramTraits | None = None,
    dynamic_shapes: bool = False,
    fp32_only: bool = False,
    narrow_matmuls: bool = False,
    float64: bool = False,
) -> list[str]:
    """turbine's default compile flags for one device URI or several (``__device_N`` order).

    The flags of :func:`compile_flags_for` for the devices' drivers: one device gets
    :func:`default_compile_flags` for its driver; several get one ``--iree-hal-target-device``
    per device (:func:`.targets.target_device_flags`), which IREE names ``__device_0``,
    ``__device_1``, ... — the names the exporter's ``#hal.device.promise<@__device_N>``
    affinities refer to — and each target's defaults. ``extra`` flags come last.

    Args:
        devices: device URIs (``"local-task"``, ``"cuda://0"``...).
        extra: the user's flags, which replace defaults of the same name.
        traits: the program's traits (:func:`.traits.program_traits`); when ``None``, the
            ``dynamic_shapes``, ``fp32_only``, ``narrow_matmuls`` and ``float64`` keywords make
            them.
    """
    if traits is None:
        traits = ProgramTraits(dynamic_shapes, fp32_only, narrow_matmuls, float64)
    return compile_flags_for(
        target_device=[driver_of(d) for d in devices], extra_args=list(extra or ()), traits=traits
    )
