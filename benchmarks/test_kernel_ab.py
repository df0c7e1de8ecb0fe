"""The kernel A/B benchmark's timing experiment (``nox -s zoo-quick``, tagged ``ci``):
``quant_kernel_ab.weights_in_l1`` must give each channel of a block a weight row of its own
(docs/quantization.md, "The int4 kernel's loop, measured again"): with all channels on one row
LLVM merges their unpacking and the "L1" timing measures a fraction of the loop. Nothing here
is timed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness
import quant_kernel_ab


def _masks_kernel(k: int = 256, n: int = 32):
    from turbine_aot._compiler.avx512_quant import Avx512QuantGemm

    # the AVX2 one-row int4 form, as for_shape builds it on an AVX2 host (spelled out: on an
    # AVX-512 host for_shape picks the lookup form)
    return Avx512QuantGemm(
        k,
        n,
        4,
        64,
        True,
        mr=1,
        nr=4,
        cols_per_workgroup=16,
        prefetch=True,
        lookup=False,
        nibble_masks=True,
        chains=1,
        prepared_row=True,
    )


def test_each_channel_reads_a_row_of_its_own():
    kernel = _masks_kernel()
    mlir = quant_kernel_ab._module(kernel, 1)
    l1 = quant_kernel_ab.weights_in_l1(kernel, mlir)
    rows = re.findall(r"vector\.load %mq\[(%\w+), ", l1)
    assert rows and sorted(set(rows)) == [f"%i{j}" for j in range(kernel.nr)]
    assert re.findall(r"vector\.load %mq\[(%\w+), ", mlir) == [
        f"%n{j}" for j in range(kernel.nr)
    ] * (len(rows) // kernel.nr)


def test_other_kernels_are_refused():
    from turbine_aot._compiler.avx512_quant import Avx512QuantGemm

    lookup = Avx512QuantGemm(256, 32, 4, 64, True, mr=1, nr=2)  # the AVX-512 table form
    with pytest.raises(SystemExit, match="not a nibble-masks kernel"):
        quant_kernel_ab.weights_in_l1(lookup, quant_kernel_ab._module(lookup, 1))


def _l1_want(x, q_packed, s, z, group, nr):
    """numpy's float64 product where channel ``c`` has weight row ``c % nr`` and its own scales
    and zero points."""
    u = np.stack([q_packed & 0xF, (q_packed >> 4) & 0xF], -1).reshape(q_packed.shape[0], -1)
    q = np.where(u >= 8, u.astype(np.int64) - 16, u.astype(np.int64))
    rows = q[np.arange(q.shape[0]) % nr]
    deq = (rows - np.repeat(z, group, 1)) * np.repeat(s, group, 1).astype(np.float64)
    return x.astype(np.float64) @ deq.T


def test_the_l1_module_computes_rows_0_to_nr(tmp_path):
    """Compiled and run: the streaming module matches numpy; in the L1 one, channel ``c`` of
    every block computes with weight row ``c % nr`` (and its own scales and zero points)."""
    iree_rt = pytest.importorskip("iree.runtime")

    kernel = _masks_kernel(k=256, n=256)  # operands() builds square weights
    host, check = quant_kernel_ab.operands(1, kernel.k, 1, 4, 64)
    mlir = quant_kernel_ab._module(kernel, 1)
    cfg = iree_rt.Config("local-sync")
    dev = [iree_rt.asdevicearray(cfg.device, a) for a in host]
    results = {}
    for name, text in (("stream", mlir), ("l1", quant_kernel_ab.weights_in_l1(kernel, mlir))):
        fn = _harness.kernel_main(text, tmp_path / f"{name}.mlir", cfg)
        out = fn(*dev)  # one layer: one result, not a list
        results[name] = np.asarray((out[0] if isinstance(out, (list, tuple)) else out).to_host())
    check("stream", results["stream"])
    x, q_packed, scales, zeros = host
    want = _l1_want(x, q_packed.view(np.uint8), scales, zeros, 64, kernel.nr)
    np.testing.assert_allclose(results["l1"], want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert not np.allclose(results["l1"], results["stream"])
