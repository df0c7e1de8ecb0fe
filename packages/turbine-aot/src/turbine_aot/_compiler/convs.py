"""CPU-only rewrite of the convolutions IREE's data-tiled convolution path handles badly, in the
module handed to IREE: image stems (few input channels) and pointwise (1x1) convolutions.

turbine compiles convolutions for ``llvm-cpu`` channels-last and data-tiled like matmuls (fastest
for 3x3 and larger kernels over many channels). Two kinds lose there, measured in
docs/performance.md:

- **stems**: the first convolution of an image network reads 1-4 channels (RGB: 3) through a
  large kernel (ResNet's 7x7/2, MobileNet's 3x3/2). The data-tiled convolution packs that
  channel dimension into 16-wide tiles, so most of its work is padding: ResNet-18's 7x7 stem
  took 19.5 ms of a 21 ms call (eager, oneDNN: ~2 ms). As an im2col copy (one element-wise
  dispatch gathering each output pixel's ``kh x kw x C`` window into a row) and a
  ``(N*OH*OW) x (kh*kw*C)`` by ``(kh*kw*C) x F`` matmul, the same call takes 7.3 ms.
- **pointwise (1x1) convolutions** are matmuls over the channels, but IREE 3.13's data-tiled
  convolution is slow on them (ResNet-50 was 2.2-2.5x eager). Written as matmuls, with the
  3x3 convolutions beside them still data-tiled, ResNet-50 (224x224, one thread, CPU time)
  takes 101 instead of 122 ms (eager 106-110 ms in the same runs). (This replaced a program-wide ``--iree-global-opt-use-im2col-for-convs``
  for programs with mostly 1x1 or depthwise convolutions, which slowed their 3x3 convolutions
  and gained nothing on depthwise ones.) Strided 1x1 convolutions (ResNet's downsampling
  shortcuts) stay convolutions: see below.

Both are the same computation: with a 1x1 kernel the "im2col" copy is the NCHW -> NHWC
transpose. :func:`rewrite_convs_as_matmuls` rewrites a module in place; the compile path applies it to the copy handed to IREE for ``llvm-cpu`` targets
(``rewrites.module_for_compile``), so the exported IR stays the one the reference emits. Each
rewritten convolution becomes a call of a private function over builtin tensors (IREE inlines
it)::

    cols[n, oh, ow, ky, kx, c] = pad(x)[n, c, oh*sh + ky*dh, ow*sw + kx*dw]
    out = (cols as [N*OH*OW, KH*KW*C]) @ (w as [KH*KW*C, F]) + b   -> NCHW

**IREE 3.13 miscompiles one pattern this creates**: when an element-wise producer has another
use besides a consumer that reads it through a non-permutation map (a strided or windowed
``linalg.generic`` like this im2col), its elementwise fusion makes that consumer compute the
producer's result too, over the consumer's iteration domain only; the other use then sees a
tensor of which only the read positions were written (ResNet-18: max abs error 0.11; minimal
case in ``tests/test_convs_as_matmuls.py``). So the im2col copy of every windowed (stem)
convolution reads its input through ``util.optimization_barrier``, which IREE does not fuse
across; a 1x1 stride-1 copy is a transpose (a permutation map) and needs none. A strided 1x1
convolution would need the barrier too, on an NCHW tensor that the other consumers want in NHWC;
IREE 3.13 then writes both layouts from the producing matmul's dispatch and exceeds its 32 KiB
stack limit (ResNet-50 at 96x96: 100352 bytes; RegNetY-200MF: 51200), which made the whole
program fall back to no data tiling. So strided 1x1 convolutions are left to IREE.

Rewritten: 2-D, fp32, groups 1, not transposed, static channels and spatial sizes, and either
at most :data:`SMALL_CHANNELS` input channels with a kernel larger than 1x1, or a 1x1 kernel
without padding or stride. The batch may be dynamic for 1x1 convolutions only (IREE 3.13 fails
to compile a barrier over a dynamic tensor: "'tensor.dim' op unexpected during shape cleanup").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .matmuls import KernelFactory, kernel_matmul_function, mark_cpu_requires
from .torch_ir import (
    NOT_CONSTANT,
    Builder,
    TensorType,
    TopLevel,
    constant,
    constant_int_list,
    walk,
)

__all__ = [
    "SMALL_CHANNELS",
    "Conv",
    "conv_geometry",
    "convs_as_matmuls",
    "rewrite_convs_as_matmuls",
]

#: Convolutions reading at most this many input channels (through a kernel larger than 1x1) are
#: rewritten; pointwise ones whatever their channels.
SMALL_CHANNELS = 4
_CONV2D = "torch.aten.conv2d"
_CONVOLUTION = "torch.aten.convolution"
_FUNC_PREFIX = "__turbine_conv_as_matmul"


@dataclass(frozen=True)
class Conv:
    """A 2-D NCHW convolution this rewrite handles, and its geometry (``n`` None: dynamic)."""

    n: int | None
    c: int
    h: int
    w: int
    f: int
    kh: int
    kw: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    oh: int
    ow: int
    bias: bool

    @property
    def hp(self) -> int:
        """Rows of the input with its padding."""
        return self.h + 2 * self.padding[0]

    @property
    def wp(self) -> int:
        """Columns of the input with its padding."""
        return self.w + 2 * self.padding[1]


def _pair(values: list[int] | None) -> tuple[int, int] | None:
    if values is None or len(values) not in (1, 2):
        return None
    return (values[0], values[-1])


def conv_geometry(op: Any, grouped: bool = False) -> Conv | None:
    """The geometry of a 2-D fp32 NCHW convolution of groups 1, not transposed, with static
    channels and spatial sizes (the batch may be dynamic), else ``None``. ``grouped``: of a
    grouped one instead, more than one group and as many filters as channels (weight ``[C,
    C / G, KH, KW]``; depthwise: ``[C, 1, KH, KW]``), whose ``f`` is ``c``."""
    operands = list(op.operands)
    if op.name == _CONV2D and len(operands) == 7:
        x, w, b, stride, padding, dilation, groups = operands
    elif op.name == _CONVOLUTION and len(operands) == 9:
        x, w, b, stride, padding, dilation, transposed, _, groups = operands
        if constant(transposed) is not False:
            return None
    else:
        return None
    xt, wt, rt = TensorType.of(x), TensorType.of(w), TensorType.of(op.results[0])
    channels = xt.sizes[1] if xt is not None and len(xt.sizes) == 4 else None
    g = constant(groups)
    if grouped:
        if not isinstance(g, int) or channels is None or g < 2 or channels % g:
            return None
    elif g != 1:
        return None
    if xt is None or wt is None or rt is None or not (xt.dtype == wt.dtype == rt.dtype == "f32"):
        return None
    if len(xt.sizes) != 4 or len(wt.sizes) != 4 or len(rt.sizes) != 4:
        return None
    if any(s is None for s in (*xt.sizes[1:], *wt.sizes, *rt.sizes[1:])):
        return None  # only the batch may be dynamic
    bias = constant(b)
    if bias is NOT_CONSTANT:
        bt = TensorType.of(b)
        if bt is None or bt.dtype != "f32" or bt.sizes != [wt.sizes[0]]:
            return None
    elif bias is not None:
        return None
    s, p, d = (
        _pair(constant_int_list(stride)),
        _pair(constant_int_list(padding)),
        _pair(constant_int_list(dilation)),
    )
    if s is None or p is None or d is None or min(*s, *d) < 1 or min(p) < 0:
        return None
    n = xt.sizes[0]
    c, h, wi = (int(v) for v in xt.sizes[1:])  # type: ignore[arg-type]
    f, wc, kh, kw = (int(v) for v in wt.sizes)  # type: ignore[arg-type]
    if (wc, f) != ((c // g, c) if grouped else (c, f)):
        return None
    oh = (h + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    ow = (wi + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    if [n, f, oh, ow] != rt.sizes or oh < 1 or ow < 1:
        return None
    return Conv(n, c, h, wi, f, kh, kw, s, p, d, oh, ow, bias is NOT_CONSTANT)


def _spec(op: Any) -> Conv | None:
    """The convolution's geometry when it is one this rewrite handles, else ``None``."""
    g = conv_geometry(op)
    if g is None:
        return None
    stem = g.c <= SMALL_CHANNELS and g.kh * g.kw > 1
    pointwise = g.kh == g.kw == 1 and g.padding == (0, 0) and g.stride == (1, 1)
    if not (stem or pointwise):
        return None
    if g.n is None and _needs_barrier(g.kh, g.kw, g.stride):
        return None  # IREE 3.13 cannot carry a dynamic dimension through the barrier
    return g


def _needs_barrier(kh: int, kw: int, stride: tuple[int, int]) -> bool:
    """Whether the im2col copy reads through a window or a stride (see the module doc)."""
    return kh * kw > 1 or max(stride) > 1


def convs_as_matmuls(module_op: Any) -> list[Any]:
    """The convolutions of ``module_op`` that :func:`rewrite_convs_as_matmuls` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name in (_CONV2D, _CONVOLUTION) and _spec(o) is not None]


def _tensor(*dims: int | None) -> str:
    return "tensor<" + "x".join("?" if d is None else str(d) for d in dims) + "xf32>"


def _function(name: str, g: Conv, matmul: str | None = None) -> str:
    """The private function computing the convolution as im2col + matmul (builtin tensors);
    ``matmul``: the private function computing the matmul (a kernel's, see
    :func:`rewrite_convs_as_matmuls`), else a ``linalg.matmul``."""
    dyn = g.n is None
    k = g.kh * g.kw * g.c
    m = None if g.n is None else g.n * g.oh * g.ow
    (sh, sw), (ph, pw), (dh, dw) = g.stride, g.padding, g.dilation
    x_t, xp_t = _tensor(g.n, g.c, g.h, g.w), _tensor(g.n, g.c, g.h + 2 * ph, g.w + 2 * pw)
    w_t, out_t = _tensor(g.f, g.c, g.kh, g.kw), _tensor(g.n, g.f, g.oh, g.ow)
    cols_t, wt_t = _tensor(g.n, g.oh, g.ow, g.kh, g.kw, g.c), _tensor(g.kh, g.kw, g.c, g.f)
    lhs_t, rhs_t, mm_t = _tensor(m, k), _tensor(k, g.f), _tensor(m, g.f)
    nhwc_t = _tensor(g.n, g.oh, g.ow, g.f)
    args = f"%x: {x_t}, %w: {w_t}" + (f", %b: {_tensor(g.f)}" if g.bias else "")
    n_arg, m_arg, n_size = ("(%n)", "(%m)", "%n") if dyn else ("()", "()", str(g.n))
    lines = [f"func.func private @{name}({args}) -> {out_t} {{"]
    lines.append("  %zero = arith.constant 0.0 : f32")
    if dyn:
        lines += [
            "  %c0 = arith.constant 0 : index",
            f"  %n = tensor.dim %x, %c0 : {x_t}",
            f"  %m = affine.apply affine_map<()[s0] -> (s0 * {g.oh * g.ow})>()[%n]",
        ]
    src, src_t = "%x", x_t
    if _needs_barrier(g.kh, g.kw, g.stride):  # a window, not a permutation: see the module doc
        lines.append(f"  %xb = util.optimization_barrier %x : {x_t}")
        src = "%xb"
    if ph or pw:
        lines += [
            f"  %xp = tensor.pad {src} low[0, 0, {ph}, {pw}] high[0, 0, {ph}, {pw}] {{",
            "  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):",
            "    tensor.yield %zero : f32",
            f"  }} : {x_t} to {xp_t}",
        ]
        src, src_t = "%xp", xp_t
    window = f"(n, c, oh * {sh} + ky * {dh}, ow * {sw} + kx * {dw})"
    lines += [
        f"  %cols_init = tensor.empty{n_arg} : {cols_t}",
        "  %cols = linalg.generic {indexing_maps = ["
        f"affine_map<(n, oh, ow, ky, kx, c) -> {window}>, "
        "affine_map<(n, oh, ow, ky, kx, c) -> (n, oh, ow, ky, kx, c)>], iterator_types = "
        '["parallel", "parallel", "parallel", "parallel", "parallel", "parallel"]} '
        f"ins({src} : {src_t}) outs(%cols_init : {cols_t}) {{",
        "  ^bb0(%in: f32, %out: f32):",
        "    linalg.yield %in : f32",
        f"  }} -> {cols_t}",
        f"  %lhs = tensor.collapse_shape %cols [[0, 1, 2], [3, 4, 5]] : {cols_t} into {lhs_t}",
        f"  %wt_init = tensor.empty() : {wt_t}",
        f"  %wt = linalg.transpose ins(%w : {w_t}) outs(%wt_init : {wt_t}) "
        "permutation = [2, 3, 1, 0]",
        f"  %rhs = tensor.collapse_shape %wt [[0, 1, 2], [3]] : {wt_t} into {rhs_t}",
        f"  %acc_init = tensor.empty{m_arg} : {mm_t}",
    ]
    if matmul is None:
        lines += [
            f"  %acc = linalg.fill ins(%zero : f32) outs(%acc_init : {mm_t}) -> {mm_t}",
            f"  %mm = linalg.matmul ins(%lhs, %rhs : {lhs_t}, {rhs_t}) outs(%acc : {mm_t}) "
            f"-> {mm_t}",
        ]
    else:
        lines.append(f"  %mm = func.call @{matmul}(%lhs, %rhs) : ({lhs_t}, {rhs_t}) -> {mm_t}")
    result = "%mm"
    if g.bias:
        lines += [
            "  %biased = linalg.generic {indexing_maps = [affine_map<(m, f) -> (m, f)>, "
            "affine_map<(m, f) -> (f)>, affine_map<(m, f) -> (m, f)>], iterator_types = "
            f'["parallel", "parallel"]}} ins(%mm, %b : {mm_t}, {_tensor(g.f)}) '
            f"outs(%acc_init : {mm_t}) {{",
            "  ^bb0(%v: f32, %bv: f32, %o: f32):",
            "    %s = arith.addf %v, %bv : f32",
            "    linalg.yield %s : f32",
            f"  }} -> {mm_t}",
        ]
        result = "%biased"
    lines += [
        f"  %nhwc = tensor.expand_shape {result} [[0, 1, 2], [3]] output_shape "
        f"[{n_size}, {g.oh}, {g.ow}, {g.f}] : {mm_t} into {nhwc_t}",
        f"  %out_init = tensor.empty{n_arg} : {out_t}",
        f"  %out = linalg.transpose ins(%nhwc : {nhwc_t}) outs(%out_init : {out_t}) "
        "permutation = [0, 3, 1, 2]",
        f"  return %out : {out_t}",
        "}",
    ]
    return "\n".join(lines)


def rewrite_convs_as_matmuls(
    module_op: Any, kernel_for: KernelFactory | None = None, cpu_requires: tuple[str, ...] = ()
) -> int:
    """Rewrites, in place, each stem and pointwise convolution (see the module doc) as an im2col
    copy and a matmul: a ``linalg.matmul``, or with ``kernel_for`` a call of the kernel
    ``kernel_for(K, F, False)`` gives (:mod:`.matmuls`: the fp32 matmul rewrite only sees torch
    ops, so these matmuls are written for the kernel here); ``cpu_requires`` is then recorded in
    the module's public functions.

    Returns:
        How many convolutions were rewritten.
    """
    op = getattr(module_op, "operation", module_op)
    top = TopLevel(op)
    convs = [(o, _spec(o)) for o in convs_as_matmuls(op)]
    for index, (conv, spec) in enumerate(convs):
        assert spec is not None
        name = top.unique(f"{_FUNC_PREFIX}_{index}")
        texts, matmul = [], None
        if kernel_for is not None:  # the matmul as a call of the kernel's function
            k = spec.kh * spec.kw * spec.c
            kernel = kernel_for(k, spec.f, False)
            if kernel.name not in top:
                texts.append(kernel.executable())
            matmul = top.unique(name + "_mm")
            rows = None if spec.n is None else spec.n * spec.oh * spec.ow
            texts.append(kernel_matmul_function(matmul, rows, k, spec.f, kernel))
        texts.append(_function(name, spec, matmul))
        top.append(*texts)  # one module: func.call needs its callee beside it to verify
        types = [
            _tensor(spec.n, spec.c, spec.h, spec.w),
            _tensor(spec.f, spec.c, spec.kh, spec.kw),
            _tensor(spec.f),
        ]
        operands = list(conv.operands)[: 3 if spec.bias else 2]
        back = Builder(conv).call_on_builtins(
            name,
            list(zip(operands, types)),
            _tensor(spec.n, spec.f, spec.oh, spec.ow),
            conv.results[0].type,
        )
        conv.results[0].replace_all_uses_with(back)
        conv.erase()
    if convs and kernel_for is not None:
        mark_cpu_requires(op, cpu_requires)
    return len(convs)
