"""The ``turbine-aot`` command line."""

from __future__ import annotations

import argparse
import sys
import time

_DEMO_MLIR = """
func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x3xf32>) -> tensor<4x3xf32> {
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<4x3xf32>
  %fill = linalg.fill ins(%zero : f32) outs(%init : tensor<4x3xf32>) -> tensor<4x3xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<4x8xf32>, tensor<8x3xf32>)
                      outs(%fill : tensor<4x3xf32>) -> tensor<4x3xf32>
  return %mm : tensor<4x3xf32>
}
"""


def _demo(args: argparse.Namespace) -> int:
    import iree.compiler as ic
    import iree.runtime as rt
    import numpy as np
    import torch

    t0 = time.perf_counter()
    vmfb = ic.compile_str(
        _DEMO_MLIR, target_backends=["llvm-cpu"], extra_args=["--iree-llvmcpu-target-cpu=host"]
    )
    t1 = time.perf_counter()
    config = rt.Config("local-task")
    module = rt.load_vm_module(rt.VmModule.copy_buffer(config.vm_instance, vmfb), config)
    x = torch.randn(4, 8)
    w = torch.randn(8, 3)
    got = torch.from_numpy(np.asarray(module.main(x.numpy(), w.numpy()).to_host()))
    want = x @ w
    t2 = time.perf_counter()
    err = (got - want).abs().max().item()
    print(f"compile {1e3 * (t1 - t0):.1f} ms, load+run {1e3 * (t2 - t1):.1f} ms")
    print("IREE :", got[0].tolist())
    print("eager:", want[0].tolist())
    print(f"max abs error {err:.3g}")
    return 0 if err < 1e-4 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="turbine-aot")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="export, compile, run and compare an embedded example with eager")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
