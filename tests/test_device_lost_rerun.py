"""The root conftest's rerun of a test that lost its IREE device (docs/development.md: IREE
3.13's Vulkan race on lavapipe), run on a throwaway test file in a pytest of its own."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

TESTS = """
from pathlib import Path

def _runs(name):
    f = Path(__file__).with_name(name)
    n = int(f.read_text()) if f.exists() else 0
    f.write_text(str(n + 1))
    return n

def test_loses_once():
    if _runs("once") == 0:
        raise RuntimeError("c/runtime/src/iree/hal/drivers/vulkan: VK_ERROR_DEVICE_LOST")

def test_loses_twice():
    _runs("twice")
    raise RuntimeError("VK_ERROR_DEVICE_LOST")

def test_other_failure():
    _runs("other")
    raise ValueError("wrong numbers")
"""


def test_a_lost_device_reruns_once_and_other_failures_do_not(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    shutil.copy(ROOT / "conftest.py", pytester.path / "conftest.py")
    pytester.makepyfile(test_lost=TESTS)
    # the child pytest finds tools/ (iree_devices) through PYTHONPATH
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(ROOT / "tools"), os.environ.get("PYTHONPATH", "")])
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "default")
    result.assert_outcomes(passed=1, failed=2, warnings=2)
    runs = {name: int((pytester.path / name).read_text()) for name in ("once", "twice", "other")}
    assert runs == {"once": 2, "twice": 2, "other": 1}
    result.stdout.fnmatch_lines(["*test_loses_once: the IREE device was lost*rerun once*"])
    result.stdout.fnmatch_lines(["cpu: *kernel flags:*"])
