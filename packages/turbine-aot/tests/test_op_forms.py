"""Ops IREE 3.13 cannot compile, or computes wrongly, as exported, in forms it compiles right
(``_compiler.op_forms``): f32 ``log10`` on llvm-cpu (matches float64; ``10 log10``: 2.5e-7
relative), ``fmod`` by a scalar on every backend, ``asinh`` of negative arguments, ``tan``, the
ELUs near 0, ``sinh``, ``atanh``, ``acosh`` and ``log_sigmoid`` on the CPU backends; each
upstream failure pinned."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import compile_copy_asm

from turbine_aot import export
from turbine_aot._compiler.flags import default_compile_flags
from turbine_aot.runtime import load_module


def _loaded(eo, device):
    """``eo`` compiled by turbine (its rewrites applied) for the test device and loaded."""
    vmfb = eo.compile(None, target_backends=None, extra_args=device.compile_args)
    return load_module(vmfb, device=device.driver)


class _Decibels(torch.nn.Module):
    def forward(self, power):
        return 10 * torch.log10(power)


def test_log10_is_written_as_log_and_computed_right():
    x = torch.cat([torch.logspace(-30, 30, 100001), torch.tensor([1.0, 10.0, 1000.0])])
    eo = export(_Decibels(), args=(x,))
    asm = compile_copy_asm(eo, default_compile_flags("llvm-cpu", use_env=False))
    assert "torch.aten.log10" not in asm and "torch.aten.log " in asm
    got = load_module(eo.compile(save_to=None)).main(x).double()
    exact = 10 * x.double().log10()
    torch.testing.assert_close(got, exact, rtol=2.5e-7, atol=0)  # eager's: 1.2e-7
    assert got[-3].item() == 0.0  # log(1) is exactly 0; log10(10) may be 1 ulp below 1
    odd = torch.tensor([0.0, -1.0, float("inf"), float("nan")])
    got = load_module(export(_Decibels(), args=(odd,)).compile(save_to=None)).main(odd)
    torch.testing.assert_close(got, _Decibels()(odd), equal_nan=True)


def test_iree_still_cannot_link_log10f(iree_device, tmp_path):
    """Why ``log10`` is rewritten: compiled as exported, IREE 3.13's llvm-cpu executable calls
    ``log10f``, which it does not link. When this test fails, IREE links it (or expands
    ``log10`` itself): drop ``_compiler.op_forms.rewrite_log10`` (docs/performance.md, section
    27)."""
    if iree_device.spec.target_backend != "llvm-cpu":
        pytest.skip(f"the missing log10f is llvm-cpu's; this run's device is {iree_device.name}")
    eo = export(_Decibels(), args=(torch.rand(64) + 0.1,))
    eo.save_mlir(str(tmp_path / "db.mlir"))
    with pytest.raises(Exception, match="undefined symbol: log10f"):
        iree_device.compile((tmp_path / "db.mlir").read_text())


class _Wrap(torch.nn.Module):
    def forward(self, x):
        return torch.fmod(x, 1.3)


def test_fmod_by_a_scalar_compiles_on_every_backend(iree_device, tmp_path):
    """torch-mlir cannot lower ``fmod.Scalar`` (pinned: the exported program fails to
    compile); turbine compiles it as ``fmod`` by a 0-d tensor: eager's values, except where
    ``x / 1.3`` rounds onto an integer (IREE's ``x - trunc(x / y) y``), one divisor away."""
    x = torch.linspace(-100, 100, 20001)
    eo = export(_Wrap(), args=(x,))
    eo.save_mlir(str(tmp_path / "fmod.mlir"))
    with pytest.raises(Exception, match="failed to legalize"):
        iree_device.compile((tmp_path / "fmod.mlir").read_text())
    got = _loaded(eo, iree_device).main(x)
    want = _Wrap()(x)
    off = (got - want).abs() > 1e-5
    assert off.float().mean() < 1e-3  # 4 of these 20001 points
    torch.testing.assert_close((got - want)[off].abs(), torch.full((int(off.sum()),), 1.3))


class _Asinh(torch.nn.Module):
    def forward(self, x):
        return torch.asinh(x)


def test_asinh_is_right_for_negative_arguments(iree_device, tmp_path):
    """IREE expands ``asinh`` as ``log(x + sqrt(x^2 + 1))``, which cancels for negative ``x``
    (pinned on llvm-cpu: more than 1e-4 off at -100 .. -10); turbine's form is within 2 ulp of
    float64 on the CPU backends, from 1e-30 to 1e30 in magnitude, both signs."""
    if iree_device.spec.target_backend not in ("llvm-cpu", "vmvx"):
        pytest.skip(
            f"asinh is rewritten for CPU targets only ({iree_device.name}: Vulkan's log1p is "
            "log(1 + y), on which the form is no better)"
        )
    mags = torch.logspace(-30, 30, 20001)
    x = torch.cat([mags, -mags, torch.tensor([0.0, float("inf"), float("-inf"), float("nan")])])
    eo = export(_Asinh(), args=(x,))
    got = _loaded(eo, iree_device).main(x)
    exact = torch.asinh(x.double())
    torch.testing.assert_close(got[:-3].double(), exact[:-3], rtol=2.5e-7, atol=1e-37)
    assert got[-3:-1].tolist() == [float("inf"), float("-inf")] and got[-1].isnan()
    if iree_device.spec.target_backend == "llvm-cpu":
        eo.save_mlir(str(tmp_path / "asinh.mlir"))
        raw = iree_device.load(iree_device.compile((tmp_path / "asinh.mlir").read_text()))
        wrong = torch.from_numpy(raw.main(x.numpy()).to_host())
        band = (x > -100) & (x < -10)
        assert (wrong[band].double() - exact[band]).abs().max() > 1e-4


class _Tan(torch.nn.Module):
    def forward(self, x):
        return torch.tan(x)


def test_tan_compiles_and_is_accurate_on_the_cpu_backends(iree_device, tmp_path):
    """vmvx has no lowering of ``math.tan`` (pinned: the exported program fails to compile);
    turbine writes it as ``sin / cos`` there (llvm-cpu: turbine's own ``tan``,
    ``test_cpu_trig.py``). Both within 2.5e-7 relative of float64 over -100 .. 100, poles
    included."""
    if iree_device.spec.target_backend not in ("llvm-cpu", "vmvx"):
        pytest.skip(
            f"tan is rewritten for CPU targets only ({iree_device.name} keeps IREE's, which is "
            "its sin over its cos: docs/turbine-aot.md, Known limitations)"
        )
    x = torch.linspace(-100.0, 100.0, 200001)
    eo = export(_Tan(), args=(x,))
    if iree_device.spec.target_backend == "vmvx":
        eo.save_mlir(str(tmp_path / "tan.mlir"))
        with pytest.raises(Exception, match=r"failed to legalize operation 'math.tan'"):
            iree_device.compile((tmp_path / "tan.mlir").read_text())
    got = _loaded(eo, iree_device).main(x)
    want = x.double().tan()
    assert ((got.double() - want).abs() / want.abs().clamp_min(1e-30)).max() <= 2.5e-7


class _Elus(torch.nn.Module):
    def forward(self, x):
        return (
            torch.nn.functional.elu(x),
            torch.nn.functional.elu(x, alpha=0.5),
            torch.nn.functional.selu(x),
            torch.nn.functional.celu(x, alpha=2.0),
        )


def test_elus_are_accurate_just_below_zero(iree_device, tmp_path):
    """torch-mlir lowers ELU / SELU / CELU with ``exp(x) - 1``, which cancels just below 0
    (pinned on llvm-cpu: more than 1e-5 off in relative terms); turbine's ``expm1`` form is
    within 2.5e-7 relative of float64 on the CPU backends, 2e-6 on Vulkan (lavapipe's
    ``expm1``; its ``exp(x) - 1`` was 100 % off), small arguments and large."""
    backend = iree_device.spec.target_backend
    if backend not in ("llvm-cpu", "vmvx", "vulkan-spirv"):
        pytest.skip(f"ELUs are rewritten for CPU targets and Vulkan ({iree_device.name})")
    x = torch.cat([torch.linspace(-1e-3, 1e-3, 20001), torch.linspace(-20, 20, 20001)])
    x = x[x != 0]
    eo = export(_Elus(), args=(x,))
    got = _loaded(eo, iree_device).main(x)
    exact = _Elus()(x.double())

    def worst(values):
        return max(((g.double() - w).abs() / w.abs()).max().item() for g, w in zip(values, exact))

    assert worst(got) <= (2e-6 if backend == "vulkan-spirv" else 2.5e-7)
    if backend == "llvm-cpu":
        eo.save_mlir(str(tmp_path / "elus.mlir"))
        raw = iree_device.load(iree_device.compile((tmp_path / "elus.mlir").read_text()))
        outs = raw.main(x.numpy())
        assert worst([torch.from_numpy(o.to_host()) for o in outs]) > 1e-5


class _Cancelling(torch.nn.Module):
    def forward(self, x, y, z, w):
        return torch.sinh(x), torch.atanh(y), torch.acosh(z), torch.nn.functional.logsigmoid(w)


def test_sinh_atanh_acosh_and_log_sigmoid_without_cancellation(iree_device, tmp_path):
    """IREE's ``sinh`` (near 0), ``atanh`` (near 0), ``acosh`` (near 1) and ``log_sigmoid``
    (large arguments) cancel (pinned on llvm-cpu: each more than 1e-6 off in relative terms,
    ``atanh`` more than 1e-3); turbine's forms are within 2.5e-7 relative of float64 on the
    CPU backends, with eager's values at +-0, +-1 and infinities."""
    if iree_device.spec.target_backend not in ("llvm-cpu", "vmvx"):
        pytest.skip(f"rewritten for CPU targets only ({iree_device.name}: log1p is log(1 + y))")
    n = 20001
    x = torch.cat([torch.linspace(-1e-3, 1e-3, n), torch.linspace(-80, 80, n)])
    y = torch.cat([torch.linspace(-1e-3, 1e-3, n), torch.linspace(-0.9999, 0.9999, n)])
    z = torch.cat([1 + torch.logspace(-7, -2, n), torch.logspace(0, 30, n)])
    w = torch.cat([torch.linspace(-80, 30, n), torch.linspace(-1e-3, 1e-3, n)])
    args = (x, y, z, w)
    eo = export(_Cancelling(), args=args)
    got = _loaded(eo, iree_device).main(*args)
    exact = _Cancelling()(*(a.double() for a in args))

    def errs(values):
        return [((g.double() - e).abs() / e.abs()).max().item() for g, e in zip(values, exact)]

    assert max(errs(got)) <= 2.5e-7
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan")])
    ones = torch.tensor([1.0, 1.0, 1.0, 1.0, float("inf"), 1.0, float("nan")])
    edge = (special, special, ones, special)
    sm = load_module(export(_Cancelling(), args=edge).compile(save_to=None))
    for g, e in zip(sm.main(*edge), _Cancelling()(*edge)):
        torch.testing.assert_close(g, e, rtol=2.5e-7, atol=0, equal_nan=True)
        assert torch.equal(g.signbit()[~e.isnan()], e.signbit()[~e.isnan()])
    if iree_device.spec.target_backend == "llvm-cpu":
        eo.save_mlir(str(tmp_path / "cancel.mlir"))
        raw = iree_device.load(iree_device.compile((tmp_path / "cancel.mlir").read_text()))
        outs = [torch.from_numpy(o.to_host()) for o in raw.main(*(a.numpy() for a in args))]
        sinh_err, atanh_err, acosh_err, logsig_err = errs(outs)
        assert min(sinh_err, acosh_err, logsig_err) > 1e-6 and atanh_err > 1e-3


class _Hyperbolic(torch.nn.Module):
    def forward(self, x):
        return torch.sinh(x), torch.cosh(x)


def test_sinh_and_cosh_stay_finite_up_to_their_overflow(iree_device):
    """``e^|x| / 2`` overflows from ``|x|`` = 88.7, ``sinh`` and ``cosh`` only from 89.4: turbine's
    forms are finite and within 4 ulp of float64 over 80 .. 89.4 (IREE's ``cosh`` and the
    former ``sinh`` form: inf from 88.7), inf beyond, on the CPU backends."""
    if iree_device.spec.target_backend not in ("llvm-cpu", "vmvx"):
        pytest.skip(f"rewritten for CPU targets only ({iree_device.name})")
    big = torch.linspace(80.0, 89.4, 4001)
    x = torch.cat([big, -big, torch.tensor([89.5, -89.5, 1.0, -0.5, 0.0])])
    eo = export(_Hyperbolic(), args=(x,))
    got = _loaded(eo, iree_device).main(x)
    for g, e in zip(got, _Hyperbolic()(x.double()), strict=True):
        finite = e.abs() < torch.finfo(torch.float32).max
        assert torch.isfinite(g[finite]).all()
        rel = (g[finite].double() - e[finite]).abs() / e[finite].abs().clamp_min(1e-30)
        assert rel.max() < 4.8e-7
        assert torch.equal(g[~finite], e[~finite].float())  # +-inf past the overflow


class _ArgReductions(torch.nn.Module):
    def forward(self, x):
        return (
            torch.argmax(x, 0),
            torch.argmin(x, 1, keepdim=True),
            torch.max(x, 0).indices,
            torch.min(x, 0, keepdim=True),
            torch.argmax(x, -1),
        )


def test_vulkan_index_reductions_run_over_the_innermost_dimension():
    """On Vulkan the copy reduces over the innermost dimension of the operand permuted; the
    innermost one (``argmax(x, -1)``) and other targets are left as they are."""
    eo = export(_ArgReductions(), args=(torch.randn(3, 4, 5),))
    vulkan = compile_copy_asm(eo, default_compile_flags("vulkan-spirv", use_env=False))
    # the four outer reductions, and the four over their NaN flags (_compiler.nan_forms)
    assert vulkan.count("torch.aten.permute") == 8
    assert vulkan.count("torch.aten.unsqueeze") == 4  # the keepdim ones
    cpu = compile_copy_asm(eo, default_compile_flags("llvm-cpu", use_env=False))
    assert "torch.aten.permute" not in cpu


def _vulkan_device(iree_device):
    if iree_device.name != "vulkan-spirv":
        pytest.skip(f"the zeros are Vulkan's; this run's device is {iree_device.name}")
    return iree_device


def test_vulkan_index_reductions_match_eager(iree_device):
    dev = _vulkan_device(iree_device)
    torch.manual_seed(0)
    for shape in [(3, 5), (2, 64), (7, 33, 4)]:
        x = torch.randn(*shape)
        eo = export(_ArgReductions(), args=(x,))
        got = _loaded(eo, dev).main(x)
        want = _ArgReductions()(x)
        for g, w in zip(got, [*want[:3], *want[3], want[4]], strict=True):
            assert torch.equal(g, w), shape


def test_iree_still_gives_zeros_for_argmax_over_an_outer_dimension_on_vulkan(iree_device, tmp_path):
    """Why Vulkan's index reductions are rewritten: compiled as exported, ``argmax(x, 0)`` of a
    ``[3, 5]`` tensor is all zeros on lavapipe. When this fails, drop
    ``rewrite_inner_index_reductions`` from ``rewrites.module_for_compile`` and this test."""
    dev = _vulkan_device(iree_device)

    class Argmax(torch.nn.Module):
        def forward(self, x):
            return torch.argmax(x, 0)

    x = torch.tensor([[0.5, 2.0, -1.0, 4.0, -3.0], [1.0, 5.0, 3.0, -2.0, 0.5]])
    export(Argmax(), args=(x,)).save_mlir(str(tmp_path / "argmax.mlir"))
    got = dev.load(dev.compile((tmp_path / "argmax.mlir").read_text())).main(x)
    got = got.to_host() if hasattr(got, "to_host") else got
    assert [int(v) for v in got] == [0] * 5  # eager: [1, 1, 1, 0, 1]


class _Signs(torch.nn.Module):
    def forward(self, x):
        return torch.isfinite(x), torch.signbit(x), torch.copysign(x.flip(0), x)


def test_isfinite_signbit_copysign_compile_and_match_eager(iree_device, tmp_path):
    """torch-mlir cannot lower them (pinned: the exported program fails to compile); turbine
    writes them in ops it lowers: eager's results for NaN, infinities, signed zeros."""
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([nan, -nan, inf, -inf, 0.0, -0.0, 1.5, -2.5, 1e-30, -1e30])
    eo = export(_Signs(), args=(x,))
    eo.save_mlir(str(tmp_path / "signs.mlir"))
    with pytest.raises(Exception, match="failed to legalize"):
        iree_device.compile((tmp_path / "signs.mlir").read_text())
    got = _loaded(eo, iree_device).main(x)
    want = _Signs()(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(got[2].isnan(), want[2].isnan())
    assert torch.equal(got[2].nan_to_num(0.0).signbit(), want[2].nan_to_num(0.0).signbit())
    assert torch.equal(got[2].nan_to_num(0.0), want[2].nan_to_num(0.0))
