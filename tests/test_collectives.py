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
    """(p-1)/p of the full buffer: 1 GB over 8 ranks at 10 GB/s = 87.5 ms, plus the ring's latency as
    given (14 us: the 7 steps of a ring at 2 us, which the placement sums)."""
    assert all_gather_s(a(1e9), a(8), a(10), a(14))[0] == pytest.approx(0.0875 + 14e-6)
    assert reduce_scatter_s(a(1e9), a(8), a(10), a(14))[0] == pytest.approx(0.0875 + 14e-6)


def test_a_ring_pays_one_latency_per_step_on_each_side_of_the_node_boundary(frontier_theory):
    """NCCL's ring model: p − nodes steps on the node's links, nodes − 1 across the network. On Frontier
    (8 GCDs a node, 3 us inside, 6 us across): a Z group of 128 with stride 1 spans 16 nodes,
    112·3 + 15·6 = 426 us; stride 8 puts one member per node, 127·6 = 762 us; 8 inside a node, 7·3."""
    from axoplan.cost.placement import place

    m = frontier_theory
    intra, inter = m.intra_node.latency_us, m.inter_node.latency_us
    assert (intra, inter) == (3.0, 6.0)
    assert place(m, 1, 128).ring_latency_us == pytest.approx(112 * 3.0 + 15 * 6.0)
    assert place(m, 8, 128).ring_latency_us == pytest.approx(127 * 6.0)
    assert place(m, 1, 8).ring_latency_us == pytest.approx(7 * 3.0)
    assert place(m, 1, 1).ring_latency_us == 0.0


def test_group_of_one_costs_nothing():
    for fn in (all_reduce_s, all_gather_s, reduce_scatter_s):
        assert fn(a(1e12), a(1), a(np.inf), a(0))[0] == 0.0


@given(st.floats(1e3, 1e11), st.integers(2, 1 << 20), st.floats(0.1, 1000), st.floats(0.1, 1000))
def test_less_bandwidth_is_never_faster(nbytes: float, p: int, bw: float, factor: float):
    slow, fast = min(bw, bw * factor), max(bw, bw * factor)
    for fn in (all_reduce_s, all_gather_s):
        assert fn(a(nbytes), a(p), a(slow), a(3))[0] >= fn(a(nbytes), a(p), a(fast), a(3))[0]


def test_gloo_all_reduces_in_a_ring_nccl_in_a_tree():
    """A CPU machine's ranks run gloo, whose allreduce is a ring reduce-scatter then all-gather at every size
    (gloo/allreduce.cc): 2(p − 1) latency steps; NCCL's and RCCL's trees pay 2⌈log2 p⌉. On local-cpu (500 µs per
    step on loopback) an all-reduce over the 8 ranks of an X group pays 14 · 500 µs = 7 ms of latency; the same
    machine read as a GPU's, 6 steps, 3 ms, and the same bandwidth term. A 2-rank group pays 2 steps either way."""
    from axoplan.cost.groups import compile_group_set
    from axoplan.inputs.machine import load_machine
    from axoplan.inputs.options import RunOptions
    from axoplan.space.candidates import Candidates
    from axoplan.space.layout import Layout

    cpu = load_machine("local-cpu")
    gpu = cpu.model_copy(update={"device": cpu.device.model_copy(update={"kind": "gpu"})})
    for layout, steps in ((Layout(8, 1, 1, 1), {"cpu": 14, "gpu": 6}), (Layout(2, 1, 1, 1), {"cpu": 2, "gpu": 2})):
        c = Candidates.single(layout, 1, False, False)
        rates = {m.device.kind: compile_group_set(m, c, RunOptions()).price(m).rates["x"] for m in (cpu, gpu)}
        for kind, rate in rates.items():
            assert rate.all_reduce_latency_s[0] == pytest.approx(steps[kind] * 500e-6)
        extra = (steps["cpu"] - steps["gpu"]) * 500e-6
        assert rates["cpu"].all_reduce_s(a(4096.0))[0] == pytest.approx(rates["gpu"].all_reduce_s(a(4096.0))[0] + extra)
