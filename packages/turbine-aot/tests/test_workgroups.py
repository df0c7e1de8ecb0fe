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
