"""Test infrastructure shared by every package's tests.

``--device NAME`` (or ``TURBINE_TEST_DEVICE``) picks the IREE backend for tests that take the
``iree_device`` fixture; those tests are marked ``backend`` automatically, so that the nox
``e2e-<device>`` sessions can run exactly them on each backend. An unavailable backend skips
with the reason. ``iree_device.compile(...)`` / ``iree_device.load(...)`` are small helpers for
lower layers' tests that have no runner of their own (turbine_aot has the product runner).

A lost device costs the test that lost it one rerun: ``iree_device`` holds a device of its own
(not IREE's process-wide cached one), and a test that fails with a lost-device error
(``VK_ERROR_DEVICE_LOST``: IREE 3.13's Vulkan queue can race on Mesa lavapipe, see
docs/development.md) makes the next load create a new one, then runs once more on it (with a
warning naming the rerun); a second loss fails it. turbine_aot's runtime replaces its lost
devices itself.

The report header names the CPU and the instruction-set extensions turbine's CPU kernels choose
by (AVX2 + FMA, AVX-512, VNNI, BF16, AMX), so that a log from another machine says what it ran on.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from _pytest.runner import runtestprotocol

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))

import iree_devices

# transformers imports torchvision when installed; the registry's torchvision wheel needs stand-in
# op schemas against the CPU torch (tools/torchvision_compat.py). Only where torchvision exists,
# so the numpy-only params-standalone session never imports torch here.
if importlib.util.find_spec("torchvision") is not None:
    import torchvision_compat

    torchvision_compat.install()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        default=None,
        help=f"IREE test device: one of {', '.join(iree_devices.DEVICES)} "
        f"(default: $TURBINE_TEST_DEVICE or {iree_devices.DEFAULT_DEVICE})",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "iree_device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.backend)


_probe_cache: dict[str, str | None] = {}


class IreeDevice:
    """A compile target + runtime driver for tests, with the runtime device they load on."""

    def __init__(self, spec: iree_devices.TestDevice):
        self.spec = spec
        self.name = spec.name
        self.driver = spec.driver
        self._device = None

    @property
    def device(self):
        """The ``HalDevice`` modules are loaded on; a new one after :meth:`forget_device`."""
        if self._device is None:
            import iree.runtime as rt

            self._device = rt.get_device(self.driver, cache=False)
        return self._device

    def forget_device(self) -> None:
        """The device was lost: the next load creates a new one."""
        self._device = None

    @property
    def compile_args(self) -> list[str]:
        return self.spec.compile_args

    def compile(self, mlir: str | bytes, *, extra_args: list[str] | tuple[str, ...] = ()) -> bytes:
        import iree.compiler as ic

        return ic.compile_str(
            mlir,
            input_type="auto",
            extra_args=[*self.compile_args, *extra_args],
        )

    def load(self, vmfb: bytes, *, parameters: dict[str, str | Path] | None = None):
        """Loads a compiled module; returns the bound module (functions by name).

        ``parameters`` maps a parameter scope to one or more .irpa/.safetensors/.gguf files.
        """
        import iree.runtime as rt

        config = rt.Config(device=self.device)
        instance = config.vm_instance
        modules = []
        for scope, paths in (parameters or {}).items():
            index = rt.ParameterIndex()
            for path in [paths] if isinstance(paths, (str, Path)) else paths:
                index.load(str(path))
            modules.append(
                rt.create_io_parameters_module(instance, index.create_provider(scope=scope))
            )
        vm_module = rt.VmModule.copy_buffer(instance, vmfb)
        loaded = rt.load_vm_modules(*modules, vm_module, config=config)
        return _DeviceModule(loaded[-1], config.device)


class _DeviceModule:
    """Wraps a bound module so that numpy inputs are uploaded to the device first.

    (The IREE runtime may refuse to import unaligned host memory on some drivers, e.g. lavapipe.)
    """

    def __init__(self, bound, device):
        self._bound = bound
        self.device = device

    def __getattr__(self, name):
        import iree.runtime as rt
        import numpy as np

        from turbine_aot._runtime.tensors import _page_aligned_copy

        fn = getattr(self._bound, name)

        def call(*args):
            dev_args = [
                rt.asdevicearray(self.device, _page_aligned_copy(a))
                if isinstance(a, np.ndarray)
                else a
                for a in args
            ]
            result = fn(*dev_args)
            if isinstance(result, (tuple, list)):
                return type(result)(_HostReadable(r) for r in result)
            return _HostReadable(result)

        return call


class _HostReadable:
    """A result whose ``to_host()`` copies through a staging buffer.

    ``DeviceArray.to_host`` imports a numpy allocation into the device when the allocator says
    it can, and Vulkan on lavapipe then rejects pointers not aligned to 4096. A staging buffer
    works on every driver (the product runner's own read-back, reused here).
    """

    def __init__(self, value):
        self.value = value

    def to_host(self):
        import iree.runtime as rt

        from turbine_aot._runtime.tensors import _staged_host_array

        if not isinstance(self.value, rt.DeviceArray):
            return self.value
        bv = self.value._buffer_view
        dtype = rt.HalElementType.map_to_dtype(bv.element_type)
        return _staged_host_array(self.value._device, bv, dtype).copy()


_devices: dict[str, IreeDevice] = {}


@pytest.fixture(scope="session")
def iree_device(request: pytest.FixtureRequest) -> IreeDevice:
    spec = iree_devices.resolve(request.config.getoption("--device"))
    if spec.name not in _probe_cache:
        _probe_cache[spec.name] = iree_devices.probe(spec)
    reason = _probe_cache[spec.name]
    if reason:
        pytest.skip(f"backend not available: {reason}")
    return _devices.setdefault(spec.name, IreeDevice(spec))


def note_test_error(error: BaseException) -> bool:
    """After a test failed with ``error``: when it says the device was lost, every test device
    is replaced at its next load. Returns whether it did."""
    if not iree_devices.device_lost(error):
        return False
    for device in _devices.values():
        device.forget_device()
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if call.excinfo is not None and note_test_error(call.excinfo.value):
        report.turbine_device_lost = True  # type: ignore[attr-defined]
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    """Runs a test; once more on a new device when its first run lost the device.

    The loss is IREE 3.13's Vulkan semaphore race on lavapipe (docs/development.md), not the
    test's doing: the rerun's reports are the ones logged, after a warning that names the loss.
    """
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    if any(getattr(r, "turbine_device_lost", False) and r.failed for r in reports):
        item.warn(
            pytest.PytestWarning(
                f"{item.nodeid}: the IREE device was lost (IREE 3.13's Vulkan race on "
                "lavapipe, docs/development.md); rerun once on a new device"
            )
        )
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_report_header(config: pytest.Config) -> str:
    return iree_devices.cpu_summary()
