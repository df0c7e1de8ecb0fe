"""Each IREE backend the suite targets can compile and run a module (hand-written MLIR)."""

from __future__ import annotations

import numpy as np

MATMUL_ADD = """
func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x3xf32>, %b: tensor<4x3xf32>) -> tensor<4x3xf32> {
  %init = tensor.empty() : tensor<4x3xf32>
  %zero = arith.constant 0.0 : f32
  %fill = linalg.fill ins(%zero : f32) outs(%init : tensor<4x3xf32>) -> tensor<4x3xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<4x8xf32>, tensor<8x3xf32>)
                      outs(%fill : tensor<4x3xf32>) -> tensor<4x3xf32>
  %r = arith.addf %mm, %b : tensor<4x3xf32>
  return %r : tensor<4x3xf32>
}
"""


def test_compile_and_run_matmul(iree_device):
    module = iree_device.load(iree_device.compile(MATMUL_ADD))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8), dtype=np.float32)
    w = rng.standard_normal((8, 3), dtype=np.float32)
    b = rng.standard_normal((4, 3), dtype=np.float32)
    got = np.asarray(module.main(x, w, b).to_host())
    np.testing.assert_allclose(got, x @ w + b, rtol=1e-5, atol=1e-5)
