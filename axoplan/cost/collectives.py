"""α-β times of the three collectives AxoNN uses, for arrays of groups.

Bandwidth term: the ring volume per rank (Thakur, Rabenseifner & Gropp 2005),
``2(p-1)/p · bytes`` for all-reduce and ``(p-1)/p · bytes`` for all-gather and
reduce-scatter, over the group's bus bandwidth. Latency term: an all-reduce pays
``2·⌈log2 p⌉`` steps, the depth of the trees and recursive doubling that NCCL and RCCL switch
to for small messages (a pure ring's ``p-1`` steps would charge a 32,768-rank all-reduce
65,534 latencies); on a CPU machine, whose ranks all-reduce with gloo, the ring's ``2(p − 1)``:
gloo's ``allreduce`` (``gloo/allreduce.cc``, what ``ProcessGroupGloo`` calls for a dense CPU
tensor) is a ring reduce-scatter then a ring all-gather at every size, with no tree.
All-gather and reduce-scatter have no tree in NCCL (ring, or NVLS and CollNet where the
hardware has them: ``src/graph/tuning.cc``), so their latency is the ring's,
linear in the group ("the latency of ring increases linearly with the communicator size",
NCCL issue 1712): ``(p − nodes)`` steps on the node's links and ``nodes − 1`` across the network,
NCCL's own latency model; :func:`axoplan.cost.placement.place` sums them into the group's
``ring_latency_us``. ``bytes`` is always the full buffer: the all-reduced message, the gathered
output, the reduce-scatter input. A group of one costs nothing.

:class:`Rates` holds a group's part of these formulas once (its shares and step counts from its size, compiled with
the group; its bytes per second and latencies from the machine's numbers), so every collective on the group costs
one multiply, one divide and one add; the three functions below are the same formulas for arrays of groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Rates", "Shares", "all_reduce_s", "all_gather_s", "reduce_scatter_s"]

Floats = npt.NDArray[np.float64]


def _steps(p: Floats) -> Floats:
    return np.ceil(np.log2(np.maximum(p, 1.0)))


@dataclass(frozen=True, slots=True)
class Shares:
    """What a group's size alone fixes of its collectives' cost: whether it has more than one member, the ring
    volume per rank (``(p-1)/p`` for all-gather and reduce-scatter, ``2(p-1)/p`` for all-reduce) and the
    all-reduce's ``2⌈log2 p⌉`` latency steps."""

    active: npt.NDArray[np.bool_]
    ring: Floats
    all_reduce: Floats
    all_reduce_steps: Floats

    @classmethod
    def of(cls, p: Floats, ring_all_reduce: bool = False) -> Shares:
        """The shares of groups of `p` members; `ring_all_reduce`: the all-reduce's latency is a ring's
        ``2(p − 1)`` steps (gloo's, a CPU machine's), not a tree's ``2⌈log2 p⌉`` (NCCL's and RCCL's)."""
        steps = 2.0 * (np.maximum(p, 1.0) - 1.0) if ring_all_reduce else 2.0 * _steps(p)
        return cls(np.asarray(p > 1), (p - 1.0) / p, 2.0 * (p - 1.0) / p, steps)

    def take(self, index: npt.NDArray[np.int64]) -> Shares:
        """The shares of the groups at `index`."""
        return Shares(self.active[index], self.ring[index], self.all_reduce[index], self.all_reduce_steps[index])

    def rates(self, bw_gbs: Floats, latency_us: Floats, ring_latency_us: Floats) -> Rates:
        """The group's :class:`Rates` with its bandwidth and latencies (per all-reduce step, and a whole ring's)."""
        return Rates(self, bw_gbs * 1e9, self.all_reduce_steps * latency_us * 1e-6, ring_latency_us * 1e-6)


@dataclass(frozen=True, slots=True)
class Rates:
    """A group's collectives priced (module docstring): its :class:`Shares`, its bus bandwidth in bytes per second,
    an all-reduce's latency and a ring's, in seconds."""

    shares: Shares
    bytes_per_s: Floats
    all_reduce_latency_s: Floats
    ring_latency_s: Floats

    def all_reduce_s(self, nbytes: Floats) -> Floats:
        """Ring all-reduce: ``2(p-1)/p · bytes / β + 2⌈log2 p⌉ · α`` seconds."""
        t = self.shares.all_reduce * nbytes / self.bytes_per_s + self.all_reduce_latency_s
        return np.where(self.shares.active, t, 0.0)

    def all_gather_s(self, nbytes: Floats) -> Floats:
        """Ring all-gather of a `nbytes` output: ``(p-1)/p · bytes / β`` plus the whole ring's latency, seconds."""
        t = self.shares.ring * nbytes / self.bytes_per_s + self.ring_latency_s
        return np.where(self.shares.active, t, 0.0)

    def reduce_scatter_s(self, nbytes: Floats) -> Floats:
        """Ring reduce-scatter of a `nbytes` input; same cost as the all-gather."""
        return self.all_gather_s(nbytes)


def all_reduce_s(nbytes: Floats, p: Floats, bw_gbs: Floats, latency_us: Floats) -> Floats:
    """Ring all-reduce: ``2(p-1)/p · bytes / β + 2⌈log2 p⌉ · α`` seconds."""
    return Shares.of(p).rates(bw_gbs, latency_us, 0.0 * p).all_reduce_s(nbytes)


def all_gather_s(nbytes: Floats, p: Floats, bw_gbs: Floats, ring_latency_us: Floats) -> Floats:
    """Ring all-gather of a `nbytes` output: ``(p-1)/p · bytes / β`` plus the whole ring's latency, seconds."""
    return Shares.of(p).rates(bw_gbs, 0.0 * p, ring_latency_us).all_gather_s(nbytes)


def reduce_scatter_s(nbytes: Floats, p: Floats, bw_gbs: Floats, ring_latency_us: Floats) -> Floats:
    """Ring reduce-scatter of a `nbytes` input; same cost as the all-gather."""
    return all_gather_s(nbytes, p, bw_gbs, ring_latency_us)
