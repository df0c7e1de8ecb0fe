"""CPU-only rewrite of convolutions with few input channels (image stems) in the module handed to IREE.

The first convolution of an image network reads 1-4 channels (RGB: 3) through a large kernel
(ResNet's 7x7/2, MobileNet's 3x3/2). IREE 3.13's data-tiled convolution packs that channel
dimension into 16-wide tiles, so most of its work is padding: ResNet-18's 7x7 stem took 19.5 ms
of a 21 ms call (one thread, loaded machine; eager, oneDNN: ~2 ms). Written as an im2col copy
(one element-wise dispatch that gathers each output pixel's ``kh x kw x C`` window into a row)
and a ``(N*OH*OW) x (kh*kw*C)`` by ``(kh*kw*C) x F`` matmul, it reaches IREE's data-tiled matmul
path: 7.3 ms for the same call (2.9x), the matmul 137 GFLOP/s (docs/performance.md). Convolutions
with more channels keep IREE's own path (data-tiled, or im2col for pointwise programs), which is
faster for them.

:func:`rewrite_small_channel_convs` rewrites a module in place; the compile path applies it to
the copy handed to IREE for ``llvm-cpu`` targets (``rewrites.module_for_compile``), so the
exported IR stays the one the reference emits. Each rewritten convolution becomes a call of a
private function over builtin tensors (IREE inlines it)::

    cols[n, oh, ow, ky, kx, c] = pad(x)[n, c, oh*sh + ky*dh, ow*sw + kx*dw]
    out = (cols as [N*OH*OW, KH*KW*C]) @ (w as [KH*KW*C, F]) + b   -> NCHW
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .torch_ir import NOT_CONSTANT, TensorType, constant, walk

__all__ = ["SMALL_CHANNELS", "rewrite_small_channel_convs", "small_channel_convs"]

#: Convolutions reading at most this many input channels are rewritten.
SMALL_CHANNELS = 4
_CONV2D = "torch.aten.conv2d"
_CONVOLUTION = "torch.aten.convolution"
_FUNC_PREFIX = "__turbine_small_channel_conv"


@dataclass(frozen=True)
class _Conv:
    """A static 2-D NCHW convolution (fp32, groups 1, not transposed) and its geometry."""

    n: int
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


def _int_list(value: Any) -> list[int] | None:
    owner = value.owner
    if getattr(owner, "name", None) != "torch.prim.ListConstruct":
        return None
    items = [constant(v) for v in owner.operands]
    if any(not isinstance(i, int) or isinstance(i, bool) for i in items):
        return None
    return items


def _pair(values: list[int] | None) -> tuple[int, int] | None:
    if values is None or len(values) not in (1, 2):
        return None
    return (values[0], values[-1])


def _spec(op: Any) -> _Conv | None:
    """The convolution's geometry when it is one this rewrite handles, else ``None``."""
    operands = list(op.operands)
    if op.name == _CONV2D and len(operands) == 7:
        x, w, b, stride, padding, dilation, groups = operands
    elif op.name == _CONVOLUTION and len(operands) == 9:
        x, w, b, stride, padding, dilation, transposed, _, groups = operands
        if constant(transposed) is not False:
            return None
    else:
        return None
    if constant(groups) != 1:
        return None
    xt, wt, rt = TensorType.of(x), TensorType.of(w), TensorType.of(op.results[0])
    if xt is None or wt is None or rt is None or not (xt.dtype == wt.dtype == rt.dtype == "f32"):
        return None
    if len(xt.sizes) != 4 or len(wt.sizes) != 4 or len(rt.sizes) != 4:
        return None
    if any(s is None for s in (*xt.sizes, *wt.sizes, *rt.sizes)):
        return None
    bias = constant(b)
    if bias is NOT_CONSTANT:
        bt = TensorType.of(b)
        if bt is None or bt.dtype != "f32" or bt.sizes != [wt.sizes[0]]:
            return None
    elif bias is not None:
        return None
    s, p, d = _pair(_int_list(stride)), _pair(_int_list(padding)), _pair(_int_list(dilation))
    if s is None or p is None or d is None:
        return None
    n, c, h, wi = (int(v) for v in xt.sizes)  # type: ignore[arg-type]
    f, wc, kh, kw = (int(v) for v in wt.sizes)  # type: ignore[arg-type]
    if wc != c or c > SMALL_CHANNELS or kh * kw == 1 or min(*s, *d) < 1 or min(p) < 0:
        return None
    oh = (h + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    ow = (wi + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    if [n, f, oh, ow] != rt.sizes or oh < 1 or ow < 1:
        return None
    return _Conv(n, c, h, wi, f, kh, kw, s, p, d, oh, ow, bias is NOT_CONSTANT)


def small_channel_convs(module_op: Any) -> list[Any]:
    """The convolutions of ``module_op`` that :func:`rewrite_small_channel_convs` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name in (_CONV2D, _CONVOLUTION) and _spec(o) is not None]


def _tensor(*dims: int) -> str:
    return "tensor<" + "x".join(str(d) for d in dims) + "xf32>"


def _function(name: str, g: _Conv) -> str:
    """The private function computing the convolution as im2col + matmul (builtin tensors)."""
    m, k = g.n * g.oh * g.ow, g.kh * g.kw * g.c
    (sh, sw), (ph, pw), (dh, dw) = g.stride, g.padding, g.dilation
    hp, wp = g.h + 2 * ph, g.w + 2 * pw
    x_t, xp_t = _tensor(g.n, g.c, g.h, g.w), _tensor(g.n, g.c, hp, wp)
    w_t, out_t = _tensor(g.f, g.c, g.kh, g.kw), _tensor(g.n, g.f, g.oh, g.ow)
    cols_t = _tensor(g.n, g.oh, g.ow, g.kh, g.kw, g.c)
    args = f"%x: {x_t}, %w: {w_t}" + (f", %b: {_tensor(g.f)}" if g.bias else "")
    lines = [f"func.func private @{name}({args}) -> {out_t} {{"]
    lines.append("  %zero = arith.constant 0.0 : f32")
    src = "%x"
    if ph or pw:
        lines += [
            f"  %xp = tensor.pad %x low[0, 0, {ph}, {pw}] high[0, 0, {ph}, {pw}] {{",
            "  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):",
            "    tensor.yield %zero : f32",
            f"  }} : {x_t} to {xp_t}",
        ]
        src = "%xp"
    window = f"(n, c, oh * {sh} + ky * {dh}, ow * {sw} + kx * {dw})"
    lines += [
        f"  %cols_init = tensor.empty() : {cols_t}",
        "  %cols = linalg.generic {indexing_maps = ["
        f"affine_map<(n, oh, ow, ky, kx, c) -> {window}>, "
        "affine_map<(n, oh, ow, ky, kx, c) -> (n, oh, ow, ky, kx, c)>], iterator_types = "
        '["parallel", "parallel", "parallel", "parallel", "parallel", "parallel"]} '
        f"ins({src} : {xp_t if src == '%xp' else x_t}) outs(%cols_init : {cols_t}) {{",
        "  ^bb0(%in: f32, %out: f32):",
        "    linalg.yield %in : f32",
        f"  }} -> {cols_t}",
        f"  %lhs = tensor.collapse_shape %cols [[0, 1, 2], [3, 4, 5]] : {cols_t} into "
        f"{_tensor(m, k)}",
        f"  %wt_init = tensor.empty() : {_tensor(g.kh, g.kw, g.c, g.f)}",
        f"  %wt = linalg.transpose ins(%w : {w_t}) outs(%wt_init : "
        f"{_tensor(g.kh, g.kw, g.c, g.f)}) permutation = [2, 3, 1, 0]",
        f"  %rhs = tensor.collapse_shape %wt [[0, 1, 2], [3]] : {_tensor(g.kh, g.kw, g.c, g.f)} "
        f"into {_tensor(k, g.f)}",
        f"  %acc_init = tensor.empty() : {_tensor(m, g.f)}",
        f"  %acc = linalg.fill ins(%zero : f32) outs(%acc_init : {_tensor(m, g.f)}) -> "
        f"{_tensor(m, g.f)}",
        f"  %mm = linalg.matmul ins(%lhs, %rhs : {_tensor(m, k)}, {_tensor(k, g.f)}) "
        f"outs(%acc : {_tensor(m, g.f)}) -> {_tensor(m, g.f)}",
    ]
    result = "%mm"
    if g.bias:
        lines += [
            "  %biased = linalg.generic {indexing_maps = [affine_map<(m, f) -> (m, f)>, "
            "affine_map<(m, f) -> (f)>, affine_map<(m, f) -> (m, f)>], iterator_types = "
            f'["parallel", "parallel"]}} ins(%mm, %b : {_tensor(m, g.f)}, {_tensor(g.f)}) '
            f"outs(%acc_init : {_tensor(m, g.f)}) {{",
            "  ^bb0(%v: f32, %bv: f32, %o: f32):",
            "    %s = arith.addf %v, %bv : f32",
            "    linalg.yield %s : f32",
            f"  }} -> {_tensor(m, g.f)}",
        ]
        result = "%biased"
    nhwc = _tensor(g.n, g.oh, g.ow, g.f)
    lines += [
        f"  %nhwc = tensor.expand_shape {result} [[0, 1, 2], [3]] output_shape "
        f"[{g.n}, {g.oh}, {g.ow}, {g.f}] : {_tensor(m, g.f)} into {nhwc}",
        f"  %out_init = tensor.empty() : {out_t}",
        f"  %out = linalg.transpose ins(%nhwc : {nhwc}) outs(%out_init : {out_t}) "
        "permutation = [0, 3, 1, 2]",
        f"  return %out : {out_t}",
        "}",
    ]
    return "\n".join(lines)


def rewrite_small_channel_convs(module_op: Any) -> int:
    """Rewrites, in place, each convolution with at most :data:`SMALL_CHANNELS` input channels
    (static, fp32, groups 1, not transposed; see the module doc) as im2col + matmul.

    Returns:
        How many convolutions were rewritten.
    """
    from turbine_ir.ir import FlatSymbolRefAttr, InsertionPoint, Module, Operation, Type

    op = getattr(module_op, "operation", module_op)
    body = op.regions[0].blocks[0]
    taken = {
        str(o.attributes["sym_name"]).strip('"')
        for o in body.operations
        if "sym_name" in o.operation.attributes
    }
    convs = [(o, _spec(o)) for o in small_channel_convs(op)]
    for index, (conv, spec) in enumerate(convs):
        assert spec is not None
        name = f"{_FUNC_PREFIX}_{index}"
        while name in taken:
            name += "_"
        taken.add(name)
        with conv.context:
            parsed = Module.parse(_function(name, spec))
        func = parsed.body.operations[0].operation
        func.detach_from_parent()
        body.append(func)
        operands = list(conv.operands)[: 3 if spec.bias else 2]
        with conv.location, InsertionPoint(conv):
            builtin = [
                Operation.create(
                    "torch_c.to_builtin_tensor",
                    results=[Type.parse(t, conv.context)],
                    operands=[v],
                ).result
                for v, t in zip(
                    operands,
                    [
                        _tensor(spec.n, spec.c, spec.h, spec.w),
                        _tensor(spec.f, spec.c, spec.kh, spec.kw),
                        _tensor(spec.f),
                    ],
                )
            ]
            call = Operation.create(
                "func.call",
                results=[Type.parse(_tensor(spec.n, spec.f, spec.oh, spec.ow), conv.context)],
                operands=builtin,
                attributes={"callee": FlatSymbolRefAttr.get(name)},
            ).result
            back = Operation.create(
                "torch_c.from_builtin_tensor",
                results=[conv.results[0].type],
                operands=[call],
            ).result
        conv.results[0].replace_all_uses_with(back)
        conv.erase()
    return len(convs)
