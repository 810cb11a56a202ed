"""Error and ordering metrics of predictions against measurements, on plain arrays.

* percentage error ``100·(predicted − measured)/measured``; MAPE is the mean of its
  absolute value, the worst case its largest absolute value (sign kept);
* Kendall's τ-b and Spearman's ρ of predicted against measured times (scipy.stats),
  ``nan`` with fewer than two distinct values on either side;
* the predicted rank of the measured best: 1 when the fastest measured layout is also
  predicted fastest; "in the predicted top-k" when that rank is at most k (ties in the
  prediction count in the measured best's favour).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import stats

__all__ = ["percent_errors", "mape", "worst_error", "kendall_tau", "spearman_rho", "predicted_rank_of_best",
           "best_in_top_k", "grouped"]

Floats = npt.NDArray[np.float64]


def _pair(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> tuple[Floats, Floats]:
    p, m = np.asarray(predicted, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    if p.shape != m.shape or p.ndim != 1:
        raise ValueError(f"predicted {p.shape} and measured {m.shape} must be 1-D arrays of one length")
    if (m <= 0).any():
        raise ValueError("measured times must be positive")
    return p, m


def percent_errors(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> Floats:
    """``100·(predicted − measured)/measured`` per run."""
    p, m = _pair(predicted, measured)
    return 100.0 * (p - m) / m


def mape(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> float:
    """Mean absolute percentage error (``nan`` for no runs)."""
    err = percent_errors(predicted, measured)
    return float(np.abs(err).mean()) if err.size else math.nan


def worst_error(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> tuple[int, float]:
    """(index, signed percentage error) of the run with the largest absolute error."""
    err = percent_errors(predicted, measured)
    if not err.size:
        return -1, math.nan
    i = int(np.argmax(np.abs(err)))
    return i, float(err[i])


def _correlation(fn: object, predicted: npt.ArrayLike, measured: npt.ArrayLike) -> float:
    p, m = _pair(predicted, measured)
    if p.size < 2 or np.unique(p).size < 2 or np.unique(m).size < 2:
        return math.nan
    return float(fn(p, m).statistic)  # type: ignore[operator]


def kendall_tau(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> float:
    """Kendall's τ-b of the two orderings (1: same order, −1: reversed)."""
    return _correlation(stats.kendalltau, predicted, measured)


def spearman_rho(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> float:
    """Spearman's rank correlation ρ of the two orderings."""
    return _correlation(stats.spearmanr, predicted, measured)


def predicted_rank_of_best(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> int:
    """1-based position of the measured-fastest run in the predicted order (ties favour it)."""
    p, m = _pair(predicted, measured)
    if not p.size:
        raise ValueError("no runs")
    best = int(np.argmin(m))
    return int((p < p[best]).sum()) + 1


def best_in_top_k(predicted: npt.ArrayLike, measured: npt.ArrayLike, k: int) -> bool:
    """Whether the measured-fastest run is among the k predicted fastest."""
    if k < 1:
        raise ValueError("k must be at least 1")
    return predicted_rank_of_best(predicted, measured) <= k


def grouped(keys: npt.ArrayLike) -> list[npt.NDArray[np.int64]]:
    """Indices of each distinct key, in order of first appearance."""
    k = np.asarray(keys)
    _, first, inverse = np.unique(k, return_index=True, return_inverse=True)
    order = np.argsort(first)
    return [np.flatnonzero(inverse == g) for g in order]
