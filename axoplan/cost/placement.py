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
broadcast back to all candidates. It is done in two passes (issue 32, "compile once, price many"):
:func:`compile_groups` finds the distinct pairs and what the machine's *topology* says of each (its
region, the nodes it spans, the node-local members whose links it rides, the measured row standing for it),
and :meth:`CompiledGroups.price` applies the machine's numbers (bandwidths, efficiencies, latencies, the
scale exponent). A machine's numbers can change (sensitivities, calibration) without placing again; its
topology (:func:`topology`) cannot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from axoplan.arrays import distinct
from axoplan.inputs.machine import Machine

__all__ = ["GroupPlacement", "GroupShape", "Placements", "CompiledGroups", "compile_groups", "link_numbers", "place",
           "place_groups", "ring_latency_us", "shape_of", "topology"]

_MAX_EXACT_CUT = 12  # members; above this the cut is approximated by single-device cuts

Region = Literal["none", "node", "domain", "network"]


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """Bandwidth and latency one communicator gets, and why."""

    bandwidth_gbs: float
    latency_us: float  # per step of an all-reduce
    crosses_nodes: bool
    link: str  # human-readable: link class, "network", "measured ...", or "none"
    ring_latency_us: float = 0.0  # all steps of a ring all-gather or reduce-scatter


@dataclass(frozen=True, slots=True)
class GroupShape:
    """What a machine's topology says of a group of `size` members `stride` ranks apart, before any of its
    numbers: the region it sits in, the nodes it spans, how many groups of its kind share a node's NICs, the
    node-local member sets whose links it rides (every group of a node for a group inside one, else the
    members on one node, if more than one), whether it spans more nodes than a dragonfly group, and the index of
    the measured row that stands for it."""

    stride: int
    size: int
    region: Region
    nodes: int
    sharing: int
    members: tuple[tuple[int, ...], ...]
    beyond_group: bool
    row: int | None


def topology(machine: Machine) -> tuple[object, ...]:
    """What placement's structure reads of a machine (not its bandwidths, efficiencies or latencies): a
    :class:`CompiledGroups` prices only machines with the topology it was compiled for."""
    domain = machine.scale_up.devices if machine.scale_up is not None else None
    rows = tuple((r.stride, r.size) for r in machine.measured_bandwidth)
    return machine.devices_per_node, domain, machine.inter_node.nodes_per_group, rows


def link_numbers(machine: Machine) -> tuple[object, ...]:
    """Every part of `machine` whose numbers placement reads (its links inside a node, its scale-up fabric, its
    network, its measured table): a group's bandwidth and latency change only when one of these does."""
    return machine.intra_node, machine.scale_up, machine.inter_node, machine.measured_bandwidth


def shape_of(machine: Machine, stride: int, size: int) -> GroupShape:
    """The topology's part of a group's placement (:class:`GroupShape`)."""
    n = machine.devices_per_node
    if size <= 1:
        return GroupShape(stride, size, "none", 1, 1, (), False, None)
    region = _region(machine, stride, size)
    nodes = 1 if region == "node" else _nodes_spanned(machine, stride, size)
    if region == "node":
        span = stride * size
        starts = (b + r for b in range(0, n, span) for r in range(stride))  # each group in a node
        members = tuple(tuple(start + i * stride for i in range(size)) for start in starts)
    else:
        local = min(size, n // stride) if stride < n else 1
        members = (tuple(i * stride for i in range(local)),) if local > 1 else ()
    groups = machine.inter_node.nodes_per_group
    beyond = groups is not None and math.ceil(stride * size / n) > groups
    return GroupShape(stride, size, region, nodes, min(stride, n), members, beyond,
                      _measured(machine, stride, size, region))


def place(machine: Machine, stride: int, size: int) -> GroupPlacement:
    """Placement of a group of `size` members `stride` ranks apart."""
    return _priced(machine, shape_of(machine, stride, size))


def _priced(machine: Machine, shape: GroupShape) -> GroupPlacement:
    """`shape` with the machine's numbers: the theory's bandwidth, or the measured row's (module docstring)."""
    if shape.region == "none":
        return GroupPlacement(math.inf, 0.0, False, "none")
    theory = _THEORY[shape.region](machine, shape)
    if shape.row is None:
        return theory
    row = machine.measured_bandwidth[shape.row]
    bandwidth = row.bandwidth_gbs
    if theory.crosses_nodes:
        bandwidth *= machine.inter_node.scale_factor(shape.nodes)
    if row.latency_us is None:
        latency, ring = theory.latency_us, theory.ring_latency_us
    else:
        latency, ring = row.latency_us, math.ceil(math.log2(shape.size)) * row.latency_us
    return GroupPlacement(bandwidth, latency, theory.crosses_nodes, f"{theory.link} (measured)", ring)


def ring_latency_us(machine: Machine, stride: int, size: int) -> float:
    """All steps of a ring over the group: ``(size − nodes)`` inside nodes, ``nodes − 1`` between them, over
    the scale-up fabric for a group inside one domain and over the network otherwise."""
    return _ring_latency_us(machine, shape_of(machine, stride, size))


def _ring_latency_us(machine: Machine, shape: GroupShape) -> float:
    between = (machine.scale_up.latency_us if shape.region == "domain" and machine.scale_up
               else machine.inter_node.latency_us)
    return (shape.size - shape.nodes) * machine.intra_node.latency_us + (shape.nodes - 1) * between


def _inside(machine: Machine, stride: int, size: int) -> bool:
    """Whether every group of this shape sits inside one node."""
    return _within(machine.devices_per_node, stride, size)


def _within(devices: int, stride: int, size: int) -> bool:
    """Whether every group of this shape sits inside one block of `devices` consecutive ranks."""
    return stride * size <= devices and devices % (stride * size) == 0


def _region(machine: Machine, stride: int, size: int) -> Region:
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


@dataclass(frozen=True, slots=True)
class CompiledGroups:
    """Arrays of groups placed on a topology: each distinct (stride, size) once (`shapes`), and `inverse`, which
    maps every group given back to its shape. :meth:`price` applies a machine's numbers."""

    shapes: tuple[GroupShape, ...]
    inverse: npt.NDArray[np.int64]
    topology: tuple[object, ...]

    def price(self, machine: Machine) -> Placements:
        """Bandwidth, latencies and node crossing of every group on `machine` (the topology compiled for)."""
        if topology(machine) != self.topology:
            raise ValueError(f"groups placed for topology {self.topology} cannot be priced on {machine.name!r} "
                             f"({topology(machine)}): compile them again")
        found = [_priced(machine, s) for s in self.shapes]
        bw = np.array([f.bandwidth_gbs for f in found], dtype=np.float64)
        lat = np.array([f.latency_us for f in found], dtype=np.float64)
        ring = np.array([f.ring_latency_us for f in found], dtype=np.float64)
        crosses = np.array([f.crosses_nodes for f in found], dtype=bool)
        inv = self.inverse
        return Placements(bw[inv], lat[inv], ring[inv], crosses[inv])


def compile_groups(machine: Machine, stride: npt.NDArray[np.int64], size: npt.NDArray[np.int64]) -> CompiledGroups:
    """The distinct groups among (`stride`, `size`) and their shapes on `machine`'s topology."""
    base = int(size.max()) + 1
    key = stride * base + size
    keys = distinct(key)  # a few hundred distinct groups; searchsorted maps back (faster than return_inverse)
    inverse = np.searchsorted(keys, key)
    shapes = tuple(shape_of(machine, int(k // base), int(k % base)) for k in keys)
    return CompiledGroups(shapes, inverse, topology(machine))


def place_groups(machine: Machine, stride: npt.NDArray[np.int64], size: npt.NDArray[np.int64]) -> Placements:
    """Vectorised `place`, aligned with the inputs: compiled, then priced."""
    return compile_groups(machine, stride, size).price(machine)


def _inside_node(machine: Machine, shape: GroupShape) -> GroupPlacement:
    worst, worst_link = math.inf, ""
    for members in shape.members:
        bw, link = _links(machine, members)
        if bw < worst:
            worst, worst_link = bw, link
    return GroupPlacement(worst * machine.intra_node.efficiency, machine.intra_node.latency_us, False, worst_link,
                          _ring_latency_us(machine, shape))


def _in_domain(machine: Machine, shape: GroupShape) -> GroupPlacement:
    """A group across nodes but inside one scale-up domain: the fabric's per-device bandwidth, capped by the
    links its members on one node share."""
    domain = machine.scale_up
    assert domain is not None  # _region names a domain only for a machine with one
    bw = domain.bandwidth_gbs * domain.efficiency
    for members in shape.members:
        bw = min(bw, _links(machine, members)[0] * machine.intra_node.efficiency)
    return GroupPlacement(bw, domain.latency_us, False, domain.name, _ring_latency_us(machine, shape))


def _across_nodes(machine: Machine, shape: GroupShape) -> GroupPlacement:
    inter = machine.inter_node
    bw = inter.injection_gbs * inter.efficiency / shape.sharing * inter.scale_factor(shape.nodes)
    if shape.beyond_group:
        bw *= inter.global_bandwidth_fraction
    link = "network"
    for members in shape.members:
        cut, slowest = _links(machine, members)
        bw = min(bw, cut * machine.intra_node.efficiency)
        link = f"network + {slowest}"
    return GroupPlacement(bw, inter.latency_us, True, link, _ring_latency_us(machine, shape))


def _links(machine: Machine, members: tuple[int, ...]) -> tuple[float, str]:
    """The members' ring bandwidth (:func:`_ring_bandwidth_gbs`) and their slowest link's class: read from the
    link classes alone, so found once per set of link classes and members (a sensitivity or a calibration that
    moves other numbers finds them again here)."""
    intra = machine.intra_node
    key = (machine.devices_per_node, intra.link_classes, intra.device_bandwidth_gbs, members)
    found = _LINKS.get(key)
    if found is None:
        found = _ring_bandwidth_gbs(machine, list(members)), _slowest_link(machine, list(members))
        if len(_LINKS) < _MAX_CACHED:
            _LINKS[key] = found
    return found


_LINKS: dict[tuple[object, ...], tuple[float, str]] = {}
_MAX_CACHED = 65536


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


def _measured(machine: Machine, stride: int, size: int, region: str) -> int | None:
    """Index of the exact (stride, size) row; the largest stride and size in the table match beyond. A row
    measured in another region than the group's (inside a node, a domain, or across) does not match."""
    rows = machine.measured_bandwidth
    if not rows:
        return None
    strides = sorted({r.stride for r in rows})
    s = stride if stride in strides else (strides[-1] if stride > strides[-1] else None)
    if s is None:
        return None
    at_stride = {r.size: i for i, r in enumerate(rows) if r.stride == s}
    biggest = max(at_stride)
    index = at_stride.get(size, at_stride[biggest] if size > biggest else None)
    if index is None or _region(machine, rows[index].stride, rows[index].size) != region:
        return None
    return index
