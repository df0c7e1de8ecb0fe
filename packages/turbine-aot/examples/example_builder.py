"""An ``iree.build`` file: three variants of a two-branch model, exported and compiled.

Each variant is exported by ``turbine_generate`` in a worker process (the three run at once) and
compiled by ``iree.build``'s ``compile`` for the host CPU. One variant has a dynamic batch.

Run it (outputs under ``out/``; the paths of the .vmfb files are printed)::

    python packages/turbine-aot/examples/example_builder.py --output-dir out

or through the build driver (``python -m iree.build`` loads the file by path)::

    python -m iree.build packages/turbine-aot/examples/example_builder.py --output-dir out \\
        --iree-hal-target-device=cpu --iree-llvmcpu-target-cpu=host

A second run reuses the exported .mlir files (the generator, its arguments and this file are
unchanged); ``--turbine-generate-jobs N`` sets the number of worker processes.
"""

from __future__ import annotations

import sys

import torch
from iree.build import compile, entrypoint, iree_build_main

from turbine_aot import ExportOutput, export
from turbine_aot.build_actions import turbine_generate

FEATURES = 16
HIDDEN = 32

#: The variants: output stem -> batch size (None: dynamic batch).
VARIANTS: dict[str, int | None] = {"two_branch_b1": 1, "two_branch_b8": 8, "two_branch_dyn": None}


class TwoBranchModel(torch.nn.Module):
    """Two parallel MLP branches on the same input, mixed at the end."""

    def __init__(self, features: int = FEATURES, hidden: int = HIDDEN):
        super().__init__()
        self.left = torch.nn.Sequential(
            torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, features)
        )
        self.right = torch.nn.Sequential(
            torch.nn.Linear(features, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, features)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.left(x)) * self.right(x) + x


def make_model(seed: int = 0) -> TwoBranchModel:
    """The model with deterministic weights (so a test can rebuild it for comparison)."""
    torch.manual_seed(seed)
    return TwoBranchModel().eval()


def export_two_branch(batch_size: int | None, *, seed: int = 0) -> ExportOutput:
    """The generator: a module-level function with plain arguments, returning ExportOutput."""
    model = make_model(seed)
    example = torch.randn(batch_size or 2, FEATURES)
    dynamic_shapes = None
    if batch_size is None:
        dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=1, max=1024)}}
    return export(model, args=(example,), dynamic_shapes=dynamic_shapes)


@entrypoint(description="Three variants of a two-branch model, compiled for the host CPU")
def two_branch():
    vmfbs = []
    for stem, batch_size in VARIANTS.items():
        mlir = turbine_generate(export_two_branch, batch_size, name=stem)
        vmfbs.extend(compile(name=stem, source=mlir))
    return vmfbs


def main(argv: list[str] | None = None) -> None:
    """Runs the build; compiles for the host CPU unless a target device is given."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not any(a.startswith("--iree-hal-target-device") for a in args):
        args += ["--iree-hal-target-device=cpu", "--iree-llvmcpu-target-cpu=host"]
    iree_build_main(args=args)


if __name__ == "__main__":
    main()
