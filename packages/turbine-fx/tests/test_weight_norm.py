"""``torch.nn.utils.parametrizations.weight_norm`` keeps static shapes (audio models' Conv1d).

IREE 3.13's own lowering of ``aten._weight_norm_interface`` gives its first result the shape of
``g / ||v||`` (``?x1x1`` for dim 0, ``1x1x?`` for dim 2) instead of ``v``'s, and the cast to the
static weight fails ("'tensor.cast' op operand type 'tensor<1x1x?xf32>' and result type
'tensor<128x32x16xf32>' are cast incompatible"). The default table decomposes the op with
torch's decomposition instead.
"""

from __future__ import annotations

import pytest
import torch
from fx_helpers import Built, run_module
from torch import nn

from turbine_fx import current_aot_decompositions, import_exported_program


def _weight_normed_conv(dim):
    torch.manual_seed(0)
    conv = nn.Conv1d(32, 128, 16, padding=8, groups=1)
    return nn.utils.parametrizations.weight_norm(conv, name="weight", dim=dim).eval()


def test_weight_norm_interface_is_in_the_default_table():
    assert torch.ops.aten._weight_norm_interface.default in current_aot_decompositions()


@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm_conv1d_golden_and_run(iree_device, dim):
    model = _weight_normed_conv(dim)
    x = torch.randn(1, 32, 50)
    ep = torch.export.export(model, (x,))
    b = Built()
    with b:
        import_exported_program(b.mb, ep)
    asm = b.asm()
    assert "torch.aten._weight_norm_interface" not in asm
    norm_shape = "[128,1,1]" if dim == 0 else "[1,1,16]"
    assert "torch.aten.linalg_vector_norm" in asm
    assert f"-> !torch.vtensor<{norm_shape},f32>" in asm
    assert "?" not in asm  # every shape stays static
    (got,) = run_module(iree_device, asm, "main", [(x,)])
    with torch.no_grad():
        torch.testing.assert_close(got[0], model(x), rtol=1e-4, atol=1e-4)
