"""The frame every turbine CPU matmul kernel's ``stream.executable`` shares (MLIR text): one export
whose workgroups are ``(column blocks, ceil(M / rows per workgroup), batch or 1)`` (the column
blocks a number, or following a size given at run time), a function taking the bindings and
``%m`` (and ``%batch``, and more sizes), the ``%c<v>`` index constants the body uses, the
workgroup's block of the output in that grid, and the choice of the register block for the
rows left (:func:`row_blocks`). The kernels (``avx512``, ``avx512_dynamic``, ``amx``,
``amx_quant``, ``avx512_quant`` with ``avx2_quant``, ``avx512_vnni``, ``avx512_w4a8``,
``few_row_products``; ``avx512_conv`` the last part only) write only their bodies
(docs/performance.md section 9, docs/quantization.md); :func:`tree_sum` adds a body's
independent accumulators pairwise."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

__all__ = [
    "close_executable",
    "open_executable",
    "open_static_executable",
    "row_blocks",
    "tree_sum",
    "workgroup_block",
]


def open_executable(
    e: Callable[[str], object],
    name: str,
    *,
    column_blocks: int | tuple[str, int],
    rows_per_workgroup: int,
    bindings: Sequence[str],
    batch: bool = False,
    constants: Iterable[int] = (),
    sizes: Sequence[str] = (),
) -> None:
    """Emits (through ``e``, one line a call) the executable's opening up to the function's
    first body line.

    Args:
        name: the executable's, export's and function's name.
        column_blocks: workgroups along the output's columns (x): a number, or ``(operand,
            width)`` for ``ceil(operand / width)`` (an operand of ``sizes``: a dynamic width).
        rows_per_workgroup: rows of ``M`` per workgroup (y is ``ceil(%m / rows)``).
        bindings: the function's binding arguments, with their ``%``, in order.
        batch: a ``%batch`` operand: the z workgroups and a function argument after ``%m``.
        constants: the index constants ``%c<v>`` to define, emitted in increasing order.
        sizes: more index operands (with their ``%``), after ``%m`` and ``%batch``.
    """
    dims = ", ".join(f"{d}: index" for d in ["%m", *(["%batch"] if batch else []), *sizes])
    e(f"stream.executable private @{name} {{")
    e(f"  stream.executable.export public @{name} workgroups({dims}) -> (index, index, index) {{")
    if isinstance(column_blocks, tuple):
        operand, width = column_blocks
        e(f"    %x = affine.apply affine_map<()[s0] -> (s0 ceildiv {width})>()[{operand}]")
    else:
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


def open_static_executable(
    e: Callable[[str], object], name: str, grid: Sequence[int], bindings: Sequence[str]
) -> None:
    """Emits (through ``e``) the opening of an executable whose workgroup grid is fixed at
    compile time (the convolution, Winograd and softmax kernels), up to its function's first
    body line: ``grid`` is ``(x,)`` (y and z 1) or ``(x, y)`` (z 1); the function takes only
    ``bindings`` (with their ``%``). :func:`close_executable` closes it."""
    e(f"stream.executable private @{name} {{")
    e(f"  stream.executable.export public @{name} workgroups() -> (index, index, index) {{")
    if len(grid) == 1:
        e(f"    %x = arith.constant {grid[0]} : index")
        e("    %one = arith.constant 1 : index")
        e("    stream.return %x, %one, %one : index, index, index")
    else:
        x, y = grid
        e(f"    %x = arith.constant {x} : index")
        e(f"    %y = arith.constant {y} : index")
        e("    %z = arith.constant 1 : index")
        e("    stream.return %x, %y, %z : index, index, index")
    e("  }")
    e("  builtin.module {")
    e(f"    func.func @{name}(" + ", ".join(f"{b}: !stream.binding" for b in bindings) + ") {")


def workgroup_block(
    e: Callable[[str], object],
    *,
    cols_per_workgroup: int,
    rows_per_workgroup: int,
    column_base: str,
    batch: bool = False,
) -> None:
    """Emits the block of ``C`` this workgroup computes, in the grid :func:`open_executable`
    exports: ``%wgx`` / ``%wgy`` (and ``%wgz``, the batch entry) and, from them, the first
    column (named ``column_base``), the first row ``%m0`` and the row bound ``%mend``."""
    p = "      "
    e(f"{p}%wgx = stream.dispatch.workgroup.id[0] : index")
    e(f"{p}%wgy = stream.dispatch.workgroup.id[1] : index")
    if batch:
        e(f"{p}%wgz = stream.dispatch.workgroup.id[2] : index")
    e(f"{p}{column_base} = affine.apply affine_map<()[s0] -> (s0 * {cols_per_workgroup})>()[%wgx]")
    e(f"{p}%m0 = affine.apply affine_map<()[s0] -> (s0 * {rows_per_workgroup})>()[%wgy]")
    e(f"{p}%mend = affine.min affine_map<()[s0, s1] -> (s0 + {rows_per_workgroup}, s1)>()[%m0, %m]")


def row_blocks(
    e: Callable[[str], object], p: str, mr: int, micro: Callable[[int, str], object]
) -> None:
    """Emits the register block of ``%left`` rows (``min(mr, rows left)``, in scope): the
    full block ``micro(mr, indent)`` by default and each shorter one ``micro(r, indent)`` (``r``
    of 1 to ``mr - 1``, the last rows of a workgroup) as a case of ``scf.index_switch`` (its
    lines at ``p``, the blocks' two spaces further); ``mr`` of 1: ``micro(1, p)`` alone."""
    if mr == 1:
        micro(1, p)
        return
    e(f"{p}scf.index_switch %left")
    for r in range(1, mr):
        e(f"{p}case {r} {{")
        micro(r, p + "  ")
        e(f"{p}  scf.yield")
        e(f"{p}}}")
    e(f"{p}default {{")
    micro(mr, p + "  ")
    e(f"{p}}}")


def close_executable(e: Callable[[str], object]) -> None:
    """Emits the function's return and the closing of the function, the module and the
    executable."""
    e("      return")
    e("    }")
    e("  }")
    e("}")


def tree_sum(e: Callable[[str], object], p: str, values: list[str], name: str, vt: str) -> str:
    """Emits the pairwise sum of ``values`` (names ``name_<i>``) and returns its name."""
    level = 0
    while len(values) > 1:
        nxt = []
        for i in range(0, len(values) - 1, 2):
            out = f"{name}_{level}_{i // 2}"
            e(f"{p}{out} = arith.addf {values[i]}, {values[i + 1]} : {vt}")
            nxt.append(out)
        if len(values) % 2:
            nxt.append(values[-1])
        values, level = nxt, level + 1
    return values[0]
