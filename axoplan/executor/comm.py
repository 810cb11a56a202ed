"""Timed collectives over the layout's groups, synchronous or overlapped.

Each call is charged to the phase ``<kind>_<axis>`` (``all_gather_z``, ``all_reduce_y``,
...) unless the caller names another; an overlapped call is charged its launch, and the
time later blocked in ``wait()`` goes to ``wait``. Groups of one member cost nothing and
move nothing. Every handle is waited on (gloo runs collectives on background threads;
a handle that is never waited leaves the buffer undefined: ``executor.md`` §1.3).
Inputs to overlapped collectives are detached (an async gloo all-gather of a tensor that
requires grad fails on ``wait()``: ``executor.md`` §2).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from axoplan.executor.groups import Groups
from axoplan.executor.timing import PhaseTimer

__all__ = ["Comm", "Pending", "ALL_GATHER", "REDUCE_SCATTER"]

# torch 2.13 deprecates the *_tensor names in favour of *_single; older torch has only the former
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Pending:
    """An overlapped collective: `wait()` blocks (timed as ``wait``) and returns its result."""

    def __init__(self, work: Any, result: torch.Tensor, timer: PhaseTimer) -> None:
        self._work, self._result, self._timer = work, result, timer

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            with self._timer.span("wait"):
                self._work.wait()
            self._work = None
        return self._result


class Comm:
    """Collectives of one rank over the groups of one layout."""

    def __init__(self, groups: Groups, timer: PhaseTimer) -> None:
        self.groups = groups
        self.timer = timer

    def size(self, axis: str) -> int:
        return self.groups.size(axis)

    def all_reduce(self, t: torch.Tensor, axis: str, phase: str | None = None,
                   op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        """Sum (or `op`) `t` in place over the `axis` group; returns `t`."""
        if self.size(axis) > 1:
            with self.timer.span(phase or f"all_reduce_{axis}", ("all_reduce", axis, t.numel(), True)):
                dist.all_reduce(t, op=op, group=self.groups.group[axis])
        return t

    def all_reduce_async(self, t: torch.Tensor, axis: str, phase: str | None = None) -> Pending:
        if self.size(axis) == 1:
            return Pending(None, t, self.timer)
        with self.timer.span(phase or f"all_reduce_{axis}", ("all_reduce", axis, t.numel(), False)):
            work = dist.all_reduce(t, group=self.groups.group[axis], async_op=True)
        return Pending(work, t, self.timer)

    def all_gather(self, shard: torch.Tensor, axis: str) -> torch.Tensor:
        """Concatenation of every member's 1-D `shard`, in group-rank order."""
        return self._gather(shard, axis, sync=True).wait()

    def all_gather_async(self, shard: torch.Tensor, axis: str) -> Pending:
        return self._gather(shard, axis, sync=False)

    def reduce_scatter(self, full: torch.Tensor, axis: str) -> torch.Tensor:
        """This member's 1-D chunk of the sum of every member's 1-D `full`."""
        return self._scatter(full, axis, sync=True).wait()

    def reduce_scatter_async(self, full: torch.Tensor, axis: str) -> Pending:
        return self._scatter(full, axis, sync=False)

    def _gather(self, shard: torch.Tensor, axis: str, sync: bool) -> Pending:
        p = self.size(axis)
        if p == 1:
            return Pending(None, shard.detach(), self.timer)
        out = torch.empty(p * shard.numel(), dtype=shard.dtype, device=shard.device)
        with torch.no_grad(), self.timer.span(f"all_gather_{axis}", ("all_gather", axis, out.numel(), sync)):
            work = ALL_GATHER(out, shard.detach(), group=self.groups.group[axis], async_op=not sync)
        return Pending(work, out, self.timer)

    def _scatter(self, full: torch.Tensor, axis: str, sync: bool) -> Pending:
        p = self.size(axis)
        if p == 1:
            return Pending(None, full, self.timer)
        out = torch.empty(full.numel() // p, dtype=full.dtype, device=full.device)
        with torch.no_grad(), self.timer.span(f"reduce_scatter_{axis}", ("reduce_scatter", axis, full.numel(), sync)):
            work = REDUCE_SCATTER(out, full.detach().contiguous(), group=self.groups.scatter_group(axis),
                                   async_op=not sync)
        return Pending(work, out, self.timer)
