"""export() in its four forms, ExportOutput (IR access, phases, compile to memory/file/Output,
targets and flags, diagnostics), and end-to-end models with dynamic batch compiled for llvm-cpu
and compared with eager PyTorch."""

# ruff: noqa: B008
from __future__ import annotations

import re
import warnings

import pytest
import torch
from iree.compiler.api import Output
from torch import nn

import turbine_aot as aot
from turbine_aot import CompiledModule, CompileError, ExportError, ExportOutput, export
from turbine_aot.builtins import AbstractTensor
from turbine_aot.runtime import load_module

# Compile flags for tests that check behaviour, not turbine's default optimization flags
# (data tiling + ukernels triple compile time); the defaults are compiled in test_export.py.
FAST = ["--iree-opt-data-tiling=false", "--iree-llvmcpu-enable-ukernels=none"]

torch.manual_seed(0)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(16, 32)
        self.l2 = nn.Linear(32, 32)
        self.l3 = nn.Linear(32, 8)

    def forward(self, x):
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv1(x)))
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.head(x.mean(dim=(2, 3)))


class DecoderBlock(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


class TinyDecoder(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 32, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(16, d) * 0.02)
        self.blocks = nn.ModuleList(DecoderBlock(d) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


def _batch_dim():
    return torch.export.Dim("batch", min=1, max=64)


# ---- end to end: models with dynamic batch -----------------------------------------------------
@pytest.mark.parametrize(
    ("model_cls", "make_input", "tol"),
    [
        (MLP, lambda n: torch.randn(n, 16), 1e-4),
        (SmallCNN, lambda n: torch.randn(n, 3, 16, 16), 1e-4),
        (TinyDecoder, lambda n: torch.randint(0, 64, (n, 8)), 2e-4),
    ],
    ids=["mlp", "cnn", "decoder"],
)
def test_model_dynamic_batch_matches_eager(model_cls, make_input, tol):
    model = model_cls().eval()
    if model_cls is TinyDecoder:  # dynamic batch and sequence length
        seq = torch.export.Dim("seq", min=2, max=16)
        dynamic_shapes = {"ids": {0: _batch_dim(), 1: seq}}
    else:
        dynamic_shapes = {"x": {0: _batch_dim()}}
    out = export(model, args=(make_input(2),), dynamic_shapes=dynamic_shapes)
    assert re.search(r"func.func @main\(%arg0: !torch.vtensor<\[\?,", str(out.mlir_module))
    loaded = load_module(out.compile(None))  # turbine's default flags for the host CPU
    for n in (1, 5):
        x = make_input(n)
        if model_cls is TinyDecoder and n == 5:
            x = x[:, :3]  # another sequence length
        with torch.no_grad():
            want = model(x)
        torch.testing.assert_close(loaded.main(x), want, rtol=tol, atol=tol)


# ---- the four export forms -------------------------------------------------------------------
def test_export_exported_program_and_names():
    model = MLP().eval()
    x = torch.randn(3, 16)
    program = torch.export.export(model, (x,))
    out = export(program, module_name="mlp", function_name="forward_fn")
    ir = str(out.mlir_module)
    assert re.search(r"module @mlp\b", ir) and "func.func @forward_fn(" in ir
    assert "util.global private @__auto.l1.weight" in ir
    loaded = load_module(out.compile(None, extra_args=FAST))
    torch.testing.assert_close(loaded.forward_fn(x), model(x), rtol=1e-4, atol=1e-4)


def test_export_compiled_module_class():
    class Echo(CompiledModule):
        def run(self, x=AbstractTensor(None, 3)):
            return x

    out = export(Echo)
    assert isinstance(out, ExportOutput)
    assert re.search(r"module @echo\b", str(out.mlir_module))
    renamed = export(Echo, module_name="other")
    assert re.search(r"module @other\b", str(renamed.mlir_module))
    with pytest.raises(ValueError, match=r"arguments \['args'\] are not allowed"):
        export(Echo, args=(torch.zeros(1),))
    with pytest.raises(TypeError, match="not an instance"):
        export(Echo(import_to=None))


def test_export_fx_programs():
    try:
        fx_builder_type = aot.FxProgramsBuilder
    except AttributeError:
        pytest.skip("turbine_fx does not provide FxProgramsBuilder in this checkout")
    model = MLP().eval()
    fxb = fx_builder_type(model)
    x = torch.randn(2, 16)

    @fxb.export_program(args=(x,), name="forward")
    def _forward(m, x):
        return m(x)

    @fxb.export_program(args=(x,), name="doubled")
    def _doubled(m, x):
        return m(x) * 2

    out = export(fxb)
    ir = str(out.mlir_module)
    assert "func.func @forward(" in ir and "func.func @doubled(" in ir
    assert ir.count("util.global private @__auto.l1.weight") == 1  # shared, not duplicated
    loaded = load_module(out.compile(None, extra_args=FAST))
    torch.testing.assert_close(loaded.doubled(x), model(x) * 2, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(loaded.forward(x), model(x), rtol=1e-4, atol=1e-4)


def test_export_kwargs_and_deprecated_positional_args():
    class Scale(nn.Module):
        def forward(self, x, *, factor):
            return x * factor

    x, f = torch.randn(4), torch.randn(4)
    out = export(Scale(), args=(x,), kwargs={"factor": f}, strict_export=False)
    torch.testing.assert_close(load_module(out.compile(None, extra_args=FAST)).main(x, f), x * f)
    with pytest.warns(DeprecationWarning, match="positionally is deprecated"):
        export(MLP(), torch.randn(2, 16))


def test_export_argument_errors():
    with pytest.raises(ValueError, match="both positionally and as args="):
        export(MLP(), torch.randn(2, 16), args=(torch.randn(2, 16),))
    with pytest.raises(TypeError, match=r"export\(\) accepts an nn\.Module"):
        export(lambda x: x)
    with pytest.raises(TypeError, match=r"got builtins\.int"):
        export(3)
    program = torch.export.export(MLP(), (torch.randn(2, 16),))
    with pytest.raises(ValueError, match="already fixed by the program"):
        export(program, args=(torch.randn(2, 16),))


def test_torch_export_failure_is_an_export_error():
    class DataDependent(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.export refuses it
                return x
            return -x

    with pytest.raises(ExportError, match=r"torch\.export\.export of DataDependent failed"):
        export(DataDependent(), args=(torch.randn(3),))


def test_arg_device_affinity():
    from turbine_aot import DeviceAffinity

    class Add(nn.Module):
        def forward(self, a, b):
            return a + b

    out = export(
        Add(),
        args=(torch.randn(2), torch.randn(2)),
        arg_device={0: DeviceAffinity(0), 1: DeviceAffinity(1)},
    )
    ir = str(out.mlir_module)
    assert "#hal.device.promise<@__device_0>" in ir and "#hal.device.promise<@__device_1>" in ir


# ---- ExportOutput ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlp_output():
    model = MLP().eval()
    return model, export(model, args=(torch.randn(2, 16),))


def test_export_output_ir_access(mlp_output, tmp_path, capsys):
    _, out = mlp_output
    out.verify()
    out.print_readable()
    printed = capsys.readouterr().out
    assert "func.func @main" in printed and "dense_resource" in printed
    assert "torch_tensor_32_16_torch.float32:" not in printed  # the 2 KiB weight blob is elided
    out.print_readable(large_elements_limit=1 << 20)
    assert "torch_tensor_32_16_torch.float32:" in capsys.readouterr().out
    out.save_mlir(tmp_path / "m.mlir")
    out.save_mlir(tmp_path / "m.mlirbc")
    assert "func.func @main" in (tmp_path / "m.mlir").read_text()
    assert (tmp_path / "m.mlirbc").read_bytes()[:4] == b"ML\xefR"
    assert out.session is not None and out.compiled_module is not None


def test_compile_to_memory_file_and_output(mlp_output, tmp_path):
    model, out = mlp_output
    x = torch.randn(2, 16)
    mem = out.compile(None)
    data = bytes(mem.map_memory())
    torch.testing.assert_close(load_module(data).main(x), model(x), rtol=1e-4, atol=1e-4)
    path = tmp_path / "sub" / "m.vmfb"
    assert out.compile(path) is None
    assert path.read_bytes()[:2] == data[:2] == b"PK"  # a .vmfb is a zip-framed FlatBuffer
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.vmfb"]  # no temp left behind
    torch.testing.assert_close(load_module(str(path)).main(x), model(x), rtol=1e-4, atol=1e-4)
    target = Output.open_membuffer()
    assert out.compile(target, extra_args=FAST) is None
    torch.testing.assert_close(
        load_module(bytes(target.map_memory())).main(x), model(x), rtol=1e-4, atol=1e-4
    )


def test_compile_targets_and_flags(mlp_output):
    model, out = mlp_output
    x = torch.randn(2, 16)
    for kwargs in (
        {"target_device": "llvm-cpu"},
        {"target_backends": "llvm-cpu", "host_cpu": False},
        {"extra_args": ["--iree-llvmcpu-target-cpu=generic", "--iree-opt-data-tiling=false"]},
        {"target_backends": ["vmvx"]},
    ):
        loaded = load_module(out.compile(None, **kwargs))
        torch.testing.assert_close(loaded.main(x), model(x), rtol=1e-4, atol=1e-4)


def test_compile_flags_defaults_and_overrides():
    from turbine_aot._compiler.flags import compile_flags_for

    flags = compile_flags_for()
    assert "--iree-hal-target-device=local" in flags
    assert "--iree-hal-local-target-device-backends=llvm-cpu" in flags
    assert "--iree-llvmcpu-target-cpu=host" in flags
    generic = compile_flags_for(extra_args=["--iree-llvmcpu-target-cpu=generic"])
    assert "--iree-llvmcpu-target-cpu=host" not in generic
    assert "--iree-llvmcpu-target-cpu=generic" in generic
    multi = compile_flags_for(target_device=["llvm-cpu", "llvm-cpu"])
    # Identical targets get ordinals: IREE would merge two plain "local" into one device.
    assert multi[:2] == ["--iree-hal-target-device=local[0]", "--iree-hal-target-device=local[1]"]
    assert compile_flags_for(target_backends=None) == []
    assert compile_flags_for(target_backends="foo-gpu") == ["--iree-hal-target-backends=foo-gpu"]


def test_session_flags_are_honoured(mlp_output):
    model, _ = mlp_output
    out = export(model, args=(torch.randn(2, 16),))
    out.session.set_flags(
        "--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=vmvx"
    )
    loaded = load_module(out.compile(None, target_backends=None))
    x = torch.randn(2, 16)
    torch.testing.assert_close(loaded.main(x), model(x), rtol=1e-4, atol=1e-4)


def test_compile_error_carries_iree_diagnostics(mlp_output):
    _, out = mlp_output
    with pytest.raises(CompileError, match="no-such-flag") as bad_flag:
        out.compile(None, extra_args=["--iree-no-such-flag=1"])
    assert bad_flag.value.diagnostics

    class Unlowerable(nn.Module):
        def forward(self, x):
            return torch.ops.aten.cross_entropy_loss(x, torch.zeros(2, dtype=torch.long))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            bad = export(Unlowerable(), args=(torch.randn(2, 3),))
        except Exception as e:  # the importer may already refuse it
            pytest.skip(f"importer rejects the op before compile: {type(e).__name__}")
    with pytest.raises(CompileError) as info:
        bad.compile(None, extra_args=FAST)
    err = info.value
    # IREE's own messages, located at the user's source line of the failing op.
    assert err.errors and "failed to legalize" in str(err)
    assert "test_export.py" in err.errors[0].message
    assert "--iree-hal-target-device=local" in str(err)


def test_import_to_full_then_compile(mlp_output):
    model = MLP().eval()
    out = export(model, args=(torch.randn(2, 16),))
    out.import_to("full")
    assert "util.func public @main" in str(out.mlir_module)
    x = torch.randn(2, 16)
    torch.testing.assert_close(
        load_module(out.compile(None, extra_args=FAST)).main(x), model(x), rtol=1e-4, atol=1e-4
    )


def test_multi_device_compile_and_run():
    from turbine_aot import DeviceAffinity

    class Axpy(nn.Module):
        def forward(self, a, b):
            return a * 2 + b

    a, b = torch.randn(3), torch.randn(3)
    out = export(Axpy(), args=(a, b), arg_device={0: DeviceAffinity(0), 1: DeviceAffinity(1)})
    vmfb = out.compile(None, target_device=["llvm-cpu", "llvm-cpu"])
    loaded = load_module(vmfb, device=["local-task", "local-task"])
    torch.testing.assert_close(loaded.main(a, b), a * 2 + b)


def test_weights_placed_on_a_second_device():
    """``DeviceTensorTrait(1)`` on a weight: the global is placed on ``__device_1`` and the
    program, compiled for two CPU devices, matches eager."""
    from turbine_aot import DeviceAffinity, DeviceTensorTrait

    class Placed(nn.Module):
        def __init__(self):
            super().__init__()
            self.w0 = nn.Parameter(torch.randn(4))
            self.w1 = nn.Parameter(torch.randn(4))

        def forward(self, x, y):
            return x * self.w0 + y * self.w1

    model = Placed()
    DeviceTensorTrait(0).set(model.w0)
    DeviceTensorTrait(1).set(model.w1)
    x, y = torch.randn(4), torch.randn(4)
    out = export(model, args=(x, y), arg_device={0: DeviceAffinity(0), 1: DeviceAffinity(1)})
    assert "stream.affinity = #hal.device.promise<@__device_1>" in str(out.mlir_module)
    vmfb = out.compile(None, target_device=["llvm-cpu", "llvm-cpu"])
    loaded = load_module(vmfb, device=["local-task", "local-task"])
    torch.testing.assert_close(loaded.main(x, y), model(x, y))


def test_external_parameters_resolve_at_run_time(tmp_path):
    model = MLP().eval()
    aot.externalize_module_parameters(model)
    aot.save_module_parameters(tmp_path / "mlp.irpa", model)
    out = export(model, args=(torch.randn(2, 16),))
    ir = str(out.mlir_module)
    assert '#flow.parameter.named<"model"::"l1.weight">' in ir
    assert "dense_resource" not in ir  # no weight data in the module
    loaded = load_module(out.compile(None, extra_args=FAST), parameters=tmp_path / "mlp.irpa")
    x = torch.randn(2, 16)
    torch.testing.assert_close(loaded.main(x), model(x), rtol=1e-4, atol=1e-4)


def test_symbolic_shape_expressions():
    class Concat(nn.Module):
        def forward(self, x):
            return torch.cat([x, x], dim=0)

    dim = torch.export.Dim("n", min=2, max=32)
    kwargs = {"args": (torch.randn(4, 3),), "dynamic_shapes": {"x": {0: dim}}}
    plain = str(export(Concat(), **kwargs).mlir_module)
    out = export(Concat(), import_symbolic_shape_expressions=True, **kwargs)
    ir = str(out.mlir_module)
    assert "torch.bind_symbolic_shape" in ir and "torch.bind_symbolic_shape" not in plain
    x = torch.randn(5, 3)
    torch.testing.assert_close(
        load_module(out.compile(None, extra_args=FAST)).main(x), torch.cat([x, x])
    )


def test_verify_reports_broken_ir():
    out = export(MLP(), args=(torch.randn(2, 16),))
    module = out.mlir_module
    func = next(
        op for op in module.regions[0].blocks[0].operations if op.operation.name == "func.func"
    )
    block = func.regions[0].blocks[0]
    list(block.operations)[-1].erase()  # drop the terminator
    with pytest.raises(ExportError, match="failed verification"):
        out.verify()


def test_load_one_call_path(mlp_output, tmp_path):
    from turbine_aot.runtime import CompileCache

    model, out = mlp_output
    x = torch.randn(2, 16)
    compiled = out.load(cache=CompileCache(tmp_path / "cache"), compile_flags=FAST)
    torch.testing.assert_close(compiled.main(x), model(x), rtol=1e-4, atol=1e-4)


def test_tool_only_flags_fall_back_to_iree_compile(mlp_output):
    from turbine_aot._compiler.invoke import tool_only_flags

    model, out = mlp_output
    # A global option of the iree-compile tool, not a compiler-session option.
    flag = "--iree-dispatch-creation-experimental-set-data-tiling-ops=convolution"
    assert tool_only_flags([flag, "--iree-opt-data-tiling=true"]) == [flag]
    x = torch.randn(2, 16)
    loaded = load_module(out.compile(None, extra_args=[*FAST, flag]))
    torch.testing.assert_close(loaded.main(x), model(x), rtol=1e-4, atol=1e-4)


def test_export_torch_builtin_modules():
    # nn.Sequential / nn.Linear name their forward parameter `input` (a Python builtin name).
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    out = export(model, args=(torch.randn(3, 4),), dynamic_shapes={"input": {0: batch}})
    loaded = load_module(out.compile(None, extra_args=FAST))
    x = torch.randn(5, 4)
    torch.testing.assert_close(loaded.main(x), model(x), rtol=1e-5, atol=1e-5)


def test_written_files_get_the_usual_permissions(mlp_output, tmp_path):
    import os
    import stat

    _, out = mlp_output
    umask = os.umask(0)
    os.umask(umask)
    out.save_mlir(tmp_path / "m.mlir")
    out.compile(tmp_path / "m.vmfb", extra_args=FAST)
    for name in ("m.mlir", "m.vmfb"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name


def test_bf16_model_matches_eager():
    model = MLP().to(torch.bfloat16).eval()
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    out = export(model, args=(x,))
    loaded = load_module(out.compile(None, extra_args=FAST))
    torch.testing.assert_close(loaded.main(x), model(x), rtol=3e-2, atol=3e-2)


def test_export_output_over_a_deferred_instance():
    class Echo(CompiledModule):
        def run(self, x=AbstractTensor(3)):
            return x

    inst = Echo(import_to=None)
    out = ExportOutput(CompiledModule.get_info(inst).session, inst)
    x = torch.randn(3)
    torch.testing.assert_close(load_module(out.compile(None, extra_args=FAST)).run(x), x)
