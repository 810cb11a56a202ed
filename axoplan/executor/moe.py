"""A mixture-of-experts MLP, whole (the reference) and sharded as AxoNN's native ``DroplessMoEMLP`` shards it.

The math (Mixtral's ``MixtralSparseMoeBlock``): router logits ``x·Wrᵀ`` (a replicated ``H×E`` weight), softmax,
the ``top_k`` experts of each token with their probabilities renormalised to sum to one; each expert a SwiGLU
MLP (``fc``: ``[2I, H]`` with gate and up rows interleaved, ``2i`` gate and ``2i+1`` up, as the dense model lays
them; ``proj``: ``[H, I]``); the output the probability-weighted sum of the chosen experts' outputs.

Sharded (``axonn/intra_layer/moe/``; ``docs/algorithm.md`` §4c): inside Z (``Gx = Gy = 1``) the ``Gz`` ranks form
``Gz/tp`` tensor-parallel groups of ``tp = expert_tp`` consecutive Z coordinates and ``tp`` FSDP groups across
them (``Groups``' ``z_tp`` and ``z_fsdp``). Tensor-parallel member ``j`` holds rows ``j·2I/tp ...`` of every
expert's ``fc`` (whole gate/up pairs) and columns ``j·I/tp ...`` of its ``proj``, flattened and split over its
FSDP group. Per forward: the tokens, their chosen experts and weights all-gathered over the tp group
(``TensorParallelGatherAndPermute``), the weights gathered over FSDP (``SimpleFSDPLinear``), each expert on its
rows, the weighted partial outputs reduce-scattered over the tp group (``TensorParallelUnpermuteAndScatter``);
backward the reverses, the weights' gradients reduce-scattered over FSDP. AxoNN's module leaves the probability
weighting commented out (its router would get no gradient); the executor weights as Mixtral does, so that it
equals the reference.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from axoplan.executor.comm import ALL_GATHER, REDUCE_SCATTER
from axoplan.executor.groups import Groups
from axoplan.executor.model import Weight
from axoplan.executor.timing import PhaseTimer
from axoplan.space.layout import Layout

__all__ = ["moe_mlp", "ExpertComm", "NativeMoE", "WholeMoE", "expert_local", "expert_shard_numel", "EXPERT_WEIGHTS"]

EXPERT_WEIGHTS = ("experts_fc", "experts_proj")


def moe_mlp(x: torch.Tensor, router: torch.Tensor, fc: torch.Tensor, proj: torch.Tensor, top_k: int,
            w: torch.Tensor | None = None, chosen: torch.Tensor | None = None) -> torch.Tensor:
    """The experts' weighted sum for the rows of `x` (``[m, H]``); `fc` ``[E, 2I', H]``, `proj` ``[E, H, I']`` (a
    slice of the width, or all of it). Routing from `router`, or given (`w`, `chosen`)."""
    if w is None or chosen is None:
        w, chosen = route(x, router, top_k)
    out = torch.zeros(x.shape[0], proj.shape[1], dtype=x.dtype, device=x.device)
    for e in range(fc.shape[0]):
        rows, slot = torch.where(chosen == e)
        if rows.numel() == 0:
            continue
        u = x[rows] @ fc[e].t()
        h = F.silu(u[:, 0::2]) * u[:, 1::2]
        out = out.index_add(0, rows, (h @ proj[e].t()) * w[rows, slot][:, None])
    return out


def route(x: torch.Tensor, router: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's `top_k` experts and their renormalised probabilities (Mixtral's router)."""
    probs = torch.softmax((x @ router.t()).float(), dim=-1)
    top, chosen = torch.topk(probs, top_k, dim=-1)
    return (top / top.sum(-1, keepdim=True)).to(x.dtype), chosen


class ExpertComm:
    """The native MoE module's collectives over Z's two sub-groups (``Groups``: ``z_tp``, ``z_fsdp``), reported to
    the timer as Z's (``all_gather_z``, ``reduce_scatter_z``)."""

    def __init__(self, groups: Groups, timer: PhaseTimer) -> None:
        self.groups, self.timer = groups, timer

    def size(self, axis: str) -> int:
        return self.groups.size(axis)

    def gather(self, t: torch.Tensor, axis: str) -> torch.Tensor:
        """All-gather `t`'s rows over the `axis` (``z_tp`` or ``z_fsdp``) group, in member order."""
        p = self.size(axis)
        if p == 1:
            return t
        out = torch.empty(p * t.numel(), dtype=t.dtype, device=t.device)
        with self.timer.span("all_gather_z", ("moe_all_gather", _which(axis), t.numel())):
            ALL_GATHER(out, t.detach().contiguous().reshape(-1), group=self.groups.group[axis])
        return out.view(p * t.shape[0], *t.shape[1:])

    def scatter(self, t: torch.Tensor, axis: str) -> torch.Tensor:
        """Reduce-scatter `t`'s rows over the `axis` group: this member's block of the sum."""
        p = self.size(axis)
        if p == 1:
            return t
        out = torch.empty(t.numel() // p, dtype=t.dtype, device=t.device)
        with self.timer.span("reduce_scatter_z", ("moe_reduce_scatter", _which(axis), t.numel())):
            REDUCE_SCATTER(out, t.detach().contiguous().reshape(-1), group=self.groups.group[axis])
        return out.view(t.shape[0] // p, *t.shape[1:])


def _which(axis: str) -> str:
    """The trace's name of a Z sub-group: "tp" or "fsdp"."""
    return axis.removeprefix("z_")


class _GatherRows(torch.autograd.Function):
    """All-gather rows over a group; backward: reduce-scatter (each member's contributions to my rows)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, comm: ExpertComm, axis: str) -> torch.Tensor:
        ctx.comm, ctx.axis = comm, axis
        return comm.gather(t, axis)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.comm.scatter(grad, ctx.axis), None, None


class _ScatterRows(torch.autograd.Function):
    """Reduce-scatter rows over a group; backward: all-gather."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, comm: ExpertComm, axis: str) -> torch.Tensor:
        ctx.comm, ctx.axis = comm, axis
        return comm.scatter(t, axis)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.comm.gather(grad, ctx.axis), None, None


def expert_shard_numel(numel: int, fsdp: int) -> int:
    return -(-numel // fsdp)


class WholeMoE(nn.Module):
    """A mixture-of-experts MLP with every weight whole (the reference)."""

    def __init__(self, top_k: int, router: nn.Parameter, fc: nn.Parameter, proj: nn.Parameter) -> None:
        super().__init__()
        self.top_k = top_k
        self.router, self.experts_fc, self.experts_proj = Weight(router), Weight(fc), Weight(proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return moe_mlp(x, self.router.weight, self.experts_fc.weight, self.experts_proj.weight, self.top_k)


class NativeMoE(nn.Module):
    """This rank's part of an MoE MLP, sharded as ``DroplessMoEMLP`` (module docstring): the router whole, each
    expert weight a flat FSDP shard of its tensor-parallel slice."""

    def __init__(self, e: int, hidden: int, width: int, top_k: int, router: nn.Parameter, fc: nn.Parameter,
                 proj: nn.Parameter, comm: ExpertComm) -> None:
        super().__init__()
        self.top_k, self.comm = top_k, comm
        tp = comm.size("z_tp")
        self.fc_shape = (e, 2 * width // tp, hidden)
        self.proj_shape = (e, hidden, width // tp)
        self.router, self.experts_fc, self.experts_proj = Weight(router), Weight(fc), Weight(proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.comm
        w, chosen = route(x, self.router.weight, self.top_k)
        x_all = _GatherRows.apply(x, c, "z_tp")
        w_all = _GatherRows.apply(w, c, "z_tp")
        chosen_all = c.gather(chosen, "z_tp")
        fc = _full(_GatherRows.apply(self.experts_fc.weight, c, "z_fsdp"), self.fc_shape)
        proj = _full(_GatherRows.apply(self.experts_proj.weight, c, "z_fsdp"), self.proj_shape)
        partial = moe_mlp(x_all, self.router.weight, fc, proj, self.top_k, w_all, chosen_all)
        return _ScatterRows.apply(partial, c, "z_tp")


def _full(flat: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    n = shape[0] * shape[1] * shape[2]
    return flat.reshape(-1)[:n].view(shape)


def expert_local(name: str, full: torch.Tensor, layout: Layout, coords: dict[str, int],
                 expert_tp: int) -> torch.Tensor:
    """What rank `coords` holds of a grouped expert weight: its tensor-parallel slice of the width (rows of
    ``fc``, columns of ``proj``), flattened, zero-padded to the FSDP group and cut to its chunk."""
    tp, fsdp = expert_tp, layout.gz // expert_tp
    j, f = coords["z"] % tp, coords["z"] // tp
    if name.endswith("experts_fc.weight"):
        part = full.shape[1] // tp
        piece = full[:, j * part:(j + 1) * part, :]
    else:
        part = full.shape[2] // tp
        piece = full[:, :, j * part:(j + 1) * part]
    flat = piece.reshape(-1)
    chunk = expert_shard_numel(flat.numel(), fsdp)
    flat = torch.nn.functional.pad(flat, (0, chunk * fsdp - flat.numel()))
    return flat[f * chunk:(f + 1) * chunk].clone()
