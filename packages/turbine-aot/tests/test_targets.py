"""turbine's default compile flags per target: what they are, that the compile path applies them,
and that each can be overridden. These check flags and numerics, never timings (timings are in
``benchmarks/models_bench.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from turbine_aot._compiler.flags import (
    COMPILE_FLAGS_ENV,
    default_compile_flags,
    default_runtime_flags,
    merge_flags,
)
from turbine_aot._compiler.targets import TARGETS, TargetError, resolve_target
from turbine_aot._compiler.traits import has_dynamic_shapes

HOST = "--iree-llvmcpu-target-cpu=host"
GENERIC = "--iree-llvmcpu-target-cpu=generic"
DATA_TILING = "--iree-opt-data-tiling=true"
UKERNELS = "--iree-llvmcpu-enable-ukernels=all"
CHANNELS_LAST = (
    "--iree-preprocessing-pass-pipeline="
    "builtin.module(util.func(iree-preprocessing-convert-conv-to-channels-last))"
)
CONV_DT = "--iree-dispatch-creation-experimental-set-data-tiling-ops="
PEEL = "--iree-llvmcpu-vector-pproc-strategy=peel"


@pytest.fixture(autouse=True)
def _no_env_flags(monkeypatch):
    monkeypatch.delenv(COMPILE_FLAGS_ENV, raising=False)


# ------------------------------------------------------------------------- flag lists
def test_llvm_cpu_defaults_are_tuned_for_the_host():
    flags = default_compile_flags()
    assert flags[:2] == [
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
    ]
    for f in (HOST, DATA_TILING, UKERNELS, CHANNELS_LAST):
        assert f in flags
    # Data tiling for convolutions must keep matmuls in the list (naming any value replaces
    # IREE's default set).
    conv_dt = [f.split("=", 1)[1] for f in flags if f.startswith(CONV_DT)]
    assert conv_dt == ["matmul", "scaled_matmul", "convolution"]
    assert not any(f.startswith("--iree-opt-level") for f in flags)


def test_portable_build_is_one_flag_away():
    flags = default_compile_flags(host=False)
    assert GENERIC in flags and HOST not in flags
    # No data tiling/ukernels by default in the portable build (IREE 3.13 fails on attention).
    assert DATA_TILING not in flags and UKERNELS not in flags
    assert DATA_TILING in default_compile_flags(host=False, fast_matmul=True)
    plain = default_compile_flags(host=False, fast_matmul=False, channels_last_conv=False)
    assert plain == [
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        GENERIC,
    ]


def test_switches_drop_their_flags():
    no_fast = default_compile_flags(fast_matmul=False)
    assert DATA_TILING not in no_fast and UKERNELS not in no_fast
    assert not any(f.startswith(CONV_DT) for f in no_fast)
    assert CHANNELS_LAST in no_fast
    no_cl = default_compile_flags(channels_last_conv=False)
    assert CHANNELS_LAST not in no_cl and not any(f.startswith(CONV_DT) for f in no_cl)


def test_overrides_replace_defaults_of_the_same_name_and_append_others():
    flags = default_compile_flags(
        overrides=["--iree-llvmcpu-enable-ukernels=none", "--iree-opt-strip-assertions"]
    )
    assert "--iree-llvmcpu-enable-ukernels=none" in flags and UKERNELS not in flags
    assert flags[-1] == "--iree-opt-strip-assertions"
    assert flags.count("--iree-llvmcpu-enable-ukernels=none") == 1
    # A repeated list option given by the user replaces all of turbine's values of it.
    flags = default_compile_flags(overrides=[CONV_DT + "matmul"])
    assert [f for f in flags if f.startswith(CONV_DT)] == [CONV_DT + "matmul"]


def test_environment_flags_apply_after_defaults(monkeypatch):
    monkeypatch.setenv(COMPILE_FLAGS_ENV, "--iree-opt-data-tiling=false --iree-foo")
    flags = default_compile_flags()
    assert "--iree-opt-data-tiling=false" in flags and DATA_TILING not in flags
    assert "--iree-foo" in flags
    # Explicit overrides win over the environment.
    flags = default_compile_flags(overrides=["--iree-opt-data-tiling=true"])
    assert DATA_TILING in flags and "--iree-opt-data-tiling=false" not in flags
    assert DATA_TILING in default_compile_flags(use_env=False)


def test_opt_level():
    flags = default_compile_flags(opt_level="O3")
    assert "--iree-opt-level=O3" in flags
    assert "--iree-llvmcpu-stack-allocation-limit=65536" in flags
    assert "--iree-opt-level=O2" in default_compile_flags(opt_level="O2")
    with pytest.raises(TargetError, match="opt_level must be one of O0, O1, O2, O3"):
        default_compile_flags(opt_level="O4")


def test_other_targets_get_no_cpu_flags():
    for name in ("vmvx", "vulkan-spirv", "rocm", "metal-spirv"):
        flags = default_compile_flags(name)
        assert not any(f.startswith("--iree-llvmcpu") for f in flags), name
        assert CHANNELS_LAST not in flags
    assert default_compile_flags("vmvx") == [
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=vmvx",
    ]
    assert "--iree-hip-target=gfx942" in default_compile_flags("rocm")
    cuda = default_compile_flags("cuda", host=False)
    assert cuda == ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80", CHANNELS_LAST]
    plain = default_compile_flags("cuda", host=False, channels_last_conv=False)
    assert plain == ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"]


def test_cuda_convolutions_are_compiled_channels_last(tmp_path):
    """The CUDA default reaches the compiler: the dispatch sees an HWCF filter (compiled here;
    running needs a GPU). NCHW fp16 convolutions are miscompiled by IREE 3.13 on CUDA."""
    import turbine_aot

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).eval()
    eo = turbine_aot.export(model, args=(torch.randn(1, 3, 16, 16),))
    nhwc = _executable_sources(eo, tmp_path / "default", target_device="cuda")
    assert "tensor<3x3x3x8xf32>" in nhwc  # filter (kh, kw, cin, cout)
    nchw = _executable_sources(
        eo,
        tmp_path / "nchw",
        target_device="cuda",
        # Overriding the preprocessing pipeline replaces the layout change.
        extra_args=["--iree-preprocessing-pass-pipeline=builtin.module(util.func(canonicalize))"],
    )
    assert "tensor<3x3x3x8xf32>" not in nchw and "tensor<8x3x3x3xf32>" in nchw


def test_resolve_target_names_and_aliases():
    assert resolve_target(None).name == "llvm-cpu"
    assert resolve_target("local-task").driver == "local-task"
    assert resolve_target("local-sync").driver == "local-sync"
    assert resolve_target("vulkan").name == "vulkan-spirv"
    assert resolve_target("hip").driver == "hip"
    assert set(TARGETS) >= {"llvm-cpu", "vmvx", "vulkan-spirv", "cuda", "rocm"}
    with pytest.raises(TargetError, match=r"unknown IREE target 'tpu'; choose one of: llvm-cpu"):
        resolve_target("tpu")


def test_merge_flags():
    assert merge_flags(["--a=1", "--b", "--c=3"], ["--a=2", "--d"]) == [
        "--b",
        "--c=3",
        "--a=2",
        "--d",
    ]
    assert merge_flags(["--a=1"], []) == ["--a=1"]


def test_runtime_flags():
    assert default_runtime_flags() == []
    assert default_runtime_flags(workers=2) == ["--task_topology_max_group_count=2"]
    assert default_runtime_flags("vulkan", workers=2) == []
    with pytest.raises(TargetError, match="workers must be >= 1"):
        default_runtime_flags(workers=0)


# ------------------------------------------------------------------------- the compile path
class ConvNet(nn.Module):
    """A conv (channels-last + data tiling path), a BN, a linear (mmt4d path)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.flatten(1))


@pytest.fixture(scope="module")
def exported():
    import turbine_aot

    torch.manual_seed(0)
    model = ConvNet().eval()
    x = torch.randn(2, 3, 6, 6)
    return model, x, turbine_aot.export(model, args=(x,))


def test_export_output_compile_uses_the_defaults(exported):
    from turbine_aot._compiler.flags import compile_flags_for

    flags = compile_flags_for()
    assert flags == default_compile_flags(use_env=False)
    generic = compile_flags_for(host_cpu=False)
    assert GENERIC in generic and HOST not in generic
    over = compile_flags_for(extra_args=["--iree-llvmcpu-enable-ukernels=none"])
    assert "--iree-llvmcpu-enable-ukernels=none" in over and UKERNELS not in over


def _executable_sources(eo, tmp_path: Path, **kwargs) -> str:
    """Compiles and returns the text of the dumped executable sources (target attributes)."""
    out = tmp_path / "dump"
    extra = [*kwargs.pop("extra_args", []), f"--iree-hal-dump-executable-sources-to={out}"]
    eo.compile(save_to=tmp_path / "m.vmfb", extra_args=extra, **kwargs)
    return "\n".join(p.read_text() for p in sorted(out.glob("*.mlir")))


def test_defaults_reach_the_compiler_and_can_be_overridden(exported, tmp_path):
    _, _, eo = exported
    text = _executable_sources(eo, tmp_path / "default")
    assert 'ukernels = "all"' in text
    assert 'cpu = "generic"' not in text  # tuned for the host
    text = _executable_sources(
        eo,
        tmp_path / "portable",
        host_cpu=False,
        extra_args=["--iree-llvmcpu-enable-ukernels=none"],
    )
    assert 'cpu = "generic"' in text
    assert 'ukernels = "none"' in text


@pytest.mark.parametrize("variant", ["default", "portable", "no-fast-paths"])
def test_default_and_portable_builds_match_eager(exported, tmp_path, variant):
    from turbine_aot import runtime

    model, x, eo = exported
    kwargs: dict = {}
    if variant == "portable":
        kwargs["host_cpu"] = False
    elif variant == "no-fast-paths":
        kwargs["extra_args"] = default_compile_flags(
            fast_matmul=False, channels_last_conv=False, use_env=False
        )
    path = tmp_path / "m.vmfb"
    eo.compile(save_to=path, **kwargs)
    m = runtime.load_module(path, device="local-task")
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(m.main(x), expected, rtol=1e-4, atol=1e-4)


def _host_with(monkeypatch, avx512: bool) -> None:
    """The flags see a host CPU with (or without) AVX-512."""
    from turbine_aot._compiler import flags

    seen = {"avx2", "fma", *(["avx512f"] if avx512 else [])}
    monkeypatch.setattr(flags, "cpu_flags", lambda: seen)


def test_dynamic_programs_get_the_dynamic_shape_defaults(monkeypatch):
    _host_with(monkeypatch, avx512=True)
    assert PEEL in default_compile_flags(dynamic_shapes=True, use_env=False)
    assert PEEL not in default_compile_flags(use_env=False)
    for target in ("vmvx", "cuda", "vulkan-spirv", "rocm"):
        assert PEEL not in default_compile_flags(target, dynamic_shapes=True, use_env=False)
    masked = "--iree-llvmcpu-vector-pproc-strategy=mask"
    over = default_compile_flags(dynamic_shapes=True, overrides=[masked], use_env=False)
    assert masked in over and PEEL not in over


def test_without_avx512_every_host_build_peels(monkeypatch):
    """On a CPU without AVX-512 masked vector tails are ``vmaskmovps``: host builds peel static
    programs too (docs/performance.md, section 19); portable builds, other targets and
    ``TURBINE_CPU_PEEL=dynamic`` keep the dynamic-only rule."""
    from turbine_aot._compiler.flags import CPU_PEEL_ENV, peel_static_programs

    _host_with(monkeypatch, avx512=False)
    monkeypatch.delenv(CPU_PEEL_ENV, raising=False)
    assert peel_static_programs()
    assert PEEL in default_compile_flags(use_env=False)
    assert PEEL not in default_compile_flags(host=False, use_env=False)
    assert PEEL in default_compile_flags(host=False, dynamic_shapes=True, use_env=False)
    for target in ("vmvx", "vulkan-spirv"):
        assert PEEL not in default_compile_flags(target, use_env=False)
    monkeypatch.setenv(CPU_PEEL_ENV, "dynamic")
    assert not peel_static_programs()
    assert PEEL not in default_compile_flags(use_env=False)
    _host_with(monkeypatch, avx512=True)
    monkeypatch.delenv(CPU_PEEL_ENV)
    assert not peel_static_programs() and PEEL not in default_compile_flags(use_env=False)


class SelfAttention(nn.Module):
    """A softmax over a (sequence x sequence) matmul: the dispatch the peeling is for."""

    def forward(self, x):
        scores = x @ x.transpose(-1, -2) / 4.0
        return torch.softmax(scores, dim=-1) @ x


def test_dynamic_exports_compile_with_peeling_and_match_eager(tmp_path, monkeypatch):
    """Peeled where the program is dynamic (on an AVX-512 host: elsewhere every host build
    peels, ``test_without_avx512_every_host_build_peels``), and right."""
    import turbine_aot
    from turbine_aot import runtime
    from turbine_aot._export import output as _exporter

    used: list[list[str]] = []
    real = _exporter.compile_flags_for

    def spy(**kwargs):
        used.append(real(**kwargs))
        return used[-1]

    monkeypatch.setattr(_exporter, "compile_flags_for", spy)
    _host_with(monkeypatch, avx512=True)  # the flag choice; the code is this CPU's
    model = SelfAttention().eval()
    x = torch.randn(2, 24, 16)
    seq = torch.export.Dim("seq", min=2, max=64)
    dynamic = turbine_aot.export(model, args=(x,), dynamic_shapes={"x": {1: seq}})
    static = turbine_aot.export(model, args=(x,))
    assert has_dynamic_shapes(dynamic) and has_dynamic_shapes(dynamic.mlir_module)
    assert not has_dynamic_shapes(static)
    dynamic.compile(save_to=tmp_path / "dynamic.vmfb")
    static.compile(save_to=tmp_path / "static.vmfb")
    assert PEEL in used[0] and PEEL not in used[1]
    m = runtime.load_module(tmp_path / "dynamic.vmfb", device="local-task")
    for length in (5, 24, 37):  # not multiples of the vector width: main loop + remainder
        xi = torch.randn(2, length, 16)
        with torch.no_grad():
            expected = model(xi)
        torch.testing.assert_close(m.main(xi), expected, rtol=1e-4, atol=1e-4)


SPLIT_K = "--iree-dispatch-creation-split-matmul-reduction=32"


def test_cuda_splits_fp32_matmul_reductions_of_static_programs_only():
    assert SPLIT_K in default_compile_flags("cuda", fp32_only=True, use_env=False)
    assert SPLIT_K not in default_compile_flags("cuda", use_env=False)
    assert SPLIT_K not in default_compile_flags(
        "cuda", fp32_only=True, dynamic_shapes=True, use_env=False
    )
    for target in ("llvm-cpu", "vmvx", "vulkan-spirv", "rocm"):
        assert SPLIT_K not in default_compile_flags(target, fp32_only=True, use_env=False)
    other = "--iree-dispatch-creation-split-matmul-reduction=4"
    over = default_compile_flags("cuda", fp32_only=True, overrides=[other], use_env=False)
    assert other in over and SPLIT_K not in over
    from turbine_aot._compiler.fallback import retry_flags

    flags = default_compile_flags("cuda", fp32_only=True, use_env=False)
    assert retry_flags(flags, []) == [f for f in flags if f != SPLIT_K]
    assert retry_flags(flags, [SPLIT_K]) is None  # the user's own flag is not dropped
    assert retry_flags(default_compile_flags("cuda", use_env=False), []) is None


def test_program_traits():
    import turbine_aot
    from turbine_aot._compiler.traits import ProgramTraits, float_types, program_traits

    lin = nn.Linear(8, 4).eval()
    x = torch.randn(2, 8)
    fp32 = turbine_aot.export(lin, args=(x,))
    assert float_types(fp32) == {"f32"}
    assert program_traits(fp32) == ProgramTraits(
        dynamic_shapes=False,
        fp32_only=True,
        narrow_matmuls=True,  # 2 rows
    )
    half = turbine_aot.export(nn.Linear(8, 4).half().eval(), args=(x.half(),))
    assert float_types(half) == {"f16"} and not program_traits(half).fp32_only
    bf16 = turbine_aot.export(nn.Linear(8, 4).bfloat16().eval(), args=(x.bfloat16(),))
    assert float_types(bf16) == {"bf16"}
    batch = torch.export.Dim("batch", min=2, max=64)
    dyn = turbine_aot.export(lin, args=(x,), dynamic_shapes={"input": {0: batch}})
    assert program_traits(dyn) == ProgramTraits(
        dynamic_shapes=True,
        fp32_only=True,
        narrow_matmuls=False,  # the batch can reach 64 rows
    )


class _Decode(nn.Module):
    """One attention step of a decoder: a single query row against a 32-row cache."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(16, 16)

    def forward(self, x, k, v):
        q = self.q(x).view(1, 2, 1, 8)
        return nn.functional.scaled_dot_product_attention(q, k, v)


def test_narrow_matmul_programs_are_not_data_tiled():
    import turbine_aot
    from turbine_aot._compiler.traits import NARROW_MATMUL_ROWS, narrow_matmuls

    mlp = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).eval()
    for rows, narrow in ((1, True), (8, True), (NARROW_MATMUL_ROWS, True), (32, False)):
        eo = turbine_aot.export(mlp, args=(torch.randn(rows, 64),))
        assert narrow_matmuls(eo) is narrow, rows
    # A linear over [batch, seq, features] has batch * seq rows.
    assert not narrow_matmuls(turbine_aot.export(mlp, args=(torch.randn(2, 9, 64),)))
    kv = torch.randn(1, 2, 32, 8)
    assert narrow_matmuls(turbine_aot.export(_Decode().eval(), args=(torch.randn(1, 16), kv, kv)))
    conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 6 * 6, 4)).eval()
    assert not narrow_matmuls(turbine_aot.export(conv, args=(torch.randn(1, 3, 8, 8),)))
    assert not narrow_matmuls(turbine_aot.export(nn.ReLU(), args=(torch.randn(4),)))  # no matmul

    flags = default_compile_flags(narrow_matmuls=True)
    assert DATA_TILING not in flags and "--iree-llvmcpu-enable-ukernels=all" in flags
    assert f"{CONV_DT}convolution" not in flags
    assert DATA_TILING in default_compile_flags()
    assert "--iree-llvmcpu-enable-ukernels=all" not in default_compile_flags(
        narrow_matmuls=True, host=False
    )  # the portable build has no fast-matmul flags at all


def test_narrow_matmul_program_compiles_without_data_tiling_and_matches_eager():
    import turbine_aot
    from turbine_aot.runtime import load_module

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).eval()
    x = torch.randn(8, 256)
    out = turbine_aot.export(mlp, args=(x,))
    compiled = load_module(out.compile(None))
    assert DATA_TILING not in out._last_compile_flags
    torch.testing.assert_close(compiled.main(x), mlp(x), rtol=1e-4, atol=1e-4)


def test_cuda_fp32_export_compiles_with_split_k_and_falls_back_without_it(monkeypatch, caplog):
    import turbine_aot
    from turbine_aot import ExportOutput
    from turbine_aot._errors import CompileError

    eo = turbine_aot.export(nn.Linear(64, 32).eval(), args=(torch.randn(4, 64),))
    used: list[list[str]] = []
    real = ExportOutput._compile

    def spy(self, flags, *args):
        used.append(list(flags))
        return real(self, flags, *args)

    monkeypatch.setattr(ExportOutput, "_compile", spy)
    assert eo.compile(save_to=None, target_device="cuda") is not None  # compiled for real
    assert SPLIT_K in used[-1]

    def refuse_split_k(self, flags, *args):
        used.append(list(flags))
        if SPLIT_K in flags:
            raise CompileError("compile (cuda)", [], flags=flags)
        return real(self, flags, *args)

    used.clear()
    monkeypatch.setattr(ExportOutput, "_compile", refuse_split_k)
    with caplog.at_level("WARNING", logger="turbine.aot"):
        assert eo.compile(save_to=None, target_device="cuda") is not None
    assert SPLIT_K in used[0] and SPLIT_K not in used[1]
    assert "without the speed-only defaults split-K fp32 matmuls" in caplog.text
    with pytest.raises(CompileError):  # asked for by the user: no second try
        eo.compile(save_to=None, target_device="cuda", extra_args=[SPLIT_K])


class Affine(nn.Module):
    def forward(self, x):
        return x * 2 + 1


def test_fp16_on_the_default_vulkan_target_is_refused_before_compiling(tmp_path):
    import turbine_aot

    x = torch.randn(4, 64)
    half = turbine_aot.export(Affine(), args=(x.half(),))
    with pytest.raises(TargetError, match=r"float16.*--iree-vulkan-target=rdna3"):
        half.compile(save_to=tmp_path / "m.vmfb", target_device="vulkan-spirv")
    assert not (tmp_path / "m.vmfb").exists()
    with pytest.raises(TargetError, match="float16"):
        half.compile(save_to=None, target_backends=["vulkan-spirv"])
    # fp16 weights behind an fp32 signature count too.
    weights = nn.Linear(8, 4).half().eval()

    class Cast(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = weights

        def forward(self, x):
            return self.lin(x.half()).float()

    with pytest.raises(TargetError, match="float16"):
        turbine_aot.export(Cast(), args=(torch.randn(2, 8),)).compile(
            save_to=None, target_device="vulkan-spirv"
        )

    # ... and fp16 only between fp32 inputs and outputs (a round trip of 24 values through
    # fp16 came back wrong on lavapipe)
    class RoundTrip(nn.Module):
        def forward(self, x):
            return x.half().float()

    with pytest.raises(TargetError, match="float16"):
        turbine_aot.export(RoundTrip(), args=(torch.randn(24),)).compile(
            save_to=None, target_device="vulkan-spirv"
        )
    # Not refused: a named Vulkan target, fp32 / bf16 programs, other targets.
    half.compile(
        save_to=tmp_path / "ok.vmfb",
        target_device="vulkan-spirv",
        extra_args=["--iree-vulkan-target=valhall4"],
    )
    assert (tmp_path / "ok.vmfb").stat().st_size > 0
    turbine_aot.export(Affine(), args=(x,)).compile(save_to=None, target_device="vulkan-spirv")
    turbine_aot.export(Affine(), args=(x.bfloat16(),)).compile(
        save_to=None, target_device="vulkan-spirv"
    )
    half.compile(save_to=None, target_device="llvm-cpu")


def test_fp16_with_a_named_vulkan_target_runs_right(tmp_path):
    import iree_devices

    from turbine_aot import export, runtime

    reason = iree_devices.probe(iree_devices.DEVICES["vulkan-spirv"])
    if reason:
        pytest.skip(f"no Vulkan device here: {reason}")
    x = torch.randn(4, 64)
    path = tmp_path / "m.vmfb"
    export(Affine(), args=(x.half(),)).compile(
        save_to=path, target_device="vulkan-spirv", extra_args=["--iree-vulkan-target=valhall4"]
    )
    got = runtime.load_module(path, device="vulkan").main(x.half())
    torch.testing.assert_close(got.float(), x * 2 + 1, rtol=2e-3, atol=5e-3)
