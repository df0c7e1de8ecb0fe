"""CompiledModule: exports, naming, inheritance, procedures calling each other, kwargs/pytrees,
scalars, import phases, pass pipelines, save_mlir, errors. Compiled with IREE and run."""

# Procedures declare their signatures with abstract-type defaults (the API's design):
# ruff: noqa: B008

from __future__ import annotations

import re
import subprocess

import pytest
import torch
from ir_check import check_ir as _check_ir

from turbine_aot import CompiledModule, CompiledModuleError, CompileError, ImportPhase, export
from turbine_aot.builtins import (
    IREE,
    AbstractF32,
    AbstractI64,
    AbstractIndex,
    AbstractTensor,
    jittable,
)
from turbine_aot.support.procedural import DeviceAffinity, export_global, export_global_tree
from turbine_ir.ir import Module

# Compile flags for tests that check behaviour, not turbine's default optimization flags
# (data tiling + ukernels triple compile time); the defaults are compiled in test_export.py.
FAST = ["--iree-opt-data-tiling=false", "--iree-llvmcpu-enable-ukernels=none"]


def _ir(inst) -> str:
    return str(CompiledModule.get_mlir_module(inst))


class BasicModule(CompiledModule):
    def identity(self, x=AbstractTensor(None, 4)):
        return x


class StatefulModule(CompiledModule):
    state = export_global(torch.zeros(4), mutable=True)

    def accumulate(self, x=AbstractTensor(4)):
        self.state = self._add(self.state, x)
        return self.state

    def _add(self, a, b):  # a helper: not exported, sees the procedure's `self`
        return IREE.tensor_update(a, b, 0)


def test_naming_from_class_and_export_name():
    assert re.search(r"module @basic\b", _ir(BasicModule(import_to="torch")))

    class MyHTTPServerModule(CompiledModule):
        def f(self, x=AbstractTensor(2)):
            return x

    assert CompiledModule.get_class_info(MyHTTPServerModule).export_name == "my_http_server"

    class Renamed(CompiledModule, export_name="bar"):
        def f(self, x=AbstractTensor(2)):
            return x

    assert re.search(r"module @bar\b", _ir(Renamed()))
    assert "func.func @f(" in _ir(Renamed())


def test_create_from_dict_matches_class_form():
    def f(self, x=AbstractTensor(3)):
        return x

    cls = CompiledModule.create_from_dict("FooModule", {"f": f}, export_name="foo_x")
    inst = cls()
    assert re.search(r"module @foo_x\b", _ir(inst))
    assert "func.func @f(%arg0: tensor<3xf32>) -> tensor<3xf32>" in _ir(inst)
    info = CompiledModule.get_class_info(cls)
    assert list(info.all_exports) == ["f"]


def test_static_accessors():
    inst = BasicModule()
    info = CompiledModule.get_info(inst)
    assert info.current_import_phase == ImportPhase.IMPORT
    assert CompiledModule.get_module_builder(inst).module_op is CompiledModule.get_mlir_module(
        inst
    ) or str(CompiledModule.get_module_builder(inst).module_op) == _ir(inst)
    assert CompiledModule.get_class_info(BasicModule) is info.class_info
    with pytest.raises(CompiledModuleError, match="not a CompiledModule instance"):
        CompiledModule.get_info(object())
    with pytest.raises(CompiledModuleError, match="cannot be called from Python"):
        _ = inst.identity


def test_mutable_global_state_persists_across_calls(iree_device):
    out = export(StatefulModule)
    ir = str(out.mlir_module)
    assert "util.global private mutable" in ir and "util.global.store" in ir
    vmfb = out.compile(None, target_backends=None, extra_args=iree_device.compile_args)
    m = iree_device.load(bytes(vmfb.map_memory()))
    x = torch.arange(4, dtype=torch.float32)
    for _ in range(3):
        got = torch.from_numpy(m.accumulate(x.numpy()).to_host())
    torch.testing.assert_close(got, x)  # tensor_update replaces: last write wins


class Base(CompiledModule):
    def shared(self, x=AbstractTensor(None, 2)):
        return x

    def overridden(self, x=AbstractTensor(None, 2)):
        return x


class Derived(Base):
    def overridden(self, x=AbstractTensor(None, 2)):
        return self.shared(x), x

    def extra(self, n=AbstractIndex):
        return n


def test_inheritance_and_override(iree_device):
    info = CompiledModule.get_class_info(Derived)
    assert list(info.all_exports) == ["shared", "overridden", "extra"]
    assert list(CompiledModule.get_class_info(Base).all_exports) == ["shared", "overridden"]
    out = export(Derived)
    ir = str(out.mlir_module)
    assert re.search(r"module @derived\b", ir)
    assert "call @shared" in ir  # the override's body, not the base's
    vmfb = out.compile(None, target_backends=None, extra_args=iree_device.compile_args)
    m = iree_device.load(bytes(vmfb.map_memory()))
    x = torch.randn(3, 2)
    a, b = m.overridden(x.numpy())
    torch.testing.assert_close(torch.from_numpy(a.to_host()), x)
    torch.testing.assert_close(torch.from_numpy(b.to_host()), x)


class Calls(CompiledModule):
    def pair(self, ab=(AbstractTensor(None, 4), AbstractTensor(None, 4)), *, scale=AbstractF32):
        a, b = ab
        return {"b": b, "a": a, "scale": scale}

    def main(self, a=AbstractTensor(None, 4), *, b=AbstractTensor(None, 4), k=AbstractI64):
        d = self.pair((a, b), scale=2.0)
        return d["b"], d["a"], k, IREE.tensor_dim(a, 0)


def test_kwargs_pytrees_scalars_and_calls():
    out = export(Calls)
    ir = str(out.mlir_module)
    assert "call @pair(" in ir
    main_sig = re.search(r"func.func @main\(([^)]*)\) -> \(([^)]*)\)", ir)
    assert main_sig is not None
    assert main_sig.group(1).count("tensor<?x4xf32>") == 2 and "i64" in main_sig.group(1)
    from turbine_aot.runtime import load_module

    m = load_module(out.compile(None, extra_args=FAST))
    a, b = torch.randn(5, 4), torch.randn(5, 4)
    rb, ra, k, dim = m.main(a, b, 7)
    torch.testing.assert_close(rb, b)
    torch.testing.assert_close(ra, a)
    assert int(k) == 7 and int(dim) == 5


def test_recursion_is_an_error():
    class Loop(CompiledModule):
        def f(self, x=AbstractTensor(2)):
            return self.f(x)

    with pytest.raises(CompiledModuleError, match="calls itself"):
        Loop()


def test_procedure_argument_without_abstract_default_is_an_error():
    with pytest.raises(CompiledModuleError, match=r"argument 'x' needs a default"):

        class Bad(CompiledModule):
            def f(self, x):
                return x


def test_assigning_a_non_global_is_an_error():
    class Assign(CompiledModule):
        def f(self, x=AbstractTensor(2)):
            self.y = x
            return x

    with pytest.raises(CompiledModuleError, match="only exported globals"):
        Assign()


def test_signature_info_arg_device():
    class Placed(CompiledModule):
        @CompiledModule.signature_info(arg_device={0: DeviceAffinity(0), 1: DeviceAffinity(1)})
        def f(self, x=AbstractTensor(2), y=AbstractTensor(2)):
            return x

    ir = _ir(Placed())
    assert "iree.abi.affinity = #hal.device.promise<@__device_0>" in ir
    assert "iree.abi.affinity = #hal.device.promise<@__device_1>" in ir


def test_import_phase_members_and_parse():
    assert ImportPhase.TORCH_IR == 0 and ImportPhase.TORCH is ImportPhase.TORCH_IR
    assert (
        ImportPhase.CUSTOM_OP_EXPANSION == 1
        and ImportPhase.IMPORT is ImportPhase.CUSTOM_OP_EXPANSION
    )
    assert ImportPhase.IREE_INTERNAL == 2 and ImportPhase.FULL is ImportPhase.IREE_INTERNAL
    assert [p.name for p in ImportPhase] == ["TORCH_IR", "CUSTOM_OP_EXPANSION", "IREE_INTERNAL"]
    assert ImportPhase.parse(None) is ImportPhase.IMPORT
    assert ImportPhase.parse("torch_ir") is ImportPhase.parse("torch") is ImportPhase.TORCH_IR
    assert ImportPhase.parse("IREE-internal") is ImportPhase.FULL
    with pytest.raises(ValueError, match="unknown import phase 'bogus'"):
        ImportPhase.parse("bogus")


def test_construction_traces_everything_import_to_picks_later_phases():
    # import_to=None is the IMPORT phase (the reference's ImportPhase.parse(None)), fully traced.
    inst = StatefulModule(import_to=None)
    info = CompiledModule.get_info(inst)
    assert info.current_import_phase == ImportPhase.IMPORT
    ir = _ir(inst)
    assert "func.func @accumulate" in ir and "util.global private mutable @_state.global" in ir
    # import_to="torch" traces as much, and stops before custom-op expansion.
    torch_inst = StatefulModule(import_to="torch")
    assert CompiledModule.get_info(torch_inst).current_import_phase == ImportPhase.TORCH_IR
    assert "func.func @accumulate" in _ir(torch_inst)
    CompiledModule.run_import(torch_inst, None)  # None means IMPORT here too
    assert CompiledModule.get_info(torch_inst).current_import_phase == ImportPhase.IMPORT
    CompiledModule.run_import(inst, "iree_internal")
    assert info.current_import_phase == ImportPhase.FULL
    ir = _ir(inst)
    assert "util.func public @accumulate" in ir and "!hal.buffer_view" in ir
    CompiledModule.run_import(inst, "torch")  # going back is a no-op
    assert info.current_import_phase == ImportPhase.FULL
    with pytest.raises(ValueError, match="unknown import phase 'bogus'"):
        CompiledModule.run_import(inst, "bogus")


def test_full_phase_of_export_compiles_and_runs(iree_device):
    out = export(StatefulModule)
    out.import_to("full")
    assert "util.func public @accumulate" in str(out.mlir_module)
    vmfb = out.compile(None, target_backends=None, extra_args=iree_device.compile_args)
    m = iree_device.load(bytes(vmfb.map_memory()))
    x = torch.arange(4, dtype=torch.float32)
    torch.testing.assert_close(torch.from_numpy(m.accumulate(x.numpy()).to_host()), x)


def test_run_pass_pipeline(capfd):
    class Foldable(CompiledModule):
        def f(self, x=AbstractTensor(4)):
            y = IREE.tensor_reshape(x, 2, 2)
            return IREE.tensor_reshape(y, 4)

    inst = Foldable()
    CompiledModule.run_pass_pipeline(inst, "builtin.module(canonicalize)", enable_ir_printing=True)
    assert "IR Dump" in capfd.readouterr().err
    with pytest.raises(CompileError, match="no-such-pass"):
        CompiledModule.run_pass_pipeline(inst, "builtin.module(no-such-pass)")


def test_save_mlir_text_and_bytecode(tmp_path):
    inst = BasicModule()
    CompiledModule.save_mlir(inst, tmp_path / "m.mlir")
    CompiledModule.save_mlir(inst, tmp_path / "m.mlirbc")
    text = (tmp_path / "m.mlir").read_text()
    assert "func.func @identity" in text
    data = (tmp_path / "m.mlirbc").read_bytes()
    assert data[:4] == b"ML\xefR"
    from iree.compiler.tools.binaries import find_tool

    printed = subprocess.run(
        [find_tool("iree-opt"), str(tmp_path / "m.mlirbc")], capture_output=True, text=True
    )
    assert "func.func @identity" in printed.stdout, printed.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mlir", "m.mlirbc"]  # no temp files


def test_given_context_and_module_op():
    from turbine_ir.ir import Context, Location

    ctx = Context()
    with ctx, Location.unknown():
        module = Module.create()
    inst = BasicModule(context=ctx, module_op=module.operation)
    assert CompiledModule.get_mlir_module(inst).context is ctx
    assert "func.func @identity" in str(module)
    CompiledModule.run_import(inst, "full")  # no session of ours: round trip through bytecode
    assert "util.func public @identity" in str(CompiledModule.get_mlir_module(inst))


def test_failing_procedure_leaves_the_module_as_it_was(iree_device):
    """A procedure whose Python body raises leaves no half-built func.func in a module shared
    with other CompiledModules: the user's exception propagates, the module still verifies,
    compiles and runs."""
    import numpy as np

    from turbine_ir.ir import Context, Location

    ctx = Context()
    with ctx, Location.unknown():
        module = Module.create()
    BasicModule(context=ctx, module_op=module.operation)
    before = str(module)

    class Broken(CompiledModule):
        def flat(self, x=AbstractTensor(2, 2)):
            IREE.tensor_reshape(x, 4)  # IR is emitted before the failure
            raise RuntimeError("the user's own error")

    with pytest.raises(RuntimeError, match="the user's own error"):
        Broken(context=ctx, module_op=module.operation)
    assert str(module) == before
    assert "flat" not in str(module)
    module.operation.verify()
    m = iree_device.load(iree_device.compile(str(module), extra_args=FAST))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(np.asarray(m.identity(x).to_host()), x)


@jittable
def _scaled_add(a, b):
    return a * 2.0 + b


class JitModule(CompiledModule):
    total = export_global(torch.zeros(3), mutable=True)

    @jittable
    def _relu(x):  # a jittable class attribute, called as self._relu(...)
        return torch.relu(x)

    def accumulate(self, x=AbstractTensor(3)):
        self.total = _scaled_add(x, self.total)
        return self._relu(self.total)

    def batch(self, x=AbstractTensor(None, 3)):
        return _scaled_add(x, x), self._relu(x)


def test_jittable_in_procedures_with_state():
    from turbine_aot.runtime import load_module

    out = export(JitModule)
    ir = str(out.mlir_module)
    assert "func.func private" in ir and "call @" in ir
    m = load_module(out.compile(None, extra_args=FAST))
    x = torch.tensor([1.0, -2.0, 3.0])
    want = torch.zeros(3)
    for _ in range(3):
        got = m.accumulate(x)
        want = x * 2.0 + want
    torch.testing.assert_close(got, torch.relu(want))
    xb = torch.randn(5, 3)
    s, r = m.batch(xb)
    torch.testing.assert_close(s, xb * 3.0)
    torch.testing.assert_close(r, torch.relu(xb))


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.bn = torch.nn.BatchNorm1d(2)


def test_the_four_globals_exporters():
    from turbine_aot import export_buffers, export_global_tree, export_parameters
    from turbine_aot.runtime import load_module

    net = _Net()
    net.bn.running_mean.copy_(torch.tensor([0.5, -0.5]))

    class Globals(CompiledModule):
        params = export_parameters(net)
        buffers = export_buffers(net)
        tree = export_global_tree({"a": torch.ones(2), "b": torch.full((2,), 3.0)}, mutable=True)

        def read(self):
            return self.params["fc.weight"], self.buffers["bn.running_mean"], self.tree["b"]

        def write_a(self, x=AbstractTensor(2)):
            self.tree["a"] = x

        def read_a(self):
            return self.tree["a"]

    out = export(Globals)
    m = load_module(out.compile(None, extra_args=FAST))
    w, mean, b = m.read()
    torch.testing.assert_close(w, net.fc.weight.detach())
    torch.testing.assert_close(mean, net.bn.running_mean)
    torch.testing.assert_close(b, torch.full((2,), 3.0))
    m.write_a(torch.tensor([7.0, 8.0]))
    torch.testing.assert_close(m.read_a(), torch.tensor([7.0, 8.0]))


def test_exported_program_as_class_attribute():
    from turbine_aot.runtime import load_module

    net = torch.nn.Linear(3, 2)
    program = torch.export.export(net, (torch.randn(4, 3),))

    class Mixed(CompiledModule):
        forward = program  # imported as the public function @forward

        def scale(self, x=AbstractTensor(4, 2)):
            return x

    out = export(Mixed)
    ir = str(out.mlir_module)
    assert "func.func @forward(" in ir and "func.func @scale(" in ir
    assert "util.global private @__auto.weight" in ir
    m = load_module(out.compile(None, extra_args=FAST))
    x = torch.randn(4, 3)
    torch.testing.assert_close(m.forward(x), net(x), rtol=1e-5, atol=1e-5)


class _SumProd(torch.nn.Module):
    def forward(self, x, y):
        return {"sum": x + y, "prod": x * y}


def test_private_exported_program_called_from_a_procedure():
    from turbine_aot.runtime import load_module

    program = torch.export.export(_SumProd(), (torch.zeros(3), torch.zeros(3)))

    class Calls(CompiledModule):
        _compute = program  # private: func.func private @_compute, callable from procedures

        def main(self, x=AbstractTensor(3), y=AbstractTensor(3)):
            r = self._compute(x, y)  # the result is rebuilt with the program's out_spec
            return r["prod"], r["sum"]

    out = export(Calls)
    _check_ir(
        str(out.mlir_module),
        r"func.func private @_compute\(%arg0: !torch.vtensor<\[3\],f32>, %arg1: "
        r"!torch.vtensor<\[3\],f32>\) -> \(!torch.vtensor<\[3\],f32>, !torch.vtensor<\[3\],f32>\)",
        r"func.func @main\(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>\)",
        r"%0 = torch_c.from_builtin_tensor %arg0 : tensor<3xf32> -> !torch.vtensor<\[3\],f32>",
        r"%1 = torch_c.from_builtin_tensor %arg1 : tensor<3xf32> -> !torch.vtensor<\[3\],f32>",
        r"%2:2 = call @_compute\(%0, %1\)",
        r"%3 = torch_c.to_builtin_tensor %2#0 : !torch.vtensor<\[3\],f32> -> tensor<3xf32>",
        r"%4 = torch_c.to_builtin_tensor %2#1",
        r"return %4, %3 : tensor<3xf32>, tensor<3xf32>",
    )
    m = load_module(out.compile(None, extra_args=FAST))
    x, y = torch.randn(3), torch.randn(3)
    prod, total = m.main(x, y)
    torch.testing.assert_close(prod, x * y)
    torch.testing.assert_close(total, x + y)


def test_calling_exported_programs_wrongly_is_a_value_error():
    program = torch.export.export(_SumProd(), (torch.zeros(3), torch.zeros(3)))

    class CallsPublic(CompiledModule):
        compute = program

        def main(self, x=AbstractTensor(3)):
            return self.compute(x, x)

    with pytest.raises(ValueError, match="only private ExportedPrograms can be called"):
        CallsPublic()

    class WrongArity(CompiledModule):
        _compute = program

        def main(self, x=AbstractTensor(3)):
            return self._compute(x)

    with pytest.raises(ValueError, match=r"Mismatched arguments to exported program '_compute'"):
        WrongArity()


class _Structured(torch.nn.Module):
    def forward(self, pair, foobar):
        a, b = pair
        return a * b + foobar


def test_an_exported_program_is_called_with_its_leaves_flat():
    # The reference's own test: exported with args=([t1, t2],), kwargs={"foobar": t3} and called
    # as self._compute(t1, t2, foobar=t3): another structure, the same leaves in number, order
    # and type, is accepted (it was "Mismatched arguments to exported program").
    from turbine_aot.runtime import load_module

    t1, t2, t3 = torch.zeros(3), torch.zeros(3), torch.zeros(3)  # distinct: torch.export ties
    program = torch.export.export(_Structured(), args=([t1, t2],), kwargs={"foobar": t3})

    class Calls(CompiledModule):
        _compute = program

        def main(self, a=AbstractTensor(3), b=AbstractTensor(3), c=AbstractTensor(3)):
            return self._compute(a, b, foobar=c)

    out = export(Calls)
    _check_ir(
        str(out.mlir_module),
        r"func.func private @_compute\(%arg0: !torch.vtensor<\[3\],f32>, %arg1: "
        r"!torch.vtensor<\[3\],f32>, %arg2: !torch.vtensor<\[3\],f32>\)",
        r"func.func @main\(%arg0: tensor<3xf32>, %arg1: tensor<3xf32>, %arg2: tensor<3xf32>\)",
        r"%3 = call @_compute\(%0, %1, %2\)",
    )
    m = load_module(out.compile(None, extra_args=FAST))
    a, b, c = torch.randn(3), torch.randn(3), torch.randn(3)
    torch.testing.assert_close(m.main(a, b, c), a * b + c)

    class WrongType(CompiledModule):
        _compute = program

        def main(self, a=AbstractTensor(3), b=AbstractTensor(3), c=AbstractTensor(4)):
            return self._compute(a, b, foobar=c)

    with pytest.raises(
        ValueError,
        match=r"call of exported program '_compute': argument 2 has type tensor<4xf32>, the "
        r"program takes tensor<3xf32>",
    ):
        WrongType()

    class WrongCount(CompiledModule):
        _compute = program

        def main(self, a=AbstractTensor(3), b=AbstractTensor(3)):
            return self._compute(a, foobar=b)

    with pytest.raises(
        ValueError,
        match=r"Mismatched arguments to exported program '_compute': 2 flattened arguments "
        r"given, it was exported with 3",
    ):
        WrongCount()


def test_exported_program_wrapper_values_are_unwrapped():
    # FxPrograms.programs values wrap the program as `.target` (with `.arg_device`).
    program = torch.export.export(_SumProd(), (torch.zeros(3), torch.zeros(3)))

    class Wrapped:
        def __init__(self, target, arg_device=None):
            self.target = target
            self.arg_device = arg_device

    class FromWrapper(CompiledModule):
        forward = Wrapped(program, {0: DeviceAffinity(1)})

    ir = _ir(FromWrapper())
    assert "func.func @forward(" in ir
    assert "iree.abi.affinity = #hal.device.promise<@__device_1>" in ir


def test_compiled_module_jittable_and_self_jittables():
    from turbine_aot.runtime import load_module
    from turbine_fx import jittable as fx_jittable

    assert CompiledModule.jittable is fx_jittable

    class SelfJit(CompiledModule):
        @CompiledModule.jittable
        def compute(x):  # a public jittable member: not a procedure, callable through self
            return x * 2 + 1

        def main(self, x=AbstractTensor(3)):
            return self.compute(x)

    out = export(SelfJit)
    _check_ir(
        str(out.mlir_module),
        r"func.func @main\(%arg0: tensor<3xf32>\) -> tensor<3xf32>",
        r"torch_c.from_builtin_tensor %arg0",
        r"call @compute\(%0\)",
        r"torch_c.to_builtin_tensor %1",
        r"func.func private @compute\(",
        r"torch.aten.mul.Scalar",
    )
    assert "func.func @compute" not in str(out.mlir_module)
    m = load_module(out.compile(None, extra_args=FAST))
    x = torch.randn(3)
    torch.testing.assert_close(m.main(x), x * 2 + 1)


def test_global_trees_returned_and_assigned_through_calls():
    from turbine_aot.runtime import load_module

    class Trees(CompiledModule):
        tree = export_global_tree({"a": torch.ones(2), "b": torch.zeros(2)}, mutable=True)

        def all(self):
            return self.tree  # a whole tree of globals as the result

        def set_b(self, x=AbstractTensor(2)):
            t = self.all()  # a call returning a tree
            self.tree = {"a": t["a"], "b": x}  # tree assignment, leaf by leaf

    out = export(Trees)
    m = load_module(out.compile(None, extra_args=FAST))
    x = torch.tensor([5.0, 6.0])
    m.set_b(x)
    a, b = m.all()
    torch.testing.assert_close(a, torch.ones(2))
    torch.testing.assert_close(b, x)
