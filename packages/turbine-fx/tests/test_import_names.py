"""Names the importer gives lifted and inlined tensors (the reference ``iree.turbine.aot`` scheme).

* tensor constants above ``inline_constant_limit`` elements: ``util.global private
  @__auto.constant_<dims joined by _>_<str(dtype)>``, repeats ``$1``, ``$2``, ..., data blob named
  as the global;
* smaller constants: ``torch.vtensor.literal(dense_resource<torch_tensor_<dims>_<str(dtype)>>)``;
* parameters and buffers: ``@__auto.<state_dict name>``; with an ``ExternalTensorTrait``:
  ``@__auto.<external_name>`` = ``#flow.parameter.named`` at any size.
"""

from __future__ import annotations

import re

import torch
from fx_helpers import Built, run_module
from torch import nn

from turbine_fx import import_exported_program
from turbine_params import ExternalTensorTrait

torch.manual_seed(0)
BIG_A = torch.randn(30, 50)  # 1500 elements: lifted to a global
BIG_B = torch.randn(30, 50)  # same shape and dtype: the `$1` repeat
SMALL = torch.randn(10)  # inlined
SMALL_2D = torch.randn(2, 40)  # inlined (80 elements)


class UsesConstants(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(50, 10)
        self.register_buffer("scale", torch.full((10,), 0.5))

    def forward(self, x):
        h = self.lin(x @ BIG_A.T @ BIG_B)  # [2, 50] -> [2, 30] -> [2, 50] -> [2, 10]
        return (h + SMALL) * self.scale + SMALL_2D[:, :10], BIG_A[0, :10] * 2


def _import(module, args):
    ep = torch.export.export(module, args)
    b = Built()
    with b:
        import_exported_program(b.mb, ep)
    return b


def _globals(asm: str) -> dict[str, str]:
    return dict(re.findall(r"^\s*util\.global private (?:mutable )?@(\S+) = (.*)$", asm, re.M))


def test_lifted_and_inlined_tensor_names_golden():
    asm = _import(UsesConstants(), (torch.randn(2, 50),)).asm()
    g = _globals(asm)
    assert g["__auto.constant_30_50_torch.float32"] == (
        "dense_resource<__auto.constant_30_50_torch.float32> : tensor<30x50xf32>"
    )
    assert g["__auto.constant_30_50_torch.float32$1"] == (
        "dense_resource<__auto.constant_30_50_torch.float32$1> : tensor<30x50xf32>"
    )
    # Parameters and buffers keep their state_dict names.
    assert g["__auto.lin.weight"] == "dense_resource<torch_tensor_10_50_torch.float32> : " + (
        "tensor<10x50xf32>"
    )
    assert "__auto.scale" in g
    assert len(g) == 5  # two constants, weight, bias, buffer: the small constants are inlined
    assert re.search(
        r"torch\.vtensor\.literal\(dense_resource<torch_tensor_10_torch\.float32> : "
        r"tensor<10xf32>\) : !torch\.vtensor<\[10\],f32>",
        asm,
    )
    assert "dense_resource<torch_tensor_2_40_torch.float32> : tensor<2x40xf32>" in asm
    # The blobs are named like the globals / literals that hold them.
    for blob in (
        "__auto.constant_30_50_torch.float32",
        "__auto.constant_30_50_torch.float32$1",
        "torch_tensor_10_torch.float32",
        "torch_tensor_2_40_torch.float32",
    ):
        assert re.search(rf"^\s*{re.escape(blob)}: \"0x", asm, re.M), blob


def test_one_constant_used_by_two_programs_is_one_global():
    class A(nn.Module):
        def forward(self, x):
            return x @ BIG_A

    class B(nn.Module):
        def forward(self, x):
            return (x @ BIG_A) * 2

    b = Built()
    with b:
        import_exported_program(b.mb, torch.export.export(A(), (torch.randn(2, 30),)))
        import_exported_program(
            b.mb, torch.export.export(B(), (torch.randn(2, 30),)), symbol_name="second"
        )
    g = _globals(b.asm())
    assert list(g) == ["__auto.constant_30_50_torch.float32"]


def test_names_compile_and_run(iree_device):
    m = UsesConstants()
    x = torch.randn(2, 50)
    asm = _import(m, (x,)).asm()
    (got,) = run_module(iree_device, asm, "main", [(x,)])
    for g, e in zip(got, m(x)):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


def test_trait_tagged_small_constant_is_external_in_the_importer():
    w = torch.randn(8)
    ExternalTensorTrait(external_scope="model", external_name="norm.w").set(w)

    class Norm(nn.Module):
        def forward(self, x):
            return x * w

    g = _globals(_import(Norm(), (torch.randn(8),)).asm())
    assert g == {"__auto.norm.w": '#flow.parameter.named<"model"::"norm.w"> : tensor<8xf32>'}
