"""The zoo's quick subset as tests (``nox -s zoo-quick``, tagged ``ci``).

Each model runs as ``benchmarks/zoo.py`` runs it, in its own child process with a timeout:
export with its native inputs -> compile with turbine's defaults -> run on IREE -> every output
against eager. Numerics only: the latency figures the child measures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo


@pytest.mark.parametrize("name", zoo.QUICK)
def test_zoo_model_passes_with_the_defaults(name):
    # One thread: torch's OpenMP workers spin when the CI cores are shared.
    args = argparse.Namespace(threads=1, calls=3, budget_s=2.0, timeout_s=900.0)
    r = zoo.run_in_child(name, args)
    assert "error" not in r, r["error"]
    print(
        f"{name}: max abs err {r['max_abs_err']:.1e}; {r['ms']:.2f} ms vs eager {r['eager_ms']:.2f} ms"
    )
    assert r["outputs"] >= 1
    assert r["max_abs_err"] <= r["atol"], f"{name}: max abs error {r['max_abs_err']:.2e}"
    assert not r["fallback"], (
        f"{name} compiled only without the speed-only defaults: {r['warnings']}"
    )
