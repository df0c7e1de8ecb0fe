"""llvm-cpu: 2-D max pooling computed channels-last in the compile copy, beside the AVX-512
direct-convolution kernel (:mod:`.avx512_conv`), which reads and writes NHWC.

torch-mlir lowers ``torch.aten.max_pool2d`` to an NCHW ``linalg.pooling_nchw_max``. Between two
rewritten convolutions (ResNet's stem and its first block) that pooling is the one NCHW op:
IREE then writes the stem's output NCHW (a transposed store of the batch norm + ReLU), data-tiles
the pooling like a convolution (an encode dispatch copying its padded input before it), and the
first block, whose residual reads the pooled NCHW tensor, reads it through a transpose, writes
its own output in both layouts and copies the NHWC one into the next padded input. Each accepted
max pooling becomes a call of a private function over builtin tensors (IREE inlines it)::

    xp  = util.optimization_barrier(pad(transpose(x, NCHW -> NHWC), -inf))
    o   = max(slice(xp, tap 0, stride), ..., slice(xp, tap KH*KW-1, stride))   (element-wise)
    out = transpose(o, NHWC -> NCHW)

so the transposes cancel against the convolutions' and every activation of the region stays
NHWC. The taps are strided slices of the padded input, which IREE folds into strided loads of
one element-wise dispatch vectorized over the channels; a ``linalg.pooling_nhwc_max`` would
still be data-tiled behind a copy of its input, and a ``linalg.generic`` reading the window
through ``h * s + ky`` maps is not vectorized (ResNet-18, one thread, per dispatch:
docs/performance.md, section 10: the region 2.8 ms before, 1.3 with the named NHWC pooling, 0.6
so). The barrier keeps IREE 3.13's element-wise fusion from the pattern it miscompiles (a
producer with another use read through a window, see :mod:`.convs`). The values are the same
bit for bit (a maximum is exact; the padding is -inf as in torch-mlir's lowering). A pooling
that reads a convolution kernel's result as the kernel wrote it (below, and
``max_pool_function(padded_input=True)``) has no barrier: its producer is a dispatch of
turbine's own, which IREE cannot fuse, and a barrier there made IREE wait on the host for the
kernel's result, splitting the call into two submissions (one more round trip through the
queue: bf16 ResNet-50 0.978x / 0.975x the time with it at one / two threads, interleaved;
docs/performance.md, section 18).
Accepted: fp32, 4-D static shapes, any kernel, stride and padding, dilation 1, ``ceil_mode``
false (or true where the output size is the same); ``max_pool2d_with_indices`` stays as it is.

Global average poolings (``adaptive_avg_pool2d`` to ``1 x 1``: squeeze-excitation blocks,
classifier heads) become ``mean.dim`` over the spatial dimensions (:func:`global_avg_pools`):
torch-mlir lowers an adaptive pooling to a reduction that gathers every element through
``tensor.extract`` with per-element index arithmetic, over a copy of its input padded by one
row and column; MobileNetV3's nine took 0.28 of its 2.39 ms (docs/performance.md, section 15).
The sum and the division are the same; only the order of the additions may differ.

A max pooling right after an AMX convolution (``precision="bf16"``: a ResNet's stem) whose
result only AMX kernels read reads that kernel's result in bf16, zero-padded, and computes in
bf16 (:func:`max_pool_bf16_function`):
rounding to bf16 is monotonic, so the maxima of the rounded values are the rounded maxima, the
bits the next convolution read before. It writes the next AMX convolution's padded input
itself, and a bf16 copy for the residual add that reads it (docs/performance.md, section 18).

``TURBINE_CPU_POOLS=keep`` leaves them all to torch-mlir; ``TURBINE_CPU_POOLS=f32`` keeps the
pooling after an AMX convolution in f32 (what turbine did before, for A/B measurements).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .convs import _pair
from .torch_ir import Builder, TensorType, TopLevel, constant, constant_int_list, replace_each, walk

__all__ = [
    "CPU_POOLS_ENV",
    "POOL_FUNC_PREFIX",
    "MaxPool",
    "global_avg_pools",
    "max_pool_bf16_function",
    "max_pool_function",
    "max_pool_geometry",
    "max_pools",
    "padded_input_size",
    "pools_in_bf16",
    "rewrite_global_avg_pools",
    "rewrite_max_pools_nhwc",
]

#: Environment variable: ``keep`` leaves the max poolings to torch-mlir (NCHW).
CPU_POOLS_ENV = "TURBINE_CPU_POOLS"
_MAX_POOL = "torch.aten.max_pool2d"
_ADAPTIVE_AVG_POOL = "torch.aten.adaptive_avg_pool2d"
_FLOATS = ("f32", "f16", "bf16", "f64")
#: The prefix of the pooling functions' names.
POOL_FUNC_PREFIX = "__turbine_max_pool_nhwc"


@dataclass(frozen=True)
class MaxPool:
    """A static fp32 2-D max pooling (dilation 1) and its geometry."""

    n: int
    c: int
    h: int
    w: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    oh: int
    ow: int


def max_pool_geometry(op: Any) -> MaxPool | None:
    """The geometry of ``op`` when it is a max pooling :func:`rewrite_max_pools_nhwc` handles."""
    if op.name != _MAX_POOL or len(list(op.operands)) != 6:
        return None
    x, kernel, stride, padding, dilation, ceil_mode = op.operands
    xt, rt = TensorType.of(x), TensorType.of(op.results[0])
    if xt is None or rt is None or xt.dtype != "f32" or rt.dtype != "f32":
        return None
    if len(xt.sizes) != 4 or len(rt.sizes) != 4 or any(s is None for s in xt.sizes):
        return None
    k = _pair(constant_int_list(kernel))
    s_list = constant_int_list(stride)
    s = k if s_list == [] else _pair(s_list)  # an empty stride is the kernel's
    p, d = _pair(constant_int_list(padding)), _pair(constant_int_list(dilation))
    if (
        k is None
        or s is None
        or p is None
        or d != (1, 1)
        or constant(ceil_mode) not in (True, False)
    ):
        return None
    if min(*k, *s) < 1 or min(p) < 0 or 2 * p[0] > k[0] or 2 * p[1] > k[1]:
        return None
    n, c, h, w = (int(v) for v in xt.sizes)  # type: ignore[arg-type]
    oh = (h + 2 * p[0] - k[0]) // s[0] + 1
    ow = (w + 2 * p[1] - k[1]) // s[1] + 1
    if oh < 1 or ow < 1 or rt.sizes != [n, c, oh, ow]:
        return None  # ceil_mode with a larger output: left as it is
    return MaxPool(n, c, h, w, k, s, p, oh, ow)


def max_pools(module_op: Any) -> list[Any]:
    """The max poolings of ``module_op`` that :func:`rewrite_max_pools_nhwc` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name == _MAX_POOL and max_pool_geometry(o) is not None]


def _tensor(*dims: int) -> str:
    return "tensor<" + "x".join(str(d) for d in dims) + "xf32>"


def padded_input_size(g: MaxPool) -> int:
    """Elements of the pooling's input zero-padded channels-last (``[n, h + 2 ph, w + 2 pw,
    c]``), as :func:`max_pool_function` takes it with ``padded_input``."""
    (ph, pw) = g.padding
    return g.n * (g.h + 2 * ph) * (g.w + 2 * pw) * g.c


def max_pool_function(name: str, g: MaxPool, padded_input: bool = False) -> str:
    """The private function computing the max pooling ``g`` channels-last (builtin tensors):
    ``(%x NCHW) -> NCHW``; with ``padded_input``, ``%x`` is the input already channels-last and
    padded, flat (:func:`padded_input_size`): a convolution kernel's result written so
    (:mod:`.direct_convs`), its border zeros rather than -inf, which gives the same maxima
    where no input is below zero (a ReLU's output) and every window holds an input pixel (a
    padding of at most half the window, as :func:`max_pool_geometry` requires)."""
    (ph, pw) = g.padding
    x_t, out_t = _tensor(g.n, g.c, g.h, g.w), _tensor(g.n, g.c, g.oh, g.ow)
    nhwc_t, xp_t = _tensor(g.n, g.h, g.w, g.c), _tensor(g.n, g.h + 2 * ph, g.w + 2 * pw, g.c)
    if padded_input:
        flat_t = _tensor(padded_input_size(g))
        lines = [f"func.func private @{name}(%x: {flat_t}) -> {out_t} {{"]
        e = lines.append
        e(
            f"  %xp = tensor.expand_shape %x [[0, 1, 2, 3]] output_shape "
            f"[{g.n}, {g.h + 2 * ph}, {g.w + 2 * pw}, {g.c}] : {flat_t} into {xp_t}"
        )
        return _pooled(lines, g, "%xp", xp_t, barrier=False)
    lines = [f"func.func private @{name}(%x: {x_t}) -> {out_t} {{"]
    e = lines.append
    e("  %ninf = arith.constant 0xFF800000 : f32")
    e(f"  %xt_init = tensor.empty() : {nhwc_t}")
    e(
        f"  %xt = linalg.transpose ins(%x : {x_t}) outs(%xt_init : {nhwc_t}) "
        "permutation = [0, 2, 3, 1]"
    )
    src, src_t = "%xt", nhwc_t
    if ph or pw:
        e(f"  %xp = tensor.pad %xt low[0, {ph}, {pw}, 0] high[0, {ph}, {pw}, 0] {{")
        e("  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):")
        e("    tensor.yield %ninf : f32")
        e(f"  }} : {nhwc_t} to {xp_t}")
        src, src_t = "%xp", xp_t
    return _pooled(lines, g, src, src_t, barrier=True)


def pools_in_bf16() -> bool:
    """Whether a max pooling after an AMX convolution runs in bf16 (unless
    ``TURBINE_CPU_POOLS=f32``; see the module doc)."""
    return os.environ.get(CPU_POOLS_ENV, "").strip().lower() != "f32"


def max_pool_bf16_function(
    name: str, g: MaxPool, next_layouts: Sequence[tuple[int, int, int, int]] = ()
) -> str:
    """The private function computing the max pooling ``g`` in bf16 over an AMX convolution's
    ReLU'd result as that kernel wrote it for the pooling (bf16, channels-last, zero-padded,
    flat: :func:`padded_input_size` elements; zero rather than -inf, as in
    :func:`max_pool_function`). Returns the NCHW f32 result (for readers that want it), the
    result channels-last in bf16 (flat ``[n, oh, ow, c]``: the layout ``(oh, ow, 0, 0)`` of
    :attr:`.amx_conv.AmxConv.residual_layout`) and, for each of ``next_layouts`` (``(rows,
    cols, ph, pw)``, as :attr:`.amx_conv.AmxConv.out_next`), an AMX convolution's input: the
    result at ``(ph, pw)`` of zeros ``rows x cols``, flat. The maxima are those of the bf16 bit
    patterns, sign bit cleared, as unsigned integers: a ReLU's values are ``+0``, positive,
    ``+inf`` or NaN (and ``-0`` at most, which the cleared sign makes ``+0``, the same value),
    whose patterns are ordered as the values are, a NaN's above all others, so a window with
    a NaN gives a NaN as ``maximumf`` does. One AND and one integer maximum per 32 values and
    tap, where the float form converted each tap to f32 and back: the pooling of ResNet-18's
    stem 0.139 -> 0.073 ms (docs/performance.md, section 18)."""
    (ph, pw) = g.padding
    n, c, oh, ow = g.n, g.c, g.oh, g.ow
    flat_t = f"tensor<{padded_input_size(g)}xbf16>"
    xp_t = f"tensor<{n}x{g.h + 2 * ph}x{g.w + 2 * pw}x{c}xbf16>"
    o_t, p_t = f"tensor<{n}x{oh}x{ow}x{c}xbf16>", f"tensor<{n * oh * ow * c}xbf16>"
    out_t, of_t = _tensor(n, c, oh, ow), _tensor(n, oh, ow, c)
    results = [out_t, p_t]
    for rows, cols, nph, npw in next_layouts:
        if nph < 0 or npw < 0 or nph + oh > rows or npw + ow > cols:
            raise ValueError(f"max pooling: its result does not fit {(rows, cols, nph, npw)}: {g}")
        results.append(f"tensor<{n * rows * cols * c}xbf16>")
    lines = [f"func.func private @{name}(%x: {flat_t}) -> ({', '.join(results)}) {{"]
    e = lines.append
    e(
        f"  %xp = tensor.expand_shape %x [[0, 1, 2, 3]] output_shape "
        f"[{n}, {g.h + 2 * ph}, {g.w + 2 * pw}, {c}] : {flat_t} into {xp_t}"
    )

    def maxima(e, taps: list[str]) -> str:
        e("    %mag = arith.constant 32767 : i16")  # 0x7fff: all but the sign
        for i, t in enumerate(taps):
            e(f"    %b{i} = arith.bitcast {t} : bf16 to i16")
            e(f"    %e{i} = arith.andi %b{i}, %mag : i16")
        acc = "%e0"
        for i in range(1, len(taps)):
            e(f"    %m{i} = arith.maxui {acc}, %e{i} : i16")
            acc = f"%m{i}"
        e(f"    %r = arith.bitcast {acc} : i16 to bf16")
        return "%r"

    _window_maximum(e, g, "%xp", xp_t, o_t, "bf16", maxima, barrier=False)
    ident = "affine_map<(n, h, w, c) -> (n, h, w, c)>"
    parallel = 'iterator_types = ["parallel", "parallel", "parallel", "parallel"]'
    e(f"  %of_init = tensor.empty() : {of_t}")
    e(
        f"  %of = linalg.generic {{indexing_maps = [{ident}, {ident}], {parallel}}} "
        f"ins(%o : {o_t}) outs(%of_init : {of_t}) {{"
    )
    e("  ^bb0(%v: bf16, %w: f32):")
    e("    %vf = arith.extf %v : bf16 to f32")
    e("    linalg.yield %vf : f32")
    e(f"  }} -> {of_t}")
    e(f"  %out_init = tensor.empty() : {out_t}")
    e(
        f"  %out = linalg.transpose ins(%of : {of_t}) outs(%out_init : {out_t}) "
        "permutation = [0, 3, 1, 2]"
    )
    e(f"  %flat = tensor.collapse_shape %o [[0, 1, 2, 3]] : {o_t} into {p_t}")
    names = ["%out", "%flat"]
    if next_layouts:
        e("  %zb = arith.constant 0.0 : bf16")
    for k, (rows, cols, nph, npw) in enumerate(next_layouts):
        pad_t = f"tensor<{n}x{rows}x{cols}x{c}xbf16>"
        e(
            f"  %pd{k} = tensor.pad %o low[0, {nph}, {npw}, 0] "
            f"high[0, {rows - oh - nph}, {cols - ow - npw}, 0] {{"
        )
        e("  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):")
        e("    tensor.yield %zb : bf16")
        e(f"  }} : {o_t} to {pad_t}")
        e(
            f"  %next{k} = tensor.collapse_shape %pd{k} [[0, 1, 2, 3]] : {pad_t} into {results[2 + k]}"
        )
        names.append(f"%next{k}")
    e(f"  return {', '.join(names)} : {', '.join(results)}")
    e("}")
    return "\n".join(lines)


def _window_maximum(
    e: Callable[[str], object],
    g: MaxPool,
    src: str,
    src_t: str,
    o_t: str,
    elem: str,
    maxima: Callable[[Callable[[str], object], list[str]], str],
    *,
    barrier: bool,
) -> None:
    """Emits ``%o`` (``o_t``, channels-last): the maxima over ``g``'s windows of the padded
    channels-last ``src``. Each tap of the window is a strided slice of it, their maximum one
    element-wise op over channels-last vectors (a pooling op would be data-tiled like a
    convolution, behind a copy of its input; a windowed read map is not vectorized), read
    through a barrier where ``barrier`` (IREE 3.13's fusion miscompiles a windowed read of a
    producer with another use, see .convs; not needed where ``src`` is a kernel's result,
    which IREE cannot fuse). ``maxima(e, taps)`` emits the op's body over its block
    arguments (the taps, ``elem``) and returns the value it yields."""
    (kh, kw), (sh, sw) = g.kernel, g.stride
    xb = src
    if barrier:
        e(f"  %xb = util.optimization_barrier {src} : {src_t}")
        xb = "%xb"
    taps = [(ky, kx) for ky in range(kh) for kx in range(kw)]
    for i, (ky, kx) in enumerate(taps):
        e(
            f"  %s{i} = tensor.extract_slice {xb}[0, {ky}, {kx}, 0] [{g.n}, {g.oh}, {g.ow}, {g.c}] "
            f"[1, {sh}, {sw}, 1] : {src_t} to {o_t}"
        )
    ident = "affine_map<(n, h, w, c) -> (n, h, w, c)>"
    e(f"  %o_init = tensor.empty() : {o_t}")
    e(
        f"  %o = linalg.generic {{indexing_maps = [{', '.join([ident] * (len(taps) + 1))}], "
        'iterator_types = ["parallel", "parallel", "parallel", "parallel"]} '
        f"ins({', '.join(f'%s{i}' for i in range(len(taps)))} : "
        f"{', '.join([o_t] * len(taps))}) outs(%o_init : {o_t}) {{"
    )
    args = [f"%t{i}" for i in range(len(taps))]
    e(f"  ^bb0({', '.join(f'{a}: {elem}' for a in args)}, %u: {elem}):")
    e(f"    linalg.yield {maxima(e, args)} : {elem}")
    e(f"  }} -> {o_t}")


def _pooled(lines: list[str], g: MaxPool, src: str, src_t: str, *, barrier: bool) -> str:
    """The rest of :func:`max_pool_function` from the padded channels-last input ``src``."""
    e = lines.append
    out_t, o_t = _tensor(g.n, g.c, g.oh, g.ow), _tensor(g.n, g.oh, g.ow, g.c)

    def maxima(e, taps: list[str]) -> str:
        acc = taps[0]
        for i in range(1, len(taps)):
            e(f"    %m{i} = arith.maximumf {acc}, {taps[i]} : f32")
            acc = f"%m{i}"
        return acc

    _window_maximum(e, g, src, src_t, o_t, "f32", maxima, barrier=barrier)
    e(f"  %out_init = tensor.empty() : {out_t}")
    e(
        f"  %out = linalg.transpose ins(%o : {o_t}) outs(%out_init : {out_t}) "
        "permutation = [0, 3, 1, 2]"
    )
    e(f"  return %out : {out_t}")
    e("}")
    return "\n".join(lines)


def rewrite_max_pools_nhwc(module_op: Any) -> int:
    """Rewrites, in place, each max pooling :func:`max_pools` finds as a call of a channels-last
    pooling function (see the module doc).

    Returns:
        How many max poolings were rewritten.
    """
    op = getattr(module_op, "operation", module_op)
    top = TopLevel(op)
    found = [(o, max_pool_geometry(o)) for o in max_pools(op)]
    for index, (pool, g) in enumerate(found):
        assert g is not None
        name = top.unique(f"{POOL_FUNC_PREFIX}_{index}")
        top.append(max_pool_function(name, g))
        back = Builder(pool).call_on_builtins(
            name,
            [(pool.operands[0], _tensor(g.n, g.c, g.h, g.w))],
            _tensor(g.n, g.c, g.oh, g.ow),
            pool.results[0].type,
        )
        pool.results[0].replace_all_uses_with(back)
        pool.erase()
    return len(found)


def _global_avg_pool(op: Any) -> bool:
    """Whether ``op`` is an ``adaptive_avg_pool2d`` to ``1 x 1`` of a 3-D or 4-D float tensor."""
    if op.name != _ADAPTIVE_AVG_POOL or len(list(op.operands)) != 2:
        return False
    xt, rt = TensorType.of(op.operands[0]), TensorType.of(op.results[0])
    size = constant_int_list(op.operands[1])
    if xt is None or rt is None or xt.dtype not in _FLOATS or rt.dtype != xt.dtype:
        return False
    return len(xt.sizes) in (3, 4) and size in ([1], [1, 1]) and rt.sizes[-2:] == [1, 1]


def global_avg_pools(module_op: Any) -> list[Any]:
    """The global average poolings of ``module_op`` (see the module doc) that
    :func:`rewrite_global_avg_pools` writes as means."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if _global_avg_pool(o)]


def rewrite_global_avg_pools(module_op: Any) -> int:
    """Rewrites, in place, each of :func:`global_avg_pools` as ``mean.dim(x, [-2, -1],
    keepdim=True)``.

    Returns:
        How many were rewritten.
    """

    def mean(b: Builder, pool: Any) -> Any:
        return b.op(
            "torch.aten.mean.dim",
            str(pool.results[0].type),
            [pool.operands[0], b.int_list([-2, -1]), b.true(), b.none()],
        )

    return replace_each(global_avg_pools(module_op), mean)
