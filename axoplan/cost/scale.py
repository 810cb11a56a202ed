"""What grows with the number of GPUs even when every collective hides: the slowest GPU and shared resources.

**The slowest of N.** Identical GPUs do not run at identical speed: chips of one SKU differ in
sustained clock under power and thermal limits (Sinha et al., "Not All GPUs Are Created Equal",
SC'22: 8 % average variation, up to 22 %, across clusters of thousands of GPUs; Bekman,
*Machine Learning Engineering*, "Not all accelerators are created equal": 5 % and more between
the GPUs of one 8-GPU node; PRISM, arXiv 2510.15596: up to 14 % GEMM variation by platform). A
synchronous step waits for the slowest: with per-GPU compute time ``t·(1 + σ·Z_i)``, ``Z_i``
independent standard normals, the step's compute is ``t·(1 + σ·E[max of N Z_i])``
(``device.speed_variation`` is σ). ``E[max]`` is exact by quadrature of
``∫ x·N·φ(x)·Φ(x)^(N−1) dx``: 0 for one GPU, 0.564 for 2 (``1/√π``), 1.424 for 8, 2.595 for 128.

**Collectives slow the compute they hide behind.** A collective's kernels occupy SMs and HBM
bandwidth while the GEMMs they overlap run, so hidden communication is not free: Calculon
(Isaev et al., SC'23, ``calculon/llm/layers.py``) charges overlapped compute
``1/(1 − processor_usage)`` and a hidden collective ``processor_usage`` of its own time, with
0.15 for NVLink and 0.02 for the scale-out network in its A100 and H100 systems; a measurement
on A100, H100, MI250 and MI210 found overlapped compute 18.9 % slower on average (arXiv
2507.03114). The machine's ``intra_node.processor_usage`` and ``inter_node.processor_usage``
charge each axis's hidden seconds by whether its group crosses nodes.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import numpy.typing as npt

from axoplan.arrays import distinct

__all__ = ["expected_max_normal", "straggler_factor", "interference_s"]

Floats = npt.NDArray[np.float64]


@cache
def _normal_grid() -> tuple[Floats, Floats, Floats]:
    """``x``, ``φ(x)`` and ``Φ(x)`` on a fine grid over ±12 (numpy 1.26 has no ``trapezoid``: sums by hand)."""
    x = np.linspace(-12.0, 12.0, 24001)
    pdf = np.exp(-0.5 * x**2) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    return x, pdf, cdf


@cache
def _expected_max(n: int) -> float:
    if n <= 1:
        return 0.0
    x, pdf, cdf = _normal_grid()
    f = x * n * pdf * cdf ** (n - 1)
    return float(((f[1:] + f[:-1]) * np.diff(x)).sum() / 2.0)  # the trapezoid rule


def expected_max_normal(n: npt.ArrayLike) -> Floats:
    """``E[max of n independent standard normals]`` for every entry of `n` (0 for n ≤ 1)."""
    arr = np.asarray(n, dtype=np.int64)
    keys = distinct(arr)  # a few distinct sizes among tens of thousands of candidates
    values = np.array([_expected_max(int(k)) for k in keys], dtype=np.float64)
    return np.asarray(values[np.searchsorted(keys, arr)], dtype=np.float64)


def straggler_factor(speed_variation: float, world: npt.ArrayLike) -> Floats:
    """Extra compute share a step of `world` GPUs waits for: ``σ·E[max of N]``."""
    return speed_variation * expected_max_normal(world)


def interference_s(hidden_s: Floats, crosses_nodes: npt.NDArray[np.bool_], intra_usage: float,
                   inter_usage: float) -> Floats:
    """Compute time lost to collectives running beside it: hidden seconds times the processor share
    their link class takes (Calculon's ``processor_usage``)."""
    return hidden_s * np.where(crosses_nodes, inter_usage, intra_usage)
