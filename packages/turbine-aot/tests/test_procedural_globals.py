"""Globals of procedural modules behave like the reference's: typed globals start at zero, an
external parameter's key is the full dotted ``<attribute>.<name>`` (``name_mapper`` sees that),
the default scope is ``"model"``, a dynamically shaped initialized global is refused when the
module is constructed, and a bare ``Context()`` works. Compiled with IREE and run."""

# Procedures declare their signatures with abstract-type defaults (the API's design):
# ruff: noqa: B008

from __future__ import annotations

import pytest
import torch
from ir_check import check_ir as _check_ir

from turbine_aot import CompiledModule, export, export_global, export_parameters
from turbine_aot.builtins import (
    AbstractBool,
    AbstractF32,
    AbstractI32,
    AbstractIndex,
    AbstractTensor,
)
from turbine_aot.runtime import load_module

FAST = ["--iree-opt-data-tiling=false", "--iree-llvmcpu-enable-ukernels=none"]


class Zeros(CompiledModule):
    n = export_global(AbstractIndex, mutable=True)
    f = export_global(AbstractF32, mutable=True)
    i = export_global(AbstractI32, mutable=True)
    b = export_global(AbstractBool, mutable=True)
    t = export_global(AbstractTensor(2, dtype=torch.float64), mutable=True)

    def read(self):
        return self.f, self.i, self.t

    def bump(self, x=AbstractTensor(2, dtype=torch.float64)):
        self.t = x
        self.i = self.i + 1


def test_typed_globals_start_at_zero_and_run():
    out = export(Zeros)
    _check_ir(
        str(out.mlir_module),
        r"^  util\.global private mutable @_n\.global = 0 : index$",
        r"^  util\.global private mutable @_f\.global = 0\.000000e\+00 : f32$",
        r"^  util\.global private mutable @_i\.global = 0 : i32$",
        r"^  util\.global private mutable @_b\.global = false$",
        r"^  util\.global private mutable @_t\.global = dense<0\.000000e\+00> : tensor<2xf64>$",
    )
    # IREE 3.13 demotes f64 to f32 by default and then returns the f64 global through a
    # buffer of half the size ("buffer view byte length 16 exceeds backing buffer byte length
    # 8"); keeping f64 avoids that IREE problem, which is not what this test is about.
    m = load_module(out.compile(None, extra_args=[*FAST, "--iree-input-demote-f64-to-f32=false"]))
    f, i, t = m.read()
    assert float(f) == 0.0 and int(i) == 0
    torch.testing.assert_close(t, torch.zeros(2, dtype=torch.float64))
    x = torch.tensor([1.5, -2.0], dtype=torch.float64)
    m.bump(x)
    _, i, t = m.read()
    assert int(i) == 1
    torch.testing.assert_close(t, x)


def test_dynamic_typed_global_is_refused_at_construction():
    class Dynamic(CompiledModule):
        cache = export_global(AbstractTensor(None, 4), mutable=True)

    with pytest.raises(
        ValueError, match=r"Cannot create initialization value for dynamic shaped tensor"
    ):
        Dynamic()

    class Declared(CompiledModule):  # uninitialized (mutable) is the way to declare it
        cache = export_global(AbstractTensor(None, 4), mutable=True, uninitialized=True)

    assert "util.global private mutable @_cache.global : tensor<?x4xf32>" in str(
        CompiledModule.get_mlir_module(Declared())
    )


class _Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.classifier = torch.nn.Linear(4, 3)


def test_external_parameter_keys_are_the_full_dotted_name(tmp_path):
    from turbine_params import ParameterArchiveBuilder

    net = _Classifier()

    class Params(CompiledModule):
        params = export_parameters(net, external=True)
        mapped = export_parameters(net, external=True, name_mapper=lambda n: "w/" + n)

        def run(self, x=AbstractTensor(2, 4)):
            return self.params["classifier.weight"], self.mapped["classifier.bias"]

    out = export(Params)
    _check_ir(
        str(out.mlir_module),
        r'@_params\.classifier\.weight = #flow\.parameter\.named<"model"::'
        r'"params\.classifier\.weight"> : tensor<3x4xf32>',
        r'@_params\.classifier\.bias = #flow\.parameter\.named<"model"::"params\.classifier\.bias">',
    )

    # The same tensors exported twice are one global each (the first export's), so `mapped`
    # resolves to the `params` globals; name_mapper applies to a fresh export:
    class Mapped(CompiledModule):
        mapped = export_parameters(_Classifier(), external=True, name_mapper=lambda n: "w/" + n)

    assert '#flow.parameter.named<"model"::"w/mapped.classifier.weight">' in str(
        CompiledModule.get_mlir_module(Mapped())
    )
    builder = ParameterArchiveBuilder()
    builder.add_module(net, prefix="params.")
    builder.save(tmp_path / "p.irpa")
    m = load_module(out.compile(None, extra_args=FAST), parameters=tmp_path / "p.irpa")
    w, b = m.run(torch.zeros(2, 4))
    torch.testing.assert_close(w, net.classifier.weight.detach())
    torch.testing.assert_close(b, net.classifier.bias.detach())


def test_bare_context_builds_abstract_tensor_types():
    from turbine_ir.ir import Context

    class WithState(CompiledModule):
        state = export_global(AbstractTensor(3), mutable=True)

        def get(self):
            return self.state

    inst = WithState(context=Context())
    _check_ir(
        str(CompiledModule.get_mlir_module(inst)),
        r"util\.global private mutable @_state\.global = dense<0\.000000e\+00> : tensor<3xf32>",
        r"func\.func @get\(\) -> tensor<3xf32>",
    )
