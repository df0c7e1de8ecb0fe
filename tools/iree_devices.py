"""IREE test devices: how the test suite compiles for and runs on each backend.

Shared by the root ``conftest.py`` (pytest ``--device``) and ``noxfile.py`` (one session per
backend). A device here is a (compile target, runtime driver) pair. ``probe()`` says whether it
can run on this machine and, when not, why — sessions and tests skip with that reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class TestDevice:
    name: str
    target_backend: str  # the (legacy) --iree-hal-target-backends name
    driver: str
    compile_flags: tuple[str, ...] = field(default_factory=tuple)
    gpu: bool = False

    @property
    def compile_args(self) -> list[str]:
        """Flags selecting this target with IREE's target-device options."""
        return list(self.compile_flags)


_HOST = ("--iree-llvmcpu-target-cpu=host",)
_LOCAL = "--iree-hal-target-device=local"
DEVICES: dict[str, TestDevice] = {
    d.name: d
    for d in (
        TestDevice(
            "llvm-cpu",
            "llvm-cpu",
            "local-task",
            (_LOCAL, "--iree-hal-local-target-device-backends=llvm-cpu", *_HOST),
        ),
        TestDevice(
            "llvm-cpu-sync",
            "llvm-cpu",
            "local-sync",
            (_LOCAL, "--iree-hal-local-target-device-backends=llvm-cpu", *_HOST),
        ),
        TestDevice(
            "vmvx", "vmvx", "local-task", (_LOCAL, "--iree-hal-local-target-device-backends=vmvx")
        ),
        TestDevice("vulkan-spirv", "vulkan-spirv", "vulkan", ("--iree-hal-target-device=vulkan",)),
        TestDevice(
            "cuda",
            "cuda",
            "cuda",
            # sm_80 PTX (JIT-compiled by the driver on newer GPUs): iree-compile 3.13 rejects
            # sm_90 and above ("missing GPU target"); sm_80 ran on an H200 (docs/running.md).
            ("--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"),
            gpu=True,
        ),
        TestDevice(
            "rocm",
            "rocm",
            "hip",
            ("--iree-hal-target-device=hip", "--iree-rocm-target=gfx942"),
            gpu=True,
        ),
    )
}
DEFAULT_DEVICE = "llvm-cpu"


def resolve(name: str | None) -> TestDevice:
    name = name or os.environ.get("TURBINE_TEST_DEVICE") or DEFAULT_DEVICE
    try:
        return DEVICES[name]
    except KeyError:
        raise ValueError(
            f"unknown test device {name!r}; choose one of: {', '.join(DEVICES)}"
        ) from None


_PROBE_SNIPPET = r"""
import sys
import iree.runtime as rt
driver = sys.argv[1]
if driver not in rt.query_available_drivers():
    print(f"the IREE runtime has no {driver!r} driver"); sys.exit(3)
try:
    d = rt.get_driver(driver)
    infos = d.query_available_devices()
except Exception as e:
    print(f"driver {driver!r} failed to initialize: {str(e).splitlines()[0]}"); sys.exit(3)
if not infos:
    print(f"driver {driver!r} reports no devices"); sys.exit(3)
try:
    rt.get_device(driver)
except Exception as e:
    print(f"could not create a {driver!r} device: {str(e).splitlines()[0]}"); sys.exit(3)
print("ok")
"""


#: The CPU flags turbine's CPU kernels choose by (docs/performance.md), as /proc/cpuinfo names them.
_KERNEL_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


def cpu_summary(cpuinfo: str = "/proc/cpuinfo") -> str:
    """One line: the CPU's model, its core count and which of the kernels' flags it has."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return "cpu: unknown (no /proc/cpuinfo)"
    model = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")),
        "unknown model",
    )
    flags = next(
        (set(ln.split(":", 1)[1].split()) for ln in text.splitlines() if ln.startswith("flags")),
        set(),
    )
    cores = sum(1 for ln in text.splitlines() if ln.startswith("processor"))
    have = [f for f in _KERNEL_FLAGS if f in flags]
    return f"cpu: {model}, {cores} logical core(s); kernel flags: {' '.join(have) or 'none'}"


#: What IREE's drivers say when a device is gone for good, and a queue fence that failed with
#: DATA_LOSS (turbine_aot's runtime, ``_runtime.devices.device_lost``, uses the same rule).
_DEVICE_LOST = ("DEVICE_LOST",)
_FENCE_FAILED = ("DATA_LOSS", "hal.fence.await")


def device_lost(error: BaseException | str) -> bool:
    """Whether an error (its message and what it was raised from) says the device was lost."""
    seen = 0
    while error is not None and seen < 8:
        text = str(error)
        if any(m in text for m in _DEVICE_LOST) or all(m in text for m in _FENCE_FAILED):
            return True
        error = getattr(error, "__cause__", None) or getattr(error, "__context__", None)
        seen += 1
    return False


def probe(device: TestDevice, python: str | None = None) -> str | None:
    """Returns None when ``device`` can run here, else the reason it cannot.

    Runs in a subprocess: a broken GPU/Vulkan driver must not take the caller down.
    """
    if device.driver in ("local-task", "local-sync"):
        return None
    try:
        proc = subprocess.run(
            [python or sys.executable, "-c", _PROBE_SNIPPET, device.driver],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        return f"probing driver {device.driver!r} timed out"
    if proc.returncode == 0:
        return None
    lines = (proc.stdout.strip() or proc.stderr.strip() or "unknown error").splitlines()
    reason = lines[-1]
    if device.name == "vulkan-spirv":
        reason += " (on a CPU-only machine install Mesa lavapipe: apt-get install mesa-vulkan-drivers libvulkan1)"
    return f"{device.name}: {reason}"
