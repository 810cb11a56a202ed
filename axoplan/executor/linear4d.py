"""The 4D linear layer (AxoNN expert mode, ``docs/algorithm.md`` §1, §4) and the per-rank runtime.

Weight ``W[n, k]``; a *plain* layer splits input features k over X and output features n
over Y, a *transposed* one the other way round. This rank's block
``W[n-block of its out-group coordinate, k-block of its in-group coordinate]`` is
flattened and split over Z; the parameter is the Z-chunk. Input: ``[m_l, k/G_in]``
(tokens split over Gdata·Gz, replicated over the out-group). Then, per micro-batch::

    forward   W_blk = all-gather_Z(shard)          (OAG: prefetched; cached: kept)
              Y = all-reduce_in(X · W_blkᵀ)        (2-chunk option: GEMM half 2 while half 1 reduces)
    backward  W_blk again (unless cached)
              dX = all-reduce_out(dY · W_blk)      (OAR: overlapped with the dW GEMM)
              dW = dYᵀ · X  → reduce-scatter_Z     (ORS: overlapped with the rest of the backward)

With ``tuned_gemm`` the forward and dX GEMMs run through ``axoplan.executor.tuned_matmul``.

When the out-group has one member and ORS is on, dW goes first so its reduce-scatter
overlaps the dX GEMM (AxoNN's special case). A block whose size Gz does not divide is
padded with zeros to ``Gz·⌈block/Gz⌉`` (FSDP-style, as the cost model assumes); the
padding gets zero gradients and stays zero.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from axoplan.executor.comm import Comm
from axoplan.executor.groups import Groups
from axoplan.executor.overlap import GradReducer, WeightGatherer
from axoplan.executor.timing import PhaseTimer
from axoplan.executor.tuned_matmul import GemmTuner
from axoplan.inputs.model import layer_axes

__all__ = ["Runtime", "Linear", "Linear4D", "block_slice", "shard_numel"]


@dataclass
class Runtime:
    """Everything a layer needs on this rank: groups, collectives, timers, overlap state."""

    groups: Groups
    comm: Comm
    timer: PhaseTimer
    gatherer: WeightGatherer
    reducer: GradReducer
    overlap_all_reduce: bool
    overlap_forward_all_reduce: bool
    grad_reduce_dtype: str = "fp32"
    phase: str = "forward"
    micro_batch_context: Callable[[], Any] = contextlib.nullcontext  # around a micro-batch (AxoNN engine)
    recompute_hook: Callable[[], Any] = contextlib.nullcontext  # around a recomputed block (AxoNN engine)
    tuner: GemmTuner | None = None  # RunOptions.tuned_gemm: forward and dX GEMMs by the tuner

    @contextmanager
    def recomputing(self) -> Iterator[None]:
        """Mark the enclosed forward as an activation recompute."""
        before, self.phase = self.phase, "recompute"
        try:
            with self.recompute_hook():
                yield
        finally:
            self.phase = before

    def part(self, axis: str, n: int) -> slice:
        """This rank's block of a dimension of size `n` split over `axis`."""
        return block_slice(n, self.groups.size(axis), self.groups.coords[axis])


def shard_numel(block: int, gz: int) -> int:
    """Elements of one Z-chunk of a flattened block: ``⌈block/Gz⌉``."""
    return -(-block // gz)


def block_slice(n: int, parts: int, index: int) -> slice:
    step = n // parts
    return slice(index * step, (index + 1) * step)


class Linear4D(nn.Module):
    """``y = x · Wᵀ`` with W sharded over X, Y and Z; no bias (the model adds it)."""

    def __init__(self, name: str, k_in: int, n_out: int, transposed: bool, rt: Runtime,
                 shard: torch.Tensor) -> None:
        super().__init__()
        self.name, self.transposed = name, transposed
        self.in_axis, self.out_axis = layer_axes(transposed)
        self.k_loc = k_in // rt.groups.size(self.in_axis)
        self.n_loc = n_out // rt.groups.size(self.out_axis)
        self.block_numel = self.k_loc * self.n_loc
        if shard.numel() != shard_numel(self.block_numel, rt.groups.size("z")):
            raise ValueError(f"{name}: shard of {shard.numel()} elements does not fit a "
                             f"{self.n_loc}x{self.k_loc} block over Gz={rt.groups.size('z')}")
        self.weight = nn.Parameter(shard)
        self.rt = rt
        self.key = rt.gatherer.register(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = _Linear4DFn.apply(x.reshape(-1, self.k_loc), self.weight, self)
        return y.reshape(*lead, self.n_loc)

    def gathered(self) -> torch.Tensor:
        """The Z-gathered block ``[n_loc, k_loc]``."""
        return self.rt.gatherer.get(self)[:self.block_numel].view(self.n_loc, self.k_loc)

    def reduce_grad(self, grad_block: torch.Tensor) -> torch.Tensor | None:
        """Reduce-scatter the gradient of the whole block over Z (padded like the weight)."""
        flat = grad_block.reshape(-1)
        pad = self.weight.numel() * self.rt.groups.size("z") - flat.numel()
        return self.rt.reducer.reduce(self, torch.nn.functional.pad(flat, (0, pad)) if pad else flat)

    def extra_repr(self) -> str:
        kind = "transposed" if self.transposed else "plain"
        return f"{self.name}: {kind}, local block {self.n_loc}x{self.k_loc}"


class Linear(nn.Module):
    """One linear as AxoNN's ``Linear`` runs it: a core that holds the weight's Z-shard (``Linear4D``, or
    AxoNN's own through ``axonn_backend``), a whole bias, and what the path wraps around the core.

    `around` is None on the Megatron path (AxoNN's expert mode: the output is this rank's block of the output
    features, and its slice of the bias is added), or the hf path's transitions (``hfmodel.transitions``:
    the output is every feature of this rank's own tokens, and the whole bias is added).
    """

    def __init__(self, core: nn.Module, bias: nn.Parameter | None,
                 around: Callable[[torch.Tensor, Any], torch.Tensor] | None = None) -> None:
        super().__init__()
        self.core: Any = core
        self.bias = bias
        self.around = around

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.around is not None:
            y = self.around(x, self.core)
            return y if self.bias is None else y + self.bias
        y = self.core(x)
        if self.bias is None:
            return y
        return y + self.bias[self.core.rt.part(self.core.out_axis, self.bias.numel())]


def _gemm(rt: Runtime, a: torch.Tensor, b: torch.Tensor, phase: str) -> torch.Tensor:
    """``a @ b`` of one phase (forward, dx, dw); forward and dX through the tuner when there is one
    (AxoNN's tuner leaves dW alone)."""
    with rt.timer.span("gemm", ("gemm", a.shape[0], b.shape[1], a.shape[1])):
        if rt.tuner is not None and phase != "dw":
            return rt.tuner.matmul(phase, a, b)
        return a @ b


class _Linear4DFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, shard: torch.Tensor, layer: Linear4D) -> torch.Tensor:
        rt = layer.rt
        w = layer.gathered()
        ctx.save_for_backward(x)
        ctx.layer = layer
        halves = rt.overlap_forward_all_reduce and rt.comm.size(layer.in_axis) > 1 and x.shape[0] >= 2
        if not halves:
            return rt.comm.all_reduce(_gemm(rt, x, w.t(), "forward"), layer.in_axis)
        mid = x.shape[0] // 2
        pending = [rt.comm.all_reduce_async(_gemm(rt, part, w.t(), "forward"), layer.in_axis)
                   for part in (x[:mid], x[mid:])]
        return torch.cat([p.wait() for p in pending])

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        (x,) = ctx.saved_tensors
        layer: Linear4D = ctx.layer
        rt = layer.rt
        dy = dy.contiguous()
        w = layer.gathered()
        if rt.reducer.overlap and rt.comm.size(layer.out_axis) == 1:
            grad_shard = layer.reduce_grad(_gemm(rt, dy.t(), x, "dw"))
            return _gemm(rt, dy, w, "dx"), grad_shard, None
        dx = _gemm(rt, dy, w, "dx")
        if rt.overlap_all_reduce:
            pending = rt.comm.all_reduce_async(dx, layer.out_axis)
            dw = _gemm(rt, dy.t(), x, "dw")
            dx = pending.wait()
        else:
            rt.comm.all_reduce(dx, layer.out_axis)
            dw = _gemm(rt, dy.t(), x, "dw")
        return dx, layer.reduce_grad(dw), None
