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
        e(f"stream.executable private @{name} {{")
        e(f"  stream.executable.export public @{name} workgroups() -> (index, index, index) {{")
        e(f"    %x = arith.constant {-(-r // rpw)} : index")
        e("    %one = arith.constant 1 : index")
        e("    stream.return %x, %one, %one : index, index, index")
        e("  }")
        e("  builtin.module {")
        e(f"    func.func @{name}(%in: !stream.binding, %out: !stream.binding) {{")
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
        # the row's maximum
        e(f"{q}%mx0 = scf.for %j = %c0 to %c{full} step %c16 iter_args(%acc = %ninf) -> ({vt}) {{")
        e(f"{q}  %v = vector.load %mi[%r, %j] : {m_t}, {vt}")
        e(f"{q}  %a = arith.maximumf %acc, %v : {vt}")
        e(f"{q}  scf.yield %a : {vt}")
        e(f"{q}}}")
        mx = "%mx0"
        if tail:
            e(
                f"{q}%vt = vector.maskedload %mi[%r, %c{full}], %tmask, %ninf : {m_t}, {mk}, {vt} into {vt}"
            )
            e(f"{q}%mx1 = arith.maximumf %mx0, %vt : {vt}")
            mx = "%mx1"
        e(f"{q}%mxs = vector.reduction <maximumf>, {mx} : {vt} into f32")
        e(f"{q}%mxv = vector.broadcast %mxs : f32 to {vt}")

        def exp(v: str, tag: str, pre: str) -> str:
            e(f"{pre}%t{tag} = arith.subf {v}, %mxv : {vt}")
            x = emit_exp(e, pre, f"%t{tag}", tag)
            # exactly zero below the clamp; NaN (a NaN or +inf in the row) kept
            e(f"{pre}%lo{tag} = arith.cmpf olt, %t{tag}, %act_elo : {vt}")
            e(f"{pre}%ez{tag} = arith.select %lo{tag}, %act_zero, {x} : {mk}, {vt}")
            e(f"{pre}%un{tag} = arith.cmpf uno, %t{tag}, %t{tag} : {vt}")
            e(f"{pre}%ex{tag} = arith.select %un{tag}, %t{tag}, %ez{tag} : {mk}, {vt}")
            return f"%ex{tag}"

        # exp(x - max), written out and summed
        e(
            f"{q}%sm0 = scf.for %j = %c0 to %c{full} step %c16 iter_args(%sacc = %act_zero) "
            f"-> ({vt}) {{"
        )
        e(f"{q}  %v = vector.load %mi[%r, %j] : {m_t}, {vt}")
        ev = exp("%v", "m", q + "  ")
        e(f"{q}  vector.store {ev}, %mo[%r, %j] : {m_t}, {vt}")
        e(f"{q}  %s = arith.addf %sacc, {ev} : {vt}")
        e(f"{q}  scf.yield %s : {vt}")
        e(f"{q}}}")
        sm = "%sm0"
        if tail:
            e(
                f"{q}%vt2 = vector.maskedload %mi[%r, %c{full}], %tmask, %ninf : {m_t}, {mk}, {vt} into {vt}"
            )
            et = exp("%vt2", "t", q)
            e(f"{q}vector.maskedstore %mo[%r, %c{full}], %tmask, {et} : {m_t}, {mk}, {vt}")
            e(f"{q}%sm1 = arith.addf %sm0, {et} : {vt}")
            sm = "%sm1"
        e(f"{q}%sms = vector.reduction <add>, {sm} : {vt} into f32")
        e(f"{q}%inv = arith.divf %fone, %sms : f32")
        e(f"{q}%invv = vector.broadcast %inv : f32 to {vt}")
        # the products with 1 / sum
        e(f"{q}scf.for %j = %c0 to %c{full} step %c16 {{")
        e(f"{q}  %w = vector.load %mo[%r, %j] : {m_t}, {vt}")
        e(f"{q}  %y = arith.mulf %w, %invv : {vt}")
        e(f"{q}  vector.store %y, %mo[%r, %j] : {m_t}, {vt}")
        e(f"{q}}}")
        if tail:
            e(
                f"{q}%wt = vector.maskedload %mo[%r, %c{full}], %tmask, %act_zero : {m_t}, {mk}, {vt} into {vt}"
            )
            e(f"{q}%yt = arith.mulf %wt, %invv : {vt}")
            e(f"{q}vector.maskedstore %mo[%r, %c{full}], %tmask, %yt : {m_t}, {mk}, {vt}")
        e(f"{p}}}")
        e(f"{p}return")
        e("    }")
        e("  }")
        e("}")
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
