"""The rewrite of the compile copy's 2-D convolutions onto the AVX-512 direct-convolution kernel
(:mod:`.avx512_conv`), applied by ``rewrites.module_for_compile`` where the fp32 matmul kernel is
the choice.

Each accepted ``torch.aten.convolution`` / ``conv2d`` becomes a call of a private function over
builtin tensors (IREE inlines it)::

    xp  = pad(transpose(x, NCHW -> NHWC))                   (one copy, the input's size)
    c   = flow.dispatch @kernel(xp, pack(w))
    out = transpose(c[:, :F] + b, NHWC -> NCHW)

With the epilogues (:mod:`.epilogues`, unless ``TURBINE_CPU_EPILOGUES=keep``) the bias, an
eval-mode batch norm after the convolution (as a per-channel scale and shift), a residual add
and a ReLU are done by the kernel in its last reduction block's store: the call replaces the
last of those ops; when that result is read only by another direct convolution with padding,
the kernel writes it zero-padded as that one reads it (``out_pad``) and IREE copies nothing in
between. Without them (or for what is not absorbed) the element-wise ops sit between a
transpose to NCHW and one back; IREE's element-wise fusion folds them into the one dispatch
that writes the next padded input, so the relayouts cost one pass over each activation
(docs/performance.md, sections 10 and 11). No ``util.optimization_barrier`` is needed: the
kernel's operands are read by a ``flow.dispatch`` IREE does not fuse into, and the producers
it sees read their inputs through permutations (the IREE 3.13 miscompile in :mod:`.convs` needs
a windowed ``linalg.generic``); ``tests/test_cpu_conv_avx512.py`` checks the shared-producer
case. Accepted: 2-D, fp32, groups 1, not transposed, static shapes (the batch too), any kernel
size, channels, stride, padding and dilation; the rest stays on :mod:`.convs`' path.

fp32 3x3 stride-1 convolutions that :func:`.winograd.winograd_choice` picks (many channels,
outputs of at least 7 x 7; ``TURBINE_CPU_WINOGRAD``) run in Winograd form instead: the same
padded input through an input transform, the AVX-512 matmul kernel over one transformed weight
per tile position, an output transform with the same epilogues and padded outputs
(:func:`_winograd_function`). Their transformed weight is a global of the compile copy that an
initializer computes at load from the weight's global (:func:`_winograd_weight`); a weight the
program computes keeps the direct kernel.

Depthwise convolutions (groups = channels = filters: MobileNet's, EfficientNet's, ConvNeXt's),
and grouped ones with as many filters as channels and up to 16 channels a group (RegNet's; those
of at most 8 groups are made dense before, by :mod:`.conv_forms`), go to :mod:`.depthwise`'s
kernel (:func:`depthwise_convs`, :func:`_depthwise_function`), fp32
whatever the precision, with a batch norm or per-channel steps and a ReLU in its store.

``precision="bf16"`` gives the kernel's bf16 form: the padded input is converted to bf16 in the
dispatch that writes it, the weight once. An odd channel count (an RGB stem) gets one zero
channel on the input (in the same padding) and on the weight, so pairs never straddle two taps;
no output is written pre-padded for a bf16 kernel (it reads bf16: a conversion pass stays).
On a CPU with AMX (``amx``), every convolution that is not dilated goes to the AMX convolution
kernel instead (:mod:`.amx_conv`; strided ones in space-to-depth form); its epilogue absorbs
the bias, a batch norm or per-channel steps, a residual add (whole panels) and a ReLU right
after them, and where the result is read by another AMX convolution at stride 1, or by a
strided one through its space-to-depth form (whole channel blocks, no channels to pad; not a
strided 1x1, which reads every other pixel; not where residual adds read a bf16 copy), the
kernel writes that one's padded bf16 input as a second result, in the layout it reads, which
the next call takes in place of its NCHW input (:func:`_amx_consumer`; a
max pooling after a ReLU likewise gets its padded input, :func:`_pool_consumer`: in bf16 where
only AMX kernels read the pooled result, the pooling then writing in turn their inputs and a
bf16 copy for the residual adds, :func:`_rewrite_bf16_pool`; else, or with
``TURBINE_CPU_POOLS=f32``, in f32). The fp32 AVX-512 kernel hands a ReLU'd result to a max
pooling after it the same way (:attr:`.avx512_conv.Avx512Conv.out_pad` = the pooling's padding;
ResNet's stem: no transpose, pad or barrier of IREE's between, one submission a call). A result
read only by AMX convolutions and residual adds that AMX kernels absorb is kept in bf16 only,
the adds reading it there (:func:`_residual_readers`: those residuals are rounded to bf16, as
the convolutions' inputs are; docs/performance.md, sections 8 and 18).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any, TypedDict

from .amx import AMX_FEATURES
from .amx import padded as amx_padded
from .amx_conv import AmxConv, AmxConvPlan, amx_conv_plan, amx_conv_supports
from .avx512 import AVX512_BF16_FEATURES
from .avx512_conv import Avx512Conv, conv_kernel_for
from .convs import Conv, conv_geometry
from .depthwise import DepthwiseConv
from .epilogues import (
    BatchNorm,
    channel_affine,
    depthwise_padded_outputs_enabled,
    eval_batch_norm,
    fusion_enabled,
    gates_enabled,
    only_user,
    padded_outputs_enabled,
    replace_with_absorbed,
    same_shape_add,
)
from .isa import kernel_features
from .matmuls import mark_cpu_requires
from .pools import (
    POOL_FUNC_PREFIX,
    MaxPool,
    max_pool_bf16_function,
    max_pool_function,
    max_pool_geometry,
    pools_in_bf16,
)
from .torch_ir import Builder, TensorType, TopLevel, constant, producer, walk
from .winograd import WinogradConv, winograd_choice

__all__ = ["depthwise_convs", "direct_convs", "rewrite_convs_avx512"]

_CONV_OPS = ("torch.aten.conv2d", "torch.aten.convolution")
_FUNC_PREFIX = "__turbine_avx512_conv"
#: The activations the direct and depthwise kernels apply in their store besides ReLU (a
#: squeeze-excitation's gate among them: its sigmoid, else computed again for every element of
#: the product it scales, docs/performance.md section 24).
_ACTIVATIONS = {
    "torch.aten.hardswish": "hardswish",
    "torch.aten.silu": "silu",
    "torch.aten.sigmoid": "sigmoid",
    "torch.aten.hardsigmoid": "hardsigmoid",
}


#: The gates among them (``TURBINE_CPU_EPILOGUES=no-gates`` leaves them to IREE).
_GATES = ("torch.aten.sigmoid", "torch.aten.hardsigmoid")


class _ActivationFields(TypedDict):
    """The kernels' activation fields other than ReLU."""

    hardswish: bool
    silu: bool
    sigmoid: bool
    hardsigmoid: bool


def _activation_fields(op_name: str | None) -> _ActivationFields:
    """The kernels' activation fields for the absorbed op ``op_name`` (all false for none)."""
    act = _ACTIVATIONS.get(op_name or "")
    return _ActivationFields(
        hardswish=act == "hardswish",
        silu=act == "silu",
        sigmoid=act == "sigmoid",
        hardsigmoid=act == "hardsigmoid",
    )


def _spec(op: Any) -> Conv | None:
    g = conv_geometry(op)
    if g is None or g.n is None:
        return None
    return g


def direct_convs(module_op: Any) -> list[Any]:
    """The (dense) convolutions of ``module_op`` that :func:`rewrite_convs_avx512` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name in _CONV_OPS and _spec(o) is not None]


def _depthwise_spec(op: Any) -> tuple[Conv, int] | None:
    """``(geometry, channels per group)`` of a depthwise convolution, or a grouped one with as
    many filters as channels and a group width dividing 16, else None."""
    g = conv_geometry(op, grouped=True)
    if g is None or g.n is None:
        return None
    width = g.c // int(constant(list(op.operands)[-1]))
    return (g, width) if 16 % width == 0 else None


def depthwise_convs(module_op: Any) -> list[Any]:
    """The depthwise (and narrow grouped) convolutions of ``module_op`` that
    :func:`rewrite_convs_avx512` puts on the depthwise kernel (fp32, static shapes;
    :mod:`.depthwise`)."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name in _CONV_OPS and _depthwise_spec(o) is not None]


def _tensor(*dims: int) -> str:
    return "tensor<" + "x".join(str(d) for d in dims) + "xf32>"


def _truncf_1d(result: str, src: str, size: int) -> str:
    """``result = bf16(src)`` over a 1-D f32 tensor of ``size`` elements."""
    bf_t = f"tensor<{size}xbf16>"
    return (
        f"  {result}_init = tensor.empty() : {bf_t}\n"
        f"  {result} = linalg.generic {{indexing_maps = [affine_map<(i) -> (i)>, "
        f'affine_map<(i) -> (i)>], iterator_types = ["parallel"]}} ins({src} : {_tensor(size)}) '
        f"outs({result}_init : {bf_t}) {{\n"
        "  ^bb0(%tv: f32, %to: bf16):\n"
        "    %tt = arith.truncf %tv : f32 to bf16\n"
        "    linalg.yield %tt : bf16\n"
        f"  }} -> {bf_t}"
    )


def _function(
    name: str,
    kernel: Avx512Conv,
    bn_eps: float | None = None,
    padded_input: bool = False,
    channels: int | None = None,
    affine: list[tuple[str, list[Any]]] | None = None,
) -> str:
    """The private function computing the convolution through ``kernel`` (builtin tensors).

    Its arguments: ``%x`` (NCHW; ``padded_input``: the previous kernel's zero-padded NHWC
    output as this kernel reads it, flat), ``%w``, the bias ``%b`` if the convolution has one,
    then for the kernel's epilogue (:mod:`.epilogues`) a batch norm's ``%gamma``, ``%beta``,
    ``%mean``, ``%var`` (``bn_eps`` given: folded into the kernel's scale and shift) or the
    per-channel parameters ``%p<i>`` of ``affine`` (``(kind, sizes)`` steps: ``sub``, ``mul``,
    ``add``, folded the same way), and the residual ``%res`` (NCHW, the output's shape). It
    returns the NCHW output and, for a kernel with :attr:`Avx512Conv.out_pad`, C as the next
    convolution reads it (flat). ``channels``: the convolution's input channels where the kernel's are more (zero channels
    padded onto the input and the weight: an odd count made even for the bf16 form)."""
    g = kernel.g
    assert g.n is not None
    n, c, h, w, f = g.n, g.c, g.h, g.w, g.f
    c0 = c if channels is None else channels
    x_t, w0_t, out_t = _tensor(n, c0, h, w), _tensor(f, c0, g.kh, g.kw), _tensor(n, f, g.oh, g.ow)
    f_t = _tensor(f)
    if padded_input:
        x_t = _tensor(kernel.input_size)
    w_arg = "%w0" if c != c0 else "%w"
    args = f"%x: {x_t}, {w_arg}: {w0_t}" + (f", %b: {f_t}" if g.bias else "")
    if bn_eps is not None:
        args += "".join(f", %{v}: {f_t}" for v in ("gamma", "beta", "mean", "var"))
    affine = affine or []
    args += "".join(f", %p{i}: {_tensor(*sizes)}" for i, (_, sizes) in enumerate(affine))
    if kernel.residual:
        args += f", %res: {out_t}"
    padded_out = any(kernel.out_pad)
    results_t = f"({out_t}, {_tensor(kernel.c_rows * kernel.np_)})" if padded_out else out_t
    lines = [f"func.func private @{name}({args}) -> {results_t} {{"]
    e = lines.append
    e("  %zero = arith.constant 0.0 : f32")
    if c != c0:  # the weight's zero channels
        e(f"  %w = tensor.pad %w0 low[0, 0, 0, 0] high[0, {c - c0}, 0, 0] {{")
        e("  ^bb0(%q0: index, %q1: index, %q2: index, %q3: index):")
        e("    tensor.yield %zero : f32")
        e(f"  }} : {w0_t} to {_tensor(f, c, g.kh, g.kw)}")
    extra = _epilogue_operands(e, kernel, bn_eps, affine)
    if padded_input:
        a_name = "%a32" if kernel.bf16 else "%a"
        e(f"  {a_name} = tensor.cast %x : {x_t} to {x_t}")
        if kernel.bf16:
            e(_truncf_1d("%a", "%a32", kernel.input_size))
    else:
        _input(e, kernel, x_t, c0)
    _rest(e, kernel, out_t, extra)
    return "\n".join(lines)


def _winograd_weight(kernel: WinogradConv, weight: str, packed: str) -> str:
    """The global ``packed`` (a new name) and the initializer that computes it from the
    global ``weight`` (``[F, C, 3, 3]``) at load: the weight transform ``G w G^T`` per tile
    position, its columns padded to the matmul kernel's panels and packed as that kernel reads
    them (:mod:`.winograd`). turbine writes this initializer itself: IREE's constant hoisting
    would not (the transformed weight is ``a^2 / 9`` times the weight's size, above its
    ``--iree-opt-const-expr-max-size-increase-threshold``), and computing it per call would
    cost more than the convolution saves."""
    g, gemm = kernel.g, kernel.gemm
    c, f, positions = g.c, g.f, kernel.positions
    b_elems = positions * c * gemm.np_
    lines = [f"util.global private @{packed} : {_tensor(b_elems)}", "util.initializer {"]
    e = lines.append
    e("  %zero = arith.constant 0.0 : f32")
    e(f"  %w = util.global.load {weight} : {_tensor(f, c, 3, 3)}")
    wu = kernel.weight_transform(e, "%w")  # [a^2, C, F]
    wu_t = _tensor(positions, c, f)
    if gemm.np_ != f:
        e(f"  %wupad = tensor.pad {wu} low[0, 0, 0] high[0, 0, {gemm.np_ - f}] {{")
        e("  ^bb0(%j0: index, %j1: index, %j2: index):")
        e("    tensor.yield %zero : f32")
        e(f"  }} : {wu_t} to {_tensor(positions, c, gemm.np_)}")
        wu, wu_t = "%wupad", _tensor(positions, c, gemm.np_)
    _pack(e, wu, wu_t, gemm.pack_layout("bkn", positions), b_elems, False)
    e(f"  util.global.store %bp, @{packed} : {_tensor(b_elems)}")
    e("  util.return")
    e("}")
    return "\n".join(lines)


def _weight_global(module_body: Any, w: Any) -> str | None:
    """The symbol (``@name``) of the immutable global the torch value ``w`` loads, else None;
    None too where a function comes before that global in the module (the transformed
    weight's initializer goes after the global and before every function:
    :meth:`.torch_ir.TopLevel.append`)."""
    cast = producer(w)
    if cast is None or cast.name != "torch_c.from_builtin_tensor":
        return None
    load = producer(cast.operands[0])
    if load is None or load.name != "util.global.load" or "global" not in load.attributes:
        return None
    sym = str(load.attributes["global"])
    for child in module_body.operations:
        op = child.operation
        if op.name in ("func.func", "util.func"):
            return None
        if op.name == "util.global" and f"@{_sym(op)}" == sym.replace('"', ""):
            return None if "is_mutable" in op.attributes else sym
    return None


def _sym(op: Any) -> str:
    return str(op.attributes["sym_name"]).strip('"')


def _winograd_function(
    name: str,
    kernel: WinogradConv,
    packed: str,
    bn_eps: float | None = None,
    padded_input: bool = False,
    affine: list[tuple[str, list[Any]]] | None = None,
) -> str:
    """The private function computing a 3x3 stride-1 convolution in Winograd form
    (:mod:`.winograd`): the padded channels-last input (as :func:`_function` writes or
    receives it) through the input transform, the per-position matmuls on the AVX-512 kernel
    over the transformed weight (the global ``packed``, :func:`_winograd_weight`), the output
    transform with the epilogue. Arguments and results as :func:`_function`'s."""
    g = kernel.g
    assert g.n is not None
    n, c, h, w, f = g.n, g.c, g.h, g.w, g.f
    x_t, w_t, out_t = _tensor(n, c, h, w), _tensor(f, c, 3, 3), _tensor(n, f, g.oh, g.ow)
    f_t = _tensor(f)
    if padded_input:
        x_t = _tensor(kernel.input_size)
    args = f"%x: {x_t}, %w: {w_t}" + (f", %b: {f_t}" if g.bias else "")
    if bn_eps is not None:
        args += "".join(f", %{v}: {f_t}" for v in ("gamma", "beta", "mean", "var"))
    affine = affine or []
    args += "".join(f", %p{i}: {_tensor(*sizes)}" for i, (_, sizes) in enumerate(affine))
    if kernel.residual:
        args += f", %res: {out_t}"
    padded_out = any(kernel.out_pad)
    results_t = f"({out_t}, {_tensor(kernel.c_rows * kernel.np_)})" if padded_out else out_t
    lines = [f"func.func private @{name}({args}) -> {results_t} {{"]
    e = lines.append
    e("  %zero = arith.constant 0.0 : f32")
    extra = _epilogue_operands(e, kernel, bn_eps, affine)
    if padded_input:
        e(f"  %a = tensor.cast %x : {x_t} to {x_t}")
    else:
        _input(e, kernel, x_t, c)
    gemm, positions, tiles = kernel.gemm, kernel.positions, kernel.tiles
    b_elems = positions * c * gemm.np_
    e(f"  %bp = util.global.load @{packed} : {_tensor(b_elems)}")
    rows = positions * tiles
    e("  %vin = " + kernel.input_dispatch("%a"))
    e(f"  %vdyn = tensor.cast %vin : {_tensor(rows, c)} to tensor<?x{c}xf32>")
    e(f"  %wn_m = arith.constant {tiles} : index")
    e(f"  %wn_b = arith.constant {positions} : index")
    e(f"  %wn_r = arith.constant {rows} : index")
    e("  %mmd = " + gemm.dispatch("%vdyn", "%bp", "%wn_m", "%wn_b", "%wn_r", b_elems))
    e(f"  %mms = tensor.cast %mmd : tensor<?x{gemm.np_}xf32> to {_tensor(rows, gemm.np_)}")
    e("  %cm = " + kernel.output_dispatch("%mms", *extra))
    _results(e, kernel, out_t)
    return "\n".join(lines)


def _depthwise_function(
    name: str,
    kernel: DepthwiseConv,
    bn_eps: float | None = None,
    affine: list[tuple[str, list[Any]]] | None = None,
    padded_input: bool = False,
) -> str:
    """The private function computing a depthwise (or grouped) convolution on
    :mod:`.depthwise`'s kernel: ``(%x NCHW, %w [C, gw, KH, KW][, %b], epilogue parameters as
    :func:`_function`'s) -> NCHW``. The input is written once channels-last, zero-padded
    (rows, columns, and channels to whole vectors), unless ``padded_input``: ``%x`` is then
    the previous direct kernel's C as this kernel reads it (flat, :attr:`Avx512Conv.out_pad`);
    the weight packed once (constant hoisting) as ``[KH * KW * gw, Cp]``."""
    g = kernel.g
    assert g.n is not None
    n, c, h, w = g.n, g.c, g.h, g.w
    cp, gw = kernel.np_, kernel.group_width
    x_t, w_t, out_t = _tensor(n, c, h, w), _tensor(c, gw, g.kh, g.kw), _tensor(n, c, g.oh, g.ow)
    if padded_input:
        x_t = _tensor(kernel.input_size)
    f_t = _tensor(c)
    args = f"%x: {x_t}, %w: {w_t}" + (f", %b: {f_t}" if g.bias else "")
    if bn_eps is not None:
        args += "".join(f", %{v}: {f_t}" for v in ("gamma", "beta", "mean", "var"))
    affine = affine or []
    args += "".join(f", %p{i}: {_tensor(*sizes)}" for i, (_, sizes) in enumerate(affine))
    lines = [f"func.func private @{name}({args}) -> {out_t} {{"]
    e = lines.append
    e("  %zero = arith.constant 0.0 : f32")
    extra = _epilogue_operands(e, kernel, bn_eps, affine)
    if padded_input:
        e(f"  %a = tensor.cast %x : {x_t} to {x_t}")
    else:
        _input(e, kernel, x_t, c, channels=cp)
    # the weight: [C, gw, KH, KW] -> [KH, KW, gw, C] -> [KH * KW * gw, C] -> pad C -> flat
    rows = kernel.taps * gw
    wt_t = _tensor(g.kh, g.kw, gw, c)
    e(f"  %wt_init = tensor.empty() : {wt_t}")
    e(
        f"  %wt = linalg.transpose ins(%w : {w_t}) outs(%wt_init : {wt_t}) "
        "permutation = [2, 3, 1, 0]"
    )
    e(f"  %wr = tensor.collapse_shape %wt [[0, 1, 2], [3]] : {wt_t} into {_tensor(rows, c)}")
    wk, wk_t = _pad_columns(e, "%wr", rows, c, cp)
    e(f"  %bp = tensor.collapse_shape {wk} [[0, 1]] : {wk_t} into {_tensor(rows * cp)}")
    e("  %cm = " + kernel.dispatch("%a", "%bp", *extra))
    _results(e, kernel, out_t)
    return "\n".join(lines)


def _input(
    e: Any,
    kernel: Avx512Conv | WinogradConv | DepthwiseConv,
    x_t: str,
    c0: int,
    channels: int | None = None,
) -> None:
    """Emits ``%a``: the NCHW ``%x`` (``c0`` channels) as the kernel reads it (NHWC,
    zero-padded to ``channels``, by default the geometry's, flat; in bf16 for the bf16 form)."""
    g = kernel.g
    assert g.n is not None
    n, h, w = g.n, g.h, g.w
    c = g.c if channels is None else channels
    (ph, pw) = g.padding
    nhwc_t, xp_t = _tensor(n, h, w, c0), _tensor(n, g.hp, g.wp, c)
    e(f"  %xt_init = tensor.empty() : {nhwc_t}")
    e(
        f"  %xt = linalg.transpose ins(%x : {x_t}) outs(%xt_init : {nhwc_t}) permutation = [0, 2, 3, 1]"
    )
    src, src_t = "%xt", nhwc_t
    if ph or pw or c != c0:
        e(f"  %xp = tensor.pad %xt low[0, {ph}, {pw}, 0] high[0, {ph}, {pw}, {c - c0}] {{")
        e("  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):")
        e("    tensor.yield %zero : f32")
        e(f"  }} : {nhwc_t} to {xp_t}")
        src, src_t = "%xp", xp_t
    dims = "[[" + ", ".join("0123") + "]]"
    a_name = "%a32" if kernel.bf16 else "%a"
    e(
        f"  {a_name} = tensor.collapse_shape {src} {dims} : {src_t} into {_tensor(kernel.input_size)}"
    )
    if kernel.bf16:  # converted in the dispatch that writes the padded input
        e(_truncf_1d("%a", "%a32", kernel.input_size))


def _pad_columns(e: Any, wk: str, k: int, f: int, np_: int) -> tuple[str, str]:
    """``wk`` (``[k, f]``) zero-padded to ``np_`` columns (the kernel's panels), and its type."""
    if np_ == f:
        return wk, _tensor(k, f)
    e(f"  %wpad = tensor.pad {wk} low[0, 0] high[0, {np_ - f}] {{")
    e("  ^bb0(%j0: index, %j1: index):")
    e("    tensor.yield %zero : f32")
    e(f"  }} : {_tensor(k, f)} to {_tensor(k, np_)}")
    return "%wpad", _tensor(k, np_)


def _to_nchw(e: Any, o_t: str, out_t: str, f: int, bias: bool) -> None:
    """Emits ``%out`` (NCHW): ``%o`` (NHWC) transposed back, plus the bias ``%b`` in the same
    op with ``bias``."""
    e(f"  %out_init = tensor.empty() : {out_t}")
    if bias:
        e(
            "  %out = linalg.generic {indexing_maps = ["
            "affine_map<(n, f, h, w) -> (n, h, w, f)>, affine_map<(n, f, h, w) -> (f)>, "
            "affine_map<(n, f, h, w) -> (n, f, h, w)>], iterator_types = "
            '["parallel", "parallel", "parallel", "parallel"]} '
            f"ins(%o, %b : {o_t}, {_tensor(f)}) outs(%out_init : {out_t}) {{"
        )
        e("  ^bb0(%v: f32, %bv: f32, %u: f32):")
        e("    %s = arith.addf %v, %bv : f32")
        e("    linalg.yield %s : f32")
        e(f"  }} -> {out_t}")
    else:
        e(
            f"  %out = linalg.transpose ins(%o : {o_t}) outs(%out_init : {out_t}) permutation = [0, 3, 1, 2]"
        )


def _pack(
    e: Any, wk: str, wk_t: str, layout: tuple[list[int], str, list[int]], size: int, bf16: bool
) -> None:
    """Emits ``%bp`` (``size`` elements, flat): ``wk`` expanded as ``layout`` (sizes,
    reassociation, permutation) says, permuted into the kernel's panels and, with ``bf16``,
    converted (a weight: once, by constant hoisting)."""
    ex_sizes, reassoc, perm = layout
    ex_t, pan_t = _tensor(*ex_sizes), _tensor(*(ex_sizes[i] for i in perm))
    e(
        f"  %wex = tensor.expand_shape {wk} {reassoc} output_shape "
        f"[{', '.join(map(str, ex_sizes))}] : {wk_t} into {ex_t}"
    )
    e(f"  %wpan_init = tensor.empty() : {pan_t}")
    e(
        f"  %wpan = linalg.transpose ins(%wex : {ex_t}) outs(%wpan_init : {pan_t}) "
        f"permutation = [{', '.join(map(str, perm))}]"
    )
    all_dims = ", ".join(str(i) for i in range(len(perm)))
    bp_name = "%bp32" if bf16 else "%bp"
    e(f"  {bp_name} = tensor.collapse_shape %wpan [[{all_dims}]] : {pan_t} into {_tensor(size)}")
    if bf16:
        e(_truncf_1d("%bp", "%bp32", size))


def _rest(e: Any, kernel: Avx512Conv, out_t: str, extra: list[str]) -> None:
    """Emits the weight's packing, the dispatch and the function's results."""
    g = kernel.g
    c, f = g.c, g.f
    np_, k, nr = kernel.np_, kernel.k, kernel.nr
    w_t = _tensor(f, c, g.kh, g.kw)
    wt_t, kf_t = _tensor(g.kh, g.kw, c, f), _tensor(k, f)
    # the weight: [F, C, KH, KW] -> [KH, KW, C, F] -> [K, F] -> pad F -> panels [P, K, nr]
    e(f"  %wt_init = tensor.empty() : {wt_t}")
    e(
        f"  %wt = linalg.transpose ins(%w : {w_t}) outs(%wt_init : {wt_t}) permutation = [2, 3, 1, 0]"
    )
    e(f"  %wk = tensor.collapse_shape %wt [[0, 1, 2], [3]] : {wt_t} into {kf_t}")
    wk, wk_t = _pad_columns(e, "%wk", k, f, np_)
    p = np_ // nr
    if kernel.bf16:  # panels of pairs: [K/2, 2, P, nr] -> [P, K/2, nr, 2]
        layout = ([k // 2, 2, p, nr], "[[0, 1], [2, 3]]", [2, 0, 3, 1])
    else:  # panels: [K, P, nr] -> [P, K, nr]
        layout = ([k, p, nr], "[[0], [1, 2]]", [1, 0, 2])
    _pack(e, wk, wk_t, layout, k * np_, kernel.bf16)
    e("  %cm = " + kernel.dispatch("%a", "%bp", *extra))
    _results(e, kernel, out_t)


def _results(e: Any, kernel: Avx512Conv | WinogradConv | DepthwiseConv, out_t: str) -> None:
    """Emits the function's results from ``%cm`` (the kernel's C: ``c_rows x Np``): the NCHW
    output (the bias added here where the kernel did not) and, with :attr:`out_pad`, C flat
    as the next convolution reads it."""
    g = kernel.g
    assert g.n is not None
    n, f, np_ = g.n, g.f, kernel.np_
    m = kernel.m
    cm, cm_t = "%cm", _tensor(m, np_)
    padded_out = any(kernel.out_pad)
    if padded_out:  # C flat for the next kernel (all Np channels), and its interior
        qh, qw = kernel.out_pad
        ohp, owp = g.oh + 2 * qh, g.ow + 2 * qw
        c_t = _tensor(kernel.c_rows, np_)
        e(
            f"  %cflat = tensor.collapse_shape %cm [[0, 1]] : {c_t} into {_tensor(kernel.c_rows * np_)}"
        )
        p4_t = _tensor(n, ohp, owp, np_)
        e(
            f"  %c4 = tensor.expand_shape %cm [[0, 1, 2], [3]] output_shape [{n}, {ohp}, {owp}, {np_}] : {c_t} into {p4_t}"
        )
        e(
            f"  %ci = tensor.extract_slice %c4[0, {qh}, {qw}, 0] [{n}, {g.oh}, {g.ow}, {np_}] [1, 1, 1, 1] : {p4_t} to {_tensor(n, g.oh, g.ow, np_)}"
        )
        e(
            f"  %cm2 = tensor.collapse_shape %ci [[0, 1, 2], [3]] : {_tensor(n, g.oh, g.ow, np_)} into {cm_t}"
        )
        cm = "%cm2"
    if np_ != f:
        e(f"  %cs = tensor.extract_slice {cm}[0, 0] [{m}, {f}] [1, 1] : {cm_t} to {_tensor(m, f)}")
        cm, cm_t = "%cs", _tensor(m, f)
    o_t = _tensor(n, g.oh, g.ow, f)
    e(
        f"  %o = tensor.expand_shape {cm} [[0, 1, 2], [3]] output_shape [{n}, {g.oh}, {g.ow}, {f}] : {cm_t} into {o_t}"
    )
    _to_nchw(e, o_t, out_t, f, bias=g.bias and not kernel.shift)
    if padded_out:
        e(f"  return %out, %cflat : {out_t}, {_tensor(kernel.c_rows * np_)}")
    else:
        e(f"  return %out : {out_t}")
    e("}")


def _amx_function(
    name: str,
    plan: AmxConvPlan,
    kernel: AmxConv,
    g: Conv,
    bn_eps: float | None = None,
    affine: list[tuple[str, list[Any]]] | None = None,
    padded_input: bool = False,
) -> str:
    """The private function computing a convolution on the AMX kernel (:mod:`.amx_conv`):
    ``(%x NCHW, %w[, %b]) -> NCHW``. The input is written once, channels-last, zero-padded
    (channels to ``plan.c_pad``; rows and columns to the plan's size, which includes one more
    zero row at the bottom for the kernel's extra columns), in its space-to-depth form for a
    strided convolution, and in bf16; the weight packed once in the AMX tile order of ``B``
    with ``k = (a, b, py, px, c)``; the kernel's output grid is cut to ``ow`` columns in the
    dispatch that adds the bias and transposes back to NCHW. With the kernel's epilogue
    (:attr:`.amx_conv.AmxConv.scale_shift`), the bias and a batch norm (``bn_eps``, arguments
    ``%gamma``, ``%beta``, ``%mean``, ``%var``) or per-channel steps (``affine``, arguments
    ``%p<i>``) are folded into its scale and shift, as for the AVX-512 kernel; with
    :attr:`.amx_conv.AmxConv.residual` the residual ``%res`` is the last argument (NCHW f32, or
    with :attr:`.amx_conv.AmxConv.residual_layout` an earlier kernel's bf16 result). With
    ``padded_input``, ``%x`` is the input as the kernel reads it (the previous AMX kernel's
    :attr:`.amx_conv.AmxConv.out_next` or :attr:`.amx_conv.AmxConv.out_strided` result); with
    :attr:`.amx_conv.AmxConv.out_next`, the function returns that result of its own after the
    NCHW output, then with :attr:`.amx_conv.AmxConv.out_strided` that one."""
    assert g.n is not None
    n, c, h, w, f = g.n, g.c, g.h, g.w, g.f
    sh, sw, cp = plan.sh, plan.sw, plan.c_pad
    np_, k = kernel.np_, kernel.kp
    x_t, w_t, out_t = _tensor(n, c, h, w), _tensor(f, c, g.kh, g.kw), _tensor(n, f, g.oh, g.ow)
    f_t = _tensor(f)
    if padded_input:
        x_t = f"tensor<{kernel.input_size}xbf16>"
    args = f"%x: {x_t}, %w: {w_t}" + (f", %b: {f_t}" if g.bias else "")
    if bn_eps is not None:
        args += "".join(f", %{v}: {f_t}" for v in ("gamma", "beta", "mean", "var"))
    affine = affine or []
    args += "".join(f", %p{i}: {_tensor(*sizes)}" for i, (_, sizes) in enumerate(affine))
    if kernel.residual:
        args += f", %res: {out_t if kernel.residual_layout is None else kernel.residual_type}"
    more = [("%cnext", kernel.out_next_type)] if kernel.out_next is not None else []
    more += [("%cstr", kernel.out_strided_type)] if kernel.out_strided is not None else []
    results_t = f"({', '.join([out_t] + [t for _, t in more])})" if more else out_t
    lines = [f"func.func private @{name}({args}) -> {results_t} {{"]
    e = lines.append
    e("  %zero = arith.constant 0.0 : f32")
    if padded_input:
        e(f"  %a = tensor.cast %x : {x_t} to {x_t}")
    else:
        _amx_input(e, plan, kernel, g, x_t)
    # the weight: [F, C, KH, KW] -> zero-padded [F, c_pad, sh * kh2, sw * kw2] -> [F, c_pad,
    # kh2, sh, kw2, sw] -> [kh2, kw2, sh, sw, c_pad, F] -> [K, F] -> pad F -> AMX's tiles of B
    kh4, kw4 = sh * plan.kh2, sw * plan.kw2
    w4_t = _tensor(f, cp, kh4, kw4)
    wsrc, wsrc_t = "%w", w_t
    if (cp, kh4, kw4) != (c, g.kh, g.kw):
        e(f"  %w4 = tensor.pad %w low[0, 0, 0, 0] high[0, {cp - c}, {kh4 - g.kh}, {kw4 - g.kw}] {{")
        e("  ^bb0(%q0: index, %q1: index, %q2: index, %q3: index):")
        e("    tensor.yield %zero : f32")
        e(f"  }} : {w_t} to {w4_t}")
        wsrc, wsrc_t = "%w4", w4_t
    w6_t = _tensor(f, cp, plan.kh2, sh, plan.kw2, sw)
    e(
        f"  %w6 = tensor.expand_shape {wsrc} [[0], [1], [2, 3], [4, 5]] output_shape "
        f"[{f}, {cp}, {plan.kh2}, {sh}, {plan.kw2}, {sw}] : {wsrc_t} into {w6_t}"
    )
    wt_t, kf_t = _tensor(plan.kh2, plan.kw2, sh, sw, cp, f), _tensor(k, f)
    e(f"  %wt_init = tensor.empty() : {wt_t}")
    e(
        f"  %wt = linalg.transpose ins(%w6 : {w6_t}) outs(%wt_init : {wt_t}) "
        "permutation = [2, 4, 3, 5, 1, 0]"
    )
    e(f"  %wk = tensor.collapse_shape %wt [[0, 1, 2, 3, 4], [5]] : {wt_t} into {kf_t}")
    wk, wk_t = _pad_columns(e, "%wk", k, f, np_)
    _pack(e, wk, wk_t, kernel.pack_layout("kn", 1), k * np_, bf16=True)
    pair = None
    if kernel.scale_shift:
        scale, shift = _scale_shift(e, g, bn_eps, affine, bias=g.bias)
        if scale is None:
            e(f"  %ones = arith.constant dense<1.0> : {f_t}")
            scale = "%ones"
        if shift is None:
            e(f"  %zeros = arith.constant dense<0.0> : {f_t}")
            shift = "%zeros"
        pair = (_padded_vector(e, scale, f, np_), _padded_vector(e, shift, f, np_))
    residual = None
    if kernel.residual_layout is not None:  # bf16, read in place
        residual = "%res"
    elif kernel.residual:
        assert np_ == f, "a residual needs whole panels"
        residual = _residual_rows(e, g)
    for line in kernel.conv_dispatch("%a", "%bp", pair, residual):
        e(line)
    grid_t, o_t = _tensor(n, g.oh, kernel.wp, np_), _tensor(n, g.oh, g.ow, f)
    e(
        f"  %c4 = tensor.expand_shape %cm [[0, 1, 2], [3]] output_shape [{n}, {g.oh}, "
        f"{kernel.wp}, {np_}] : {_tensor(n * kernel.m, np_)} into {grid_t}"
    )
    e(
        f"  %o = tensor.extract_slice %c4[0, 0, 0, 0] [{n}, {g.oh}, {g.ow}, {f}] [1, 1, 1, 1] : "
        f"{grid_t} to {o_t}"
    )
    _to_nchw(e, o_t, out_t, f, bias=g.bias and not kernel.scale_shift)
    values = ", ".join(["%out"] + [v for v, _ in more])
    e(f"  return {values} : {', '.join([out_t] + [t for _, t in more])}")
    e("}")
    return "\n".join(lines)


def _amx_input(e: Any, plan: AmxConvPlan, kernel: AmxConv, g: Conv, x_t: str) -> None:
    """Emits ``%a``: the NCHW ``%x`` as :func:`_amx_function`'s kernel reads it (see there)."""
    assert g.n is not None
    n, c, h, w = g.n, g.c, g.h, g.w
    ph, pw = g.padding
    sh, sw, cp = plan.sh, plan.sw, plan.c_pad
    nhwc_t = _tensor(n, h, w, c)
    e(f"  %xt_init = tensor.empty() : {nhwc_t}")
    e(
        f"  %xt = linalg.transpose ins(%x : {x_t}) outs(%xt_init : {nhwc_t}) permutation = [0, 2, 3, 1]"
    )
    # zero-pad to at least the plan's extent, then take the plan's rows and columns from it
    # (a strided 1x1: every th-th / tw-th; else a crop of what a stride leaves unread)
    hh, ww = plan.height, plan.width
    eh, ew = plan.extent
    high_h, high_w = max(0, eh - h - ph), max(0, ew - w - pw)
    big_t = _tensor(n, h + ph + high_h, w + pw + high_w, cp)
    e(f"  %xpb = tensor.pad %xt low[0, {ph}, {pw}, 0] high[0, {high_h}, {high_w}, {cp - c}] {{")
    e("  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):")
    e("    tensor.yield %zero : f32")
    e(f"  }} : {nhwc_t} to {big_t}")
    xp_t = _tensor(n, hh, ww, cp)
    e(
        f"  %xp = tensor.extract_slice %xpb[0, 0, 0, 0] [{n}, {hh}, {ww}, {cp}] "
        f"[1, {plan.th}, {plan.tw}, 1] : {big_t} to {xp_t}"
    )
    xs, rank = "%xp", 4
    if sh * sw > 1:  # space-to-depth: [n, rows, sh, cols, sw, c] -> [n, rows, cols, sh, sw, c]
        r, q = plan.rows, plan.cols
        ex_t, s2d_t = _tensor(n, r, sh, q, sw, cp), _tensor(n, r, q, sh, sw, cp)
        e(
            f"  %xe = tensor.expand_shape %xp [[0], [1, 2], [3, 4], [5]] output_shape "
            f"[{n}, {r}, {sh}, {q}, {sw}, {cp}] : {xp_t} into {ex_t}"
        )
        e(f"  %xs_init = tensor.empty() : {s2d_t}")
        e(
            f"  %xs = linalg.transpose ins(%xe : {ex_t}) outs(%xs_init : {s2d_t}) "
            "permutation = [0, 1, 3, 2, 4, 5]"
        )
        xs, xp_t, rank = "%xs", s2d_t, 6
    size = kernel.input_size
    dims = ", ".join(str(i) for i in range(rank))
    e(f"  %a32 = tensor.collapse_shape {xs} [[{dims}]] : {xp_t} into {_tensor(size)}")
    e(_truncf_1d("%a", "%a32", size))


def _call_operands(
    conv: Any,
    g: Conv,
    bn: BatchNorm | None,
    affine: list[tuple[Any, str, Any]],
    residual: Any,
    width: int | None = None,
) -> tuple[list[Any], list[str]]:
    """The operands of a convolution function's call and their builtin types: the input, the
    weight (``width`` channels a group: ``[C, width, KH, KW]``), the bias if any, then what
    the epilogue absorbed (a batch norm's parameters or the per-channel steps' ones, the
    residual)."""
    assert g.n is not None
    f_t = _tensor(g.f)
    w_t = _tensor(g.f, g.c if width is None else width, g.kh, g.kw)
    types = [_tensor(g.n, g.c, g.h, g.w), w_t, f_t]
    operands = list(conv.operands)[: 3 if g.bias else 2]
    types = types[: len(operands)]
    if bn is not None:
        operands += [bn.weight, bn.bias, bn.mean, bn.var]
        types += [f_t] * 4
    for _, _, param in affine:
        operands.append(param)
        sizes = TensorType.of(param).sizes  # type: ignore[union-attr]
        types.append(_tensor(*sizes))  # type: ignore[arg-type]
    if residual is not None:
        operands.append(residual)
        types.append(_tensor(g.n, g.f, g.oh, g.ow))
    return operands, types


def _replace_by_call(
    conv: Any,
    absorbed: list[Any],
    name: str,
    operands: list[Any],
    types: list[str],
    results: list[str],
    first: Any = None,
    last: Any = None,
) -> tuple[Any, Any]:
    """Replaces ``conv`` and the ops ``absorbed`` after it by a call of ``name`` (its first
    result the last op's, in torch types) and returns the call and that torch value; ``first``: a builtin value
    standing for the first operand (a previous kernel's padded output); ``last``: a builtin
    value appended to the operands (a residual an earlier kernel kept in bf16)."""
    anchor = absorbed[-1] if absorbed else conv  # operands of absorbed ops may come later
    b = Builder(anchor, location=conv.location)
    builtin = [
        first if i == 0 and first is not None else b.to_builtin(v, t)
        for i, (v, t) in enumerate(zip(operands, types))
    ]
    if last is not None:
        builtin.append(last)
    call = b.call(name, builtin, results)
    back = b.from_builtin(call.results[0], conv.results[0].type)
    replace_with_absorbed(conv, absorbed, back)
    return call, back


def _rewrite_amx(
    top: TopLevel,
    conv: Any,
    g: Conv,
    index: int,
    found: list[tuple[Any, Conv | None]],
    padded: Any = None,
    pools: bool = False,
    bf16_results: list[tuple[Any, Any, tuple[int, int, int, int]]] | None = None,
    unwritten: list[Any] | None = None,
) -> tuple[Any, list[tuple[int, Any]]]:
    """Replaces ``conv`` (and the ops its epilogue absorbs, unless ``TURBINE_CPU_EPILOGUES=keep``)
    by a call of :func:`_amx_function`; ``padded``: its input as the kernel reads it (an
    earlier AMX kernel's :attr:`.amx_conv.AmxConv.out_next` result); ``pools``: a max pooling
    that is the one reader of the result after a ReLU may be rewritten here too, reading the
    kernel's :attr:`.amx_conv.AmxConv.out_next` result (:func:`_pool_consumer`): in bf16
    where only AMX kernels read the pooled result (:func:`_bf16_pool_readers`;
    :func:`.pools.max_pool_bf16_function`, which then writes the inputs of the AMX convolutions
    reading it, and a bf16 copy for the residual adds that read it), else or with
    ``TURBINE_CPU_POOLS=f32`` in f32.

    ``bf16_results``: ``(torch value, bf16 result, layout)`` of the earlier AMX kernels whose
    results are kept in bf16 for the residual adds that read them; a residual found there is
    read in bf16 (:attr:`.amx_conv.AmxConv.residual_layout`), and this kernel's own result is
    added to it when later AMX kernels add it as their residual (:func:`_residual_readers`;
    its f32 result then only written where something else reads it). ``unwritten`` collects
    the torch values of the results whose f32 copy the kernel does not write: once every
    convolution is rewritten nothing may read them (:func:`rewrite_convs_avx512` checks).

    Returns the call and ``(index in found, input)`` of the convolutions whose input is written
    here (this kernel's :attr:`.amx_conv.AmxConv.out_next` result, or the bf16 pooling's)."""
    assert g.n is not None
    bf16_results = [] if bf16_results is None else bf16_results
    plan, kernel = amx_conv_plan(g)
    whole = kernel.np_ == g.f
    bn, affine, residual, absorbed = (
        _absorbed(conv, g, whole) if fusion_enabled() else (None, [], None, [])
    )
    relu = bool(absorbed) and absorbed[-1].name == "torch.aten.relu"
    scale_shift = bn is not None or bool(affine) or (g.bias and (relu or residual is not None))
    residual_bf16 = None  # (bf16 value, layout) of a residual an earlier kernel kept in bf16
    if residual is not None:
        residual_bf16 = next(((b, lay) for v, b, lay in bf16_results if v == residual), None)
    consumer = None
    final = absorbed[-1].results[0] if absorbed else conv.results[0]
    handoffs = padded_outputs_enabled() and whole
    readers = _residual_readers(final, g, found, index + 1) if handoffs else []
    if handoffs:  # the residual adds read a copy laid out at stride 1: then no strided reader
        consumer = _amx_consumer(final, g, found, index + 1, strided=not readers)
    out_next = None
    out_next_s2d = (1, 1)
    if consumer is not None:
        nplan, _ = amx_conv_plan(consumer[1])
        cph, cpw = consumer[1].padding
        out_next = (nplan.rows, nplan.cols, cph, cpw)
        out_next_s2d = (nplan.sh, nplan.sw)
    pool = _pool_consumer(final, g) if pools and handoffs and relu and consumer is None else None
    # the residual adds of a pooling that may run in bf16 (None: it stays f32)
    pool_adds = None
    if pool is not None and pools_in_bf16():
        pool_adds = _bf16_pool_readers(pool[0].results[0], pool[1], found, index + 1)
    if pool is not None:
        gp = pool[1]
        pph, ppw = gp.padding
        out_next = (gp.h + 2 * pph, gp.w + 2 * ppw, pph, ppw)
    if pool is not None:
        readers = []
    if readers and out_next is None:  # a bf16 copy for the residual adds alone
        out_next = (g.oh, g.ow, 0, 0)
    # a strided 1x1 over the result (a shortcut): its input written here too
    strided = _amx_strided_consumer(final, g, found, index + 1) if handoffs and not pool else None
    out_strided = None
    if strided is not None:
        splan, _ = amx_conv_plan(strided[1])
        out_strided = (splan.rows, splan.cols, *strided[1].stride)
    taken = [found[c[0]][0].operation for c in (consumer, strided) if c is not None]
    # what reads the f32 result: the uses besides the next convolutions' inputs and the
    # residual adds that read the bf16 one
    others = [
        u
        for u in final.uses
        if u.owner.operation not in readers
        and u.owner.operation not in taken
        and not (pool is not None and u.owner.operation == pool[0].operation)
    ]
    kernel = replace(
        kernel,
        scale_shift=scale_shift,
        relu=relu,
        residual=residual is not None,
        residual_layout=residual_bf16[1] if residual_bf16 is not None else None,
        out_next=out_next,
        out_next_s2d=out_next_s2d,
        out_next_f32=pool is not None and pool_adds is None,
        out_strided=out_strided,
        f32_out=(out_next is None and out_strided is None) or bool(others),
    )
    if kernel.name not in top:
        top.append(kernel.executable())
    name = top.unique(f"{_FUNC_PREFIX}_amx_{index}")
    steps = [(kind, TensorType.of(p).sizes) for _, kind, p in affine]  # type: ignore[union-attr]
    eps = bn.eps if bn is not None else None
    top.append(_amx_function(name, plan, kernel, g, eps, steps, padded_input=padded is not None))
    operands, types = _call_operands(
        conv, g, bn, affine, residual if residual_bf16 is None else None
    )
    results = [_tensor(g.n, g.f, g.oh, g.ow)]
    if out_next is not None:
        results.append(kernel.out_next_type)
    if out_strided is not None:
        results.append(kernel.out_strided_type)
    last = residual_bf16[0] if residual_bf16 is not None else None
    call, back = _replace_by_call(conv, absorbed, name, operands, types, results, padded, last)
    if readers:
        assert out_next is not None
        bf16_results.append((back, call.results[1], out_next))
    if not kernel.f32_out and unwritten is not None:
        unwritten.append(back)
    if pool is not None:  # the pooling reads the kernel's padded result
        pool_op, gp = pool
        if pool_adds is not None:
            return call, _rewrite_bf16_pool(
                top, call, pool_op, gp, index, found, pool_adds, bf16_results
            )
        _pool_padded_result(top, pool, call.results[1], f"{POOL_FUNC_PREFIX}_amx_{index}")
    inputs = [] if consumer is None else [(consumer[0], call.results[1])]
    if strided is not None:
        inputs.append((strided[0], call.results[len(results) - 1]))
    return call, inputs


def _pool_padded_result(top: TopLevel, pool: tuple[Any, MaxPool], padded: Any, name: str) -> None:
    """Replaces the max pooling ``pool`` (op, geometry) by a call of a new private function
    ``name`` (made unique) pooling ``padded``, the convolution kernel's result written
    zero-padded channels-last as the pooling reads it (:func:`.pools.max_pool_function` with
    ``padded_input``)."""
    pool_op, gp = pool
    pool_name = top.unique(name)
    top.append(max_pool_function(pool_name, gp, padded_input=True))
    b = Builder(pool_op, location=pool_op.location)
    pooled = b.call(pool_name, [padded], [_tensor(gp.n, gp.c, gp.oh, gp.ow)])
    pool_op.results[0].replace_all_uses_with(
        b.from_builtin(pooled.results[0], pool_op.results[0].type)
    )
    pool_op.erase()


def _rewrite_bf16_pool(
    top: TopLevel,
    call: Any,
    pool_op: Any,
    gp: MaxPool,
    index: int,
    found: list[tuple[Any, Conv | None]],
    readers: list[Any],
    bf16_results: list[tuple[Any, Any, tuple[int, int, int, int]]],
) -> list[tuple[int, Any]]:
    """Replaces the max pooling ``pool_op`` after the AMX kernel ``call`` (whose second result
    is its bf16 input, padded) by a call of :func:`.pools.max_pool_bf16_function`; that
    function also writes the inputs of the AMX convolutions of ``found[index + 1:]`` reading
    the pooled result at stride 1 (one per layout: a ResNet-50's first 1x1 convolution and its
    shortcut's share one), and its bf16 copy is recorded in ``bf16_results`` for the residual
    adds later AMX kernels absorb (``readers``, :func:`_bf16_pool_readers`). Returns ``(index in found, input)`` of those convolutions."""
    assert gp.n is not None
    value = pool_op.results[0]
    like = _pooled_like(gp)
    layouts: dict[tuple[int, int, int, int], list[int]] = {}
    for i, g2 in _amx_consumers(value, like, found, index + 1):
        nplan, _ = amx_conv_plan(g2)
        cph, cpw = g2.padding
        layouts.setdefault((nplan.rows, nplan.cols, cph, cpw), []).append(i)
    name = top.unique(f"{POOL_FUNC_PREFIX}_amx_{index}")
    top.append(max_pool_bf16_function(name, gp, list(layouts)))
    results = [_tensor(gp.n, gp.c, gp.oh, gp.ow), f"tensor<{gp.n * gp.oh * gp.ow * gp.c}xbf16>"]
    results += [f"tensor<{gp.n * rows * cols * gp.c}xbf16>" for rows, cols, _, _ in layouts]
    b = Builder(pool_op, location=pool_op.location)
    pooled = b.call(name, [call.results[1]], results)
    back = b.from_builtin(pooled.results[0], value.type)
    value.replace_all_uses_with(back)
    pool_op.erase()
    if readers:
        bf16_results.append((back, pooled.results[1], (gp.oh, gp.ow, 0, 0)))
    return [(i, pooled.results[2 + k]) for k, ids in enumerate(layouts.values()) for i in ids]


def _pooled_like(gp: MaxPool) -> Conv:
    """The pooled result of ``gp`` as the output of a 1x1 convolution, for the checks of the
    convolutions that read it (:func:`_amx_consumers`, :func:`_residual_readers`)."""
    assert gp.n is not None
    return Conv(gp.n, gp.c, gp.oh, gp.ow, gp.c, 1, 1, (1, 1), (0, 0), (1, 1), gp.oh, gp.ow, False)


def _bf16_pool_readers(
    value: Any, gp: MaxPool, found: list[tuple[Any, Conv | None]], start: int
) -> list[Any] | None:
    """The residual adds reading ``value`` (the result of the max pooling ``gp``) that AMX
    kernels of ``found[start:]`` absorb (:func:`_residual_readers`), if every reader of it
    rounds it to bf16 anyway: those adds (which read a bf16 copy) and the inputs of AMX
    convolutions there. Only then may the pooling run in bf16: any other reader would see the
    pooled values rounded where they were f32 before (None)."""
    adds = _residual_readers(value, _pooled_like(gp), found, start)
    convs = {o.operation for o, g2 in found[start:] if g2 is not None and amx_conv_supports(g2)}
    for use in value.uses:
        op = use.owner.operation
        if op not in adds and not (use.operand_number == 0 and op in convs):
            return None
    return adds


def _residual_readers(
    value: Any, g: Conv, found: list[tuple[Any, Conv | None]], start: int
) -> list[Any]:
    """The residual adds reading ``value`` (the result of the convolution ``g``) that later AMX
    kernels of ``found[start:]`` absorb (whole panels, the same output): those can read a bf16
    copy of it (:attr:`.amx_conv.AmxConv.residual_layout`). Their operations, in use order."""
    adds = {u.owner.operation for u in value.uses if u.owner.name == "torch.aten.add.Tensor"}
    readers = []
    for o, g2 in found[start:]:
        if not adds:  # each add found its kernel
            break
        if g2 is None or not amx_conv_supports(g2) or amx_padded(g2.f) != g2.f:
            continue
        if (g2.n, g2.f, g2.oh, g2.ow) != (g.n, g.f, g.oh, g.ow):
            continue
        _, _, residual, absorbed = _absorbed(o, g2, True)
        if residual is not None and residual == value:
            add = next(a.operation for a in absorbed if a.operation in adds)
            readers.append(add)
            adds.discard(add)
    return readers


def _pool_consumer(value: Any, g: Conv) -> tuple[Any, MaxPool] | None:
    """``(op, geometry)`` of the max pooling that is ``value``'s one reader (``value``: a ReLU's
    result, never below zero, of the convolution ``g``), if :func:`.pools.max_pool_geometry`
    accepts it, else None."""
    uses = list(value.uses)
    if len(uses) != 1 or uses[0].operand_number != 0:
        return None
    owner = uses[0].owner
    gp = max_pool_geometry(owner)
    if gp is None or gp.c != g.f or gp.n != g.n:
        return None
    return owner, gp


def _amx_consumer(
    value: Any, g: Conv, found: list[tuple[Any, Conv | None]], start: int, strided: bool = False
) -> tuple[int, Conv] | None:
    """``(index, geometry)`` of a convolution of ``found[start:]`` that reads ``value`` (the
    result of the convolution ``g``, whole panels) as its input and that the AMX kernel computes
    at stride 1 over it as it is (no space-to-depth form, no strided reads, no channels to
    pad), or with ``strided`` also over its space-to-depth form (a strided 3x3, not a strided
    1x1): the kernel computing ``g`` can then write its input (:attr:`.amx_conv.AmxConv.out_next`,
    :attr:`.amx_conv.AmxConv.out_next_s2d`). Other uses of ``value`` may remain (they read the
    NCHW output)."""
    consumers = _amx_consumers(value, g, found, start, strided)
    # a reader at stride 1 first (as before strided readers were taken)
    consumers.sort(key=lambda c: c[1].stride != (1, 1))
    return consumers[0] if consumers else None


def _amx_strided_consumer(
    value: Any, g: Conv, found: list[tuple[Any, Conv | None]], start: int
) -> tuple[int, Conv] | None:
    """``(index, geometry)`` of a strided 1x1 convolution without padding of ``found[start:]``
    reading ``value`` (the result of the convolution ``g``, whole panels) as its input, on
    the AMX kernel (every ``th``-th row and ``tw``-th column, no channels to pad: a ResNet's
    shortcut at a stage transition): the kernel computing ``g`` can then write that input, a
    subsample of its pixels in bf16 (:attr:`.amx_conv.AmxConv.out_strided`), where the
    shortcut would otherwise read the f32 result and subsample and round it in a pass of its
    own (docs/performance.md, section 33)."""
    for i, g2, plan2 in _amx_readers(value, found, start):
        if (plan2.th, plan2.tw) == (1, 1) or (plan2.sh, plan2.sw) != (1, 1):
            continue
        if g2.padding == (0, 0) and g2.c == g.f == plan2.c_pad and g2.n == g.n:
            return i, g2
    return None


def _amx_consumers(
    value: Any, g: Conv, found: list[tuple[Any, Conv | None]], start: int, strided: bool = False
) -> list[tuple[int, Conv]]:
    """Every convolution :func:`_amx_consumer` would accept, in use order."""
    out = []
    for i, g2, plan2 in _amx_readers(value, found, start):
        if (plan2.th, plan2.tw) != (1, 1) or not (g2.c == g.f == plan2.c_pad and g2.n == g.n):
            continue
        if (plan2.sh, plan2.sw) == (1, 1):
            out.append((i, g2))
            continue
        # the space-to-depth form: whole blocks of channels, every pixel inside the form
        ph2, pw2 = g2.padding
        if strided and g.f % 32 == 0 and ph2 + g.oh <= plan2.height and pw2 + g.ow <= plan2.width:
            out.append((i, g2))
    return out


def _amx_readers(
    value: Any, found: list[tuple[Any, Conv | None]], start: int
) -> Iterator[tuple[int, Conv, AmxConvPlan]]:
    """``(index, geometry, plan)`` of each convolution of ``found[start:]`` that the AMX
    kernel computes and that reads ``value`` as its input, in use order."""
    for use in value.uses:
        if use.operand_number != 0:
            continue
        for i in range(start, len(found)):
            o, g2 = found[i]
            if o.operation == use.owner.operation and g2 is not None and amx_conv_supports(g2):
                yield i, g2, amx_conv_plan(g2)[0]


def _rewrite_depthwise(
    top: TopLevel, conv: Any, g: Conv, width: int, index: int, fuse: bool, padded: Any = None
) -> None:
    """Replaces the depthwise (``width`` 1) or grouped ``conv`` (and the batch norm or
    per-channel steps and ReLU its epilogue absorbs, with ``fuse``) by a call of
    :func:`_depthwise_function`; ``padded``: its input as the kernel reads it (an earlier
    direct kernel's padded C, :func:`_depthwise_consumer`)."""
    assert g.n is not None
    bn, affine, _, absorbed = (
        _absorbed(conv, g, False, activations_ok=True) if fuse else (None, [], None, [])
    )
    kinds = [kind for _, kind, _ in affine]
    last = absorbed[-1].name if absorbed else None
    kernel = DepthwiseConv(
        g,
        width,
        scale=bn is not None or "mul" in kinds,
        shift=bn is not None or g.bias or any(k != "mul" for k in kinds),
        relu=last == "torch.aten.relu",
        **_activation_fields(last),
    )
    if not fuse:  # TURBINE_CPU_EPILOGUES=keep: even the bias as IREE's op
        kernel = DepthwiseConv(g, width)
    if kernel.name not in top:
        top.append(kernel.executable())
    name = top.unique(f"{_FUNC_PREFIX}_depthwise_{index}")
    steps = [(kind, TensorType.of(p).sizes) for _, kind, p in affine]  # type: ignore[union-attr]
    eps = bn.eps if bn is not None else None
    top.append(_depthwise_function(name, kernel, eps, steps, padded_input=padded is not None))
    operands, types = _call_operands(conv, g, bn, affine, None, width=width)
    results = [_tensor(g.n, g.f, g.oh, g.ow)]
    _replace_by_call(conv, absorbed, name, operands, types, results, padded)


def _vector_op(e: Any, result: str, ins: list[str], body: list[str], f: int) -> None:
    """``result = linalg.generic`` over ``[f]`` vectors ``ins`` (block arguments ``%i0``...;
    ``body`` ends by defining ``%r``)."""
    f_t = _tensor(f)
    maps = ", ".join(["affine_map<(d0) -> (d0)>"] * (len(ins) + 1))
    e(f"  {result}_init = tensor.empty() : {f_t}")
    e(
        f"  {result} = linalg.generic {{indexing_maps = [{maps}], iterator_types = "
        f'["parallel"]}} ins({", ".join(ins)} : {", ".join([f_t] * len(ins))}) '
        f"outs({result}_init : {f_t}) {{"
    )
    e("  ^bb0(" + ", ".join(f"%i{i}: f32" for i in range(len(ins))) + ", %o: f32):")
    for line in body:
        e(f"    {line}")
    e("    linalg.yield %r : f32")
    e(f"  }} -> {f_t}")


def _scale_shift(
    e: Any, g: Conv, bn_eps: float | None, affine: list[tuple[str, list[Any]]], bias: bool
) -> tuple[str | None, str | None]:
    """Emits the ``[f]`` scale and shift (either None where not needed) that fold a batch norm
    (``bn_eps`` given: the arguments ``%gamma``, ``%beta``, ``%mean``, ``%var``; with the bias)
    or the per-channel steps ``affine`` (arguments ``%p<i>``; with the bias) into a kernel's
    epilogue, else the bias ``%b`` alone as the shift (``bias``); returns their names."""
    f = g.f
    if bn_eps is not None:  # y = (conv + b - mean) / sqrt(var + eps) * gamma + beta
        e(f"  %eps = arith.constant {bn_eps:.9e} : f32")
        _vector_op(
            e,
            "%scale",
            ["%gamma", "%var"],
            [
                "%ve = arith.addf %i1, %eps : f32",
                "%sd = math.sqrt %ve : f32",
                "%r = arith.divf %i0, %sd : f32",
            ],
            f,
        )
        if g.bias:  # shift = beta + (b - mean) * scale
            ins = ["%beta", "%mean", "%scale", "%b"]
            body = ["%bm = arith.subf %i3, %i1 : f32", "%ms = arith.mulf %bm, %i2 : f32"]
            body.append("%r = arith.addf %i0, %ms : f32")
        else:  # shift = beta - mean * scale
            ins = ["%beta", "%mean", "%scale"]
            body = ["%ms = arith.mulf %i1, %i2 : f32", "%r = arith.subf %i0, %ms : f32"]
        _vector_op(e, "%shift", ins, body, f)
        return "%scale", "%shift"
    if affine:
        return _affine_vectors(e, affine, f, "%b" if g.bias else None)
    return None, "%b" if bias else None


def _padded_vector(e: Any, v: str, f: int, np_: int) -> str:
    """``v`` (``[f]``) zero-padded to ``np_`` (the kernel's panels); its name."""
    if np_ == f:
        return v
    e(f"  {v}_np = tensor.pad {v} low[0] high[{np_ - f}] {{")
    e("  ^bb0(%pi: index):")
    e("    tensor.yield %zero : f32")
    e(f"  }} : {_tensor(f)} to {_tensor(np_)}")
    return f"{v}_np"


def _epilogue_operands(
    e: Any,
    kernel: Avx512Conv | WinogradConv | DepthwiseConv,
    bn_eps: float | None,
    affine: list[tuple[str, list[Any]]],
) -> list[str]:
    """Emits the kernel's epilogue operands (scale, shift: padded to ``Np``; the residual as
    ``M x Np``) from the function's arguments; returns their names, in the kernel's order."""
    g = kernel.g
    assert g.n is not None
    f, np_ = g.f, kernel.np_
    pair = _scale_shift(e, g, bn_eps, affine, kernel.shift)
    out = [_padded_vector(e, v, f, np_) for v in pair if v is not None]
    if kernel.residual:
        assert np_ == f, "a residual needs whole panels"
        out.append(_residual_rows(e, g))
    return out


def _residual_rows(e: Any, g: Conv) -> str:
    """Emits ``%rm``, the NCHW residual ``%res`` of the convolution ``g``'s output as
    channels-last rows (``[n * oh * ow, f]``), as the kernels' epilogues read it; its name."""
    assert g.n is not None
    nhwc = _tensor(g.n, g.oh, g.ow, g.f)
    e(f"  %rt_init = tensor.empty() : {nhwc}")
    e(
        f"  %rt = linalg.transpose ins(%res : {_tensor(g.n, g.f, g.oh, g.ow)}) "
        f"outs(%rt_init : {nhwc}) permutation = [0, 2, 3, 1]"
    )
    rows_t = _tensor(g.n * g.oh * g.ow, g.f)
    e(f"  %rm = tensor.collapse_shape %rt [[0, 1, 2], [3]] : {nhwc} into {rows_t}")
    return "%rm"


def _affine_vectors(
    e: Any, affine: list[tuple[str, list[Any]]], f: int, bias: str | None
) -> tuple[str | None, str | None]:
    """Emits the kernel's ``[f]`` scale and shift (None where there is none) folding the
    steps ``affine`` applied to ``conv + bias``: ``- p`` and ``+ p`` move the shift, ``* p``
    scales both."""
    scale, shift = None, bias
    ops = {"sub": "arith.subf", "add": "arith.addf", "mul": "arith.mulf"}
    for i, (kind, sizes) in enumerate(affine):
        dims = ", ".join(str(d) for d in range(len(sizes)))
        e(
            f"  %pv{i} = tensor.collapse_shape %p{i} [[{dims}]] : {_tensor(*sizes)} into {_tensor(f)}"
        )
        p = f"%pv{i}"
        if kind == "mul":
            if scale is not None:
                _vector_op(e, f"%sc{i}", [scale, p], ["%r = arith.mulf %i0, %i1 : f32"], f)
            scale = f"%sc{i}" if scale is not None else p
        if shift is not None:
            _vector_op(e, f"%sh{i}", [shift, p], [f"%r = {ops[kind]} %i0, %i1 : f32"], f)
            shift = f"%sh{i}"
        elif kind == "add":
            shift = p
        elif kind == "sub":
            _vector_op(e, f"%sh{i}", [p], ["%r = arith.negf %i0 : f32"], f)
            shift = f"%sh{i}"
    return scale, shift


def _absorbed(
    conv: Any, g: Conv, residual_ok: bool, activations_ok: bool = False
) -> tuple[BatchNorm | None, list[tuple[Any, str, Any]], Any, list[Any]]:
    """What the kernel absorbs after ``conv`` (:mod:`.epilogues`): ``(batch norm, per-channel
    steps, residual, ops)``, ``ops`` the absorbed ops in order (the last one's result is the
    call's); a residual add only where ``residual_ok`` (the AVX-512 and AMX kernels with whole
    panels); a hardswish, SiLU, sigmoid or hardsigmoid (``_ACTIVATIONS``) instead of a ReLU
    only where ``activations_ok`` (the direct and depthwise AVX-512 kernels)."""
    ops: list[Any] = []
    value = conv.results[0]
    bn = eval_batch_norm(value, g.f)
    affine: list[tuple[Any, str, Any]] = []
    if bn is not None:
        ops.append(bn.op)
        value = bn.op.results[0]
    else:  # a batch norm as torch.export decomposes it, or any per-channel scale and shift
        affine = channel_affine(value, g.f)
        ops += [step[0] for step in affine]
        if affine:
            value = affine[-1][0].results[0]
    residual = None
    add = same_shape_add(value) if residual_ok else None
    if add is not None:
        ops.append(add[0])
        residual, value = add[1], add[0].results[0]
    act = only_user(value, "torch.aten.relu")
    gates = gates_enabled()
    for name in _ACTIVATIONS if activations_ok else ():
        if act is None and (gates or name not in _GATES):
            act = only_user(value, name)
    if act is not None:
        ops.append(act)
    return bn, affine, residual, ops


def _padded_consumer(
    value: Any, found: list[tuple[Any, Conv | None]], start: int
) -> tuple[int, Conv] | None:
    """``(index, geometry)`` of the convolution of ``found[start:]`` reading ``value`` as its input,
    ``value``'s one use, with padding: the kernel producing ``value`` then writes it zero-padded
    as that convolution reads it (:attr:`Avx512Conv.out_pad`), and IREE copies nothing in
    between."""
    uses = list(value.uses)
    if len(uses) != 1 or uses[0].operand_number != 0:
        return None
    user = uses[0].owner
    for i in range(start, len(found)):
        o, g = found[i]
        if o.operation == user.operation and g is not None and any(g.padding):
            return i, g
    return None


def _depthwise_consumer(value: Any, depthwise: list[Any], np_: int) -> tuple[int, Conv] | None:
    """``(index, geometry)`` of the depthwise (or grouped) convolution of ``depthwise`` reading
    ``value`` as its input, ``value``'s one use, with padding, whose kernel reads as many
    channels as the direct kernel producing ``value`` writes (``np_``: its panels' columns past
    ``F``, computed from zero-padded weights, stand where the depthwise kernel reads channels
    it computes and drops; no real channel reads them): that kernel then writes ``value``
    zero-padded as the depthwise kernel reads it, and IREE copies nothing in between
    (EfficientNet's and MobileNet's expansions before their depthwise convolutions)."""
    uses = list(value.uses)
    if len(uses) != 1 or uses[0].operand_number != 0:
        return None
    user = uses[0].owner
    for i, o in enumerate(depthwise):
        if o.operation != user.operation:
            continue
        spec = _depthwise_spec(o)
        if spec is None or not any(spec[0].padding):
            return None
        return (i, spec[0]) if DepthwiseConv(spec[0], spec[1]).np_ == np_ else None
    return None


def rewrite_convs_avx512(
    module_op: Any, bf16: bool = False, amx: bool = False, pools: bool = False
) -> int:
    """Rewrites, in place, each convolution :func:`direct_convs` finds as a call of the AVX-512
    direct-convolution kernel (see the module doc); ``bf16``: its bf16 form
    (``precision="bf16"``), the module then marked as needing AVX512-BF16; ``bf16`` and
    ``amx``: the convolutions the AMX kernel takes (:func:`.amx_conv.amx_conv_supports`) on it
    instead, the module then marked as needing AMX too; ``pools`` (max poolings channels-last,
    :mod:`.pools`): a kernel (AMX, or the fp32 AVX-512 one) may hand its ReLU'd result to a max
    pooling after it, padded (:func:`_rewrite_amx`, :func:`_pool_consumer`).

    Returns:
        How many convolutions were rewritten.
    """
    op = getattr(module_op, "operation", module_op)
    top = TopLevel(op)
    found = [(o, _spec(o)) for o in direct_convs(op)]
    fuse = fusion_enabled()
    depthwise = depthwise_convs(op)  # not rewritten by the loop below: the same ops after it
    # convolutions (their index in found) whose input is an earlier kernel's padded output
    padded_inputs: dict[int, Any] = {}
    # the same for the depthwise convolutions (their index in depthwise)
    padded_depthwise: dict[int, Any] = {}
    # the Winograd-transformed weights: (weight global, tile) -> the packed global's name
    packed_weights: dict[tuple[str, int], str] = {}
    # the AMX kernels' results kept in bf16 for the residual adds of later ones
    bf16_results: list[tuple[Any, Any, tuple[int, int, int, int]]] = []
    unwritten: list[Any] = []  # results whose f32 copy no kernel writes
    body = op.regions[0].blocks[0]
    any_bf16 = any_amx = any_avx512 = False
    for index, (conv, g) in enumerate(found):
        assert g is not None and g.n is not None
        if bf16 and amx and amx_conv_supports(g):
            _, next_inputs = _rewrite_amx(
                top,
                conv,
                g,
                index,
                found,
                padded_inputs.pop(index, None),
                pools,
                bf16_results,
                unwritten,
            )
            padded_inputs.update(next_inputs)
            any_amx = True
            continue
        any_avx512 = True
        # bf16 reads channel pairs: an odd channel count gets one zero channel (the stems)
        pad_c = bf16 and g.c % 2 == 1
        tile = 0 if bf16 else winograd_choice(g)
        weight = _weight_global(body, conv.operands[1]) if tile else None
        tile = tile if weight is not None else 0
        kernel: Avx512Conv | WinogradConv = (
            WinogradConv(g, tile)
            if tile
            else conv_kernel_for(replace(g, c=g.c + 1) if pad_c else g, bf16)
        )
        any_bf16 = any_bf16 or kernel.bf16
        out_t = _tensor(g.n, g.f, g.oh, g.ow)
        direct = isinstance(kernel, Avx512Conv)
        bn, affine, residual, absorbed = (
            _absorbed(conv, g, kernel.np_ == g.f, activations_ok=direct)
            if fuse
            else (None, [], None, [])
        )
        kinds = [kind for _, kind, _ in affine]
        consumer = dw_consumer = pool = None
        if fuse:
            final = absorbed[-1].results[0] if absorbed else conv.results[0]
            relu = bool(absorbed) and absorbed[-1].name == "torch.aten.relu"
            # not in bf16: the next kernel reads bf16, so a conversion pass stays anyway
            if padded_outputs_enabled() and not bf16:
                if kernel.np_ == g.f:  # a direct consumer reads exactly F channels
                    consumer = _padded_consumer(final, found, index + 1)
                if consumer is None and depthwise_padded_outputs_enabled():
                    dw_consumer = _depthwise_consumer(final, depthwise, kernel.np_)
                # a max pooling after the ReLU (a ResNet's stem) reads the result zero-padded
                # as the kernel writes it, without a transpose and a pad of IREE's between
                # (and without the barrier such an input needs: pools.py)
                if pools and relu and kernel.np_ == g.f and consumer is dw_consumer is None:
                    pool = _pool_consumer(final, g)
            reader = consumer or dw_consumer
            out_pad = reader[1].padding if reader is not None else (0, 0)
            kernel = replace(
                kernel,
                scale=bn is not None or "mul" in kinds,
                shift=bn is not None or g.bias or any(k != "mul" for k in kinds),
                residual=residual is not None,
                relu=relu,
                out_pad=pool[1].padding if pool is not None else out_pad,
            )
            # isinstance, not `direct`: it narrows the type for replace
            if isinstance(kernel, Avx512Conv) and absorbed:
                kernel = replace(kernel, **_activation_fields(absorbed[-1].name))
        operands, types = _call_operands(conv, g, bn, affine, residual)
        padded = padded_inputs.pop(index, None)
        name = top.unique(f"{_FUNC_PREFIX}_{index}")
        eps = bn.eps if bn is not None else None
        steps = [(kind, TensorType.of(p).sizes) for _, kind, p in affine]  # type: ignore[union-attr]
        if isinstance(kernel, WinogradConv):
            assert weight is not None
            for exe_name, executable in (
                (kernel.input_name, kernel.input_executable),
                (kernel.gemm.name, kernel.gemm.executable),
                (kernel.name, kernel.output_executable),
            ):
                if exe_name not in top:
                    top.append(executable())
            key = (weight, kernel.tile)
            if key not in packed_weights:  # one transformed copy per weight
                packed_weights[key] = top.unique(f"{_FUNC_PREFIX}_winograd_weight_{index}")
                top.append(
                    _winograd_weight(kernel, weight, packed_weights[key]),
                    declarations=[f"util.global private {weight} : {_tensor(g.f, g.c, 3, 3)}"],
                    before_functions=True,
                )
            text = _winograd_function(
                name,
                kernel,
                packed_weights[key],
                eps,
                padded_input=padded is not None,
                affine=steps,
            )
        else:
            if kernel.name not in top:
                top.append(kernel.executable())
            text = _function(
                name,
                kernel,
                eps,
                padded_input=padded is not None,
                channels=g.c if pad_c else None,
                affine=steps,
            )
        declarations = []
        if isinstance(kernel, WinogradConv):
            packed = packed_weights[(weight, kernel.tile)]  # type: ignore[index]
            elems = kernel.positions * g.c * kernel.gemm.np_
            declarations.append(f"util.global private @{packed} : {_tensor(elems)}")
        top.append(text, declarations=declarations)
        results = [out_t]
        if consumer is not None or dw_consumer is not None or pool is not None:
            results.append(_tensor(kernel.c_rows * kernel.np_))
        # with ``padded``: the previous kernel's C, as this kernel reads it
        call, _ = _replace_by_call(conv, absorbed, name, operands, types, results, padded)
        if consumer is not None:
            padded_inputs[consumer[0]] = call.results[1]
        if dw_consumer is not None:
            padded_depthwise[dw_consumer[0]] = call.results[1]
        if pool is not None:  # the pooling reads the kernel's padded result
            _pool_padded_result(top, pool, call.results[1], f"{POOL_FUNC_PREFIX}_{index}")
    for index, conv in enumerate(depthwise):
        spec = _depthwise_spec(conv)
        assert spec is not None
        padded = padded_depthwise.pop(index, None)
        _rewrite_depthwise(top, conv, spec[0], spec[1], index, fuse, padded)
        any_avx512 = True
    for value in unwritten:  # a reader left would read memory no kernel wrote
        if list(value.uses):
            raise AssertionError(
                "internal error: a convolution's f32 result was left unwritten but is read "
                f"by {next(iter(value.uses)).owner.name}; set TURBINE_CPU_EPILOGUES=nopad "
                "and report the model"
            )
    if any_avx512:
        mark_cpu_requires(op, AVX512_BF16_FEATURES if any_bf16 else kernel_features())
    if any_amx:
        mark_cpu_requires(op, AMX_FEATURES)
    return len(found)
