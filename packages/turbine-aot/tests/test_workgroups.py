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


def test_quantized_products_of_one_row_take_columns_two_workers_share():
    """A decode step's quantized products (110M Llama: 768 / 1536 channels) were 24
    workgroups, 16 on one of two workers; cut for two workers each runs half. One worker,
    unknown rows and already even grids keep the usual cut; a gain under 5 % is not taken."""
    from turbine_aot._compiler.avx512_quant import Avx512QuantGemm
    from turbine_aot._compiler.avx512_vnni import Avx512VnniGemm
    from turbine_aot._compiler.avx512_w4a8 import Avx512W4A8Gemm

    def busiest_columns(kernel, workers=2):
        return (
            busiest_share(kernel.n // kernel.cols_per_workgroup, workers)
            * kernel.cols_per_workgroup
        )

    uneven = 0
    for n in (768, 1536):
        for bits, group in ((4, 128), (8, None)):
            args = (768, n, bits, group, group is not None)
            usual = Avx512QuantGemm.for_shape(*args, rows=1, workers=1)
            two = Avx512QuantGemm.for_shape(*args, rows=1, workers=2)
            assert busiest_columns(two) == n // 2  # an even split
            assert n % two.cols_per_workgroup == 0 and two.cols_per_workgroup % two.nr == 0
            if n // usual.cols_per_workgroup == 24:  # 16 of them on one worker
                uneven += 1
                assert two.cols_per_workgroup > usual.cols_per_workgroup
            else:  # already even: kept
                assert two == usual
            assert two == workgroups.balanced_columns(usual, 1, n, usual.nr, workers=2)
        w4a8 = Avx512W4A8Gemm.for_shape(768, n, 128, True, "avx2", rows=1, workers=2)
        assert busiest_columns(w4a8) == n // 2
        vnni = Avx512VnniGemm.for_shape(768, n, rows=1, workers=2)
        assert busiest_columns(vnni) == n // 2
    assert uneven  # on every host some of these were 24 workgroups
    # unknown rows (a dynamic M), or one worker: the usual cut
    usual = Avx512QuantGemm.for_shape(768, 768, 4, 128, True)
    assert Avx512QuantGemm.for_shape(768, 768, 4, 128, True, rows=None, workers=2) == usual
    assert (
        Avx512QuantGemm.for_shape(768, 768, 4, 128, True, rows=1, workers=1).cols_per_workgroup
        == usual.cols_per_workgroup
    )
    # the output layer: 250 workgroups of 128 (AVX2) leave one worker 16 reservations against
    # 15.25, 2000 of 16 would save 2 %: not taken
    out = Avx512QuantGemm.for_shape(768, 32000, 4, 128, True, rows=1, workers=1)
    assert Avx512QuantGemm.for_shape(768, 32000, 4, 128, True, rows=1, workers=2) == out
