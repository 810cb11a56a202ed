"""The four group families of a layout, built in the planner's rank order.

The DeviceMesh is made from ``Layout.grid()`` itself (by default index ``[d, z, y, x]``,
X fastest: ``rank = ((d·Gz + z)·Gy + y)·Gx + x``), with the layout's mesh dimension names
(``Layout.mesh_dims``: ``data, z, y, x`` for the default order); every
group's members are then checked against ``Layout.groups(axis)``, so the executor runs
exactly the placement the cost model priced. Every rank must call this (every rank takes
part in creating every group).

DeviceMesh creates its subgroups with torch's 30-minute default timeout unless it is
given backend options, so the options carry the run's timeout (measured: without them a
peer that never arrives blocks the X group for as long as the peer lives). Torch before
2.9 has no ``backend_override``; there the groups are made here, with the timeout, and
wrapped with ``DeviceMesh.from_group`` (torch >= 2.4), so every supported torch gets the
same groups, names and timeouts.

A mixture-of-experts model's native module (``moe.NativeMoE``) splits Z in two: ``z_tp``, ``expert_tp``
consecutive Z members (its tensor-parallel group), and ``z_fsdp``, the members at the same place in each of
those (its FSDP group, ``Gz/expert_tp`` of them). They are made here with the others, keyed by the dimension
they span, with the same timeout.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from axoplan.inputs.axes import AXES, mesh_dims
from axoplan.space.layout import Layout

__all__ = ["Groups", "build_groups", "has_backend_override", "Z_SPLIT"]


@dataclass(frozen=True)
class Groups:
    """This rank's process group along each axis, its coordinates, and the group sizes."""

    layout: Layout
    rank: int
    coords: dict[str, int]
    group: dict[str, dist.ProcessGroup]  # "x", "y", "z", "data", "world"; "z_scatter", "z_tp", "z_fsdp" if made
    mesh: DeviceMesh
    expert_tp: int = 1  # the size of "z_tp" (when made)

    def size(self, axis: str) -> int:
        if axis == "world":
            return self.layout.world_size
        if axis in Z_SPLIT:
            tp = self.expert_tp
            return tp if axis == "z_tp" else self.layout.gz // tp
        return self.layout.size(axis)

    def scatter_group(self, axis: str) -> dist.ProcessGroup:
        """The group reduce-scatters over `axis` use: a second communicator of the same members
        when the run has one (``concurrent_z``), so they run beside the all-gathers."""
        return self.group.get(f"{axis}_scatter", self.group[axis])

    def is_owner(self, redundant_axes: tuple[str, ...]) -> bool:
        """True on the one member that speaks for copies repeated along `redundant_axes`."""
        return all(self.coords[a] == 0 for a in redundant_axes)


Z_SPLIT = ("z_tp", "z_fsdp")
"""Z split for the native MoE module: its tensor-parallel and FSDP groups (module docstring)."""

MESH_DIMS = mesh_dims()
"""Mesh dimension names of the default rank order (a layout's own are ``Layout.mesh_dims``)."""


def build_groups(layout: Layout, device_type: str, timeout_s: float, native: bool | None = None,
                 second_z: bool = False, expert_tp: int | None = None) -> Groups:
    """Create the mesh for `layout` over the default process group and check its rank order.

    `native`: DeviceMesh makes the groups (needs ``backend_override``, torch >= 2.9), or
    they are made here and wrapped; None picks the first where torch has it. `second_z`: one
    more communicator over each Z group (``z_scatter``) for the reduce-scatters. `expert_tp`: Z's split for
    the native MoE module (``z_tp``, ``z_fsdp``).
    """
    world = dist.get_world_size()
    if world != layout.world_size:
        raise RuntimeError(f"process group has {world} ranks, layout {layout} needs {layout.world_size}")
    rank = dist.get_rank()
    native = has_backend_override() if native is None else native
    mesh = _native_mesh(layout, device_type, timeout_s) if native else _wrapped_mesh(layout, device_type, timeout_s)
    groups = {axis: mesh.get_group(axis) for axis in AXES}
    coords = layout.coords(rank)
    for axis in AXES:
        want = [int(r) for r in layout.groups(axis)[layout.group_row(axis, coords)]]
        got = dist.get_process_group_ranks(groups[axis])
        if got != want:
            raise RuntimeError(f"DeviceMesh group {axis} of rank {rank} is {got}, the planner's order says {want}")
    groups["world"] = dist.group.WORLD  # type: ignore[assignment]  # set once the default group exists
    if second_z:
        rows = [[int(r) for r in row] for row in layout.groups("z")]
        groups["z_scatter"], _ = dist.new_subgroups_by_enumeration(rows, timeout=timedelta(seconds=timeout_s))
    if expert_tp is not None:
        groups.update(_z_split(layout, rank, expert_tp, timeout_s))
    return Groups(layout, rank, coords, groups, mesh, expert_tp or 1)


def _z_split(layout: Layout, rank: int, tp: int, timeout_s: float) -> dict[str, dist.ProcessGroup]:
    """This rank's ``z_tp`` and ``z_fsdp`` groups. Every rank creates every group (as ``new_group`` requires):
    for each Z group (members by z), its consecutive chunks of `tp` and the strided sets across them."""
    timeout = timedelta(seconds=timeout_s)
    mine: dict[str, dist.ProcessGroup] = {}
    for row in layout.groups("z"):
        members = [int(r) for r in row]
        for f in range(layout.gz // tp):
            chunk = members[f * tp:(f + 1) * tp]
            group = dist.new_group(chunk, timeout=timeout)
            if rank in chunk:
                mine["z_tp"] = group
        for j in range(tp):
            strided = members[j::tp]
            group = dist.new_group(strided, timeout=timeout)
            if rank in strided:
                mine["z_fsdp"] = group
    return mine


def has_backend_override() -> bool:
    """Whether this torch's DeviceMesh takes per-dimension backend options (torch >= 2.9)."""
    return "backend_override" in inspect.signature(DeviceMesh.__init__).parameters


def _native_mesh(layout: Layout, device_type: str, timeout_s: float) -> DeviceMesh:
    backend = dist.get_backend()
    override = tuple((backend, _options(backend, timeout_s)) for _ in layout.mesh_dims)
    return DeviceMesh(device_type, torch.from_numpy(layout.grid()), mesh_dim_names=layout.mesh_dims,
                      backend_override=override)


def _wrapped_mesh(layout: Layout, device_type: str, timeout_s: float) -> DeviceMesh:
    """Every group of every axis made with the timeout (each rank takes part in all), then wrapped."""
    mine = []
    for axis in layout.mesh_dims:
        rows = [[int(r) for r in row] for row in layout.groups(axis)]
        group, _ = dist.new_subgroups_by_enumeration(rows, timeout=timedelta(seconds=timeout_s))
        mine.append(group)
    return DeviceMesh.from_group(mine, device_type, mesh=torch.from_numpy(layout.grid()),
                                 mesh_dim_names=layout.mesh_dims)


def _options(backend: str, timeout_s: float) -> Any:
    """Backend options that carry the collective timeout into every subgroup."""
    options = dist.ProcessGroupNCCL.Options() if backend == "nccl" else dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = timedelta(seconds=timeout_s)
    return options
