"""torchao's int4-weight x int8-activation products of the module handed to IREE rewritten as
calls of the w4a8 kernel (:mod:`.avx512_w4a8`): its AVX-512 VNNI form, or its AVX2 form.

``Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(G))``
exports as fake quantization (docs/quantization.md): the program quantizes each row of the
activations to int8 (asymmetric: scale ``sx`` and zero point ``zx`` per row), dequantizes it
back, ``xd = (cast_f32(X) - cast_f32(zx)) * sx``, and multiplies it in an f32 ``mm`` by the
dequantized int4 weight (the weight-only int4 pattern of :mod:`.quant_matmuls`:
``t(view((cast_f32(view(Q)) - cast_f32(Z)) * S))``, ``Q`` an ``i4`` global sign-extended).

The compile copy (``rewrites.module_for_compile``) gets, for such an ``mm``, a call of a private
function over builtin tensors (IREE inlines it) that takes the program's own int8 ``X``, ``zx``
and ``sx`` (the quantization stays the program's: torchao's rounding; the rows collapsed to
``[?, K]``) and the weight's packed bytes, scales and zero points as stored, computes the
weight's ``t[n] = sum_g S sum Q`` (a constant expression of the globals: hoisted to load time),
and dispatches the kernel (which prepares the rows itself). The dequantizations feeding the ``mm`` are erased.

Anything else (int8 weights stored a byte each, as inline weights of an export without an
archive are; shapes the kernel does not take) stays as it was: the weight-only kernel on the
dequantized activations, or IREE's code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .avx512_vnni import VNNI_FEATURES
from .avx512_w4a8 import Avx512W4A8Gemm
from .isa import isa_features
from .matmuls import mark_cpu_requires
from .quant_matmuls import _CASTS, _VIEWS, _cast_f32_of, _erase_dead, _grouped_weight, _i4_source
from .torch_ir import Builder, TensorType, TopLevel, constant, erase_unused, producer, walk

__all__ = ["rewritable_w4a8_matmuls", "rewrite_w4a8_matmuls"]

#: Ops without side effects that the dequantized activations are made of.
_PURE = frozenset(
    {
        *_CASTS,
        *_VIEWS,
        "torch.aten.sub.Tensor",
        "torch.aten.mul.Tensor",
        "torch.prim.ListConstruct",
        "torch.constant.int",
        "torch.constant.none",
        "torch.constant.bool",
        "torch.constant.device",
    }
)


@dataclass(frozen=True)
class _W4A8Matmul:
    """One rewritable product: ``mm(xd, W^T)`` with ``xd`` fake-quantized int8 rows."""

    x: Any  # torch [..., K] si8 (its rows: the mm's M)
    zx: Any  # torch [..., 1] si8
    sx: Any  # torch [..., 1] f32
    lead: tuple[int | None, ...]  # the sizes of x's leading dimensions
    q: Any  # builtin tensor<NxKxi4>
    scale: Any  # torch [N, K/G, 1] f32
    zero_point: Any  # torch [N, K/G, 1] si8, or None
    m: int | None
    k: int
    n: int
    group: int

    def kernel(self, isa: str) -> Avx512W4A8Gemm:
        return Avx512W4A8Gemm.for_shape(
            self.k, self.n, self.group, self.zero_point is not None, isa, rows=self.m
        )


def _row_views(value: Any, k: int) -> Any:
    """``value`` with views / reshapes that keep rows of ``k`` taken off (``[?, K]`` of a
    ``[1, ?, K]`` LLM activation: the same row-major elements)."""
    while True:
        op = producer(value)
        if op is None or op.name not in _VIEWS:
            return value
        src = op.operands[0]
        st, vt = TensorType.of(src), TensorType.of(value)
        if st is None or vt is None or st.dtype != vt.dtype or st.sizes[-1:] != [k]:
            return value
        if vt.sizes[-1:] != [k]:
            return value
        value = src


def _activation(xd: Any, k: int) -> tuple[Any, Any, Any, list[int | None]] | None:
    """``(X, zx, sx, leading sizes)`` of ``xd = (cast_f32(X) - cast_f32(zx)) * sx`` with ``X``
    ``[..., K]`` and ``zx`` / ``sx`` ``[..., 1]`` (else None)."""
    v = _row_views(xd, k)
    mul = producer(v)
    vt = TensorType.of(v)
    if mul is None or mul.name != "torch.aten.mul.Tensor" or vt is None:
        return None
    lead = vt.sizes[:-1]
    for d, s in (mul.operands, reversed(list(mul.operands))):
        st = TensorType.of(s)
        if st is None or st.dtype != "f32" or st.sizes != [*lead, 1]:
            continue
        sub = producer(d)
        if sub is None or sub.name != "torch.aten.sub.Tensor" or constant(sub.operands[2]) != 1:
            return None
        x = _cast_f32_of(sub.operands[0], "si8")
        zx = _cast_f32_of(sub.operands[1], "si8")
        if x is None or zx is None:
            return None
        xt, zt = TensorType.of(x), TensorType.of(zx)
        if xt is None or zt is None or xt.sizes != [*lead, k] or zt.sizes != [*lead, 1]:
            return None
        return x, zx, s, lead
    return None


def _spec(op: Any) -> _W4A8Matmul | None:
    if op.name != "torch.aten.mm" or len(op.operands) != 2:
        return None
    xd, w = op.operands
    xt, wt, ot = TensorType.of(xd), TensorType.of(w), TensorType.of(op.results[0])
    if xt is None or wt is None or ot is None or len(xt.sizes) != 2 or len(wt.sizes) != 2:
        return None
    if not (xt.dtype == wt.dtype == ot.dtype == "f32"):
        return None
    k, n = wt.sizes
    m = xt.sizes[0]
    if k is None or n is None or xt.sizes[1] != k:
        return None
    found = _grouped_weight(w, n, k)
    if found is None:
        return None
    q, scale, zp, group = found
    i4 = _i4_source(q) if k % 2 == 0 else None
    if i4 is None or not Avx512W4A8Gemm.supports(k, n, group):
        return None
    act = _activation(xd, k)
    if act is None:
        return None
    x, zx, sx, lead = act
    return _W4A8Matmul(x, zx, sx, tuple(lead), i4, scale, zp, m, k, n, group)


def rewritable_w4a8_matmuls(module_op: Any) -> list[Any]:
    """The ``torch.aten.mm`` ops of ``module_op`` that :func:`rewrite_w4a8_matmuls`
    rewrites (whatever the CPU)."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name == "torch.aten.mm" and _spec(o) is not None]


def _generic(maps: list[str], iters: list[str], ins: str, outs: str, body: list[str], res: str):
    """A ``linalg.generic`` (MLIR text lines)."""
    its = ", ".join(f'"{i}"' for i in iters)
    return [
        f"  {res} = linalg.generic {{indexing_maps = [{', '.join(maps)}], iterator_types = [{its}]}} "
        f"ins({ins}) outs({outs}) {{",
        *("    " + b for b in body),
        "  }" + f" -> {outs.split(' : ')[-1]}",
    ]


def _function(name: str, g: _W4A8Matmul, kernel: Avx512W4A8Gemm) -> str:
    """The private function: the rows as ``[?, K]``, the weight's ``t`` (hoisted to load time),
    the kernel's dispatch."""
    M = "?" if g.m is None else str(g.m)
    k, n, group, groups = g.k, g.n, g.group, g.k // g.group
    lead = "x".join("?" if d is None else str(d) for d in g.lead)
    params = [
        f"%x: tensor<{lead}x{k}xi8>",
        f"%zx: tensor<{lead}x1xi8>",
        f"%sx: tensor<{lead}x1xf32>",
        f"%q: tensor<{n}x{k}xi4>",
        f"%s: tensor<{n}x{groups}x1xf32>",
    ]
    if g.zero_point is not None:
        params.append(f"%z: tensor<{n}x{groups}x1xi8>")
    out_t = f"tensor<{M}x{n}xf32>"
    lines = [f"func.func private @{name}({', '.join(params)}) -> {out_t} {{"]
    e = lines.append
    ext = lines.extend
    e("  %c0 = arith.constant 0 : index")
    e("  %zi = arith.constant 0 : i32")
    e("  %zf = arith.constant 0.0 : f32")
    # the rows as [?, K] and [?]: the leading dimensions collapsed, static sizes cast away
    r = len(g.lead)
    rows = "?" if None in g.lead else str(math.prod(g.lead))  # type: ignore[arg-type]
    rows_group = "[" + ", ".join(str(i) for i in range(r)) + "]"
    all_group = "[" + ", ".join(str(i) for i in range(r + 1)) + "]"
    x2 = "%x"
    if r > 1:
        e(
            f"  %x2 = tensor.collapse_shape %x [{rows_group}, [{r}]] : tensor<{lead}x{k}xi8> "
            f"into tensor<{rows}x{k}xi8>"
        )
        x2 = "%x2"
    e(f"  %xa = tensor.cast {x2} : tensor<{rows}x{k}xi8> to tensor<?x{k}xi8>")
    e(f"  %m = tensor.dim %xa, %c0 : tensor<?x{k}xi8>")
    for v, dt in (("zx", "i8"), ("sx", "f32")):
        e(
            f"  %{v}c = tensor.collapse_shape %{v} [{all_group}] : tensor<{lead}x1x{dt}> "
            f"into tensor<{rows}x{dt}>"
        )
        e(f"  %{v}1 = tensor.cast %{v}c : tensor<{rows}x{dt}> to tensor<?x{dt}>")
    xa = "%xa"
    operands = {"x": xa, "zx": "%zx1", "sx": "%sx1"}
    # the weight: its bytes, scales, zero points as stored; t[n] = sum_g S sum Q (at load)
    e(f"  %qb = flow.tensor.bitcast %q : tensor<{n}x{k}xi4> -> tensor<{n}x{k // 2}xi8>")
    e(
        f"  %s2 = tensor.collapse_shape %s [[0], [1, 2]] : tensor<{n}x{groups}x1xf32> "
        f"into tensor<{n}x{groups}xf32>"
    )
    e(
        f"  %q3 = tensor.expand_shape %qb [[0], [1, 2]] output_shape [{n}, {groups}, {group // 2}] "
        f": tensor<{n}x{k // 2}xi8> into tensor<{n}x{groups}x{group // 2}xi8>"
    )
    e(f"  %eq = tensor.empty() : tensor<{n}x{groups}xi32>")
    e(
        f"  %fq = linalg.fill ins(%zi : i32) outs(%eq : tensor<{n}x{groups}xi32>) "
        f"-> tensor<{n}x{groups}xi32>"
    )
    e("  %c4i = arith.constant 4 : i32")
    e("  %c28i = arith.constant 28 : i32")
    ext(
        _generic(
            [
                "affine_map<(d0, d1, d2) -> (d0, d1, d2)>",
                "affine_map<(d0, d1, d2) -> (d0, d1)>",
            ],
            ["parallel", "parallel", "reduction"],
            f"%q3 : tensor<{n}x{groups}x{group // 2}xi8>",
            f"%fq : tensor<{n}x{groups}xi32>",
            [
                "^bb0(%v: i8, %acc: i32):",
                "  %w = arith.extsi %v : i8 to i32",
                "  %hi = arith.shrsi %w, %c4i : i32",  # the high nibble, signed
                "  %l28 = arith.shli %w, %c28i : i32",
                "  %lo = arith.shrsi %l28, %c28i : i32",  # the low nibble, signed
                "  %two = arith.addi %lo, %hi : i32",
                "  %r = arith.addi %acc, %two : i32",
                "  linalg.yield %r : i32",
            ],
            "%sq",
        )
    )
    e(f"  %et = tensor.empty() : tensor<{n}xf32>")
    e(f"  %ft = linalg.fill ins(%zf : f32) outs(%et : tensor<{n}xf32>) -> tensor<{n}xf32>")
    ext(
        _generic(
            [
                "affine_map<(d0, d1) -> (d0, d1)>",
                "affine_map<(d0, d1) -> (d0, d1)>",
                "affine_map<(d0, d1) -> (d0)>",
            ],
            ["parallel", "reduction"],
            f"%sq, %s2 : tensor<{n}x{groups}xi32>, tensor<{n}x{groups}xf32>",
            f"%ft : tensor<{n}xf32>",
            [
                "^bb0(%v: i32, %sc: f32, %acc: f32):",
                "  %vf = arith.sitofp %v : i32 to f32",
                "  %p = arith.mulf %vf, %sc : f32",
                "  %r = arith.addf %acc, %p : f32",
                "  linalg.yield %r : f32",
            ],
            "%t",
        )
    )
    operands.update({"q": "%qb", "s": "%s2", "t": "%t"})
    if g.zero_point is not None:
        e(
            f"  %z2 = tensor.collapse_shape %z [[0], [1, 2]] : tensor<{n}x{groups}x1xi8> "
            f"into tensor<{n}x{groups}xi8>"
        )
        operands["z"] = "%z2"
    e("  %c = " + kernel.dispatch(operands, "%m"))
    c = "%c"
    if g.m is not None:
        e(f"  %cs = tensor.cast %c : tensor<?x{n}xf32> to {out_t}")
        c = "%cs"
    e(f"  return {c} : {out_t}")
    e("}")
    return "\n".join(lines)


def rewrite_w4a8_matmuls(module_op: Any, isa: str = "avx512") -> int:
    """Rewrites, in place, each product :func:`rewritable_w4a8_matmuls` finds as a call of the
    w4a8 kernel in its form for ``isa`` (``avx512``: AVX-512 VNNI; ``avx2``), and records what
    that form needs (``avx512f,avx512_vnni`` / ``avx2,fma``) in the module's public functions
    (``turbine.cpu_requires``). The caller checks that the target CPU has it.

    Returns:
        How many products were rewritten.
    """
    op = getattr(module_op, "operation", module_op)
    top = TopLevel(op)
    found = rewritable_w4a8_matmuls(op)
    for index, mm in enumerate(found):
        spec = _spec(mm)
        assert spec is not None
        kernel = spec.kernel(isa)
        if kernel.name not in top:
            top.append(kernel.executable())
        name = top.unique(f"__turbine_{kernel.stem}_w4a8_matmul_{index}")
        top.append(_function(name, spec, kernel))
        m = "?" if spec.m is None else str(spec.m)
        groups = spec.k // spec.group
        lead = "x".join("?" if d is None else str(d) for d in spec.lead)
        operands = [
            (spec.x, f"tensor<{lead}x{spec.k}xi8>"),
            (spec.zx, f"tensor<{lead}x1xi8>"),
            (spec.sx, f"tensor<{lead}x1xf32>"),
            (spec.q, None),
            (spec.scale, f"tensor<{spec.n}x{groups}x1xf32>"),
        ]
        if spec.zero_point is not None:
            operands.append((spec.zero_point, f"tensor<{spec.n}x{groups}x1xi8>"))
        result = Builder(mm).call_on_builtins(
            name, operands, f"tensor<{m}x{spec.n}xf32>", mm.results[0].type
        )
        xd, weight = mm.operands
        mm.results[0].replace_all_uses_with(result)
        mm.erase()
        _erase_dead(weight)
        erase_unused(xd, _PURE)
    if found:
        mark_cpu_requires(op, VNNI_FEATURES if isa == "avx512" else isa_features(isa))
    return len(found)
