"""CPU-only rewrite of 1-D and grouped convolutions into the 2-D, groups-1 form that turbine's
AVX-512 direct-convolution kernel takes (:mod:`.avx512_conv`, :mod:`.direct_convs`), in the module handed to IREE.

IREE 3.13 computes grouped convolutions slowly on CPUs: wav2vec2's positional convolution (a
``Conv1d(64, 64, 16, groups=4)`` over 199 frames) ran at ~2 GFLOP/s, 3.5 of the model's 6.4 ms
per call (one thread, AMD EPYC Zen 4), where the kernel runs dense 2-D convolutions at 70-150
GFLOP/s. Two rewrites of the torch-dialect op, before the kernel's rewrite matches it:

- **1-D convolutions** (``[N, C, L]``) become 2-D ones over ``[N, C, 1, L]`` with a ``1 x K``
  kernel (stride, padding and dilation ``(1, s)``, ``(0, p)``, ``(1, d)``) and the result's unit
  height squeezed away: the same sums in the same order.
- **Grouped convolutions** with at most :data:`MAX_GROUPS` groups become one dense convolution
  whose weight is block diagonal: group ``g``'s filters see its own ``C / G`` input channels and
  zeros elsewhere (``constant_pad_nd`` of each group's slice, concatenated). The kernel then does
  ``G`` times the multiply-adds, on zeros for all but one group's, and is still several times
  faster at small ``G``; the zero products add exact zeros, so the values are eager's up to the
  order of the additions. The dense weight is a function of the weight alone: IREE's constant
  hoisting builds it once, at load. Convolutions of more groups (``G`` above
  :data:`MAX_GROUPS`) are not made dense, the blow-up would outgrow the gain: depthwise ones
  and those of up to 16 channels a group go to the depthwise kernel (:mod:`.depthwise`), the
  others keep IREE's code. Where the kernels are built for AVX2, the few-group ones that the
  depthwise kernel takes (as many filters as channels, groups of 1, 2, 4, 8 or 16 channels) go
  there too instead of being made dense (:data:`GROUPED_MAX_WIDTH`).

Only fp32, not transposed, static shapes, where the direct-convolution kernel is the choice
(``rewrites.module_for_compile``); the exported IR is not changed.
"""

from __future__ import annotations

import os
from typing import Any

from .isa import kernel_isa
from .torch_ir import NOT_CONSTANT, Builder, TensorType, constant, constant_int_list, walk

__all__ = ["GROUPED_ENV", "GROUPED_MAX_WIDTH", "MAX_GROUPS", "convs_to_reform", "reform_convs"]

#: Grouped convolutions with at most this many groups are made dense (measured in
#: docs/performance.md, section 10: wav2vec2's 4-group convolution 3.5 -> 0.3 ms).
MAX_GROUPS = 8
#: ... unless the kernels are built for AVX2 and they have as many filters as channels and
#: groups of a divisor of this many channels: the depthwise kernel's grouped form computes
#: those without the dense form's ``G``-fold multiply-adds, 2-4x faster there (RegNetY's groups
#: of 8, wav2vec2's of 16; docs/performance.md section 24; not measured on AVX-512 CPUs, which
#: keep the dense form); 1-D ones are made 2-D, their groups kept. ``TURBINE_CPU_GROUPED=dense``
#: makes them dense there too (for A/B measurements).
GROUPED_MAX_WIDTH = 16
GROUPED_ENV = "TURBINE_CPU_GROUPED"
_CONVOLUTION = "torch.aten.convolution"
_CONV_OPS = ("torch.aten.convolution", "torch.aten.conv1d", "torch.aten.conv2d")


def _operands(op: Any) -> tuple[Any, ...] | None:
    """(x, w, b, stride, padding, dilation, groups) of a convolution op turbine can reform."""
    ops = list(op.operands)
    if op.name == _CONVOLUTION and len(ops) == 9:
        x, w, b, stride, padding, dilation, transposed, _, groups = ops
        if constant(transposed) is not False:
            return None
        return x, w, b, stride, padding, dilation, groups
    if op.name in ("torch.aten.conv1d", "torch.aten.conv2d") and len(ops) == 7:
        x, w, b, stride, padding, dilation, groups = ops
        if str(padding.type) == "!torch.str":
            return None  # padding="same" / "valid"
        return x, w, b, stride, padding, dilation, groups
    return None


def _form(op: Any, grouped_kernel: bool) -> tuple[int, int] | None:
    """``(spatial rank, groups)`` of a convolution to reform (1-D, or grouped with at most
    :data:`MAX_GROUPS` groups and more than one channel per group), else ``None``;
    ``grouped_kernel``: those the depthwise kernel takes stay grouped (:data:`GROUPED_MAX_WIDTH`)."""
    parts = _operands(op)
    if parts is None:
        return None
    x, w, b, stride, padding, dilation, groups = parts
    g = constant(groups)
    xt, wt, rt = TensorType.of(x), TensorType.of(w), TensorType.of(op.results[0])
    if not isinstance(g, int) or g < 1 or xt is None or wt is None or rt is None:
        return None
    if not (xt.dtype == wt.dtype == rt.dtype == "f32"):
        return None
    rank = len(xt.sizes) - 2
    if rank not in (1, 2) or len(wt.sizes) != rank + 2 or len(rt.sizes) != rank + 2:
        return None
    if any(s is None for s in (*xt.sizes, *wt.sizes, *rt.sizes)):
        return None
    if any(constant_int_list(v) is None for v in (stride, padding, dilation)):
        return None
    bias = constant(b)
    if bias is not None and bias is not NOT_CONSTANT:
        return None
    c, f = int(xt.sizes[1]), int(wt.sizes[0])  # type: ignore[arg-type]
    if g > 1 and (g > MAX_GROUPS or c % g or f % g or c == g):
        return None  # many groups, or depthwise: IREE's code
    if g > 1 and grouped_kernel and f == c and GROUPED_MAX_WIDTH % (c // g) == 0:
        g = 1  # the depthwise kernel's grouped form (2-D) takes it, faster than dense
    if g == 1 and rank == 2:
        return None  # already the kernel's form (direct or depthwise)
    return rank, g


def _to_reform(module_op: Any, isa: str | None) -> list[tuple[Any, tuple[int, int]]]:
    """The convolutions to reform, each with its :func:`_form` (read once), for kernels built
    for ``isa`` (None: :func:`.isa.kernel_isa`)."""
    op = getattr(module_op, "operation", module_op)
    grouped_kernel = (isa or kernel_isa()) == "avx2" and (
        os.environ.get(GROUPED_ENV, "").strip().lower() != "dense"
    )
    found = ((o, _form(o, grouped_kernel)) for o in walk(op) if o.name in _CONV_OPS)
    return [(o, form) for o, form in found if form is not None]


def convs_to_reform(module_op: Any, isa: str | None = None) -> list[Any]:
    """The convolutions of ``module_op`` that :func:`reform_convs` rewrites."""
    return [o for o, _ in _to_reform(module_op, isa)]


def _block_diagonal(b: Builder, w: Any, wt: TensorType, groups: int, channels: int) -> Any:
    """The ``[F, C, *K]`` weight whose group ``g`` filters read only group ``g``'s channels."""
    f, cg = int(wt.sizes[0]), int(wt.sizes[1])  # type: ignore[arg-type]
    fg = f // groups
    kernel = [int(k) for k in wt.sizes[2:]]  # type: ignore[arg-type]
    blocks = []
    for g in range(groups):
        part = wt.with_sizes([fg, cg, *kernel])
        piece = b.op(
            "torch.aten.slice.Tensor",
            part.asm(),
            [w, b.int(0), b.int(g * fg), b.int((g + 1) * fg), b.int(1)],
        )
        # constant_pad_nd pads the last dimension first: the kernel's, then the channels'.
        pads = [0, 0] * len(kernel) + [g * cg, (groups - 1 - g) * cg]
        padded = b.op(
            "torch.aten.constant_pad_nd",
            wt.with_sizes([fg, channels, *kernel]).asm(),
            [piece, b.int_list(pads), b.float(0.0)],
        )
        blocks.append(padded)
    listed = b.op("torch.prim.ListConstruct", "!torch.list<vtensor>", blocks)
    return b.op("torch.aten.cat", wt.with_sizes([f, channels, *kernel]).asm(), [listed, b.int(0)])


def _reform_one(op: Any, form: tuple[int, int]) -> None:
    rank, groups = form
    # the operands read now: an earlier rewrite may have replaced this op's input
    parts = _operands(op)
    assert parts is not None
    x, w, bias, stride, padding, dilation, op_groups = parts
    xt, wt, rt = TensorType.of(x), TensorType.of(w), TensorType.of(op.results[0])
    assert xt is not None and wt is not None and rt is not None
    channels = int(xt.sizes[1])  # type: ignore[arg-type]
    s, p, d = (constant_int_list(v) for v in (stride, padding, dilation))
    assert s is not None and p is not None and d is not None
    s, p, d = ([v[0]] * rank if len(v) == 1 else v for v in (s, p, d))  # conv2d's [1] = [1, 1]
    bld = Builder(op)
    if groups > 1:
        w = _block_diagonal(bld, w, wt, groups, channels)
        wt = wt.with_sizes([wt.sizes[0], channels, *wt.sizes[2:]])
    if rank == 1:  # [N, C, L] -> [N, C, 1, L]: a 1 x K kernel over a unit height
        x = bld.op(
            "torch.aten.unsqueeze",
            xt.with_sizes([*xt.sizes[:2], 1, xt.sizes[2]]).asm(),
            [x, bld.int(2)],
        )
        w = bld.op(
            "torch.aten.unsqueeze",
            wt.with_sizes([*wt.sizes[:2], 1, wt.sizes[2]]).asm(),
            [w, bld.int(2)],
        )
        s, p, d = [1, s[-1]], [0, p[-1]], [1, d[-1]]
    out_t = rt.with_sizes([*rt.sizes[:2], 1, rt.sizes[2]]) if rank == 1 else rt
    conv = bld.op(
        _CONVOLUTION,
        out_t.asm(),
        [
            x,
            w,
            bias,
            bld.int_list(s),
            bld.int_list(p),
            bld.int_list(d),
            bld.false(),
            bld.int_list([0] * len(s)),
            bld.int(1 if groups > 1 else int(constant(op_groups))),  # dense, or as it was
        ],
    )
    if rank == 1:
        conv = bld.op("torch.aten.squeeze.dim", rt.asm(), [conv, bld.int(2)])
    op.results[0].replace_all_uses_with(conv)
    op.erase()


def reform_convs(module_op: Any, isa: str | None = None) -> int:
    """Rewrites, in place, each 1-D and few-group convolution (see the module doc) as a 2-D dense
    convolution (or a 2-D grouped one, see :data:`GROUPED_MAX_WIDTH`), for kernels built for
    ``isa`` (None: :func:`.isa.kernel_isa`). Returns how many were rewritten."""
    convs = _to_reform(module_op, isa)
    for conv, form in convs:  # each form read once, before any rewrite
        _reform_one(conv, form)
    return len(convs)
