"""torchao's int8 x int8 matmuls (dynamic-activation configs) of the module handed to IREE
rewritten as calls of the AVX-512 VNNI kernel (:mod:`.avx512_vnni`).

``Int8DynamicActivationInt8WeightConfig()`` quantizes each row of the activations in the
program (symmetric: ``s_x = max(|min(x, 0)|, max(x, 0)) / 127.5``, ``X = clamp(round(x / s_x),
-128, 127)``, no zero point) and multiplies the int8 rows by the int8 weight ``Q`` (``[N, K]``,
per-channel scales ``s_w``) in integers, ``y = float(X @ Q^T) * s_x * s_w (+ bias)``
(docs/quantization.md). torchao writes the integer product one of two ways, depending on the
CPU that exports (``torchao.kernel.intmm``):

- on a CPU with AVX-512 VNNI and without AMX, ``u8 x s8`` with a correction:
  ``sub(_int_mm(to_u8(to_i32(X) + 128), t(Q)), sum(t(Q), [0], keepdim, i32) * 128)``;
- elsewhere ``_int_mm(X, t(Q))``.

Both are the exact ``[M, N]`` i32 sums ``X @ Q^T``, which IREE 3.13 computes with its own code
(an integer matmul, slow on CPUs). The compile copy (``rewrites.module_for_compile``) gets, for
that value, a call of a private function over builtin tensors (IREE inlines it) that computes the
kernel's correction ``128 * sum_k Q[n, k]`` (a constant expression of the weight's global: IREE
hoists it into an initializer) and dispatches the kernel on ``X`` and ``Q`` as they are. The
rescale that follows stays the program's: the results are torchao's float math on the same
integers.

Anything else (other dtypes, shapes the kernel does not take: ``K`` not a multiple of 64, ``N``
not of 4) stays IREE's, as does everything on a CPU without AVX-512 VNNI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .avx512_vnni import VNNI_FEATURES, Avx512VnniGemm
from .matmuls import mark_cpu_requires
from .quant_matmuls import _CASTS
from .torch_ir import (
    Builder,
    TensorType,
    TopLevel,
    constant,
    constant_int_list,
    erase_unused,
    producer,
    walk,
)

__all__ = ["CPU_INT8_MATMUL_ENV", "rewritable_int8_matmuls", "rewrite_int8_matmuls_vnni"]

#: ``TURBINE_CPU_INT8_MATMUL=iree`` keeps IREE's code for these products (the A/B baseline of
#: ``benchmarks/quant_bench.py``); unset, the VNNI kernel where the CPU has it.
CPU_INT8_MATMUL_ENV = "TURBINE_CPU_INT8_MATMUL"


#: Ops without side effects that a rewritten product's operands are made of.
_PURE = frozenset(
    {
        *_CASTS,
        "torch.aten._int_mm",
        "torch.aten.add.Scalar",
        "torch.aten.mul.Scalar",
        "torch.aten.sub.Tensor",
        "torch.aten.sum.dim_IntList",
        "torch.aten.t",
        "torch.prim.ListConstruct",
        "torch.constant.int",
        "torch.constant.none",
        "torch.constant.bool",
        "torch.constant.device",
        "torch_c.from_builtin_tensor",
        "util.global.load",
    }
)


@dataclass(frozen=True)
class _Int8Matmul:
    """One rewritable product: ``result`` (``[M, N]`` si32) ``= x @ q^T``."""

    result: Any  # the torch value replaced
    x: Any  # torch [M, K] si8
    q: Any  # torch [N, K] si8
    m: int | None
    k: int
    n: int

    def kernel(self) -> Avx512VnniGemm:
        return Avx512VnniGemm.for_shape(self.k, self.n, rows=self.m)


def _named(value: Any, name: str) -> Any:
    """The op defining ``value`` when it is a ``name`` op (else None)."""
    op = producer(value)
    return op if op is not None and op.name == name else None


def _cast_of(value: Any, src: str, dst: str) -> Any:
    """``value``'s input when it is a cast of a ``src`` tensor to ``dst`` of the same shape."""
    op = producer(value)
    if op is None or op.name not in _CASTS:
        return None
    inner = op.operands[0]
    it, vt = TensorType.of(inner), TensorType.of(value)
    if it is None or vt is None or (it.dtype, vt.dtype) != (src, dst) or it.sizes != vt.sizes:
        return None
    return inner


def _signed_of_unsigned(u: Any) -> Any:
    """``X`` of ``to_u8(to_i32(X) + 128)`` (else None)."""
    wide = _cast_of(u, "si32", "ui8")
    add = None if wide is None else _named(wide, "torch.aten.add.Scalar")
    if add is None or constant(add.operands[1]) != 128 or constant(add.operands[2]) != 1:
        return None
    return _cast_of(add.operands[0], "si8", "si32")


def _is_correction(value: Any, qt: Any) -> bool:
    """Whether ``value`` is ``sum(qt, [0], keepdim=True, dtype=int32) * 128``."""
    mul = _named(value, "torch.aten.mul.Scalar")
    if mul is None or constant(mul.operands[1]) != 128:
        return False
    total = _named(mul.operands[0], "torch.aten.sum.dim_IntList")
    if total is None or len(total.operands) != 4:
        return False
    src, dims, keep, dtype = total.operands
    return (
        src == qt
        and constant_int_list(dims) == [0]
        and constant(keep) is True
        and constant(dtype) == 3  # torch.int32
    )


def _spec(mm: Any) -> _Int8Matmul | None:
    """The product an ``_int_mm`` computes, in either of torchao's forms (module docstring)."""
    if mm.name != "torch.aten._int_mm" or len(mm.operands) != 2:
        return None
    a, qt = mm.operands
    t = _named(qt, "torch.aten.t")
    if t is None:
        return None
    q = t.operands[0]
    at, qtt, ot = TensorType.of(a), TensorType.of(q), TensorType.of(mm.results[0])
    if at is None or qtt is None or ot is None or len(at.sizes) != 2 or len(qtt.sizes) != 2:
        return None
    n, k = qtt.sizes
    if qtt.dtype != "si8" or ot.dtype != "si32" or n is None or k is None or at.sizes[1] != k:
        return None
    result = mm.results[0]
    if at.dtype == "si8":
        x = a
    elif at.dtype == "ui8":
        x = _signed_of_unsigned(a)
        uses = [u.owner for u in result.uses]
        if x is None or len(uses) != 1:
            return None
        sub = getattr(uses[0], "operation", uses[0])
        if sub.name != "torch.aten.sub.Tensor" or sub.operands[0] != result:
            return None
        if constant(sub.operands[2]) != 1 or not _is_correction(sub.operands[1], qt):
            return None
        st = TensorType.of(sub.results[0])
        if st is None or st.dtype != "si32" or st.sizes != ot.sizes:
            return None
        result = sub.results[0]
    else:
        return None
    if not Avx512VnniGemm.supports(k, n):
        return None
    return _Int8Matmul(result, x, q, at.sizes[0], k, n)


def rewritable_int8_matmuls(module_op: Any) -> list[Any]:
    """The ``torch.aten._int_mm`` ops of ``module_op`` that :func:`rewrite_int8_matmuls_vnni`
    rewrites (whatever the CPU)."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name == "torch.aten._int_mm" and _spec(o) is not None]


def _function(name: str, g: _Int8Matmul, kernel: Avx512VnniGemm) -> str:
    """The private function computing the weight's correction and calling the kernel."""
    m = "?" if g.m is None else str(g.m)
    x_t, q_t, out_t = f"tensor<{m}x{g.k}xi8>", f"tensor<{g.n}x{g.k}xi8>", f"tensor<{m}x{g.n}xi32>"
    lines = [f"func.func private @{name}(%x: {x_t}, %q: {q_t}) -> {out_t} {{"]
    e = lines.append
    if g.m is None:
        e("  %c0 = arith.constant 0 : index")
        e(f"  %m = tensor.dim %x, %c0 : {x_t}")
        a = "%x"
    else:
        e(f"  %m = arith.constant {g.m} : index")
        e(f"  %a = tensor.cast %x : {x_t} to tensor<?x{g.k}xi8>")
        a = "%a"
    # 128 * sum_k Q[n, k]: X + 128 as u8 in the kernel adds it to every sum
    e("  %z = arith.constant 0 : i32")
    e("  %c128 = arith.constant 128 : i32")
    e(f"  %e = tensor.empty() : tensor<{g.n}xi32>")
    e(f"  %f = linalg.fill ins(%z : i32) outs(%e : tensor<{g.n}xi32>) -> tensor<{g.n}xi32>")
    e(
        "  %corr = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, "
        'affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]} '
        f"ins(%q : {q_t}) outs(%f : tensor<{g.n}xi32>) {{"
    )
    e("  ^bb0(%w: i8, %acc: i32):")
    e("    %wi = arith.extsi %w : i8 to i32")
    e("    %ws = arith.muli %wi, %c128 : i32")
    e("    %r = arith.addi %acc, %ws : i32")
    e("    linalg.yield %r : i32")
    e(f"  }} -> tensor<{g.n}xi32>")
    e("  %c = " + kernel.dispatch(a, "%q", "%corr", "%m"))
    c = "%c"
    if g.m is not None:
        e(f"  %cs = tensor.cast %c : tensor<?x{g.n}xi32> to {out_t}")
        c = "%cs"
    e(f"  return {c} : {out_t}")
    e("}")
    return "\n".join(lines)


def rewrite_int8_matmuls_vnni(module_op: Any) -> int:
    """Rewrites, in place, each product :func:`rewritable_int8_matmuls` finds as a call of the
    AVX-512 VNNI kernel, and records ``avx512f,avx512_vnni`` in the module's public functions
    (``turbine.cpu_requires``). The caller checks that the target CPU has VNNI.

    Returns:
        How many products were rewritten.
    """
    op = getattr(module_op, "operation", module_op)
    top = TopLevel(op)
    found = rewritable_int8_matmuls(op)
    for index, mm in enumerate(found):
        spec = _spec(mm)
        assert spec is not None
        kernel = spec.kernel()
        if kernel.name not in top:
            top.append(kernel.executable())
        name = top.unique(f"__turbine_avx512_vnni_int8_matmul_{index}")
        top.append(_function(name, spec, kernel))
        m = "?" if spec.m is None else str(spec.m)
        result = Builder(producer(spec.result)).call_on_builtins(
            name,
            [(spec.x, f"tensor<{m}x{spec.k}xi8>"), (spec.q, f"tensor<{spec.n}x{spec.k}xi8>")],
            f"tensor<{m}x{spec.n}xi32>",
            spec.result.type,
        )
        spec.result.replace_all_uses_with(result)
        erase_unused(spec.result, _PURE)
    if found:
        mark_cpu_requires(op, VNNI_FEATURES)
    return len(found)
