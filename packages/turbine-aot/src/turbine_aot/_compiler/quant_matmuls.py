"""torchao weight-only quantized matmuls of the module handed to IREE rewritten as calls of the
AVX-512 quantized kernel (:mod:`.avx512_quant`), which reads the integer weights as stored.

IREE 3.13 compiles torchao's dequantize-then-matmul as two dispatches per layer: an element-wise
one writing the whole weight in f32 and an f32 matmul reading it back, so a quantized call moves
more bytes than the fp32 one (docs/quantization.md). The exported program stays as it is; the
compile copy (``rewrites.module_for_compile``) gets, for each ``torch.aten.mm`` whose right
operand is one of torchao's weight-only patterns as imported, a call of a private function over
builtin tensors (IREE inlines it) that dispatches the kernel on the weight's integer data:

- ``Int8WeightOnlyConfig`` (per channel): ``mm(x, cast_f32(t(Q)))`` (or ``t(cast_f32(Q))``),
  ``Q`` ``[N, K]`` si8; the scale multiply that follows stays the program's.
- ``IntxWeightOnlyConfig`` (``PerGroup(G)``, int4 or int8):
  ``mm(x, t(view_[N,K]((cast_f32(view_[N,K/G,G](Q)) - cast_f32(Z)) * S)))`` with ``S``
  ``[N, K/G, 1]`` f32 and ``Z`` ``[N, K/G, 1]`` si8 (the subtraction may be absent; with one
  group per channel, ``G = K``, torchao has no group axis: the views are ``[N, K]`` and ``S``
  and ``Z`` are ``[N, 1]``). A ``Q``
  that is an ``i4`` global sign-extended to i8 (``arith.extsi``: turbine's packed archives) is
  read as its bytes (``flow.tensor.bitcast`` to ``[N, K/2] x i8``): half a byte per weight.

Anything else (other dtypes, shapes the kernel does not take) stays IREE's.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from .amx_quant import AMX_INT8_FEATURES, AmxQuantGemm, int4_fits_cache, quant_amx_choice
from .avx512_quant import VARIANTS, Avx512QuantGemm
from .isa import kernel_features
from .matmuls import mark_cpu_requires
from .torch_ir import Builder, TensorType, TopLevel, constant, erase_unused, producer, walk

__all__ = ["QUANT_KERNEL_ENV", "rewritable_quant_matmuls", "rewrite_quant_matmuls_avx512"]

#: ``TURBINE_CPU_QUANT_KERNEL=v1`` builds the kernel's first version (for A/B measurements:
#: ``benchmarks/quant_bench.py --ab``), ``rows-per-workgroup`` the AVX2 nibble-masks form
#: without its prepared row; unset or empty, the current one. Any other value logs a
#: warning naming the known ones and builds the current kernel (the variants that lost, ``arith``,
#: ``lut``, ``nr8``, ``pf2``, ``nozb``, ``nopf``, were removed: docs/quantization.md).
QUANT_KERNEL_ENV = "TURBINE_CPU_QUANT_KERNEL"

_log = logging.getLogger("turbine.aot")
#: The unknown ``TURBINE_CPU_QUANT_KERNEL`` values already warned about (once per process).
_warned: set[str] = set()

_CASTS = ("torch.aten._to_copy", "torch.aten.to.dtype")
_VIEWS = ("torch.aten.view", "torch.aten.reshape")


@dataclass(frozen=True)
class _QuantMatmul:
    """One rewritable quantized matmul: ``x`` ``[M, K]`` f32 times the weight's transpose."""

    x: Any
    q: Any  # the integer data: a torch [N, K] si8 value, or a builtin tensor<NxKxi4>
    q_i4: bool
    scale: Any  # torch [N, K/G, 1] f32 value, or None (per channel: applied after the call)
    zero_point: Any  # torch [N, K/G, 1] si8 value, or None
    m: int | None
    k: int
    n: int
    group: int | None
    flat: bool = False  # scales / zero points [N, 1] (one group per channel), not [N, K/G, 1]

    @property
    def bits(self) -> int:
        return 4 if self.q_i4 else 8

    def kernel(self, amx: bool = False) -> Avx512QuantGemm | AmxQuantGemm:
        """The kernel for this product: the AMX one for one row where ``amx`` allows it and
        it takes the shape, else the AVX-512 one."""
        if amx and self.m == 1 and AmxQuantGemm.supports(self.k, self.n, self.bits, self.group):
            return AmxQuantGemm.for_shape(
                self.k, self.n, self.bits, self.group, self.zero_point is not None
            )
        return Avx512QuantGemm.for_shape(
            self.k,
            self.n,
            self.bits,
            self.group,
            self.zero_point is not None,
            _variant(),
            rows=self.m,
        )


def _variant() -> str:
    """The kernel version ``TURBINE_CPU_QUANT_KERNEL`` asks for; an unknown value is warned
    about (once) and gets the current kernel."""
    variant = os.environ.get(QUANT_KERNEL_ENV, "").strip().lower()
    if variant in VARIANTS:
        return variant
    if variant not in _warned:
        _warned.add(variant)
        _log.warning(
            "%s=%r is not a quantized kernel variant (known: unset for the current kernel, "
            "'v1' for the first version; the others were removed, see docs/quantization.md): "
            "building the current kernel",
            QUANT_KERNEL_ENV,
            variant,
        )
    return ""


_owner = producer


def _name(value: Any) -> str | None:
    owner = _owner(value)
    return None if owner is None else owner.name


def _cast_f32_of(value: Any, dtype: str) -> Any:
    """``value``'s input when it is an f32 cast of a ``dtype`` tensor (else None)."""
    op = _owner(value)
    if op is None or op.name not in _CASTS:
        return None
    src = op.operands[0]
    st, dt = TensorType.of(src), TensorType.of(value)
    if st is None or dt is None or st.dtype != dtype or dt.dtype != "f32":
        return None
    if st.sizes != dt.sizes:
        return None
    return src


def _view_of(value: Any) -> Any:
    op = _owner(value)
    if op is None or op.name not in _VIEWS:
        return None
    return op.operands[0]


def _transpose_of(value: Any) -> Any:
    op = _owner(value)
    if op is None or op.name != "torch.aten.t":
        return None
    return op.operands[0]


def _int8_weight(w: Any) -> Any:
    """``Q`` of ``cast_f32(t(Q))`` / ``t(cast_f32(Q))`` (else None)."""
    inner = _cast_f32_of(w, "si8")
    if inner is not None:
        return _transpose_of(inner)
    inner = _transpose_of(w)
    return None if inner is None else _cast_f32_of(inner, "si8")


def _grouped_weight(w: Any, n: int, k: int) -> tuple[Any, Any, Any, int] | None:
    """``(Q, S, Z, G)`` of torchao's per-group dequantization feeding ``t(view(...))``."""
    wt = _transpose_of(w)
    if wt is None:
        return None
    mul = _view_of(wt)
    if mul is None or _name(mul) != "torch.aten.mul.Tensor":
        return None
    mt = TensorType.of(mul)
    if mt is None or mt.sizes[:1] != [n] or None in mt.sizes:
        return None
    if len(mt.sizes) == 3:
        _, groups, g = mt.sizes
    elif len(mt.sizes) == 2 and mt.sizes[1] == k:  # one group per channel: no group axis
        groups, g = 1, k
    else:
        return None
    side = [n, groups, 1] if len(mt.sizes) == 3 else [n, 1]  # the scales' and zero points
    if groups * g != k:  # type: ignore[operator]
        return None
    a, b = _owner(mul).operands
    for d, s in ((a, b), (b, a)):
        st = TensorType.of(s)
        if st is None or st.dtype != "f32" or st.sizes != side:
            continue
        zp = None
        if _name(d) == "torch.aten.sub.Tensor":
            sub = _owner(d)
            c, z, alpha = sub.operands
            if constant(alpha) not in (1, 1.0):
                return None
            zp = _cast_f32_of(z, "si8")
            zt = None if zp is None else TensorType.of(zp)
            if zt is None or zt.sizes != side:
                return None
            d = c
        src = _cast_f32_of(d, "si8")
        if src is None:
            return None
        q = _view_of(src)
        qt = None if q is None else TensorType.of(q)
        if qt is None or qt.dtype != "si8" or qt.sizes != [n, k]:
            return None
        return q, s, zp, int(g)  # type: ignore[arg-type]
    return None


def _i4_source(q: Any) -> Any:
    """The ``tensor<NxKxi4>`` that ``q`` (a torch si8 value) sign-extends, else None."""
    op = _owner(q)
    if op is None or op.name != "torch_c.from_builtin_tensor":
        return None
    ext = _owner(op.operands[0])
    if ext is None or ext.name != "arith.extsi":
        return None
    src = ext.operands[0]
    return src if str(src.type).endswith("xi4>") else None


def _spec(op: Any) -> _QuantMatmul | None:
    if op.name != "torch.aten.mm" or len(op.operands) != 2:
        return None
    x, w = op.operands
    xt, wt, ot = TensorType.of(x), TensorType.of(w), TensorType.of(op.results[0])
    if xt is None or wt is None or ot is None:
        return None
    if not (xt.dtype == wt.dtype == ot.dtype == "f32") or len(xt.sizes) != 2:
        return None
    k, n = wt.sizes
    if k is None or n is None or xt.sizes[1] != k:
        return None
    q = _int8_weight(w)
    scale = zp = None
    group: int | None = None
    if q is None:
        found = _grouped_weight(w, n, k)
        if found is None:
            return None
        q, scale, zp, group = found
    qt = TensorType.of(q)
    if qt is None or qt.dtype != "si8" or qt.sizes != [n, k]:
        return None
    i4 = _i4_source(q) if group is not None and k % 2 == 0 else None
    bits = 4 if i4 is not None else 8
    if not Avx512QuantGemm.supports(k, n, bits, group):
        return None
    st = None if scale is None else TensorType.of(scale)
    flat = st is not None and len(st.sizes) == 2
    return _QuantMatmul(
        x, i4 if i4 is not None else q, i4 is not None, scale, zp, xt.sizes[0], k, n, group, flat
    )


def rewritable_quant_matmuls(module_op: Any) -> list[Any]:
    """The ops of ``module_op`` that :func:`rewrite_quant_matmuls_avx512` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name == "torch.aten.mm" and _spec(o) is not None]


def _side_type(g: _QuantMatmul, elem: str) -> str:
    """The type of ``g``'s scales or zero points (``elem``) as imported: ``[N, K/G, 1]``, or
    ``[N, 1]`` for one group per channel (torchao then has no group axis)."""
    groups = g.k // g.group if g.group else 0
    return f"tensor<{g.n}x1x{elem}>" if g.flat else f"tensor<{g.n}x{groups}x1x{elem}>"


def _side_matrix(e, v: str, t: str, g: _QuantMatmul, elem: str) -> None:
    """Emits ``{v}2``: the scales or zero points ``v`` (of type ``t``) as ``[N, K/G]``."""
    if g.flat:  # already [N, 1]
        e(f"  {v}2 = tensor.cast {v} : {t} to tensor<{g.n}x1x{elem}>")
        return
    groups = g.k // g.group if g.group else 0
    e(f"  {v}2 = tensor.collapse_shape {v} [[0], [1, 2]] : {t} into tensor<{g.n}x{groups}x{elem}>")


def _function(name: str, g: _QuantMatmul, kernel: Avx512QuantGemm | AmxQuantGemm) -> str:
    """The private function calling the kernel (builtin tensors)."""
    m = "?" if g.m is None else str(g.m)
    x_t, out_t = f"tensor<{m}x{g.k}xf32>", f"tensor<{m}x{g.n}xf32>"
    q_t = f"tensor<{g.n}x{g.k}x{'i4' if g.q_i4 else 'i8'}>"
    params = [f"%x: {x_t}", f"%q: {q_t}"]
    s3_t, z3_t = _side_type(g, "f32"), _side_type(g, "i8")
    if g.scale is not None:
        params.append(f"%s: {s3_t}")
    if g.zero_point is not None:
        params.append(f"%z: {z3_t}")
    lines = [f"func.func private @{name}({', '.join(params)}) -> {out_t} {{"]
    e = lines.append
    if g.m is None:
        e("  %c0 = arith.constant 0 : index")
        e(f"  %m = tensor.dim %x, %c0 : {x_t}")
        a = "%x"
    else:
        e(f"  %m = arith.constant {g.m} : index")
        e(f"  %a = tensor.cast %x : {x_t} to tensor<?x{g.k}xf32>")
        a = "%a"
    weights = ["%q"]
    if g.q_i4:
        e(f"  %qb = flow.tensor.bitcast %q : {q_t} -> tensor<{g.n}x{g.k // 2}xi8>")
        weights = ["%qb"]
    if g.scale is not None:
        _side_matrix(e, "%s", s3_t, g, "f32")
        weights.append("%s2")
    if g.zero_point is not None:
        _side_matrix(e, "%z", z3_t, g, "i8")
        weights.append("%z2")
    if isinstance(kernel, Avx512QuantGemm) and kernel.prepared_row:  # A's rows in its order
        e("  %rows = " + kernel.row_dispatch(a, "%m"))
        a = "%rows"
    e("  %c = " + kernel.dispatch(a, weights, "%m"))
    c = "%c"
    if g.m is not None:
        e(f"  %cs = tensor.cast %c : tensor<?x{g.n}xf32> to {out_t}")
        c = "%cs"
    e(f"  return {c} : {out_t}")
    e("}")
    return "\n".join(lines)


#: Ops without side effects that the dequantization of a rewritten weight is made of.
_PURE = frozenset(
    {
        *_CASTS,
        *_VIEWS,
        "torch.aten.t",
        "torch.aten.sub.Tensor",
        "torch.aten.mul.Tensor",
        "torch.prim.ListConstruct",
        "torch.constant.int",
        "torch.constant.none",
        "torch.constant.bool",
        "torch.constant.device",
        "torch_c.from_builtin_tensor",
        "arith.extsi",
        "util.global.load",
    }
)


def _erase_dead(value: Any) -> None:
    """Erases the ops computing ``value`` that nothing uses any more (the dequantization of a
    rewritten weight: left in place, an ``i4`` global's now dead sign extension makes IREE 3.13
    reject the module's bytecode: "parsed use-list orders were invalid")."""
    erase_unused(value, _PURE)


def _int4_weight_bytes(found: list[Any]) -> int:
    """The bytes of the distinct int4 weights the matmuls ``found`` read: a global that several
    functions load (an LLM's prefill and decode steps) counts once."""
    sizes: dict[Any, int] = {}
    for mm in found:
        spec = _spec(mm)
        if spec is None or spec.bits != 4:
            continue
        load = _owner(spec.q)
        key: Any = len(sizes)  # a weight that is not a global: its own
        if load is not None and load.name == "util.global.load" and "global" in load.attributes:
            key = str(load.attributes["global"])
        sizes[key] = spec.n * spec.k // 2
    return sum(sizes.values())


def rewrite_quant_matmuls_avx512(module_op: Any, amx: bool = False) -> int:
    """Rewrites, in place, each matmul :func:`rewritable_quant_matmuls` finds as a call of the
    AVX-512 quantized kernel (with ``amx``, one-row products of the shapes it takes as calls
    of the AMX-INT8 kernel, :mod:`.amx_quant`: int8 always, int4 where the module's int4
    weights fit the cache, :func:`.amx_quant.int4_fits_cache`), and records the CPU features
    they need in the module's public functions (``turbine.cpu_requires``).

    Returns:
        How many matmuls were rewritten.
    """
    op = getattr(module_op, "operation", module_op)
    top = TopLevel(op)
    found = rewritable_quant_matmuls(op)
    # int4 on AMX where the module's int4 weights stay in the cache (or when asked for)
    amx4 = amx and (quant_amx_choice() == "on" or int4_fits_cache(_int4_weight_bytes(found)))
    on_amx = False
    for index, mm in enumerate(found):
        spec = _spec(mm)  # now: the rewrites before it replaced values it refers to
        assert spec is not None
        kernel = spec.kernel(amx4 if spec.bits == 4 else amx)
        on_amx = on_amx or isinstance(kernel, AmxQuantGemm)
        if kernel.name not in top:
            top.append(kernel.executable())
        if isinstance(kernel, Avx512QuantGemm):  # the rows it reads prepared (prepared_row)
            row = kernel.row_name
            if row is not None and row not in top:
                top.append(kernel.row_executable())
        kind = "amx" if isinstance(kernel, AmxQuantGemm) else "avx512"
        name = top.unique(f"__turbine_{kind}_quant_matmul_{index}")
        top.append(_function(name, spec, kernel))
        m = "?" if spec.m is None else str(spec.m)
        operands = [
            (spec.x, f"tensor<{m}x{spec.k}xf32>"),
            (spec.q, None if spec.q_i4 else f"tensor<{spec.n}x{spec.k}xi8>"),
        ]
        if spec.scale is not None:
            operands.append((spec.scale, _side_type(spec, "f32")))
        if spec.zero_point is not None:
            operands.append((spec.zero_point, _side_type(spec, "i8")))
        result = Builder(mm).call_on_builtins(
            name, operands, f"tensor<{m}x{spec.n}xf32>", mm.results[0].type
        )
        weight = mm.operands[1]
        mm.results[0].replace_all_uses_with(result)
        mm.erase()
        _erase_dead(weight)
    if found:
        mark_cpu_requires(op, AMX_INT8_FEATURES if on_amx else kernel_features())
    return len(found)
