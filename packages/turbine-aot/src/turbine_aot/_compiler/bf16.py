"""``precision="bf16"`` on llvm-cpu: the fp32 matmuls of the module handed to IREE rewritten as
calls of the AMX bf16 kernel (:mod:`.amx`), activations cast per call, weights packed once.

The exported program stays fp32 (and the reference's); the compile copy
(``rewrites.module_for_compile``) gets, for every fp32 ``torch.aten.mm`` / ``addmm`` /
``linear`` / ``matmul`` / ``bmm`` whose reduction ``K`` and width ``N`` are static, a call of a
private function over builtin tensors (IREE inlines it)::

    a  = bf16(x as [rows, K]), zero-padded to Kp            (per call; fuses into x's producer)
    bp = pack(bf16(w as [K, N]), zero-padded to Kp x Np)    (a weight: hoisted by IREE, once)
    c  = flow.dispatch @amx_kernel(a, bp)                   (f32 accumulation)
    out = c[:, :N] as the op's result shape (+ bias)

``pack`` is the VNNI tile layout :mod:`.amx` documents, written as reshape + transpose (no
strided reads). For a weight (any operand computed only from globals and constants) IREE's
constant-expression hoisting moves the cast and the pack into an initializer, so the weight is
converted once (at compile time for inlined weights, when the module loads for external
parameters); a matmul of two activations (attention's QK^T and PV) packs its right operand
per call. Rows (M, the batch) may be dynamic; a batched right operand needs static batch
dimensions equal to the left's (no broadcasting).

Where a module was rewritten its public functions record ``turbine.cpu_requires`` =
``"amx_tile,amx_bf16"`` in their ``iree.reflection``; turbine's runtime reads it when it loads
the module and requests the AMX permission from Linux (:func:`.amx.request_amx_permission`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .amx import AMX_FEATURES, CPU_REQUIRES_KEY, AmxGemm, host_amx_missing, padded
from .targets import TargetError, flag_targets
from .torch_ir import NOT_CONSTANT, TensorType, constant, walk

__all__ = [
    "CPU_REQUIRES_KEY",
    "PRECISIONS",
    "PRECISION_FLAG",
    "bf16_matmuls",
    "check_precision",
    "precision_flags",
    "precision_of",
    "rewrite_matmuls_bf16",
    "strip_precision_flags",
]

#: The precisions ``ExportOutput.compile(precision=...)`` accepts.
PRECISIONS = ("fp32", "bf16")
#: The compile flag carrying ``precision="bf16"`` through every compile path (the compile
#: cache keys, bundle manifests and the module's compile record see it); turbine reads it and
#: removes it before IREE sees the flags (:func:`strip_precision_flags`).
PRECISION_FLAG = "--turbine-precision"

_REFLECTION_ATTR = "iree.reflection"
_FUNC_PREFIX = "__turbine_bf16_matmul"
_MATMUL_OPS = frozenset(
    {
        "torch.aten.mm",
        "torch.aten.addmm",
        "torch.aten.linear",
        "torch.aten.matmul",
        "torch.aten.bmm",
    }
)


def precision_of(flags: Any) -> str:
    """The precision the flags ask for (the last ``--turbine-precision=``; default fp32)."""
    value = "fp32"
    for f in flags:
        if f.startswith(PRECISION_FLAG + "="):
            value = f.split("=", 1)[1].strip().lower()
    return value


def precision_flags(precision: str) -> list[str]:
    """The flags asking for ``precision`` (none for fp32).

    Raises:
        TargetError: ``precision`` is not one of :data:`PRECISIONS`.
    """
    value = str(precision).strip().lower()
    if value not in PRECISIONS:
        raise TargetError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return [] if value == "fp32" else [f"{PRECISION_FLAG}={value}"]


def strip_precision_flags(flags: Any) -> list[str]:
    """``flags`` without turbine's precision flag (what IREE is given)."""
    return [f for f in flags if not f.startswith(PRECISION_FLAG + "=")]


def _target_cpu(flags: Any) -> str | None:
    cpu = None
    for f in flags:
        if f.startswith("--iree-llvmcpu-target-cpu="):
            cpu = f.split("=", 1)[1]
    return cpu


def check_precision(flags: Any) -> None:
    """Refuses a precision the flags' target cannot give.

    ``bf16`` needs the llvm-cpu target built for this machine (``--iree-llvmcpu-target-cpu=host``,
    turbine's default) on a CPU with AMX-BF16: the kernel is AMX code, and IREE 3.13's own bf16
    path is slower than fp32 (docs/performance.md).

    Raises:
        TargetError: an unknown precision, another target, a portable build, or a host CPU
            without AMX-BF16 (the message names what is missing and what to use instead).
    """
    precision = precision_of(flags)
    if precision not in PRECISIONS:
        raise TargetError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return
    targets = flag_targets(flags)
    if targets != {"llvm-cpu"}:
        raise TargetError(
            f"precision='bf16' is implemented for the llvm-cpu target only (this compile targets "
            f"{', '.join(sorted(targets)) or 'nothing'}); on GPUs export the model in bf16 "
            "instead (model.to(torch.bfloat16))"
        )
    cpu = _target_cpu(flags)
    if cpu != "host":
        raise TargetError(
            f"precision='bf16' runs AMX code and needs a module built for this machine's CPU "
            f"(--iree-llvmcpu-target-cpu=host, the default), not {cpu!r}; drop host_cpu=False / "
            "the target CPU flag, or use precision='fp32' for a portable module"
        )
    missing = host_amx_missing()
    if missing:
        raise TargetError(
            f"precision='bf16' needs a CPU with AMX-BF16 (Intel Xeon 4th generation, Sapphire "
            f"Rapids, or newer); this machine lacks {', '.join(missing)}. Use precision='fp32' "
            "(the default): IREE 3.13's own bf16 code is slower than its fp32 code on CPUs "
            "without AMX"
        )


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


def bf16_matmuls(module_op: Any) -> list[Any]:
    """The ops of ``module_op`` that :func:`rewrite_matmuls_bf16` rewrites."""
    op = getattr(module_op, "operation", module_op)
    return [o for o in walk(op) if o.name in _MATMUL_OPS and _spec(o) is not None]


def _tensor(sizes: Any, dtype: str) -> str:
    return "tensor<" + "".join(("?" if s is None else str(s)) + "x" for s in sizes) + dtype + ">"


def _function(name: str, g: _Matmul, kernel: AmxGemm) -> str:
    """The private function computing the matmul through the AMX kernel (builtin tensors)."""
    k, n, kp, np_ = g.k, g.n, kernel.kp, kernel.np_
    xs, ws, outs = list(g.x.sizes), list(g.w.sizes), list(g.out.sizes)
    x_t, w_t, out_t = _tensor(xs, "f32"), _tensor(ws, "f32"), _tensor(outs, "f32")
    lines = [f"func.func private @{name}(%x: {x_t}, %w: {w_t}) -> {out_t} {{"]
    e = lines.append
    e("  %zero = arith.constant 0.0 : bf16")
    # dynamic dims of x, for reshapes; rows = product of all dims but K
    dims: list[str] = []
    for i, s in enumerate(xs[:-1]):
        if s is None:
            e(f"  %ci{i} = arith.constant {i} : index")
            e(f"  %d{i} = tensor.dim %x, %ci{i} : {x_t}")
            dims.append(f"%d{i}")
        else:
            dims.append(str(s))
    lead = xs[:-1]
    nb = len(g.batch)
    m_sizes = lead[nb:]  # the M dims (all of lead for a shared weight)
    rows_static = None if any(s is None for s in lead) else math.prod(lead)  # type: ignore[arg-type]
    m_static = None if any(s is None for s in m_sizes) else math.prod(m_sizes)  # type: ignore[arg-type]
    # rows, m, batch as index values
    e(f"  %batch = arith.constant {math.prod(g.batch) if g.batch else 1} : index")
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
    # x -> [rows, K] bf16, padded to Kp
    rows_t = _tensor([rows_static, k], "f32")
    src = "%x"
    if len(xs) > 2:
        group = ", ".join(str(i) for i in range(len(xs) - 1))
        e(f"  %x2 = tensor.collapse_shape %x [[{group}], [{len(xs) - 1}]] : {x_t} into {rows_t}")
        src = "%x2"
    xb_t = _tensor([rows_static, k], "bf16")
    rows_dyn = "(%rows)" if rows_static is None else "()"
    e(f"  %xb_init = tensor.empty{rows_dyn} : {xb_t}")
    e(_truncf("%xb", src, rows_t, "%xb_init", xb_t, 2))
    a, a_t = "%xb", xb_t
    if kp != k:
        a_t = _tensor([rows_static, kp], "bf16")
        e(f"  %a = tensor.pad %xb low[0, 0] high[0, {kp - k}] {{")
        e("  ^bb0(%i0: index, %i1: index):")
        e("    tensor.yield %zero : bf16")
        e(f"  }} : {xb_t} to {a_t}")
        a = "%a"
    if rows_static is not None:  # the kernel takes ?xKp
        e(f"  %ad = tensor.cast {a} : {a_t} to {_tensor([None, kp], 'bf16')}")
        a = "%ad"
    # w -> packed bf16 tiles
    bcount = math.prod(g.batch) if g.batch else 1
    if g.batched:
        w3_t = _tensor([bcount, k, n], "f32")
        src = "%w"
        if nb > 1:
            group = ", ".join(str(i) for i in range(nb))
            e(
                f"  %w3 = tensor.collapse_shape %w [[{group}], [{nb}], [{nb + 1}]] : {w_t} into {w3_t}"
            )
            src = "%w3"
        elif nb == 1:
            src = "%w"
        wsz, wsz_p = [bcount, k, n], [bcount, kp, np_]
        src_t = w3_t
    elif g.transposed:
        wsz, wsz_p, src, src_t = [n, k], [np_, kp], "%w", w_t
    else:
        wsz, wsz_p, src, src_t = [k, n], [kp, np_], "%w", w_t
    wb_t = _tensor(wsz, "bf16")
    e(f"  %wb_init = tensor.empty() : {wb_t}")
    e(_truncf("%wb", src, src_t, "%wb_init", wb_t, len(wsz)))
    wp, wp_t = "%wb", wb_t
    if wsz_p != wsz:
        wp_t = _tensor(wsz_p, "bf16")
        low = ", ".join("0" for _ in wsz)
        high = ", ".join(str(p - s) for p, s in zip(wsz_p, wsz))
        idx = ", ".join(f"%j{i}: index" for i in range(len(wsz)))
        e(f"  %wpad = tensor.pad %wb low[{low}] high[{high}] {{")
        e(f"  ^bb0({idx}):")
        e("    tensor.yield %zero : bf16")
        e(f"  }} : {wb_t} to {wp_t}")
        wp = "%wpad"
    kt, nt = kp // 32, np_ // 16
    if g.batched:
        ex_sizes, reassoc, perm = (
            [bcount, kt, 16, 2, nt, 16],
            "[[0], [1, 2, 3], [4, 5]]",
            [0, 4, 1, 2, 5, 3],
        )
    elif g.transposed:
        ex_sizes, reassoc, perm = [nt, 16, kt, 16, 2], "[[0, 1], [2, 3, 4]]", [0, 2, 3, 1, 4]
    else:
        ex_sizes, reassoc, perm = [kt, 16, 2, nt, 16], "[[0, 1, 2], [3, 4]]", [3, 0, 1, 4, 2]
    ex_t = _tensor(ex_sizes, "bf16")
    e(
        f"  %wex = tensor.expand_shape {wp} {reassoc} output_shape "
        f"[{', '.join(map(str, ex_sizes))}] : {wp_t} into {ex_t}"
    )
    tiled = [ex_sizes[p] for p in perm]
    tiled_t = _tensor(tiled, "bf16")
    e(f"  %wt_init = tensor.empty() : {tiled_t}")
    e(
        f"  %wt = linalg.transpose ins(%wex : {ex_t}) outs(%wt_init : {tiled_t}) "
        f"permutation = [{', '.join(map(str, perm))}]"
    )
    b_elems = bcount * kernel.packed_b_size
    all_dims = ", ".join(str(i) for i in range(len(tiled)))
    e(
        f"  %bp = tensor.collapse_shape %wt [[{all_dims}]] : {tiled_t} into "
        f"{_tensor([b_elems], 'bf16')}"
    )
    e("  %c = " + kernel.dispatch(a, "%bp", "%m", "%batch", "%rows", b_elems))
    c, c_t = "%c", _tensor([None, np_], "f32")
    if np_ != n:
        e(
            f"  %cs = tensor.extract_slice %c[0, 0] [%rows, {n}] [1, 1] : {c_t} to {_tensor([None, n], 'f32')}"
        )
        c, c_t = "%cs", _tensor([None, n], "f32")
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


def _truncf(result: str, src: str, src_t: str, init: str, dst_t: str, rank: int) -> str:
    ids = ", ".join(f"d{i}" for i in range(rank))
    amap = f"affine_map<({ids}) -> ({ids})>"
    iters = ", ".join('"parallel"' for _ in range(rank))
    return (
        f"  {result} = linalg.generic {{indexing_maps = [{amap}, {amap}], iterator_types = "
        f"[{iters}]}} ins({src} : {src_t}) outs({init} : {dst_t}) {{\n"
        "  ^bb0(%in: f32, %out: bf16):\n"
        "    %t = arith.truncf %in : f32 to bf16\n"
        "    linalg.yield %t : bf16\n"
        f"  }} -> {dst_t}"
    )


def rewrite_matmuls_bf16(module_op: Any) -> int:
    """Rewrites, in place, each matmul :func:`bf16_matmuls` finds as a call of the AMX bf16
    kernel (see the module doc), and marks the module's public functions as needing AMX.

    Returns:
        How many matmuls were rewritten.
    """
    from turbine_ir.ir import FlatSymbolRefAttr, InsertionPoint, Module, Operation, Type

    op = getattr(module_op, "operation", module_op)
    body = op.regions[0].blocks[0]
    taken = {
        str(o.attributes["sym_name"]).strip('"')
        for o in body.operations
        if "sym_name" in o.operation.attributes
    }
    found = [(o, _spec(o)) for o in bf16_matmuls(op)]
    kernels: dict[AmxGemm, None] = {}
    for index, (mm, spec) in enumerate(found):
        assert spec is not None
        kernel = AmxGemm.for_shape(padded(spec.k), padded(spec.n), batch_b=spec.batched)
        if kernel not in kernels:
            kernels[kernel] = None
            with mm.context:
                parsed = Module.parse(kernel.executable())
            exe = parsed.body.operations[0].operation
            exe.detach_from_parent()
            body.append(exe)
        name = f"{_FUNC_PREFIX}_{index}"
        while name in taken:
            name += "_"
        taken.add(name)
        with mm.context:
            parsed = Module.parse(_function(name, spec, kernel))
        func = parsed.body.operations[0].operation
        func.detach_from_parent()
        body.append(func)
        operands = _operands(mm)
        with mm.location, InsertionPoint(mm):
            builtin = [
                Operation.create(
                    "torch_c.to_builtin_tensor",
                    results=[Type.parse(_tensor(t.sizes, "f32"), mm.context)],
                    operands=[v],
                ).result
                for v, t in zip(operands, (spec.x, spec.w))
            ]
            call = Operation.create(
                "func.call",
                results=[Type.parse(_tensor(spec.out.sizes, "f32"), mm.context)],
                operands=builtin,
                attributes={"callee": FlatSymbolRefAttr.get(name)},
            ).result
            result = Operation.create(
                "torch_c.from_builtin_tensor", results=[mm.results[0].type], operands=[call]
            ).result
            if spec.bias is not None:
                one = Operation.create(
                    "torch.constant.int",
                    results=[Type.parse("!torch.int", mm.context)],
                    attributes={"value": _i64(1, mm.context)},
                ).result
                result = Operation.create(
                    "torch.aten.add.Tensor",
                    results=[mm.results[0].type],
                    operands=[result, spec.bias, one],
                ).result
        mm.results[0].replace_all_uses_with(result)
        mm.erase()
    if found:
        _mark_public_functions(op)
    return len(found)


def _operands(mm: Any) -> list[Any]:
    operands = list(mm.operands)
    if mm.name == "torch.aten.addmm":
        return [operands[1], operands[2]]
    return [operands[0], operands[1]]


def _i64(v: int, context: Any) -> Any:
    from turbine_ir.ir import IntegerAttr, IntegerType

    with context:
        return IntegerAttr.get(IntegerType.get_signless(64), v)


def _mark_public_functions(module_op: Any) -> None:
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
            entries[CPU_REQUIRES_KEY] = ir.StringAttr.get(",".join(AMX_FEATURES))
            attrs[_REFLECTION_ATTR] = ir.DictAttr.get(entries)
