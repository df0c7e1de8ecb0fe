"""How IREE's ``local-task`` driver shares a dispatch's workgroups among its workers, and the
workgroup grids turbine's kernels choose for it (docs/performance.md, section 28).

IREE 3.13 hands a dispatch's workgroups out one at a time while it has fewer than 8 per worker,
and 8 at a time (one reservation) from there on: a dispatch of 24 workgroups on two workers runs
16 on one and 8 on the other, a third longer than an even split (measured with IREE's own
profiler: the sum of the workgroups' times against the dispatch's, 0.75 at 24 workgroups, 0.84
at 20 and 40, 0.88 at 28, 0.96-0.97 at 16, 32 and 48; 0.94 at 33, whose last reservation holds
one). A kernel whose grid can be cut several ways takes the cut whose busiest worker has the
least work (:func:`busiest_share`), for the worker count IREE starts by default, one per
physical core of the compiling host (:func:`.host.host_physical_cores`): the speed of a module
run with other worker counts may differ, its results never do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from .host import host_physical_cores

K = TypeVar("K", bound=Any)

__all__ = [
    "RESERVATION",
    "balanced_columns",
    "balanced_grid",
    "balanced_rows",
    "best_grid",
    "busiest_share",
    "busiest_work",
    "default_workers",
]

#: Workgroups a worker of IREE 3.13's ``local-task`` driver takes at a time once a dispatch
#: has at least this many per worker (one at a time below).
RESERVATION = 8


def default_workers() -> int:
    """The workers IREE's ``local-task`` starts by default here (one per physical core; 1
    where the count is unknown)."""
    return max(1, host_physical_cores())


def busiest_share(tiles: int, workers: int) -> int:
    """The most workgroups one of ``workers`` runs of a dispatch of ``tiles`` equal ones: an
    even split one at a time below :data:`RESERVATION` per worker, else reservations of
    :data:`RESERVATION` (the last one what is left), each taken by the worker that is free
    first."""
    return busiest_work([1] * max(0, tiles), workers)


def best_grid(choices: Iterable[tuple[int, int]], workers: int | None = None) -> int:
    """The index of the best of ``choices``, each ``(workgroups, work per workgroup)`` for the
    same dispatch cut another way: the least work for its busiest worker
    (:func:`busiest_share` times the work of one), the first of equal ones (list the usual cut
    first)."""
    w = default_workers() if workers is None else workers
    costs = [busiest_share(tiles, w) * work for tiles, work in choices]
    return min(range(len(costs)), key=lambda i: (costs[i], i))


def balanced_grid(kernel: K, m: int | None, batch: int, step: int, workers: int | None = None) -> K:
    """``kernel`` (a dataclass with ``np_``, ``rows_per_workgroup`` and ``cols_per_workgroup``)
    with the columns per workgroup that :func:`best_grid` picks for ``m`` static rows of
    ``batch`` entries, among its usual ones (kept on ties) and one to four ``step``-wide
    panels dividing ``np_``; unchanged for unknown rows (``None``)."""
    if m is None or m <= 0:
        return kernel
    width, cols = kernel.np_, kernel.cols_per_workgroup
    row_blocks = batch * -(-m // kernel.rows_per_workgroup)
    choices = [cols] + [c for c in range(step, 4 * step + 1, step) if c != cols]
    choices = [c for c in choices if width % c == 0]
    best = choices[best_grid([(row_blocks * (width // c), c) for c in choices], workers)]
    return kernel if best == cols else replace(kernel, cols_per_workgroup=best)


#: The workgroup widths :func:`balanced_columns` tries after a kernel's usual one: wider
#: powers of two first (fewer workgroups), then the rest.
_WIDER = (64, 128, 256)
_OTHER = (16, 32, 48, 96, 192)


def balanced_columns(
    kernel: K, rows: int | None, n: int, step: int, workers: int | None = None
) -> K:
    """``kernel`` (a dataclass with ``rows_per_workgroup`` and ``cols_per_workgroup``, its grid
    ``(n / cols, ceil(rows / rows_per_workgroup))``) with the columns per workgroup, a multiple
    of ``step`` dividing ``n``, that leave the busiest worker the least work for ``rows``
    static rows (:func:`busiest_share`); unchanged for unknown rows (``None``), and unless the
    gain is 5 % or more (the output layer's 250 workgroups of 128 channels leave one of two
    workers 2 % more than 2000 of 16 would: not worth 8x the workgroups). The quantized
    products of one row (docs/quantization.md, "Workgroups two workers share evenly"): 768 or
    1536 channels in 24 workgroups ran 16 on one of two workers, 12 are shared one at a time."""
    w = default_workers() if workers is None else workers
    if rows is None or rows <= 0 or w <= 1:
        return kernel
    usual = kernel.cols_per_workgroup
    rest = [c for c in _WIDER if c > usual] + list(_OTHER)
    options = [usual] + [c for c in rest if c != usual and n % c == 0 and c % step == 0]
    blocks = -(-rows // kernel.rows_per_workgroup)
    cost = [busiest_share(blocks * (n // c), w) * c for c in options]
    best = min(range(len(options)), key=lambda i: (cost[i], i))
    if cost[best] > 0.95 * cost[0]:
        return kernel
    return replace(kernel, cols_per_workgroup=options[best])


def busiest_work(sizes: Sequence[int], workers: int) -> int:
    """The most work one of ``workers`` runs of a dispatch whose workgroups, in the order IREE
    hands them out (``x`` fastest, then ``y``, then ``z``), have ``sizes``: one at a time below
    :data:`RESERVATION` per worker, else reservations of :data:`RESERVATION` consecutive ones,
    each taken by the worker that is free first."""
    if workers <= 1:
        return sum(sizes)
    step = 1 if len(sizes) < RESERVATION * workers else RESERVATION
    loads = [0] * workers
    for i in range(0, len(sizes), step):
        loads[loads.index(min(loads))] += sum(sizes[i : i + step])
    return max(loads)


#: The rows per workgroup :func:`balanced_rows` may choose (multiples of the AMX kernel's 32-row
#: strips; fewer than 96 would read each workgroup's weight panel for too few rows).
ROW_CHOICES = (96, 128, 160, 192, 224, 256)


def balanced_rows(kernel: K, m: int, batch: int, workers: int | None = None) -> K:
    """``kernel`` (a dataclass with ``np_``, ``rows_per_workgroup`` and ``cols_per_workgroup``,
    its grid ``(np_ / cols, ceil(m / rows), batch)``) with the rows per workgroup of
    :data:`ROW_CHOICES` whose busiest worker computes the fewest rows (:func:`busiest_work`; the
    last row block of each batch entry holds what is left), its usual count kept on ties. A
    convolution's output grid (ResNet's first stage: 56 x 58 rows, 26 workgroups of 128 rows,
    16 of them for one of two workers) rarely divides evenly (docs/performance.md, section 35)."""
    w = default_workers() if workers is None else workers
    if m <= 0 or w <= 1:
        return kernel
    col_blocks = kernel.np_ // kernel.cols_per_workgroup

    def busiest(rows: int) -> int:
        entry = [min(rows, m - start) for start in range(0, m, rows)]
        return busiest_work([r for _ in range(batch) for r in entry for _ in range(col_blocks)], w)

    usual = kernel.rows_per_workgroup
    options = [usual] + [r for r in ROW_CHOICES if r != usual]
    best = min(options, key=lambda r: (busiest(r), options.index(r)))
    return kernel if best == usual else replace(kernel, rows_per_workgroup=best)
