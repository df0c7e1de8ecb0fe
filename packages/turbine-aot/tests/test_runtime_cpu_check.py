"""A module compiled for a CPU with instructions this one lacks is refused when loaded, with an
error naming them, instead of killing the process with an illegal instruction (IREE 3.13's
runtime does not check; docs/running.md, "A module built for another CPU")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import turbine_aot as aot
from turbine_aot import runtime as R
from turbine_aot._cli.main import main
from turbine_aot._compiler.host import cpu_flags
from turbine_aot._runtime.cpu_check import (
    CPUINFO_FLAG,
    CpuTarget,
    check_kernel_features,
    check_module_cpu,
    missing_features,
    module_cpu_targets,
)

#: Named CPUs, newest extensions last: the test builds for the first whose code this CPU lacks.
_OTHER_CPUS = ("sapphirerapids", "graniterapids", "znver5")
_X86_LINUX = sys.platform == "linux" and os.uname().machine in ("x86_64", "amd64")


def _lacking(cpu: str) -> list[str]:
    """What this CPU lacks of ``cpu``'s extensions, as the check reads them from a module."""
    return missing_features(_target_of(_compiled(cpu)), cpu_flags())


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))


_compiled_cache: dict[str, bytes] = {}


def _compiled(cpu: str) -> bytes:
    """The model exported and compiled for ``cpu`` the way a user builds for a deployment
    machine: the target CPU set on the export's compiler session."""
    if cpu not in _compiled_cache:
        eo = aot.export(_model(), args=(torch.randn(4, 256),))
        eo.session.set_flags(f"--iree-llvmcpu-target-cpu={cpu}")
        _compiled_cache[cpu] = bytes(eo.compile(save_to=None).map_memory())
    return _compiled_cache[cpu]


def _target_of(vmfb: bytes) -> CpuTarget:
    targets = module_cpu_targets(vmfb, None)
    assert len(targets) == 1, targets
    return targets[0]


@pytest.fixture(scope="module")
def other_cpu() -> str:
    """A named CPU with extensions this one lacks (skips where this CPU has them all)."""
    if not _X86_LINUX:
        pytest.skip("the check reads /proc/cpuinfo: Linux on x86-64 only")
    for cpu in _OTHER_CPUS:
        if _lacking(cpu):
            return cpu
    pytest.skip(f"this CPU has every extension of {', '.join(_OTHER_CPUS)}")


def test_a_module_keeps_its_target_cpu_and_features():
    """IREE 3.13 prints each device's target into the module; turbine reads the CPU, its
    expanded features and the triple (this fails first if a new IREE stops keeping them)."""
    target = _target_of(_compiled("sapphirerapids"))
    assert target.cpu == "sapphirerapids"
    assert {"avx512f", "avx512bw", "avx512vnni", "amx-bf16", "avx2", "fma"} <= target.features
    assert target.triple.startswith("x86_64")
    generic = _target_of(_compiled("x86-64-v3"))
    assert generic.cpu == "x86-64-v3"
    assert {"avx2", "fma", "f16c", "bmi2"} <= generic.features
    assert not any(f.startswith(("avx512", "amx")) for f in generic.features)


def test_features_turned_off_later_in_the_list_do_not_count():
    text = (
        b'xx#hal.executable.target<"llvm-cpu", "embedded-elf-x86_64", {cpu = "znver3", '
        b'cpu_features = "+avx2,+pku,+avx512f,-avx512f,+fma", data_layout = "e", '
        b'target_triple = "x86_64-unknown-unknown-eabi-elf"}>yy'
    )
    (target,) = module_cpu_targets(text, None)
    assert target == CpuTarget("znver3", frozenset({"avx2", "pku", "fma"}), target.triple)
    assert missing_features(target, {"avx2", "fma"}) == []  # pku is not an instruction set
    assert missing_features(target, {"avx2"}) == ["fma"]


@pytest.mark.skipif(not _X86_LINUX, reason="the check reads /proc/cpuinfo: Linux on x86-64 only")
def test_a_module_built_here_loads_and_matches_eager(tmp_path):
    """The default build (target CPU ``host``) needs nothing this CPU lacks: loaded as ever."""
    vmfb = _compiled("host")
    assert missing_features(_target_of(vmfb), cpu_flags()) == []
    path = tmp_path / "here.vmfb"
    path.write_bytes(vmfb)
    x = torch.randn(4, 256)
    out = R.load_module(path).main(x)
    torch.testing.assert_close(out, _model()(x), rtol=1e-4, atol=1e-4)


def test_a_module_built_for_another_cpu_is_refused_by_name(other_cpu, tmp_path):
    vmfb = _compiled(other_cpu)
    lacking = _lacking(other_cpu)
    path = tmp_path / f"{other_cpu}.vmfb"
    path.write_bytes(vmfb)
    for module, where in ((path, repr(str(path))), (vmfb, "the module")):
        with pytest.raises(R.TurbineRuntimeError) as info:
            R.load_module(module)
        msg = str(info.value)
        assert f"{where} was compiled for CPU {other_cpu!r} with {lacking[0]}" in msg, msg
        assert "illegal instruction" in msg and "--iree-llvmcpu-target-cpu=host" in msg, msg


def test_the_command_line_says_so_in_one_line(other_cpu, tmp_path, capsys):
    path = tmp_path / "other.vmfb"
    path.write_bytes(_compiled(other_cpu))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert f"turbine-aot: error: module {str(path)!r} was compiled for CPU {other_cpu!r}" in err


def test_only_local_cpu_devices_are_checked(other_cpu, monkeypatch):
    vmfb = _compiled(other_cpu)
    check_module_cpu(vmfb, None, ["vulkan"], "the module")  # its CPU code never runs there
    with pytest.raises(R.TurbineRuntimeError):
        check_module_cpu(vmfb, None, ["local-sync"], "the module")
    monkeypatch.setenv("TURBINE_CPU_CHECK", "0")
    check_module_cpu(vmfb, None, ["local-sync"], "the module")


def test_every_listed_extension_is_a_cpuinfo_flag_name():
    """The table maps LLVM's names to Linux's: a flag this CPU reports under the Linux name
    of a listed extension is found (a typo in the table would refuse good modules)."""
    flags = cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo flags on this machine")
    for llvm, linux in CPUINFO_FLAG.items():
        assert linux == linux.lower() and " " not in linux, (llvm, linux)
    host = _target_of(_compiled("host"))
    # every extension LLVM detected on this CPU, of those listed, is a flag Linux reports
    assert [f for f in host.features if f in CPUINFO_FLAG and CPUINFO_FLAG[f] not in flags] == []
    # and what Linux reports, LLVM detected: the names agree both ways
    assert [f for f in CPUINFO_FLAG if CPUINFO_FLAG[f] in flags and f not in host.features] == []


@pytest.mark.skipif(not _X86_LINUX, reason="needs an x86-64 CPU without AVX-512")
def test_without_the_check_iree_lets_the_process_die(other_cpu, tmp_path):
    """What the check prevents: with it off, loading and calling the module kills the process
    (IREE 3.13). If a later IREE refuses such a module itself, this fails: the check may go."""
    if "avx512f" in cpu_flags() or "avx512f" not in _lacking(other_cpu):
        pytest.skip("this CPU runs AVX-512 code: the other CPU's code may well run here")
    path = tmp_path / "other.vmfb"
    path.write_bytes(_compiled(other_cpu))
    script = textwrap.dedent(
        f"""
        import torch
        from turbine_aot import runtime as R
        m = R.load_module({str(path)!r})
        m.main(torch.randn(4, 256))
        """
    )
    env = dict(os.environ, TURBINE_CPU_CHECK="0")
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -signal.SIGILL, (proc.returncode, proc.stderr[-2000:])


def test_a_module_file_is_read_near_its_start_only(tmp_path):
    """A module file is mapped, and read only around its printed targets: a target text far
    past the first (beyond the targets' span) is not looked for."""
    first = _compiled("host")
    path = tmp_path / "padded.vmfb"
    far = b"\0" * (3 << 20) + _compiled("x86-64-v3")
    path.write_bytes(first + far)
    targets = module_cpu_targets(None, path)
    assert [t.cpu for t in targets] == [_target_of(first).cpu]
    empty = tmp_path / "empty.vmfb"
    empty.write_bytes(b"")
    assert module_cpu_targets(None, empty) == []


def test_a_module_with_one_variant_that_runs_here_is_not_refused(other_cpu):
    """Two targets in one module (IREE's variants of a device): it loads where one runs."""
    both = _compiled(other_cpu) + _compiled("x86-64-v3")  # both texts within the span
    assert len(module_cpu_targets(both, None)) == 2
    if _lacking("x86-64-v3"):
        pytest.skip("this CPU lacks x86-64-v3 (AVX2)")
    check_module_cpu(both, None, ["local-task"], "the module")
    with pytest.raises(R.TurbineRuntimeError, match=f"CPU {other_cpu!r}"):
        check_module_cpu(_compiled(other_cpu) * 2, None, ["local-task"], "the module")


# ------------------------------------------------------------------ turbine's kernels' needs
def _cpu_requires(vmfb: bytes) -> set[str]:
    """The CPU flags the module's public functions record for turbine's kernels."""
    import iree.runtime as rt

    from turbine_aot._signatures.reflection import module_functions

    vm = rt.VmModule.copy_buffer(rt.VmInstance(), vmfb)
    return {
        flag
        for _, _, reflection in module_functions(vm, "the module")
        for flag in reflection.get("turbine.cpu_requires", "").split(",")
        if flag
    }


def test_kernels_record_what_the_target_needs_not_the_blocking():
    from turbine_aot._compiler.isa import (
        AVX2_FEATURES,
        AVX512_FEATURES,
        kernel_features,
        kernels_for,
    )

    with kernels_for("avx512", target_avx512=False):
        assert kernel_features() == AVX2_FEATURES  # LLVM splits the vectors: AVX2 code
    with kernels_for("avx512", target_avx512=True):
        assert kernel_features() == AVX512_FEATURES
    with kernels_for("avx2", target_avx512=True):
        assert kernel_features() == AVX2_FEATURES


@pytest.mark.skipif(not _X86_LINUX, reason="the check reads /proc/cpuinfo: Linux on x86-64 only")
@pytest.mark.parametrize(
    "flags",
    [["--turbine-cpu-matmul=avx512"], ["--iree-llvmcpu-target-cpu=x86-64-v3"]],
    ids=["avx512-blocking", "x86-64-v3"],
)
def test_a_build_for_an_avx2_target_needs_avx2_only(flags):
    """Built for a target without AVX-512 (a blocking asked for it on this CPU, or the fleet
    target ``x86-64-v3`` on any CPU), the module needs no more than AVX2 and FMA: it loads on
    any AVX2 CPU and matches eager."""
    if {"avx2", "fma"} - cpu_flags():
        pytest.skip("this CPU has no AVX2 + FMA")
    if flags[0].startswith("--turbine") and "avx512f" in cpu_flags():
        pytest.skip("the blocking's target is this CPU, which has AVX-512")
    eo = aot.export(_model(), args=(torch.randn(4, 256),))
    vmfb = bytes(eo.compile(save_to=None, extra_args=flags).map_memory())
    # (a named target gets IREE's own code, no kernels: nothing recorded)
    expected = set() if "target-cpu" in flags[0] else {"avx2", "fma"}
    assert _cpu_requires(vmfb) == expected
    x = torch.randn(4, 256)
    torch.testing.assert_close(R.load_module(vmfb).main(x), _model()(x), rtol=1e-4, atol=1e-4)


def test_kernels_needing_what_this_cpu_lacks_are_refused_by_name(monkeypatch):
    """The kernels' record is checked besides the printed target (an explicit
    ``--iree-llvmcpu-target-cpu-features`` can say less than the kernels use)."""
    if not _X86_LINUX or not cpu_flags():
        pytest.skip("the check reads /proc/cpuinfo: Linux on x86-64 only")
    reflections = [{"turbine.cpu_requires": "avx2,avx10_9_imaginary"}, {}]
    with pytest.raises(R.TurbineRuntimeError) as info:
        check_kernel_features(reflections, ["local-task"], "m")
    msg = str(info.value)
    assert "module 'm' holds turbine kernels built for a CPU with avx10_9_imaginary," in msg
    assert "avx2," not in msg or "avx2" in cpu_flags()
    check_kernel_features(reflections, ["vulkan"], "m")  # its kernels never run there
    # AMX is the tile permission's to check (its own message, load_module's _prepare_cpu_for)
    check_kernel_features([{"turbine.cpu_requires": "amx_tile,amx_bf16"}], ["local-task"], "m")
    monkeypatch.setenv("TURBINE_CPU_CHECK", "off")
    check_kernel_features(reflections, ["local-task"], "m")
