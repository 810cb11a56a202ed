"""α-β times of the three collectives AxoNN uses, for arrays of groups.

Bandwidth term: the ring volume per rank (Thakur, Rabenseifner & Gropp 2005),
``2(p-1)/p · bytes`` for all-reduce and ``(p-1)/p · bytes`` for all-gather and
reduce-scatter, over the group's bus bandwidth. Latency term: an all-reduce pays
``2·⌈log2 p⌉`` steps, the depth of the trees and recursive doubling that NCCL and RCCL switch
to for small messages (a pure ring's ``p-1`` steps would charge a 32,768-rank all-reduce
65,534 latencies). All-gather and reduce-scatter have no tree in NCCL (ring, or NVLS and
CollNet where the hardware has them: ``src/graph/tuning.cc``), so their latency is the ring's,
linear in the group ("the latency of ring increases linearly with the communicator size",
NCCL issue 1712): ``(p − nodes)`` steps on the node's links and ``nodes − 1`` across the network,
NCCL's own latency model; :func:`axoplan.cost.placement.place` sums them into the group's
``ring_latency_us``. ``bytes`` is always the full buffer: the all-reduced message, the gathered
output, the reduce-scatter input. A group of one costs nothing.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["all_reduce_s", "all_gather_s", "reduce_scatter_s"]

Floats = npt.NDArray[np.float64]


def _steps(p: Floats) -> Floats:
    return np.ceil(np.log2(np.maximum(p, 1.0)))


def all_reduce_s(nbytes: Floats, p: Floats, bw_gbs: Floats, latency_us: Floats) -> Floats:
    """Ring all-reduce: ``2(p-1)/p · bytes / β + 2⌈log2 p⌉ · α`` seconds."""
    t = 2.0 * (p - 1.0) / p * nbytes / (bw_gbs * 1e9) + 2.0 * _steps(p) * latency_us * 1e-6
    return np.where(p > 1, t, 0.0)


def all_gather_s(nbytes: Floats, p: Floats, bw_gbs: Floats, ring_latency_us: Floats) -> Floats:
    """Ring all-gather of a `nbytes` output: ``(p-1)/p · bytes / β`` plus the whole ring's latency, seconds."""
    t = (p - 1.0) / p * nbytes / (bw_gbs * 1e9) + ring_latency_us * 1e-6
    return np.where(p > 1, t, 0.0)


def reduce_scatter_s(nbytes: Floats, p: Floats, bw_gbs: Floats, ring_latency_us: Floats) -> Floats:
    """Ring reduce-scatter of a `nbytes` input; same cost as the all-gather."""
    return all_gather_s(nbytes, p, bw_gbs, ring_latency_us)
