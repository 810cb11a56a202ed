"""Every communicator of a step, keyed by its dimension, placed once per candidate set and priced per machine.

A candidate's groups (``docs/algorithm.md`` §3): one per axis (``x``, ``y``, ``z``, ``data``), the whole
``world``, and, where AxoNN's native MoE module runs (``--moe-impl native``, ``axoplan.cost.moe``), the two groups
``DroplessMoEMLP`` makes inside Z: ``experts_tp`` (``min(Gz, expert_tp)`` ranks at Z's stride) and
``experts_fsdp`` (``max(Gz / expert_tp, 1)`` ranks, ``expert_tp`` times Z's stride). All of them are placed by one
:func:`axoplan.cost.placement.compile_groups` call (:func:`compile_group_set`), whatever their kind, and priced
by :meth:`GroupSet.price` with a machine's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from axoplan.cost.collectives import Rates, Shares
from axoplan.cost.placement import CompiledGroups, compile_groups, link_numbers
from axoplan.inputs.machine import Machine
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates

__all__ = ["Group", "Groups", "GroupSet", "compile_group_set", "NATIVE_GROUPS"]

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

NATIVE_GROUPS = ("experts_tp", "experts_fsdp")
"""The native MoE module's groups inside Z (module docstring)."""


@dataclass(frozen=True, slots=True)
class Group:
    """One communicator of every candidate: members, stride, bandwidth, latency (per all-reduce step, and a
    ring's) and whether it crosses nodes."""

    size: Floats
    members: Ints  # `size` as integers, as a collective term records it
    stride: Ints
    bw: Floats
    lat: Floats
    ring: Floats
    crosses: npt.NDArray[np.bool_]
    rates: Rates  # its collectives' cost (axoplan.cost.collectives)


@dataclass(frozen=True, slots=True)
class Groups:
    """Each dimension's group per candidate, by name (``x``, ``y``, ``z``, ``data``, ``world``, and the native
    MoE module's where it runs)."""

    size: dict[str, Floats]
    stride: dict[str, Ints]
    bw: dict[str, Floats]
    lat: dict[str, Floats]
    ring: dict[str, Floats]
    crosses: dict[str, npt.NDArray[np.bool_]]
    members: dict[str, Ints]
    rates: dict[str, Rates]

    def of(self, name: str) -> Group:
        """The group of dimension `name`."""
        return Group(self.size[name], self.members[name], self.stride[name], self.bw[name], self.lat[name],
                     self.ring[name], self.crosses[name], self.rates[name])


@dataclass(frozen=True, slots=True)
class GroupSet:
    """The groups of a candidate set placed on a topology (:func:`compile_group_set`): sizes and strides by
    dimension, and the distinct groups among them once."""

    sizes: dict[str, Ints]
    strides: dict[str, Ints]
    placed: CompiledGroups  # the groups of each run of candidates with one layout, the dimensions one after another
    shares: dict[str, Shares]
    back: Ints  # each candidate's run
    priced: dict[tuple[object, ...], Groups] = field(default_factory=dict)
    """The groups priced, by the machine numbers placement reads (:func:`axoplan.cost.placement.link_numbers`)."""

    def price(self, machine: Machine) -> Groups:
        """Every group with `machine`'s numbers (a machine of the topology compiled for); found once for each set of
        the numbers placement reads, whatever else a repricing moves."""
        key = link_numbers(machine)
        if key not in self.priced:
            self.priced[key] = self._price(machine)
        return self.priced[key]

    def _price(self, machine: Machine) -> Groups:
        placed = self.placed.price(machine)
        runs, back = len(self.placed.inverse) // len(self.sizes), self.back

        def by_name(values: np.ndarray) -> dict[str, np.ndarray]:
            return {a: values[i * runs:(i + 1) * runs][back] for i, a in enumerate(self.sizes)}

        bw, lat, ring = by_name(placed.bandwidth_gbs), by_name(placed.latency_us), by_name(placed.ring_latency_us)
        rates = {a: s.rates(bw[a], lat[a], ring[a]) for a, s in self.shares.items()}
        return Groups(self.float_sizes, self.strides, bw, lat, ring, by_name(placed.crosses_nodes), self.sizes, rates)

    @property
    def float_sizes(self) -> dict[str, Floats]:
        """Each group's members as floats, as the cost formulas take them."""
        return {a: s.astype(np.float64) for a, s in self.sizes.items()}


def compile_group_set(machine: Machine, c: Candidates, options: RunOptions, native_moe: bool = False) -> GroupSet:
    """Every group of `c` (and the native MoE module's, with `native_moe`), placed on `machine`'s topology by one
    :func:`axoplan.cost.placement.compile_groups` call. A layout's groups do not depend on its micro-batch or
    options, so they are found once per run of candidates with one layout (:func:`_layout_runs`) and spread back."""
    first, back = _layout_runs(c)
    lay = c.take(first)
    sizes = lay.sizes() | {"world": lay.world_size}
    strides = lay.strides() | {"world": np.ones_like(lay.gx)}
    if native_moe:
        tp, gz = options.expert_tp, lay.gz.astype(np.int64)
        sizes |= {"experts_tp": np.minimum(gz, tp), "experts_fsdp": np.maximum(gz // tp, 1)}
        strides |= {"experts_tp": strides["z"], "experts_fsdp": strides["z"] * tp}
    names = list(sizes)
    all_strides, all_sizes = (np.concatenate([d[a] for a in names]) for d in (strides, sizes))
    gloo = machine.device.kind == "cpu"  # a CPU machine's ranks run gloo (Machine.device.kind)
    shares = {a: Shares.of(s.astype(np.float64), ring_all_reduce=gloo).take(back) for a, s in sizes.items()}
    return GroupSet({a: s[back] for a, s in sizes.items()}, {a: s[back] for a, s in strides.items()},
                    compile_groups(machine, all_strides, all_sizes), shares, back)


def _layout_runs(c: Candidates) -> tuple[Ints, Ints]:
    """The first row of each run of consecutive candidates with one layout and order, and each candidate's run
    (``Candidates.enumerate`` lists a layout's micro-batches and options together: tens of thousands of rows, a
    few thousand runs)."""
    assert c.order_id is not None  # Candidates sets it
    cols = (c.gx, c.gy, c.gz, c.gdata, c.order_id)
    change = np.ones(len(c), dtype=bool)
    change[1:] = np.logical_or.reduce([col[1:] != col[:-1] for col in cols])
    return np.flatnonzero(change), np.cumsum(change) - 1
