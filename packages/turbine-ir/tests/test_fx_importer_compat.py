"""RefTracker satisfies the py_attr_tracker protocol of iree.compiler.extras.fx_importer."""

from __future__ import annotations

import torch

from turbine_ir import ModuleBuilder, RefTracker, ir


def test_fx_importer_uses_ref_tracker_for_literals():
    from iree.compiler.extras.fx_importer import FxImporter

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("c", torch.arange(6, dtype=torch.float32).reshape(2, 3))

        def forward(self, x):
            return x + self.c

    program = torch.export.export(M(), (torch.ones(2, 3),))
    ctx = ir.Context()
    with ctx, ir.Location.unknown():
        mb = ModuleBuilder(ir.Module.create())
    assert isinstance(mb.fx_py_attr_tracker, RefTracker)
    module = ir.Module.parse("module {}", ctx)
    importer = FxImporter(module=module, py_attr_tracker=mb.fx_py_attr_tracker)
    importer.import_frozen_program(program, func_name="main")
    tracked = len(mb.fx_py_attr_tracker)
    assert tracked >= 1
    # A second import of the same program reuses the tracked literal: one resource blob.
    importer.import_frozen_program(program, func_name="again")
    text = str(module)
    assert "func.func @main" in text and "func.func @again" in text
    assert text.count("torch.vtensor.literal(dense_resource<") == 2
    assert text.split("dialect_resources", 1)[1].count('"0x') == 1
