"""Placement: which links a group uses, and the bandwidth its collectives get."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from axoplan.cost.collectives import all_reduce_s
from axoplan.cost.placement import place, place_groups
from axoplan.inputs.machine import load_machine
from axoplan.space.layout import Layout


def test_frontier_x_pair_stays_on_one_mi250x(frontier_theory):
    """Gx=2 has stride 1: ranks 2i, 2i+1 are the two GCDs of one MI250X (200 GB/s, 4 IF links)."""
    g = place(frontier_theory, stride=1, size=2)
    assert not g.crosses_nodes and g.link == "mi250x-package"
    assert g.bandwidth_gbs == pytest.approx(200 * frontier_theory.intra_node.efficiency)


def test_frontier_stride_two_pair_spans_packages(frontier_theory):
    g = place(frontier_theory, stride=2, size=2)
    assert not g.crosses_nodes and g.link == "cross-package"
    assert g.bandwidth_gbs < place(frontier_theory, 1, 2).bandwidth_gbs


def test_data_group_with_node_stride_shares_the_nics(frontier_theory):
    """Stride 8 = one node: every member on another node; 8 groups share 4 x 25 GB/s."""
    g = place(frontier_theory, stride=8, size=16)
    assert g.crosses_nodes and g.link == "network"
    assert g.bandwidth_gbs == pytest.approx(100 * 0.8 / 8)  # = 10 GB/s, i.e. 12.5 GB/s per GCD x 0.8
    assert g.latency_us == frontier_theory.inter_node.latency_us


def test_one_group_per_node_gets_the_whole_injection(perlmutter_theory):
    """Stride 1, size 8 on 4-GPU nodes: one group per node uses all four NICs: 100 x 0.8 = 80 GB/s,
    the value the AxoNN authors measured on Perlmutter (get_bw, ip=1, my>=8)."""
    g = place(perlmutter_theory, stride=1, size=8)
    assert g.crosses_nodes and g.bandwidth_gbs == pytest.approx(80.0)
    assert place(perlmutter_theory, 2, 8).bandwidth_gbs == pytest.approx(40.0)  # authors: 40
    assert place(perlmutter_theory, 4, 8).bandwidth_gbs == pytest.approx(20.0)  # authors: 20


def test_all_to_all_nvlink_group_uses_several_rings(perlmutter_theory):
    """4 A100s, 100 GB/s per pair: minimum cut = 3 x 100 = 300 = the per-GPU NVLink total;
    x 0.75 gives 225 GB/s, the authors' measured Perlmutter value for ip=1, my=4."""
    assert place(perlmutter_theory, 1, 4).bandwidth_gbs == pytest.approx(225.0)
    assert place(perlmutter_theory, 1, 2).bandwidth_gbs == pytest.approx(75.0)


def test_group_of_one_is_free(frontier):
    g = place(frontier, stride=4, size=1)
    assert math.isinf(g.bandwidth_gbs) and g.latency_us == 0


def test_measured_table_overrides_theory(frontier, frontier_theory):
    assert place(frontier, 1, 8).bandwidth_gbs == 135  # exact row
    # largest size matches beyond (80 GB/s at 2 nodes), less the loss at 8 nodes
    assert place(frontier, 1, 64).bandwidth_gbs == pytest.approx(80 * 4**-0.143)
    assert place(frontier, 32, 2).bandwidth_gbs == 10  # largest stride matches beyond; 2 nodes
    assert "measured" in place(frontier, 1, 8).link
    # a size between table rows is not guessed: theory answers
    assert place(frontier, 1, 3).bandwidth_gbs == place(frontier_theory, 1, 3).bandwidth_gbs


def test_vectorised_placement_matches_scalar(frontier):
    lay = Layout(2, 4, 8, 16)
    strides = np.array([lay.stride(a) for a in ("x", "y", "z", "data")] * 3)
    sizes = np.array([lay.size(a) for a in ("x", "y", "z", "data")] * 3)
    placed = place_groups(frontier, strides, sizes)
    for i, (s, p) in enumerate(zip(strides, sizes, strict=True)):
        g = place(frontier, int(s), int(p))
        assert placed.bandwidth_gbs[i] == g.bandwidth_gbs and placed.latency_us[i] == g.latency_us
        assert placed.ring_latency_us[i] == g.ring_latency_us and placed.crosses_nodes[i] == g.crosses_nodes


def test_bandwidth_falls_with_the_nodes_a_group_spans_as_the_machine_says() -> None:
    """Perlmutter (4 GPUs a node, 80 GB/s for one group per node): a data group of stride 4
    spanning N nodes (one of 4 groups sharing the node's NICs: 20 GB/s on 2 nodes) gets
    20·(N/2)^-0.04; at 256 nodes 20·128^-0.04 = 16.4 GB/s (the Polaris NCCL measurement the
    exponent comes from: 36.6 -> 30.9 GB/s)."""
    from axoplan.cost.placement import place
    from axoplan.inputs.machine import load_machine

    m = load_machine("perlmutter").model_copy(update={"measured_bandwidth": ()})
    two, many = place(m, 4, 2), place(m, 4, 256)
    assert two.bandwidth_gbs == pytest.approx(20.0)
    assert many.bandwidth_gbs == pytest.approx(20.0 * 128 ** -0.04)
    flat = m.model_copy(update={"inter_node": m.inter_node.model_copy(update={"scale_exponent": 0.0})})
    assert place(flat, 4, 256).bandwidth_gbs == pytest.approx(20.0)
    assert place(m, 1, 4).bandwidth_gbs == place(flat, 1, 4).bandwidth_gbs  # inside a node: untouched


def test_frontier_measured_inter_node_rows_are_scaled_not_halved() -> None:
    """The AxoNN authors' 2-node value for (stride 8, size 2) is 10 GB/s (they halved it to 5);
    at 2 nodes it stands, at 256 nodes (2,048 GCDs) the exponent halves it: 10·128^-0.143 = 5.0."""
    from axoplan.cost.placement import place
    from axoplan.inputs.machine import load_machine

    m = load_machine("frontier")
    assert place(m, 8, 2).bandwidth_gbs == pytest.approx(10.0)
    assert place(m, 8, 256).bandwidth_gbs == pytest.approx(10.0 * 128 ** -0.143)
    assert place(m, 8, 256).bandwidth_gbs == pytest.approx(5.0, rel=0.01)


@settings(max_examples=50, deadline=None)
@given(stride=st.sampled_from([8, 16, 64]), size=st.integers(2, 512))
def test_more_nodes_never_mean_more_bandwidth(stride: int, size: int) -> None:
    """Members on distinct nodes (stride of a node or more): a group twice as large spans
    twice the nodes and never gets more bandwidth."""
    from axoplan.cost.placement import place
    from axoplan.inputs.machine import load_machine

    m = load_machine("frontier")
    assert place(m, stride, size * 2).bandwidth_gbs <= place(m, stride, size).bandwidth_gbs * (1 + 1e-12)


def test_a_row_with_a_fitted_latency_replaces_both_theory_numbers() -> None:
    """dgx-a100's 8-GPU row (nccl-tests on the vTrain node): its bandwidth and its α, not 300 x 0.75 and 5 µs."""
    machine = load_machine("dgx-a100")
    row = next(r for r in machine.measured_bandwidth if (r.stride, r.size) == (1, 8))
    g = place(machine, stride=1, size=8)
    assert row.latency_us is not None and not g.crosses_nodes
    assert (g.bandwidth_gbs, g.latency_us) == (row.bandwidth_gbs, row.latency_us)
    assert (g.bandwidth_gbs, g.latency_us) != (300 * machine.intra_node.efficiency, machine.intra_node.latency_us)


def test_the_fitted_row_prices_an_8_gpu_all_reduce_near_the_measured_time() -> None:
    """nccl-tests on the vTrain node: 93.25 µs for 2 MiB and 358.1 µs for 32 MiB over 8 A100s."""
    machine = load_machine("dgx-a100")
    for nbytes, measured_us in ((2**21, 93.25), (2**25, 358.1)):
        placed = place_groups(machine, np.array([1]), np.array([8]))
        seconds = all_reduce_s(np.array([float(nbytes)]), np.array([8.0]), placed.bandwidth_gbs, placed.latency_us)
        t_us = seconds[0] * 1e6
        assert t_us == pytest.approx(measured_us, rel=0.15)


@pytest.mark.parametrize(("stride", "size"), [(1, 16), (8, 2), (4, 4)])
def test_a_row_measured_inside_a_node_never_prices_a_group_that_crosses_nodes(stride: int, size: int) -> None:
    """An NVLink measurement says nothing of InfiniBand: crossing groups keep the network theory."""
    machine = load_machine("dgx-a100")
    theory = machine.model_copy(update={"measured_bandwidth": ()})
    g = place(machine, stride, size)
    assert g.crosses_nodes
    assert (g.bandwidth_gbs, g.latency_us) == (place(theory, stride, size).bandwidth_gbs, machine.inter_node.latency_us)


def test_a_row_without_a_latency_keeps_the_machine_latency() -> None:
    machine = load_machine("perlmutter")
    assert all(r.latency_us is None for r in machine.measured_bandwidth)
    assert place(machine, 1, 2).latency_us == machine.intra_node.latency_us


# ------------------------------------------------------------------------- a scale-up domain across nodes (issue 25)

def test_a_group_across_trays_inside_one_nvl72_rack_runs_at_nvlink_speed() -> None:
    """GB200 NVL72: nodes (trays) of 4 GPUs, 72 GPUs on one NVLink domain. Stride 1, size 8 spans two trays;
    8 divides 72, so every such group sits inside one rack: 900 GB/s x 0.8 = 720 GB/s (its 4 members on one
    tray have 3 x 900 capped at the GPU's 900, x 0.8 = 720 too), not the network's 4 x 50 x 0.93 = 186; the
    ring pays 6 steps on the tray's links (2 us) and 1 through the switch trays (2.5 us) = 14.5 us."""
    m = load_machine("gb200-nvl72")
    g = place(m, stride=1, size=8)
    assert not g.crosses_nodes and g.link == "nvl72-nvlink"
    assert g.bandwidth_gbs == pytest.approx(720.0)
    assert g.latency_us == 2.5 and g.ring_latency_us == pytest.approx(6 * 2.0 + 1 * 2.5)
    without = m.model_copy(update={"scale_up": None})
    network = place(without, stride=1, size=8)
    assert network.crosses_nodes and network.bandwidth_gbs == pytest.approx(4 * 50 * 0.93)  # 2 nodes: no scale loss


def test_a_strided_group_filling_the_rack_stays_on_nvlink() -> None:
    """Stride 4 (one member per tray), size 18: 72 ranks, exactly one rack: 900 x 0.8 = 720 GB/s, where on the
    network four such groups would share each tray's 4 NICs: 200 x 0.93 / 4 x (18/2)^-0.04 = 42.0 GB/s."""
    m = load_machine("gb200-nvl72")
    assert place(m, stride=4, size=18).bandwidth_gbs == pytest.approx(720.0)
    without = m.model_copy(update={"scale_up": None})
    assert place(without, stride=4, size=18).bandwidth_gbs == pytest.approx(200 * 0.93 / 4 * 9 ** -0.04)


def test_a_group_that_straddles_two_racks_crosses_the_network() -> None:
    """Stride 1, size 16: 16 does not divide 72, so some groups span two racks and the worst decides: the
    network, one group per tray using its 4 NICs, 186 x (4 nodes / 2)^-0.04 = 180.9 GB/s."""
    m = load_machine("gb200-nvl72")
    g = place(m, stride=1, size=16)
    assert g.crosses_nodes and g.link == "network + nvlink5"
    assert g.bandwidth_gbs == pytest.approx(186.0 * 2 ** -0.04)
    assert g.ring_latency_us == pytest.approx(12 * 2.0 + 3 * m.inter_node.latency_us)


def test_groups_inside_one_tray_are_untouched_by_the_domain() -> None:
    m = load_machine("gb200-nvl72")
    without = m.model_copy(update={"scale_up": None})
    for stride, size in ((1, 2), (1, 4), (2, 2)):
        assert place(m, stride, size) == place(without, stride, size)


def test_vectorised_placement_matches_scalar_with_a_domain() -> None:
    m = load_machine("gb200-nvl72")
    strides = np.array([1, 1, 1, 4, 8, 2, 16, 72])
    sizes = np.array([4, 8, 16, 18, 9, 36, 4, 2])
    placed = place_groups(m, strides, sizes)
    for i, (s, p) in enumerate(zip(strides, sizes, strict=True)):
        g = place(m, int(s), int(p))
        assert placed.bandwidth_gbs[i] == g.bandwidth_gbs and placed.crosses_nodes[i] == g.crosses_nodes
        assert placed.ring_latency_us[i] == g.ring_latency_us


def test_a_row_measured_inside_the_domain_prices_only_groups_inside_a_domain() -> None:
    """A measured row for (stride 1, size 8) was taken inside one rack: it prices that group (and, as the
    largest size, larger ones), but not size 16, which crosses racks and keeps the network theory."""
    from axoplan.inputs.machine import MeasuredBandwidth

    m = load_machine("gb200-nvl72")
    measured = m.model_copy(update={"measured_bandwidth": (MeasuredBandwidth(stride=1, size=8, bandwidth_gbs=600),)})
    assert place(measured, 1, 8).bandwidth_gbs == 600 and "measured" in place(measured, 1, 8).link
    assert place(measured, 1, 16) == place(m, 1, 16)


def test_the_domain_must_hold_whole_nodes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from axoplan.errors import AxoplanError
    from axoplan.inputs.machine import machines_dir

    data = yaml.safe_load((machines_dir() / "gb200-nvl72.yaml").read_text())
    data["scale_up"]["devices"] = 70
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(AxoplanError, match="scale_up.devices 70 must be a multiple of devices_per_node"):
        load_machine(path)
