"""How IREE's ``local-task`` shares a dispatch's workgroups (``_compiler.workgroups``): the model
the kernels choose their grids by, against what IREE 3.13's profiler showed on two workers."""

from __future__ import annotations

import pytest

from turbine_aot._compiler import workgroups
from turbine_aot._compiler.host import host_physical_cores
from turbine_aot._compiler.workgroups import best_grid, busiest_share


@pytest.mark.parametrize(
    ("tiles", "busiest"),
    [
        (1, 1),
        (7, 4),  # below 8 a worker: one at a time
        (15, 8),
        (16, 8),  # two reservations of 8
        (20, 12),  # 8 + 4 / 8: the profile's 0.84
        (24, 16),  # 16 / 8: 0.75
        (28, 16),  # 16 / 12: 0.88
        (32, 16),
        (33, 17),  # the last reservation holds one: 0.94
        (40, 24),
        (48, 24),
    ],
)
def test_two_workers_share_as_iree_does(tiles, busiest):
    assert busiest_share(tiles, 2) == busiest


def test_one_worker_runs_everything_and_many_take_one_at_a_time():
    assert busiest_share(24, 1) == 24
    assert busiest_share(24, 4) == 6  # 24 < 32: one at a time
    assert busiest_share(0, 2) == 0


def test_the_best_grid_is_the_least_work_for_the_busiest_worker():
    # 24 workgroups of one unit (16 on one worker) against 12 of two (6 + 6): the second
    assert best_grid([(24, 1), (12, 2)], workers=2) == 1
    # equal: the first (the usual cut) stays
    assert best_grid([(16, 1), (8, 2)], workers=2) == 0
    assert best_grid([(24, 1), (12, 2)], workers=1) == 0


def test_the_default_is_one_worker_per_physical_core(monkeypatch):
    assert host_physical_cores() >= 1  # Linux: /proc/cpuinfo
    monkeypatch.setattr(workgroups, "host_physical_cores", lambda: 0)
    assert workgroups.default_workers() == 1  # unknown: no reason to cut otherwise


def test_unequal_workgroups_are_shared_as_equal_ones_are():
    # equal sizes: the same as busiest_share, in units of one workgroup's work
    for tiles in (7, 20, 24, 33):
        assert workgroups.busiest_work([3] * tiles, 2) == 3 * busiest_share(tiles, 2)
    # one at a time, each to the worker free first: 5 | 4, then 1 to the second, 3 to the first
    assert workgroups.busiest_work([5, 4, 1, 3], 2) == 8
    # from 16 on, reservations of 8 consecutive ones: 8 x 1 | 8 x 2, then 1 x 9 to the first
    assert workgroups.busiest_work([1] * 8 + [2] * 8 + [9], 2) == 17
    assert workgroups.busiest_work([5, 4, 1, 3], 1) == 13


def test_a_convolution_grid_takes_the_rows_two_workers_share_evenly():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Grid:
        np_: int = 64
        rows_per_workgroup: int = 128
        cols_per_workgroup: int = 64

    # ResNet's first stage at 56 x 56 (an output grid of 56 x 58 rows): 26 workgroups of 128
    # rows run 16 x 128 = 2048 rows on one worker; 15 of 224 run 7 x 224 + 112 = 1680
    assert workgroups.balanced_rows(Grid(), 56 * 58, 1, workers=2).rows_per_workgroup == 224
    # already even (two row blocks a batch entry, four column blocks), or one worker: unchanged
    assert workgroups.balanced_rows(Grid(np_=256), 224, 1, workers=2) == Grid(np_=256)
    assert workgroups.balanced_rows(Grid(), 56 * 58, 1, workers=1) == Grid()
