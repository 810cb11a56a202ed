"""Compute time: GEMMs from tiles and waves, flash attention, element-wise work.

GEMM ``[m × k]·[k × n]`` on a GPU with ``U`` compute units (SMs or CUs): the library splits
the output into ``tm × tn`` tiles, one per unit at a time, so it runs in
``waves = ⌈⌈m/tm⌉·⌈n/tn⌉ / U⌉`` waves, each as long as one tile's ``2·tm·tn·k`` flops at the
unit's share of peak times the full-wave efficiency (tile and wave quantization: NVIDIA,
"Matrix Multiplication Background User's Guide", Deep Learning Performance docs; the tile
shapes are CUTLASS's). The library picks the tile, and may swap m and n (``Cᵀ = BᵀAᵀ``), so the
fastest is taken. Without tiles (a CPU) a smooth efficiency curve stands in. Either way the
GEMM is never faster than moving its operands through HBM once (roofline, Williams et al.
2009): ``t = max(t_tiles, 2(mk + kn + mn) / (β_hbm · memory_efficiency))``.

Operand layout (``orientation``, ``axoplan.inputs.machine.Orientation``) divides the compute time by
its relative efficiency ``gemm.orientation_efficiency`` (1 unless a YAML says otherwise); a
measured table with rows of that orientation is read instead.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from axoplan.inputs.machine import GemmModel, Machine, Orientation

__all__ = ["gemm_efficiency", "gemm_s", "gemm_numbers", "waves", "wave_quantized_s", "memory_bound_s", "aligned"]

Floats = npt.NDArray[np.float64]
BYTES_BF16 = 2.0


def gemm_efficiency(gemm: GemmModel, m: Floats, n: Floats, k: Floats, orientation: Orientation = "nn") -> Floats:
    """Fraction of peak for local GEMM shapes (a measured table wins over the curve)."""
    if gemm.table:
        return _nearest_measured(gemm, m, n, k, orientation)
    half = gemm.half_efficiency_dim
    shape = (m / (m + half)) * (n / (n + half)) * (k / (k + half))
    return gemm.max_efficiency * shape * gemm.orientation_efficiency.of(orientation)


def _nearest_measured(gemm: GemmModel, m: Floats, n: Floats, k: Floats, orientation: Orientation) -> Floats:
    """Efficiency of the measured shape closest in log2 space (L1 distance).

    Rows measured in `orientation` are read as they are; without any, the ``nn`` rows (or,
    without those, all rows) scaled by the orientation's relative efficiency."""
    rows = [p for p in gemm.table if p.orientation == orientation]
    factor = 1.0
    if not rows:
        rows = [p for p in gemm.table if p.orientation == "nn"] or list(gemm.table)
        factor = gemm.orientation_efficiency.of(orientation)
    table = np.array([[p.m, p.n, p.k] for p in rows], dtype=np.float64)
    eff = np.array([p.efficiency for p in rows]) * factor
    query = np.log2(np.stack(np.broadcast_arrays(m, n, k), axis=-1))
    dist = np.abs(query[..., None, :] - np.log2(table)).sum(axis=-1)
    return eff[np.argmin(dist, axis=-1)]


def gemm_s(machine: Machine, m: Floats, n: Floats, k: Floats, orientation: Orientation = "nn") -> Floats:
    """Seconds for one ``[m×k]·[k×n]`` bf16 GEMM on one device, operands laid out as `orientation`."""
    gemm, units = machine.gemm, machine.device.compute_units
    if gemm.tiles and units is not None and not gemm.table:
        compute = wave_quantized_s(gemm, units, machine.peak_flops, m, n, k)
        compute = compute / gemm.orientation_efficiency.of(orientation)
    else:
        compute = 2.0 * m * n * k / (machine.peak_flops * gemm_efficiency(gemm, m, n, k, orientation))
    if machine.kernels is not None and machine.kernels.unaligned_gemm_efficiency < 1.0:
        unaligned = machine.kernels.unaligned_gemm_efficiency
        compute = compute / np.where(aligned(m) & aligned(n) & aligned(k), 1.0, unaligned)
    traffic = BYTES_BF16 * (m * k + k * n + m * n)
    return np.maximum(compute, memory_bound_s(machine, traffic))


def gemm_numbers(machine: Machine) -> tuple[object, ...]:
    """Every number of `machine` that :func:`gemm_s` reads (and :func:`memory_bound_s`, which a tuned GEMM's copies
    add): a GEMM's time changes only when one of these does, so a repricing that moves none of them (a network
    efficiency, a host latency) may keep the GEMM times it has."""
    unaligned = machine.kernels.unaligned_gemm_efficiency if machine.kernels is not None else None
    return (machine.gemm, machine.device.compute_units, machine.peak_flops, unaligned,
            machine.device.hbm_bandwidth_gbs, machine.memory_efficiency)


def aligned(dim: Floats) -> npt.NDArray[np.bool_]:
    """A GEMM dimension whose bf16 rows are 16-byte aligned (a multiple of 8 elements): cuBLAS's vectorised
    tensor-core kernels need it, otherwise an align1 kernel runs (NVIDIA, "Matrix Multiplication Background
    User's Guide", tensor-core requirements; the GPT-2 trace's cutlass_75_*_align1 LM-head GEMMs)."""
    return np.asarray(np.mod(dim, 8.0) == 0.0)


def waves(tiles: Floats, units: int) -> Floats:
    """Waves needed to run `tiles` output tiles on `units` compute units, one tile each at a time."""
    return np.ceil(tiles / units)


def wave_quantized_s(gemm: GemmModel, units: int, peak_flops: float, m: Floats, n: Floats, k: Floats) -> Floats:
    """Seconds for the GEMM by tile and wave quantization, with the best tile and orientation."""
    best: Floats | None = None
    per_unit = peak_flops / units * gemm.max_efficiency
    for tile in gemm.tiles:
        for rows, cols in ((m, n), (n, m)):
            count = np.ceil(rows / tile.m) * np.ceil(cols / tile.n)
            t = waves(count, units) * 2.0 * tile.m * tile.n * k / (per_unit * tile.relative_efficiency)
            best = t if best is None else np.minimum(best, t)
    assert best is not None
    return best


def memory_bound_s(machine: Machine, nbytes: Floats) -> Floats:
    """Seconds to stream `nbytes` through HBM (element-wise kernels, optimizer step)."""
    return nbytes / (machine.device.hbm_bandwidth_gbs * 1e9 * machine.memory_efficiency)
