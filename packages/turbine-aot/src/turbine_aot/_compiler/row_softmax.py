"""llvm-cpu: a static fp32 softmax over the last dimension as one hand-written dispatch, each
row in one pass over the cache: its maximum, ``exp(x - max)`` written out and summed, then the
products with ``1 / sum`` (docs/performance.md, section 32).

IREE 3.13 compiles the form :mod:`.softmax` writes (``exp(x - max) * (1 / sum)``) into three
dispatches: the maximum and the exponentials, their sum, the products; over rows of an odd
length (attention over 199 keys in wav2vec2, 197 in ViT) its reductions take 0.33 ms for 158,404
values where ONNX Runtime's softmax takes 0.14. Here a workgroup takes a few rows, each row read
three times while it is in L1; the tail of a row that 16 does not divide is read and written
with masks. ``exp`` is :mod:`.activations`' (within 2 ulp; exactly 0 below ``-86.5``, where
f32's own value would be below 2.7e-38), NaN kept: a row holding a NaN or a ``+inf`` is NaN
throughout, a row of ``-inf`` too, as in eager.
"""

from __future__ import annotations

from dataclasses import dataclass

from .activations import emit_activation_constants, emit_exp
from .kernel_text import close_executable, open_static_executable

__all__ = ["RowSoftmax"]


@dataclass(frozen=True)
class RowSoftmax:
    """The softmax of ``rows`` rows of ``length`` f32 values, row-major."""

    rows: int
    length: int

    @property
    def rows_per_workgroup(self) -> int:
        """Rows a workgroup takes: about 4096 values a workgroup, at least one row."""
        return max(1, min(self.rows, 4096 // self.length))

    @property
    def name(self) -> str:
        return f"__turbine_row_softmax_{self.rows}x{self.length}"

    def dispatch(self, x: str) -> str:
        """The ``flow.dispatch`` of ``x`` (``tensor<rows x length x f32>``)."""
        t = f"tensor<{self.rows}x{self.length}xf32>"
        return f"flow.dispatch @{self.name}::@{self.name}({x}) : ({t}) -> {t}"

    def executable(self) -> str:
        """The ``stream.executable`` (MLIR text) for a module's top level."""
        r, n, rpw = self.rows, self.length, self.rows_per_workgroup
        full, tail = n - n % 16, n % 16
        m_t, vt = f"memref<{r}x{n}xf32>", "vector<16xf32>"
        mk = "vector<16xi1>"
        out: list[str] = []
        e = out.append
        name = self.name
        open_static_executable(e, name, (-(-r // rpw),), ["%in", "%out"])
        p = "      "
        for v in sorted({0, 1, 16, full}):
            e(f"{p}%c{v} = arith.constant {v} : index")
        e(f"{p}%mi = stream.binding.subspan %in[%c0] : !stream.binding -> {m_t}")
        e(f"{p}%mo = stream.binding.subspan %out[%c0] : !stream.binding -> {m_t}")
        e(f"{p}%wg = stream.dispatch.workgroup.id[0] : index")
        e(f"{p}%r0 = affine.apply affine_map<()[s0] -> (s0 * {rpw})>()[%wg]")
        e(f"{p}%r1 = affine.min affine_map<()[s0] -> (s0 * {rpw} + {rpw}, {r})>()[%wg]")
        e(f"{p}%ninf = arith.constant dense<0xFF800000> : {vt}")
        e(f"{p}%fone = arith.constant 1.0 : f32")
        emit_activation_constants(e, p)
        if tail:
            e(f"{p}%ctail = arith.constant {tail} : index")
            e(f"{p}%tmask = vector.create_mask %ctail : {mk}")
        e(f"{p}scf.for %r = %r0 to %r1 step %c1 {{")
        q = p + "  "

        def row_pass(name: str, mem: str, pad: str, work, init: str | None = None) -> str | None:
            """One pass over row ``%r`` of ``mem``: a loop over its full vectors, then its tail
            read with ``pad`` past the row's end. ``work(pre, v, at, masked, tag, acc)`` emits
            what is done with the vector ``v`` of columns ``at``... and returns the value
            carried on (the pass's result, with ``init`` its first value), else None."""
            if init is None:
                e(f"{q}scf.for %j = %c0 to %c{full} step %c16 {{")
            else:
                e(
                    f"{q}%{name}0 = scf.for %j = %c0 to %c{full} step %c16 "
                    f"iter_args(%{name}a = {init}) -> ({vt}) {{"
                )
            e(f"{q}  %{name}v = vector.load {mem}[%r, %j] : {m_t}, {vt}")
            acc = work(q + "  ", f"%{name}v", "%j", False, f"{name}m", f"%{name}a")
            if init is not None:
                e(f"{q}  scf.yield {acc} : {vt}")
            e(f"{q}}}")
            result = None if init is None else f"%{name}0"
            if tail:
                e(
                    f"{q}%{name}t = vector.maskedload {mem}[%r, %c{full}], %tmask, {pad} : "
                    f"{m_t}, {mk}, {vt} into {vt}"
                )
                result = work(q, f"%{name}t", f"%c{full}", True, f"{name}t", result)
            return result

        def store(pre: str, v: str, at: str, masked: bool) -> None:
            if masked:
                e(f"{pre}vector.maskedstore %mo[%r, {at}], %tmask, {v} : {m_t}, {mk}, {vt}")
            else:
                e(f"{pre}vector.store {v}, %mo[%r, {at}] : {m_t}, {vt}")

        def maximum(pre: str, v: str, at: str, masked: bool, tag: str, acc: str) -> str:
            e(f"{pre}%mx{tag} = arith.maximumf {acc}, {v} : {vt}")
            return f"%mx{tag}"

        def exp_and_sum(pre: str, v: str, at: str, masked: bool, tag: str, acc: str) -> str:
            e(f"{pre}%t{tag} = arith.subf {v}, %mxv : {vt}")
            x = emit_exp(e, pre, f"%t{tag}", tag)
            # exactly zero below the clamp; NaN (a NaN or +inf in the row) kept
            e(f"{pre}%lo{tag} = arith.cmpf olt, %t{tag}, %act_elo : {vt}")
            e(f"{pre}%ez{tag} = arith.select %lo{tag}, %act_zero, {x} : {mk}, {vt}")
            e(f"{pre}%un{tag} = arith.cmpf uno, %t{tag}, %t{tag} : {vt}")
            e(f"{pre}%ex{tag} = arith.select %un{tag}, %t{tag}, %ez{tag} : {mk}, {vt}")
            store(pre, f"%ex{tag}", at, masked)
            e(f"{pre}%sm{tag} = arith.addf {acc}, %ex{tag} : {vt}")
            return f"%sm{tag}"

        def scale(pre: str, v: str, at: str, masked: bool, tag: str, acc: str | None) -> None:
            e(f"{pre}%y{tag} = arith.mulf {v}, %invv : {vt}")
            store(pre, f"%y{tag}", at, masked)

        # the row's maximum; exp(x - max), written out and summed; the products with 1 / sum
        mx = row_pass("a", "%mi", "%ninf", maximum, "%ninf")
        e(f"{q}%mxs = vector.reduction <maximumf>, {mx} : {vt} into f32")
        e(f"{q}%mxv = vector.broadcast %mxs : f32 to {vt}")
        sm = row_pass("b", "%mi", "%ninf", exp_and_sum, "%act_zero")
        e(f"{q}%sms = vector.reduction <add>, {sm} : {vt} into f32")
        e(f"{q}%inv = arith.divf %fone, %sms : f32")
        e(f"{q}%invv = vector.broadcast %inv : f32 to {vt}")
        row_pass("c", "%mo", "%act_zero", scale)
        e(f"{p}}}")
        close_executable(e)
        return "\n".join(out)

    def function(self, fname: str, shape: list[int]) -> str:
        """A private function ``@fname(x: shape) -> shape`` (builtin f32 tensors) computing the
        softmax of ``x`` over its last dimension through this kernel."""
        t = f"tensor<{'x'.join(map(str, shape))}xf32>"
        t2 = f"tensor<{self.rows}x{self.length}xf32>"
        lines = [f"func.func private @{fname}(%x: {t}) -> {t} {{"]
        if len(shape) == 2:
            lines += [f"  %y = {self.dispatch('%x')}", f"  return %y : {t}", "}"]
            return "\n".join(lines)
        group = ", ".join(str(i) for i in range(len(shape) - 1))
        reassoc = f"[[{group}], [{len(shape) - 1}]]"
        lines += [
            f"  %x2 = tensor.collapse_shape %x {reassoc} : {t} into {t2}",
            f"  %y2 = {self.dispatch('%x2')}",
            f"  %y = tensor.expand_shape %y2 {reassoc} output_shape "
            f"[{', '.join(map(str, shape))}] : {t2} into {t}",
            f"  return %y : {t}",
            "}",
        ]
        return "\n".join(lines)
