"""Z all-gathers of weight shards (prefetch, cache) and Z reduce-scatters of their gradients.

**OAG** (``docs/algorithm.md`` §5): when a layer takes its gathered weight, the gather the run
will need next is started, one ahead. AxoNN walks ``model.modules()`` for "next";
here the order is *recorded* during the first (warm-up) iteration — every gather that
was really needed, forward, recompute and backward — and replayed afterwards, so the
prefetch is right with recompute and caching too. Nothing is prefetched across an
iteration boundary (the optimizer changes the weights there).

**Weight caching**: a weight gathered in the forward is kept until the micro-batch's
backward is done, so recompute and backward gather nothing (Megatron-AxoNN
``--layer-caching-level``, all layers).

**ORS**: the reduce-scatter of a weight gradient is started and not waited; the
gradients are added to ``.grad`` when the micro-batch's backward is done (``drain``),
as AxoNN's ``optimize_communication`` does on exit.
"""

from __future__ import annotations

from typing import Protocol

import torch

from axoplan.executor.comm import Comm, Pending

__all__ = ["ShardedWeight", "WeightGatherer", "GradReducer"]


class ShardedWeight(Protocol):
    """A layer owning one Z-sharded weight."""

    weight: torch.nn.Parameter
    key: int


class WeightGatherer:
    """Gives each layer its Z-gathered (flat) weight block."""

    def __init__(self, comm: Comm, prefetch: bool, cache: bool) -> None:
        self.comm, self.prefetch, self.cache = comm, prefetch, cache
        self._layers: list[ShardedWeight] = []
        self._order: list[int] = []
        self._recorded = False
        self._cursor = 0
        self._pending: dict[int, Pending] = {}
        self._cached: dict[int, torch.Tensor] = {}

    def register(self, layer: ShardedWeight) -> int:
        self._layers.append(layer)
        return len(self._layers) - 1

    def start_iteration(self) -> None:
        """Called before each iteration: after the first one, the gather order is known."""
        if self._pending:
            raise RuntimeError("a prefetched all-gather was never used")
        self._recorded = self._recorded or bool(self._order)
        self._cursor = 0

    def end_micro_batch(self) -> None:
        self._cached.clear()

    def get(self, layer: ShardedWeight) -> torch.Tensor:
        """The full flat weight block of `layer` (the shard itself when Gz = 1)."""
        if self.comm.size("z") == 1:
            return layer.weight.detach()
        hit = self._cached.get(layer.key)
        if hit is not None:
            return hit
        self._advance(layer.key)
        pending = self._pending.pop(layer.key, None)
        full = pending.wait() if pending is not None else self.comm.all_gather(layer.weight, "z")
        self._start_next()
        if self.cache:
            self._cached[layer.key] = full
        return full

    def _advance(self, key: int) -> None:
        if not self._recorded:
            self._order.append(key)
            return
        if self._cursor >= len(self._order) or self._order[self._cursor] != key:
            raise RuntimeError(f"all-gather order changed between iterations at step {self._cursor}")
        self._cursor += 1

    def _start_next(self) -> None:
        if not (self.prefetch and self._recorded and self._cursor < len(self._order)):
            return
        nxt = self._order[self._cursor]
        if nxt not in self._pending:
            self._pending[nxt] = self.comm.all_gather_async(self._layers[nxt].weight, "z")


class GradReducer:
    """Reduce-scatters full weight-block gradients over Z, now or overlapped (ORS)."""

    def __init__(self, comm: Comm, overlap: bool) -> None:
        self.comm, self.overlap = comm, overlap
        self._pending: list[tuple[torch.nn.Parameter, Pending]] = []

    def reduce(self, layer: ShardedWeight, grad_block: torch.Tensor) -> torch.Tensor | None:
        """This rank's shard of the Z-summed gradient, or None if it arrives at `drain`."""
        if not self.overlap or self.comm.size("z") == 1:
            return self.comm.reduce_scatter(grad_block, "z")
        self._pending.append((layer.weight, self.comm.reduce_scatter_async(grad_block, "z")))
        return None

    def drain(self) -> None:
        """Wait for every overlapped reduce-scatter and add it to its parameter's gradient."""
        for param, pending in self._pending:
            shard = pending.wait()
            param.grad = shard if param.grad is None else param.grad + shard
        self._pending.clear()
