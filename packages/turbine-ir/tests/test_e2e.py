"""End to end: modules built with ModuleBuilder, compiled with IREE and run, compared with torch.

Every test here takes the ``iree_device`` fixture, so the nox ``e2e-<device>`` sessions re-run it
on each backend. Each test compiles one small module.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from turbine_ir import (
    FunctionBuilder,
    GlobalAttributes,
    ModuleBuilder,
    attributes_from_argument_device_affinities,
    build_tensor_dim_value,
    ir,
    torch_tensor_type,
)
from turbine_ir.dialects import arith, util
from turbine_params import DeviceAffinity, DeviceTensorTrait, ExternalTensorTrait

_CPU = ("llvm-cpu", "llvm-cpu-sync")


def _new_builder() -> tuple[ir.Context, ModuleBuilder]:
    ctx = ir.Context()
    with ctx, ir.Location.unknown():
        return ctx, ModuleBuilder(ir.Module.create().operation)


def _define(mb: ModuleBuilder, name: str, arg_types, body, *, arg_attrs=None) -> None:
    """Adds ``func.func @name`` whose body is ``body(args) -> results``."""
    _, fop = mb.create_func_op(name, arg_types, argument_attributes=arg_attrs)
    fb = FunctionBuilder(module_builder=mb, func_op=fop)
    with fb.ip, fb.loc:
        fb.emit_return(*body(list(fop.arguments)))


def _load(sym: str, gtype: ir.Type) -> ir.Value:
    return util.GlobalLoadOp(gtype, sym).result


def _to_numpy_readable(v: ir.Value, dtype: torch.dtype) -> ir.Value:
    """Widens element types numpy/IREE results cannot carry (bf16, fp8 → f32; i1 → i8)."""
    rtt = ir.RankedTensorType(v.type)
    if dtype == torch.bool:
        return arith.ExtUIOp(torch_tensor_type(rtt.shape, torch.int8), v).result
    if dtype.is_floating_point and dtype.itemsize < 4:
        return arith.ExtFOp(torch_tensor_type(rtt.shape, torch.float32), v).result
    return v


def _expected(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.bool:
        return t.to(torch.int8)
    if t.dtype.is_floating_point and t.dtype.itemsize < 4:
        return t.to(torch.float32)
    if t.dtype == torch.uint8:
        return t.view(torch.int8)  # signless i8 comes back as int8
    return t


def _compile_run(iree_device, mb: ModuleBuilder, *, parameters=None):
    mb.finalize_construct()
    vmfb = iree_device.compile(str(mb.module_op))
    return iree_device.load(vmfb, parameters=parameters)


def _host(x) -> torch.Tensor:
    return torch.from_numpy(np.asarray(x.to_host()).copy())


INLINE_DTYPES = {
    "core": [
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int8,
        torch.uint8,
        torch.int32,
        torch.bool,
    ],
    "wide": [torch.int64, torch.complex64],
    "fp8": [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz],
}


def _inline_sample(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        return torch.rand(2, 5, generator=g) > 0.5
    if dtype == torch.complex64:
        return torch.complex(torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g))
    if dtype.is_floating_point:
        return (torch.randn(2, 5, generator=g) * 3).to(dtype)
    return torch.randint(-100 if dtype.is_signed else 0, 120, (2, 5), generator=g).to(dtype)


@pytest.mark.parametrize("group", list(INLINE_DTYPES))
def test_inline_globals_of_every_element_type(iree_device, group):
    if group == "fp8" and iree_device.name not in _CPU:
        # vmvx: "unhandled float element bit width 8"; SPIR-V: fp8 constants fail to legalize.
        pytest.skip(f"IREE 3.13 cannot compile float8 data for {iree_device.name}")
    dtypes = INLINE_DTYPES[group]
    tensors = [_inline_sample(d) for d in dtypes]
    ctx, mb = _new_builder()
    with ctx, ir.Location.unknown():
        globals_ = [
            mb.create_tensor_global(f"__auto.g{i}", t, attrs=GlobalAttributes())
            for i, t in enumerate(tensors)
        ]
        # A one-element (splat) global too.
        scalar = torch.tensor(2.5, dtype=torch.bfloat16)
        s_sym, _, s_type = mb.create_tensor_global("__auto.s", scalar, attrs=GlobalAttributes())

        def body(_args):
            outs = [
                _to_numpy_readable(_load(sym, gtype), t.dtype)
                for (sym, _, gtype), t in zip(globals_, tensors)
            ]
            return [*outs, _to_numpy_readable(_load(s_sym, s_type), torch.bfloat16)]

        _define(mb, "main", [], body)
        module = _compile_run(iree_device, mb)
    results = module.main()
    for t, r in zip([*tensors, scalar], results):
        torch.testing.assert_close(_host(r), _expected(t), rtol=0, atol=0)


def _write_irpa(path, entries: dict[str, torch.Tensor]) -> None:
    """Writes an archive with IREE's own tool (iree.runtime.ParameterIndex)."""
    import iree.runtime as rt

    index = rt.ParameterIndex()
    for key, t in entries.items():
        index.add_buffer(key, t.contiguous().numpy().tobytes())
    index.create_archive_file(str(path))


def test_external_globals_resolved_from_irpa_with_dynamic_dims(iree_device, tmp_path):
    w = torch.randn(4)
    b = torch.randn(4)
    ExternalTensorTrait("", "layer.w").set(w)  # empty scope -> "model"
    irpa = tmp_path / "params.irpa"
    _write_irpa(irpa, {"layer.w": w, "p.bias": b})
    ctx, mb = _new_builder()
    with ctx, ir.Location.unknown():
        w_sym, _, w_type = mb.create_tensor_global("__auto.w", w, attrs=GlobalAttributes())
        b_sym, _, b_type = mb.create_tensor_global(
            "__auto.b",
            torch.empty(4, device="meta"),
            attrs=GlobalAttributes(external=True, name_mapper=lambda n: "p." + n),
            logical_name="bias",
        )
        dyn = torch_tensor_type([None], torch.float32)

        def body(args):
            x, y = args
            s = arith.AddFOp(x, y).result  # dynamic-shaped arithmetic
            wb = arith.MulFOp(_load(w_sym, w_type), _load(b_sym, b_type)).result
            return [s, wb, build_tensor_dim_value(x, 0)]

        _define(mb, "main", [dyn, dyn], body)
        assert '#flow.parameter.named<"model"::"layer.w">' in str(mb.module_op)
        module = _compile_run(iree_device, mb, parameters={"model": irpa})
    for n in (3, 7):
        x, y = torch.randn(n), torch.randn(n)
        s, wb, dim = module.main(x.numpy(), y.numpy())
        torch.testing.assert_close(_host(s), x + y)
        torch.testing.assert_close(_host(wb), w * b)
        assert int(dim.to_host()) == n


def test_mutable_and_uninitialized_state_across_calls(iree_device):
    ctx, mb = _new_builder()
    with ctx, ir.Location.unknown():
        acc_sym, _, acc_type = mb.create_tensor_global(
            "__auto.acc", torch.zeros(3), attrs=GlobalAttributes(mutable=True, noinline=True)
        )
        dyn = torch_tensor_type([None], torch.float32)
        st_sym, _ = mb.create_typed_global(
            "__auto.state", dyn, attrs=GlobalAttributes(mutable=True, uninitialized=True)
        )

        def accumulate(args):
            new = arith.AddFOp(_load(acc_sym, acc_type), args[0]).result
            util.GlobalStoreOp(new, acc_sym)
            return [new]

        def set_state(args):
            util.GlobalStoreOp(args[0], st_sym)
            return []

        def get_state(_args):
            return [_load(st_sym, dyn)]

        _define(mb, "accumulate", [acc_type], accumulate)
        _define(mb, "set_state", [dyn], set_state)
        _define(mb, "get_state", [], get_state)
        assert "util.global private mutable @__auto.state : tensor<?xf32>" in str(mb.module_op)
        module = _compile_run(iree_device, mb)
    total = torch.zeros(3)
    for step in range(3):
        x = torch.full((3,), float(step + 1)) * torch.tensor([1.0, -2.0, 0.5])
        total = total + x
        torch.testing.assert_close(_host(module.accumulate(x.numpy())), total)
    for n in (2, 5):
        v = torch.randn(n)
        module.set_state(v.numpy())
        torch.testing.assert_close(_host(module.get_state()), v)


def test_device_affinities_compile_and_run(iree_device):
    t = torch.randn(4)
    DeviceTensorTrait(0).set(t)
    ctx, mb = _new_builder()
    with ctx, ir.Location.unknown():
        sym, _, gtype = mb.create_tensor_global("__auto.placed", t, attrs=GlobalAttributes())
        attrs = attributes_from_argument_device_affinities({0: DeviceAffinity(0)}, 1, ctx)

        def body(args):
            return [arith.AddFOp(args[0], _load(sym, gtype)).result]

        _define(mb, "main", [gtype], body, arg_attrs=attrs)
        text = str(mb.module_op)
        assert "stream.affinity = #hal.device.promise<@__device_0>" in text
        assert "iree.abi.affinity = #hal.device.promise<@__device_0>" in text
        module = _compile_run(iree_device, mb)
    x = torch.randn(4)
    torch.testing.assert_close(_host(module.main(x.numpy())), x + t)


def test_small_bf16_and_large_fp8_globals_in_arithmetic(iree_device):
    """The sizes where IREE 3.13 breaks on dense_resource of these types (see _resources.py)."""
    if iree_device.name == "vmvx":
        pytest.skip("IREE 3.13 vmvx cannot compile bf16 arithmetic ('vm.add.f32' on i32)")
    h = (torch.randn(16) * 3).to(torch.bfloat16)
    q = (torch.randn(1000) * 3).to(torch.float8_e4m3fn)
    with_fp8 = iree_device.name in _CPU
    ctx, mb = _new_builder()
    with ctx, ir.Location.unknown():
        h_sym, _, h_type = mb.create_tensor_global("__auto.h", h, attrs=GlobalAttributes())
        f32_16 = torch_tensor_type([16], torch.float32)

        def body(args):
            # bf16 cannot cross the numpy boundary: take f32 (exact bf16 values) and narrow.
            x = arith.TruncFOp(h_type, args[0]).result
            s = arith.AddFOp(x, _load(h_sym, h_type)).result
            return [arith.ExtFOp(f32_16, s).result]

        _define(mb, "add_h", [f32_16], body)
        if with_fp8:
            q_sym, _, q_type = mb.create_tensor_global("__auto.q", q, attrs=GlobalAttributes())
            f32_1000 = torch_tensor_type([1000], torch.float32)

            def body_q(args):
                wide = arith.ExtFOp(f32_1000, _load(q_sym, q_type)).result
                return [arith.MulFOp(args[0], wide).result]

            _define(mb, "mul_q", [f32_1000], body_q)
        module = _compile_run(iree_device, mb)
    x = (torch.randn(16) * 3).to(torch.bfloat16)
    got = _host(module.add_h(x.to(torch.float32).numpy()))
    # IREE may keep the fused add in f32 (no bf16 rounding before extf): bf16 tolerance.
    torch.testing.assert_close(got, (x + h).to(torch.float32), rtol=1.6e-2, atol=1e-5)
    if with_fp8:
        y = torch.randn(1000)
        torch.testing.assert_close(_host(module.mul_q(y.numpy())), y * q.to(torch.float32))


def test_module_parameters_through_turbine_params_archive(iree_device, tmp_path):
    """externalize_module_parameters + save_module_parameters → globals that resolve at run time.

    Tied weights (one Parameter under two names) become one global.
    """
    from turbine_params import externalize_module_parameters, save_module_parameters

    torch.manual_seed(3)
    lin = torch.nn.Linear(4, 4)
    model = torch.nn.Module()
    model.a = lin
    model.b = lin  # tied: the same Parameters under a second name
    model.register_buffer("scale", torch.randn(4).to(torch.bfloat16))
    externalize_module_parameters(model)
    path = tmp_path / "model.irpa"
    save_module_parameters(path, model)
    ctx, mb = _new_builder()
    with ctx, ir.Location.unknown():
        made = {
            name: mb.get_or_create_tensor_global(f"__auto.{name}", t, attrs=GlobalAttributes())
            for name, t in model.state_dict(keep_vars=True).items()
        }
        assert made["a.weight"][0] == made["b.weight"][0] == "__auto.a.weight"
        assert str(mb.module_op).count("util.global") == 3
        f32 = torch_tensor_type([4], torch.float32)

        def body(_args):
            bias = _load(*made["b.bias"][::2])
            scale = arith.ExtFOp(f32, _load(*made["scale"][::2])).result
            return [arith.MulFOp(bias, scale).result, _load(*made["a.weight"][::2])]

        _define(mb, "main", [], body)
        text = str(mb.module_op)
        assert '#flow.parameter.named<"model"::"scale"> : tensor<4xbf16>' in text
        module = _compile_run(iree_device, mb, parameters={"model": path})
    out, weight = module.main()
    torch.testing.assert_close(_host(out), lin.bias.detach() * model.scale.float())
    torch.testing.assert_close(_host(weight), lin.weight.detach())
