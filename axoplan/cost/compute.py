"""Compute time: GEMMs with a shape-dependent efficiency, flash attention, element-wise work.

GEMM ``[m × k]·[k × n]``: ``2mnk`` flops at ``peak · eff(m, n, k)``, but never faster
than moving its operands through HBM once (roofline, Williams et al. 2009):
``t = max(2mnk / (peak·eff), 2(mk + kn + mn) / (β_hbm · memory_efficiency))``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from axoplan.machine import GemmModel, Machine

__all__ = ["gemm_efficiency", "gemm_s", "attention_s", "memory_bound_s"]

Floats = npt.NDArray[np.float64]
BYTES_BF16 = 2.0


def gemm_efficiency(gemm: GemmModel, m: Floats, n: Floats, k: Floats) -> Floats:
    """Fraction of peak for local GEMM shapes (a measured table wins over the curve)."""
    if gemm.table:
        return _nearest_measured(gemm, m, n, k)
    half = gemm.half_efficiency_dim
    shape = (m / (m + half)) * (n / (n + half)) * (k / (k + half))
    return gemm.max_efficiency * shape


def _nearest_measured(gemm: GemmModel, m: Floats, n: Floats, k: Floats) -> Floats:
    """Efficiency of the measured shape closest in log2 space (L1 distance)."""
    table = np.array([[p.m, p.n, p.k] for p in gemm.table], dtype=np.float64)
    eff = np.array([p.efficiency for p in gemm.table])
    query = np.log2(np.stack(np.broadcast_arrays(m, n, k), axis=-1))
    dist = np.abs(query[..., None, :] - np.log2(table)).sum(axis=-1)
    return eff[np.argmin(dist, axis=-1)]


def gemm_s(machine: Machine, m: Floats, n: Floats, k: Floats) -> Floats:
    """Seconds for one ``[m×k]·[k×n]`` bf16 GEMM on one device."""
    flops = 2.0 * m * n * k
    compute = flops / (machine.peak_flops * gemm_efficiency(machine.gemm, m, n, k))
    traffic = BYTES_BF16 * (m * k + k * n + m * n)
    return np.maximum(compute, memory_bound_s(machine, traffic))


def attention_s(machine: Machine, flops: Floats) -> Floats:
    """Seconds for flash-attention work of `flops` on one device."""
    return flops / (machine.peak_flops * machine.attention_efficiency)


def memory_bound_s(machine: Machine, nbytes: Floats) -> Floats:
    """Seconds to stream `nbytes` through HBM (element-wise kernels, optimizer step)."""
    return nbytes / (machine.device.hbm_bandwidth_gbs * 1e9 * machine.memory_efficiency)
