"""The benchmark's own candidates, checked as the zoo's are (``nox -s zoo-quick``, tagged ``ci``):
numerics only, nothing here asserts on time.

``turbine-prepared`` (``benchmarks/_peers.py``) times the same module as ``turbine`` through a
``runtime.PreparedCall``: it must give the plain call's results, and its results must outlive
the next call, as ONNX Runtime's and OpenVINO's (copied) ones do.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _peers


@pytest.mark.parametrize("threads", [1, 2])
def test_prepared_turbine_gives_the_plain_calls_results(tmp_path, threads):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ).eval()
    x = torch.randn(3, 16)
    with torch.no_grad():
        want = model(x).numpy()
    plain = _peers.build_turbine(model, (x,), {}, threads, tmp_path)
    prepared = _peers.build_turbine(model, (x,), {}, threads, tmp_path, prepared=True)
    assert "runtime.PreparedCall" in prepared.notes
    for built in (plain, prepared):
        (got,) = built.outputs()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    first = prepared.call()[0]
    kept = first.copy()
    prepared.call()
    # a copy, not a view of the argument and result buffers the next call reuses
    assert first.flags.owndata
    np.testing.assert_array_equal(first, kept)
