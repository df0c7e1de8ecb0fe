"""The frame every turbine CPU matmul kernel's ``stream.executable`` shares (MLIR text): one
export whose workgroups are ``(column blocks, ceil(M / rows per workgroup), batch or 1)``, a
function taking the bindings and ``%m`` (and ``%batch``), and the ``%c<v>`` index constants the
body uses. The kernels (``avx512``, ``amx``, ``avx512_quant``, ``avx512_vnni``,
``avx512_w4a8``) write only their bodies (docs/performance.md section 9, docs/quantization.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

__all__ = ["close_executable", "open_executable"]


def open_executable(
    e: Callable[[str], object],
    name: str,
    *,
    column_blocks: int,
    rows_per_workgroup: int,
    bindings: Sequence[str],
    batch: bool = False,
    constants: Iterable[int] = (),
) -> None:
    """Emits (through ``e``, one line a call) the executable's opening up to the function's
    first body line.

    Args:
        name: the executable's, export's and function's name.
        column_blocks: workgroups along the output's columns (x).
        rows_per_workgroup: rows of ``M`` per workgroup (y is ``ceil(%m / rows)``).
        bindings: the function's binding arguments, with their ``%``, in order.
        batch: a ``%batch`` operand: the z workgroups and a function argument after ``%m``.
        constants: the index constants ``%c<v>`` to define, emitted in increasing order.
    """
    dims = "%m: index, %batch: index" if batch else "%m: index"
    e(f"stream.executable private @{name} {{")
    e(f"  stream.executable.export public @{name} workgroups({dims}) -> (index, index, index) {{")
    e(f"    %x = arith.constant {column_blocks} : index")
    e(f"    %y = affine.apply affine_map<()[s0] -> (s0 ceildiv {rows_per_workgroup})>()[%m]")
    if batch:
        e("    stream.return %x, %y, %batch : index, index, index")
    else:
        e("    %one = arith.constant 1 : index")
        e("    stream.return %x, %y, %one : index, index, index")
    e("  }")
    e("  builtin.module {")
    args = ", ".join(f"{b}: !stream.binding" for b in bindings)
    e(f"    func.func @{name}({args}, {dims}) {{")
    for v in sorted(set(constants)):
        e(f"      %c{v} = arith.constant {v} : index")


def close_executable(e: Callable[[str], object]) -> None:
    """Emits the function's return and the closing of the function, the module and the
    executable."""
    e("      return")
    e("    }")
    e("  }")
    e("}")
