"""The matmuls of the module handed to IREE rewritten as calls of one of turbine's own CPU
kernels: the AMX bf16 kernel (:mod:`.amx`, ``precision="bf16"``, :mod:`.bf16`) or the AVX-512
fp32 kernel (:mod:`.avx512`, ``--turbine-cpu-matmul=avx512``).

The exported program stays as it is (and the reference's); the compile copy
(``rewrites.module_for_compile``) gets, for every fp32 ``torch.aten.mm`` / ``addmm`` /
``linear`` / ``matmul`` / ``bmm`` whose reduction ``K`` and width ``N`` are static, a call of a
private function over builtin tensors (IREE inlines it)::

    a  = x as [rows, K], in the kernel's type (bf16: cast per call, zero-padded to Kp)
    bp = pack(w as [K, N], in the kernel's type, zero-padded)   (a weight: hoisted, once)
    c  = flow.dispatch @kernel(a, bp)                           (f32 accumulation)
    out = c[:, :N] as the op's result shape (+ bias)

(the AVX-512 kernels write ``c`` as ``[rows, N]`` themselves, masked stores in the last panel:
no slice, so no copy of it by IREE; :attr:`.avx512.Avx512Gemm.n_out`.)

``pack`` is the layout the kernel's module documents, written as reshape + transpose (no
strided reads). For a weight (any operand computed only from globals and constants) IREE's
constant-expression hoisting moves the conversion and the pack into an initializer, so the
weight is converted once (at compile time for inlined weights, when the module loads for
external parameters); a matmul of two activations (attention's QK^T and PV) packs its right
operand per call. Rows (M, the batch) may be dynamic; a batched right operand needs static
batch dimensions equal to the left's (no broadcasting).

A rewritten module's public functions record the CPU features the kernels need in their
``iree.reflection`` (``turbine.cpu_requires``): turbine's runtime reads it when it loads the
module (AMX: it requests the tile permission from Linux, :func:`.amx.request_amx_permission`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .amx import CPU_REQUIRES_KEY, AmxGemm
from .avx512 import Avx512Gemm, host_avx512_missing
from .epilogues import fusion_enabled, only_user, replace_with_absorbed
from .isa import KERNEL_ISAS, host_isa, kernel_features
from .targets import TargetError
from .torch_ir import NOT_CONSTANT, Builder, TensorType, TopLevel, builtin_tensor, constant, walk

__all__ = [
    "AVX2_FMA_CPUS",
    "CPU_MATMUL_ENV",
    "CPU_MATMUL_FLAG",
    "CPU_REQUIRES_KEY",
    "Kernel",
    "cpu_matmul_kernel",
    "cpu_quant_kernel",
    "kernel_matmul_function",
    "mark_cpu_requires",
    "rewritable_matmuls",
    "rewrite_matmuls",
    "rewrite_matmuls_avx512",
    "target_cpu",
    "target_has_avx2_fma",
    "target_has_avx512",
]

#: The compile flag choosing the kernel of fp32 matmuls on llvm-cpu: ``avx512`` (turbine's
#: AVX-512 kernel, :mod:`.avx512`) or ``iree`` (IREE's own matmul code). Read by
#: ``rewrites.module_for_compile``, never given to IREE. Without it (or the environment
#: variable :data:`CPU_MATMUL_ENV`) the default applies: :func:`cpu_matmul_kernel`.
CPU_MATMUL_FLAG = "--turbine-cpu-matmul"
#: Environment variable with the same choice (``TURBINE_CPU_MATMUL=iree`` keeps IREE's matmuls
#: for a whole test run); the flag wins over it.
CPU_MATMUL_ENV = "TURBINE_CPU_MATMUL"
_CPU_MATMUL_KERNELS = ("iree", *KERNEL_ISAS)
_TARGET_CPU_FLAG = "--iree-llvmcpu-target-cpu="
_TARGET_FEATURES_FLAG = "--iree-llvmcpu-target-cpu-features="
_UKERNELS_FLAG = "--iree-llvmcpu-enable-ukernels=all"
#: LLVM's names of x86-64 CPUs (``--iree-llvmcpu-target-cpu``) that have AVX2 and FMA: builds
#: for them get turbine's AVX2 quantized kernels by default (:func:`cpu_quant_kernel`). A name
#: not listed counts as without (IREE's own code: right everywhere, slower).
AVX2_FMA_CPUS = frozenset(
    {
        "x86-64-v3",
        "x86-64-v4",
        "core-avx2",
        "haswell",
        "broadwell",
        "skylake",
        "skylake-avx512",
        "cascadelake",
        "cooperlake",
        "cannonlake",
        "icelake-client",
        "icelake-server",
        "tigerlake",
        "rocketlake",
        "alderlake",
        "raptorlake",
        "meteorlake",
        "arrowlake",
        "lunarlake",
        "sapphirerapids",
        "emeraldrapids",
        "graniterapids",
        "znver1",
        "znver2",
        "znver3",
        "znver4",
        "znver5",
    }
)

_REFLECTION_ATTR = "iree.reflection"
_MATMUL_OPS = frozenset(
    {
        "torch.aten.mm",
        "torch.aten.addmm",
        "torch.aten.linear",
        "torch.aten.matmul",
        "torch.aten.bmm",
    }
)


class Kernel(Protocol):
    """What the rewrite needs of a kernel (:class:`.amx.AmxGemm`, :class:`.avx512.Avx512Gemm`)."""

    @property
    def operand_dtype(self) -> str: ...  # "bf16" or "f32"

    @property
    def name(self) -> str: ...

    @property
    def kp(self) -> int: ...

    @property
    def np_(self) -> int: ...

    @property
    def packed_b_size(self) -> int: ...

    def pack_layout(self, kind: str, batch: int) -> tuple[list[int], str, list[int]]: ...

    def dispatch(
        self, a: str, b: str, m: str, batch: str, rows: str, b_elems: int, bias: str | None = None
    ) -> str: ...

    def executable(self) -> str: ...


def cpu_matmul_kernel(flags: Sequence[str]) -> str:
    """The kernel of fp32 matmuls for an llvm-cpu compile with ``flags``: the last
    ``--turbine-cpu-matmul=``, else ``$TURBINE_CPU_MATMUL``, else the default: ``avx512`` for
    builds for this machine's CPU (``--iree-llvmcpu-target-cpu=host``) with IREE's ukernels on
    (turbine's fast-matmul defaults: a compile that fails with them is retried without, and
    then without this kernel too) when the CPU has AVX-512, ``avx2`` (the same kernels blocked
    for AVX2's 16 registers, :mod:`.isa`) when it has AVX2 and FMA; ``iree`` otherwise.

    Raises:
        TargetError: an unknown kernel name (the message lists the choices).
    """
    value = _chosen_matmul_kernel(flags)
    if value is None:
        value = "iree"
        if target_cpu(flags) == "host" and _UKERNELS_FLAG in flags:
            value = "avx512" if not host_avx512_missing() else (host_isa() or "iree")
    if value not in _CPU_MATMUL_KERNELS:
        raise TargetError(
            f"unknown {CPU_MATMUL_FLAG} value {value!r}; choose one of "
            f"{', '.join(_CPU_MATMUL_KERNELS)}"
        )
    return value


def _chosen_matmul_kernel(flags: Sequence[str]) -> str | None:
    """The kernel the user chose: the last ``--turbine-cpu-matmul=``, else
    ``$TURBINE_CPU_MATMUL``, else ``None``."""
    value = os.environ.get(CPU_MATMUL_ENV, "").strip().lower() or None
    for f in flags:
        if f.startswith(CPU_MATMUL_FLAG + "="):
            value = f.split("=", 1)[1].strip().lower()
    return value


def cpu_quant_kernel(flags: Sequence[str]) -> str:
    """The kernel of torchao's quantized products for an llvm-cpu compile with ``flags``:
    :func:`cpu_matmul_kernel`'s, except that a build for a named CPU with AVX2 and FMA
    (:func:`target_has_avx2_fma`; ``x86-64-v3``, ``znver3``, ...) with turbine's fast-matmul
    defaults gets ``avx2`` where nobody chose a kernel. Such builds keep IREE's fp32 matmuls
    (as fast there), but IREE's own dequantize + matmul decoded a 110M Llama in int4 15x
    slower than turbine's kernels (docs/quantization.md, "Builds for a named CPU")."""
    kernel = cpu_matmul_kernel(flags)
    if kernel != "iree" or _chosen_matmul_kernel(flags) is not None:
        return kernel
    named = target_cpu(flags) not in (None, "host")
    if named and _UKERNELS_FLAG in flags and target_has_avx2_fma(flags):
        return "avx2"
    return kernel


def target_has_avx2_fma(flags: Sequence[str]) -> bool:
    """Whether an llvm-cpu compile with ``flags`` targets a CPU with AVX2 and FMA: the last
    ``--iree-llvmcpu-target-cpu-features`` names ``+avx2`` and ``+fma``, or, without one, the
    target CPU is ``host`` and this machine has them, or a CPU named in
    :data:`AVX2_FMA_CPUS`."""
    features = _target_features(flags)
    if features is not None:
        return "+avx2" in features and "+fma" in features
    cpu = target_cpu(flags)
    if cpu == "host":
        return bool(host_isa())
    return cpu in AVX2_FMA_CPUS


def target_has_avx512(flags: Sequence[str]) -> bool:
    """Whether an llvm-cpu compile with ``flags`` targets a CPU with AVX-512 (``avx512f``): the
    last ``--iree-llvmcpu-target-cpu-features`` names ``+avx512f``, or, without one, the target
    CPU is ``host`` and this machine has it. Any other target (a named CPU, IREE's generic
    x86-64) counts as without: the kernels keep to instructions a CPU with AVX2 has, which is
    right there, at worst slower (:func:`.isa.target_avx512`)."""
    features = _target_features(flags)
    if features is not None:
        return "+avx512f" in features
    return target_cpu(flags) == "host" and not host_avx512_missing()


def _target_features(flags: Sequence[str]) -> list[str] | None:
    """The features the last ``--iree-llvmcpu-target-cpu-features`` names (``+avx2``, ...), or
    ``None`` without one."""
    features = [f for f in flags if f.startswith(_TARGET_FEATURES_FLAG)]
    return features[-1].split("=", 1)[1].split(",") if features else None


def target_cpu(flags: Sequence[str]) -> str | None:
    """The CPU an llvm-cpu compile with ``flags`` targets: the last
    ``--iree-llvmcpu-target-cpu``'s value (``host``: this machine's), or ``None``."""
    cpu = None
    for f in flags:
        if f.startswith(_TARGET_CPU_FLAG):
            cpu = f.split("=", 1)[1]
    return cpu


#: A kernel for a ``(k, n, batched)`` product.
KernelFactory = Callable[[int, int, bool], Kernel]


@dataclass(frozen=True)
class _Matmul:
    """One rewritable matmul: ``x`` is ``[*lead, K]`` (``lead`` = ``[*batch, M]``), ``w`` is
    ``[K, N]`` (``[N, K]`` if ``transposed``) or, batched, ``[*batch, K, N]``."""

    x: TensorType
    w: TensorType
    out: TensorType
    k: int
    n: int
    batch: tuple[int, ...]  # static batch dims shared by x and w ((): w is one matrix)
    transposed: bool
    bias: Any  # the bias operand (torch value) or None

    @property
    def batched(self) -> bool:
        return bool(self.batch)

    @property
    def rows(self) -> int | None:
        """``M``: the rows of one batch entry (``None`` where a size is dynamic)."""
        m_sizes = self.x.sizes[len(self.batch) : -1]
        return None if None in m_sizes else math.prod(m_sizes)  # type: ignore[arg-type]


def _static(sizes: list[int | None]) -> bool:
    return all(s is not None for s in sizes)


def _spec(op: Any) -> _Matmul | None:
    operands = list(op.operands)
    bias = None
    if op.name == "torch.aten.addmm" and len(operands) == 5:
        bias, x, w, beta, alpha = operands
        if constant(beta) not in (1, 1.0) or constant(alpha) not in (1, 1.0):
            return None
    elif op.name == "torch.aten.linear" and len(operands) == 3:
        x, w, bias = operands
        if constant(bias) is None:
            bias = None
        elif constant(bias) is not NOT_CONSTANT:
            return None
    elif op.name in ("torch.aten.mm", "torch.aten.matmul", "torch.aten.bmm") and len(operands) == 2:
        x, w = operands
    else:
        return None
    xt, wt, ot = TensorType.of(x), TensorType.of(w), TensorType.of(op.results[0])
    if xt is None or wt is None or ot is None or not (xt.dtype == wt.dtype == ot.dtype == "f32"):
        return None
    if bias is not None:
        bt = TensorType.of(bias)
        if bt is None or bt.dtype != "f32":
            return None
    transposed = op.name == "torch.aten.linear"
    if len(xt.sizes) < 2 or len(wt.sizes) < 2:
        return None
    if op.name in ("torch.aten.mm", "torch.aten.addmm") and (len(xt.sizes), len(wt.sizes)) != (
        2,
        2,
    ):
        return None
    if op.name == "torch.aten.bmm" and (len(xt.sizes), len(wt.sizes)) != (3, 3):
        return None
    if op.name == "torch.aten.linear" and len(wt.sizes) != 2:
        return None
    k_x = xt.sizes[-1]
    if transposed:
        n, k = wt.sizes
    else:
        k, n = wt.sizes[-2], wt.sizes[-1]
    if k is None or n is None or k_x != k:
        return None
    batch: tuple[int, ...] = ()
    if len(wt.sizes) > 2:  # batched: same static batch dims on both sides
        wb, xb = wt.sizes[:-2], xt.sizes[:-2]
        if len(xb) != len(wb) or not _static(wb) or list(xb) != list(wb):
            return None
        batch = tuple(int(s) for s in wb)  # type: ignore[arg-type]
    if list(ot.sizes) != [*xt.sizes[:-1], n]:
        return None
    return _Matmul(xt, wt, ot, int(k), int(n), batch, transposed, bias)


def rewritable_matmuls(module_op: Any) -> list[Any]:
    """The ops of ``module_op`` that :func:`rewrite_matmuls` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name in _MATMUL_OPS and _spec(o) is not None]


def _tensor(sizes: Any, dtype: str) -> str:
    return builtin_tensor(sizes, dtype)


def _function(name: str, g: _Matmul, kernel: Kernel, bias: bool = False) -> str:
    """The private function computing the matmul through ``kernel`` (builtin tensors); ``bias``:
    a third argument, ``[N]``, that the kernel adds (its epilogue, :mod:`.epilogues`)."""
    dt = kernel.operand_dtype
    k, n, kp, np_ = g.k, g.n, kernel.kp, kernel.np_
    xs, ws, outs = list(g.x.sizes), list(g.w.sizes), list(g.out.sizes)
    x_t, w_t, out_t = _tensor(xs, "f32"), _tensor(ws, "f32"), _tensor(outs, "f32")
    bias_arg = f", %bias: {_tensor([n], 'f32')}" if bias else ""
    lines = [f"func.func private @{name}(%x: {x_t}, %w: {w_t}{bias_arg}) -> {out_t} {{"]
    e = lines.append
    e(f"  %zero = arith.constant 0.0 : {dt}")
    bias_operand = None
    if bias:  # zero-padded to Np (a weight's: hoisted, once)
        bias_operand = "%bias"
        if np_ != n:  # f32 whatever the operands' type (the bias adds to f32 sums)
            e("  %fzero = arith.constant 0.0 : f32")
            e(f"  %biasp = tensor.pad %bias low[0] high[{np_ - n}] {{")
            e("  ^bb0(%bi: index):")
            e("    tensor.yield %fzero : f32")
            e(f"  }} : {_tensor([n], 'f32')} to {_tensor([np_], 'f32')}")
            bias_operand = "%biasp"
    dims: list[str] = []  # the sizes of x's dims but K, as index values or literals
    for i, s in enumerate(xs[:-1]):
        if s is None:
            e(f"  %ci{i} = arith.constant {i} : index")
            e(f"  %d{i} = tensor.dim %x, %ci{i} : {x_t}")
            dims.append(f"%d{i}")
        else:
            dims.append(str(s))
    lead, nb = xs[:-1], len(g.batch)
    bcount = math.prod(g.batch) if g.batch else 1
    rows_static = None if None in lead else math.prod(lead)  # type: ignore[arg-type]
    m_sizes = lead[nb:]
    m_static = None if None in m_sizes else math.prod(m_sizes)  # type: ignore[arg-type]
    e(f"  %batch = arith.constant {bcount} : index")
    e("  %one = arith.constant 1 : index")
    if m_static is not None:
        e(f"  %m = arith.constant {m_static} : index")
    else:
        acc = "%one"
        for i, d in enumerate(dims[nb:]):
            if not d.startswith("%"):
                e(f"  %mc{i} = arith.constant {d} : index")
                d = f"%mc{i}"
            e(f"  %mp{i} = arith.muli {acc}, {d} : index")
            acc = f"%mp{i}"
        e(f"  %m = arith.muli {acc}, %one : index")
    e("  %rows = arith.muli %m, %batch : index")
    # x -> [rows, Kp] in the kernel's type
    a, a_t = "%x", x_t
    if len(xs) > 2:
        group = ", ".join(str(i) for i in range(len(xs) - 1))
        a_t = _tensor([rows_static, k], "f32")
        e(f"  %x2 = tensor.collapse_shape %x [[{group}], [{len(xs) - 1}]] : {x_t} into {a_t}")
        a = "%x2"
    if dt != "f32":
        xb_t = _tensor([rows_static, k], dt)
        e(f"  %xb_init = tensor.empty{'(%rows)' if rows_static is None else '()'} : {xb_t}")
        e(_truncf("%xb", a, a_t, "%xb_init", xb_t, 2, dt))
        a, a_t = "%xb", xb_t
    if kp != k:
        padded_t = _tensor([rows_static, kp], dt)
        e(f"  %a = tensor.pad {a} low[0, 0] high[0, {kp - k}] {{")
        e("  ^bb0(%i0: index, %i1: index):")
        e(f"    tensor.yield %zero : {dt}")
        e(f"  }} : {a_t} to {padded_t}")
        a, a_t = "%a", padded_t
    if rows_static is not None:  # the kernel takes ?xKp
        e(f"  %ad = tensor.cast {a} : {a_t} to {_tensor([None, kp], dt)}")
        a = "%ad"
    # w -> the packed layout, in the kernel's type
    if g.batched:
        kind, wsz, wsz_p = "bkn", [bcount, k, n], [bcount, kp, np_]
        src, src_t = "%w", w_t
        if nb > 1:
            group = ", ".join(str(i) for i in range(nb))
            src_t = _tensor(wsz, "f32")
            e(
                f"  %w3 = tensor.collapse_shape %w [[{group}], [{nb}], [{nb + 1}]] : {w_t} into {src_t}"
            )
            src = "%w3"
    elif g.transposed:
        kind, wsz, wsz_p, src, src_t = "nk", [n, k], [np_, kp], "%w", w_t
    else:
        kind, wsz, wsz_p, src, src_t = "kn", [k, n], [kp, np_], "%w", w_t
    wp, wp_t = src, src_t
    if dt != "f32":
        wb_t = _tensor(wsz, dt)
        e(f"  %wb_init = tensor.empty() : {wb_t}")
        e(_truncf("%wb", src, src_t, "%wb_init", wb_t, len(wsz), dt))
        wp, wp_t = "%wb", wb_t
    if wsz_p != wsz:
        pad_t = _tensor(wsz_p, dt)
        low = ", ".join("0" for _ in wsz)
        high = ", ".join(str(p - s) for p, s in zip(wsz_p, wsz))
        idx = ", ".join(f"%j{i}: index" for i in range(len(wsz)))
        e(f"  %wpad = tensor.pad {wp} low[{low}] high[{high}] {{")
        e(f"  ^bb0({idx}):")
        e(f"    tensor.yield %zero : {dt}")
        e(f"  }} : {wp_t} to {pad_t}")
        wp, wp_t = "%wpad", pad_t
    ex_sizes, reassoc, perm = kernel.pack_layout(kind, bcount)
    ex_t = _tensor(ex_sizes, dt)
    e(
        f"  %wex = tensor.expand_shape {wp} {reassoc} output_shape "
        f"[{', '.join(map(str, ex_sizes))}] : {wp_t} into {ex_t}"
    )
    tiled = [ex_sizes[p] for p in perm]
    tiled_t = _tensor(tiled, dt)
    e(f"  %wt_init = tensor.empty() : {tiled_t}")
    e(
        f"  %wt = linalg.transpose ins(%wex : {ex_t}) outs(%wt_init : {tiled_t}) "
        f"permutation = [{', '.join(map(str, perm))}]"
    )
    b_elems = bcount * kernel.packed_b_size
    all_dims = ", ".join(str(i) for i in range(len(tiled)))
    e(f"  %bp = tensor.collapse_shape %wt [[{all_dims}]] : {tiled_t} into {_tensor([b_elems], dt)}")
    e("  %c = " + kernel.dispatch(a, "%bp", "%m", "%batch", "%rows", b_elems, bias_operand))
    c_cols = getattr(kernel, "c_cols", np_)
    c, c_t = "%c", _tensor([None, c_cols], "f32")
    if c_cols != n:
        sliced_t = _tensor([None, n], "f32")
        e(f"  %cs = tensor.extract_slice %c[0, 0] [%rows, {n}] [1, 1] : {c_t} to {sliced_t}")
        c, c_t = "%cs", sliced_t
    if rows_static is not None:
        st = _tensor([rows_static, n], "f32")
        e(f"  %cst = tensor.cast {c} : {c_t} to {st}")
        c, c_t = "%cst", st
    if len(outs) > 2:
        group = ", ".join(str(i) for i in range(len(outs) - 1))
        shape = ", ".join([*dims, str(n)])
        e(
            f"  %out = tensor.expand_shape {c} [[{group}], [{len(outs) - 1}]] output_shape "
            f"[{shape}] : {c_t} into {out_t}"
        )
        c = "%out"
    elif c_t != out_t:
        e(f"  %out = tensor.cast {c} : {c_t} to {out_t}")
        c = "%out"
    e(f"  return {c} : {out_t}")
    e("}")
    return "\n".join(lines)


def kernel_matmul_function(name: str, m: int | None, k: int, n: int, kernel: Kernel) -> str:
    """A private function ``@name(x: [m, k], w: [k, n]) -> [m, n]`` (builtin f32 tensors,
    ``m`` None: dynamic) computing ``x @ w`` through ``kernel`` (``w`` packed as for a weight;
    the caller adds ``kernel.executable()`` to the module): for other rewrites whose matmuls are
    built from builtin tensors (``convs``' im2col matmuls)."""
    spec = _Matmul(
        TensorType([m, k], "f32"),
        TensorType([k, n], "f32"),
        TensorType([m, n], "f32"),
        k,
        n,
        (),
        False,
        None,
    )
    return _function(name, spec, kernel)


def _truncf(result: str, src: str, src_t: str, init: str, dst_t: str, rank: int, dt: str) -> str:
    ids = ", ".join(f"d{i}" for i in range(rank))
    amap = f"affine_map<({ids}) -> ({ids})>"
    iters = ", ".join('"parallel"' for _ in range(rank))
    return (
        f"  {result} = linalg.generic {{indexing_maps = [{amap}, {amap}], iterator_types = "
        f"[{iters}]}} ins({src} : {src_t}) outs({init} : {dst_t}) {{\n"
        f"  ^bb0(%in: f32, %out: {dt}):\n"
        f"    %t = arith.truncf %in : f32 to {dt}\n"
        f"    linalg.yield %t : {dt}\n"
        f"  }} -> {dst_t}"
    )


def rewrite_matmuls(
    module_op: Any,
    kernel_for: KernelFactory,
    *,
    prefix: str,
    cpu_requires: Sequence[str],
    epilogues: bool = False,
) -> int:
    """Rewrites, in place, each matmul :func:`rewritable_matmuls` finds as a call of the kernel
    ``kernel_for(k, n, batched)`` gives (see the module doc), and records ``cpu_requires`` in
    the module's public functions (``turbine.cpu_requires``, added to what is there).

    Args:
        prefix: the private functions' name prefix.
        epilogues: the kernel (an :class:`.avx512.Avx512Gemm`) absorbs a ``[N]`` bias and a
            following ReLU (the result's one use) into its store (:mod:`.epilogues`).

    Returns:
        How many matmuls were rewritten.
    """
    op = getattr(module_op, "operation", module_op)
    top = TopLevel(op)
    found = [(o, _spec(o)) for o in rewritable_matmuls(op)]
    for index, (mm, spec) in enumerate(found):
        assert spec is not None
        kernel = kernel_for(spec.k, spec.n, spec.batched)
        if isinstance(kernel, Avx512Gemm):  # few static rows: prefetch the weight's next block
            kernel = kernel.for_rows(spec.rows)
        if isinstance(kernel, Avx512Gemm | AmxGemm):  # a grid IREE's workers share evenly
            kernel = kernel.balanced(spec.rows, math.prod(spec.batch))
        if isinstance(kernel, Avx512Gemm) and kernel.np_ != spec.n:
            kernel = replace(kernel, n_out=spec.n)  # C written as [rows, N]: no copy after it
        bias: Any = None  # the bias the kernel adds
        absorbed: list[Any] = []  # the ops after the matmul whose work it does
        if epilogues:
            bias, absorbed = _epilogue(mm, spec)
            if bias is not None or absorbed:
                relu = bool(absorbed) and absorbed[-1].name == "torch.aten.relu"
                kernel = replace(kernel, bias=bias is not None, relu=relu)  # type: ignore[type-var]
        if kernel.name not in top:  # one executable per kernel (the conv rewrites' too)
            top.append(kernel.executable())
        name = top.unique(f"{prefix}_{index}")
        fused_bias = bias is not None
        top.append(_function(name, spec, kernel, fused_bias))
        operands = _operands(mm)
        types = [spec.x, spec.w]
        if fused_bias:
            operands.append(bias)
            types.append(TensorType([spec.n], "f32"))
        anchor = absorbed[-1] if absorbed else mm  # a fused add's bias may come after mm
        b = Builder(anchor, location=mm.location)
        result = b.call_on_builtins(
            name,
            [(v, _tensor(t.sizes, "f32")) for v, t in zip(operands, types)],
            _tensor(spec.out.sizes, "f32"),
            mm.results[0].type,
        )
        if spec.bias is not None and not fused_bias:
            add_t = str(mm.results[0].type)
            result = b.op("torch.aten.add.Tensor", add_t, [result, spec.bias, b.int(1)])
        replace_with_absorbed(mm, absorbed, result)
    if found:
        mark_cpu_requires(op, cpu_requires)
    return len(found)


def _epilogue(mm: Any, spec: _Matmul) -> tuple[Any, list[Any]]:
    """What the kernel absorbs after the matmul ``mm`` (:mod:`.epilogues`): ``(bias, ops)``,
    ``bias`` the ``[N]`` vector it adds (the op's own, or that of a ``torch.aten.add.Tensor``
    with alpha 1 that is the result's one use) or None, ``ops`` the ops after ``mm`` whose work
    it does (that add, then a ``torch.aten.relu`` that is the one use of the value before it),
    in order. A bias of another shape (addmm's ``[M, N]``) is absorbed with nothing after it."""
    bias = None
    absorbed: list[Any] = []
    value = mm.results[0]
    if spec.bias is not None:
        bt = TensorType.of(spec.bias)
        if spec.batched or bt is None or bt.sizes != [spec.n]:
            return None, []  # the rewrite adds it after the kernel, as without epilogues
        bias = spec.bias
    elif not spec.batched:
        add = only_user(value, "torch.aten.add.Tensor")
        if add is not None:
            other, alpha = list(add.operands)[1:]
            ot, rt = TensorType.of(other), TensorType.of(add.results[0])
            if (
                constant(alpha) in (1, 1.0)
                and ot is not None
                and (ot.sizes, ot.dtype) == ([spec.n], "f32")
                and rt is not None
                and (rt.sizes, rt.dtype) == (spec.out.sizes, "f32")
            ):
                bias = other
                absorbed.append(add)
                value = add.results[0]
    relu = only_user(value, "torch.aten.relu")
    if relu is not None:
        absorbed.append(relu)
    return bias, absorbed


def _operands(mm: Any) -> list[Any]:
    operands = list(mm.operands)
    if mm.name == "torch.aten.addmm":
        return [operands[1], operands[2]]
    return [operands[0], operands[1]]


def mark_cpu_requires(module_op: Any, features: Sequence[str]) -> None:
    """Adds ``features`` to the ``turbine.cpu_requires`` of ``module_op``'s public functions."""
    from turbine_ir import ir

    body = module_op.regions[0].blocks[0]
    for child in body.operations:
        f = child.operation
        if f.name not in ("func.func", "util.func"):
            continue
        vis = f.attributes["sym_visibility"] if "sym_visibility" in f.attributes else None  # noqa: SIM401
        if vis is not None and str(vis).strip('"') != "public":
            continue
        attrs = f.attributes
        with f.context:
            entries: dict[str, Any] = {}
            if _REFLECTION_ATTR in attrs:
                old = ir.DictAttr(attrs[_REFLECTION_ATTR])
                entries = {old[i].name: old[i].attr for i in range(len(old))}
            have = entries.get(CPU_REQUIRES_KEY)
            listed = [f for f in (ir.StringAttr(have).value if have else "").split(",") if f]
            listed += [f for f in features if f not in listed]
            entries[CPU_REQUIRES_KEY] = ir.StringAttr.get(",".join(listed))
            attrs[_REFLECTION_ATTR] = ir.DictAttr.get(entries)


def rewrite_matmuls_avx512(module_op: Any) -> int:
    """Rewrites, in place, each fp32 matmul as a call of the AVX-512 fp32 kernel (blocked for
    :func:`.isa.kernel_isa`).

    Returns:
        How many matmuls were rewritten.
    """

    def kernel(k: int, n: int, batched: bool) -> Avx512Gemm:
        return Avx512Gemm.for_shape(k, n, batch_b=batched)

    return rewrite_matmuls(
        module_op,
        kernel,
        prefix="__turbine_avx512_matmul",
        cpu_requires=kernel_features(),
        epilogues=fusion_enabled(),
    )
