"""α-β collective times against hand-derived values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from axoplan.cost.collectives import all_gather_s, all_reduce_s, reduce_scatter_s


def a(x: float) -> np.ndarray:
    return np.array([x], dtype=np.float64)


def test_ring_all_reduce_volume():
    """1 GB over 4 ranks at 100 GB/s: 2·3/4·1e9 / 1e11 = 15 ms; plus 2·log2(4)·5 us = 20 us."""
    assert all_reduce_s(a(1e9), a(4), a(100), a(0))[0] == pytest.approx(0.015)
    assert all_reduce_s(a(1e9), a(4), a(100), a(5))[0] == pytest.approx(0.015 + 20e-6)


def test_all_gather_and_reduce_scatter_volume():
    """(p-1)/p of the full buffer: 1 GB over 8 ranks at 10 GB/s = 87.5 ms, + 3 steps of 2 us."""
    assert all_gather_s(a(1e9), a(8), a(10), a(2))[0] == pytest.approx(0.0875 + 6e-6)
    assert reduce_scatter_s(a(1e9), a(8), a(10), a(2))[0] == pytest.approx(0.0875 + 6e-6)


def test_group_of_one_costs_nothing():
    for fn in (all_reduce_s, all_gather_s, reduce_scatter_s):
        assert fn(a(1e12), a(1), a(np.inf), a(0))[0] == 0.0


@given(st.floats(1e3, 1e11), st.integers(2, 1 << 20), st.floats(0.1, 1000), st.floats(0.1, 1000))
def test_less_bandwidth_is_never_faster(nbytes: float, p: int, bw: float, factor: float):
    slow, fast = min(bw, bw * factor), max(bw, bw * factor)
    for fn in (all_reduce_s, all_gather_s):
        assert fn(a(nbytes), a(p), a(slow), a(3))[0] >= fn(a(nbytes), a(p), a(fast), a(3))[0]
