"""Where a communicator's members sit, and the bandwidth its collectives get.

A group along one axis has a *stride* (rank distance between members) and a *size*.
With ``N`` devices per node (``docs/algorithm.md`` §3; Plexus ``comm_model.py`` v2):

* the group is **inside a node** when ``stride·size <= N`` and divides ``N``. Its ring runs
  over the link classes its members span; the bus bandwidth is the minimum cut of the
  member-to-member bandwidth matrix (what several rings can carry at once), capped by a
  device's total link bandwidth, times ``intra_node.efficiency``.
* a group that is not inside a node but inside one **scale-up domain** (``machine.scale_up``: the
  72 GPUs of a GB200 NVL72 rack on NVLink switches, 18 nodes of 4), by the same rule with the
  domain's size for ``N``, runs over that fabric, not the NICs: each member sends and receives at
  its port bandwidth through the switches, ``scale_up.bandwidth_gbs · scale_up.efficiency``, no
  more than its members on one node get from their own links, and no NIC sharing or loss with
  scale applies. It counts as inside (``crosses_nodes`` False): the fabric's latency per step and
  the node's processor usage (NVLink's).
* otherwise it **crosses nodes**. ``min(stride, N)`` groups of the same kind share each
  node's NICs, so each gets ``injection · efficiency / min(stride, N)``; the members on
  one node (``N // stride`` of them when stride < N) also need their intra-node links.
  Groups spanning more nodes than a dragonfly group keep ``global_bandwidth_fraction``.
  Collective libraries also lose bandwidth as a group spans more nodes (NCCL all-reduce on
  Polaris: 36.6 GB/s busbw on 2 nodes, 30.9 on 256, 29.1 on 540, ALCF's measurements): a
  crossing group spanning ``N`` nodes keeps ``(N / N_ref)^(−scale_exponent)`` of its
  bandwidth, the measured table's included (its rows were taken at ``N_ref`` nodes).

A ring all-gather or reduce-scatter over the group pays one latency per step: ``p − nodes``
steps over the node's links and ``nodes − 1`` over the network, or over the scale-up fabric for
a group inside one domain (NCCL's latency model, ``src/graph/tuning.cc``), the group's
``ring_latency_us``.

A row of the machine's measured table that matches (stride, size) overrides the theory's
bandwidth, and its latency too where the row has one (an α-β fit to a message-size sweep of
all-reduce, whose ``2⌈log2 p⌉`` steps the fit assumed; a ring of the same group then costs
``⌈log2 p⌉`` of them, the same share of the all-reduce's latency as ``p − 1`` of ``2(p − 1)``).
A row only stands in for groups in the same region as the group it was measured on (inside a
node, inside a scale-up domain, or across the network): an NVLink measurement says nothing about
a group that crosses the network.
Placement depends only on (stride, size), so it is computed once per distinct pair and
broadcast back to all candidates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from axoplan.inputs.machine import Machine, MeasuredBandwidth

__all__ = ["GroupPlacement", "Placements", "place", "place_groups", "ring_latency_us"]

_MAX_EXACT_CUT = 12  # members; above this the cut is approximated by single-device cuts


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """Bandwidth and latency one communicator gets, and why."""

    bandwidth_gbs: float
    latency_us: float  # per step of an all-reduce
    crosses_nodes: bool
    link: str  # human-readable: link class, "network", "measured ...", or "none"
    ring_latency_us: float = 0.0  # all steps of a ring all-gather or reduce-scatter


def place(machine: Machine, stride: int, size: int) -> GroupPlacement:
    """Placement of a group of `size` members `stride` ranks apart."""
    if size <= 1:
        return GroupPlacement(math.inf, 0.0, False, "none")
    region = _region(machine, stride, size)
    theory = _THEORY[region](machine, stride, size)
    row = _measured(machine, stride, size, region)
    if row is None:
        return theory
    bandwidth = row.bandwidth_gbs
    if theory.crosses_nodes:
        bandwidth *= machine.inter_node.scale_factor(_nodes_spanned(machine, stride, size))
    if row.latency_us is None:
        latency, ring = theory.latency_us, theory.ring_latency_us
    else:
        latency, ring = row.latency_us, math.ceil(math.log2(size)) * row.latency_us
    return GroupPlacement(bandwidth, latency, theory.crosses_nodes, f"{theory.link} (measured)", ring)


def ring_latency_us(machine: Machine, stride: int, size: int) -> float:
    """All steps of a ring over the group: ``(size − nodes)`` inside nodes, ``nodes − 1`` between them, over
    the scale-up fabric for a group inside one domain and over the network otherwise."""
    region = _region(machine, stride, size)
    nodes = 1 if region == "node" else _nodes_spanned(machine, stride, size)
    between = machine.scale_up.latency_us if region == "domain" and machine.scale_up else machine.inter_node.latency_us
    return (size - nodes) * machine.intra_node.latency_us + (nodes - 1) * between


def _inside(machine: Machine, stride: int, size: int) -> bool:
    """Whether every group of this shape sits inside one node."""
    return _within(machine.devices_per_node, stride, size)


def _within(devices: int, stride: int, size: int) -> bool:
    """Whether every group of this shape sits inside one block of `devices` consecutive ranks."""
    return stride * size <= devices and devices % (stride * size) == 0


def _region(machine: Machine, stride: int, size: int) -> str:
    """'node' (every group inside one node), 'domain' (inside one scale-up domain), or 'network'."""
    if _inside(machine, stride, size):
        return "node"
    if machine.scale_up is not None and _within(machine.scale_up.devices, stride, size):
        return "domain"
    return "network"


def _nodes_spanned(machine: Machine, stride: int, size: int) -> int:
    return math.ceil(stride * size / machine.devices_per_node) if stride < machine.devices_per_node else size


@dataclass(frozen=True, slots=True)
class Placements:
    """`place` for arrays of groups: one entry per (stride, size) given."""

    bandwidth_gbs: npt.NDArray[np.float64]
    latency_us: npt.NDArray[np.float64]  # per all-reduce step
    ring_latency_us: npt.NDArray[np.float64]
    crosses_nodes: npt.NDArray[np.bool_]


def place_groups(machine: Machine, stride: npt.NDArray[np.int64], size: npt.NDArray[np.int64]) -> Placements:
    """Vectorised `place`, aligned with the inputs."""
    base = int(size.max()) + 1
    key = stride * base + size
    keys = np.unique(key)  # a few hundred distinct groups; searchsorted maps back (faster than return_inverse)
    inverse = np.searchsorted(keys, key)
    found = [place(machine, int(k // base), int(k % base)) for k in keys]
    bw = np.array([f.bandwidth_gbs for f in found], dtype=np.float64)
    lat = np.array([f.latency_us for f in found], dtype=np.float64)
    ring = np.array([f.ring_latency_us for f in found], dtype=np.float64)
    crosses = np.array([f.crosses_nodes for f in found], dtype=bool)
    return Placements(bw[inverse], lat[inverse], ring[inverse], crosses[inverse])


def _inside_node(machine: Machine, stride: int, size: int) -> GroupPlacement:
    n = machine.devices_per_node
    worst, worst_link = math.inf, ""
    span = stride * size
    for start in (b + r for b in range(0, n, span) for r in range(stride)):  # each group in a node
        members = [start + i * stride for i in range(size)]
        bw = _ring_bandwidth_gbs(machine, members)
        if bw < worst:
            worst, worst_link = bw, _slowest_link(machine, members)
    return GroupPlacement(worst * machine.intra_node.efficiency, machine.intra_node.latency_us, False, worst_link,
                          ring_latency_us(machine, stride, size))


def _in_domain(machine: Machine, stride: int, size: int) -> GroupPlacement:
    """A group across nodes but inside one scale-up domain: the fabric's per-device bandwidth, capped by the
    links its members on one node share."""
    domain = machine.scale_up
    assert domain is not None  # _region names a domain only for a machine with one
    n = machine.devices_per_node
    bw = domain.bandwidth_gbs * domain.efficiency
    link = domain.name
    local = min(size, n // stride) if stride < n else 1
    if local > 1:
        members = [i * stride for i in range(local)]
        bw = min(bw, _ring_bandwidth_gbs(machine, members) * machine.intra_node.efficiency)
    return GroupPlacement(bw, domain.latency_us, False, link, ring_latency_us(machine, stride, size))


def _across_nodes(machine: Machine, stride: int, size: int) -> GroupPlacement:
    n, inter = machine.devices_per_node, machine.inter_node
    sharing = min(stride, n)
    nodes = _nodes_spanned(machine, stride, size)
    bw = inter.injection_gbs * inter.efficiency / sharing * inter.scale_factor(nodes)
    if inter.nodes_per_group is not None and math.ceil(stride * size / n) > inter.nodes_per_group:
        bw *= inter.global_bandwidth_fraction
    link = "network"
    local = min(size, n // stride) if stride < n else 1
    if local > 1:
        members = [i * stride for i in range(local)]
        bw = min(bw, _ring_bandwidth_gbs(machine, members) * machine.intra_node.efficiency)
        link = f"network + {_slowest_link(machine, members)}"
    return GroupPlacement(bw, inter.latency_us, True, link, ring_latency_us(machine, stride, size))


def _ring_bandwidth_gbs(machine: Machine, members: list[int]) -> float:
    """Minimum cut of the members' link graph: an upper bound on what rings can carry."""
    bw = machine.pair_bandwidth_gbs[np.ix_(members, members)].copy()
    np.fill_diagonal(bw, 0.0)
    cap = machine.intra_node.device_bandwidth_gbs or math.inf
    p = len(members)
    if p > _MAX_EXACT_CUT:
        return float(min(bw.sum(axis=1).min(), cap))
    # every split with member 0 on one side: rows of `side` are the subsets
    codes = np.arange(2 ** (p - 1), 2**p - 1, dtype=np.int64)[:, None]
    side = ((codes >> np.arange(p)) & 1).astype(np.float64)
    cuts = np.einsum("si,ij,sj->s", side, bw, 1.0 - side)
    return float(min(cuts.min(), cap))


def _slowest_link(machine: Machine, members: list[int]) -> str:
    bw = machine.pair_bandwidth_gbs[np.ix_(members, members)]
    i, j = np.unravel_index(np.argmin(bw), bw.shape)
    return machine.link_class_name(members[i], members[j])


_THEORY = {"node": _inside_node, "domain": _in_domain, "network": _across_nodes}
"""The theory's placement of a group in each region."""


def _measured(machine: Machine, stride: int, size: int, region: str) -> MeasuredBandwidth | None:
    """Exact (stride, size) row; the largest stride and size in the table match beyond. A row
    measured in another region than the group's (inside a node, a domain, or across) does not match."""
    rows = machine.measured_bandwidth
    if not rows:
        return None
    strides = sorted({r.stride for r in rows})
    s = stride if stride in strides else (strides[-1] if stride > strides[-1] else None)
    if s is None:
        return None
    at_stride = {r.size: r for r in rows if r.stride == s}
    biggest = max(at_stride)
    row = at_stride.get(size, at_stride[biggest] if size > biggest else None)
    return row if row is not None and _region(machine, row.stride, row.size) == region else None
