"""Prediction intervals, probability of being fastest, and ties with the best (issue 10).

The step time of candidate *i* is modelled in log space as a linearisation around the
machine's current parameters ``p``:

    log t_i(p·e^z) ≈ log t_i(p) + J_i · z + ε_i,   z ~ N(0, Σ),   ε_i ~ N(0, σ_model²)

``J_i = ∂ log t_i / ∂ log p`` is found by one forward difference per parameter (P + 1 cost-
model evaluations instead of one per Monte-Carlo sample), ``Σ`` is the covariance of the
parameters' logarithms (a calibration's fit, or the prior of :data:`PRIOR_REL_SIGMA` by
how each number is sourced), and ``σ_model`` is the model's own error, estimated from held-out
validation residuals. Intervals are analytic (normal quantiles of ``log t``); the
probability that each candidate is fastest is estimated by sampling ``z`` and ``ε`` with
common random numbers (every candidate sees the same parameter draws, so candidates that
share a bottleneck move together). Only *contenders* (feasible, within a factor of the best
point prediction) are sampled; the rest have probability zero of being best.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from axoplan.inputs.parameters import DEFAULT_SOURCES, PRIOR_REL_SIGMA

__all__ = ["INTERVAL_COLUMNS", "suggest_indices", "machine_spread", "with_intervals", "PRIOR_REL_SIGMA",
           "DEFAULT_SOURCES", "ParameterSpread", "prior_spread", "Intervals", "intervals", "sensitivities",
           "model_sigma", "widened_note", "ranking_note"]

if TYPE_CHECKING:
    from axoplan.inputs.machine import Machine
    from axoplan.search.ranking import Ranking
    from axoplan.uncertainty.reach import Reach

Floats = npt.NDArray[np.float64]
DEFAULT_MODEL_SIGMA = 0.10
"""Relative model error of a machine without validation residuals (the 5-15% of issue 10) [decision]."""
CONTENDER_FACTOR = 1.5
"""Only feasible candidates within this factor of the best point prediction are sampled for P(best)."""
MAX_CONTENDERS = 2048
INTERVAL_COLUMNS = ("t_low_s", "t_high_s", "p_best", "tied")
"""Columns `with_intervals` adds; not part of a plan's predicted breakdown."""

# The priors by source (PRIOR_REL_SIGMA) and each uncertain parameter's source (DEFAULT_SOURCES) are the registry's:
# one entry per machine parameter in axoplan/inputs/parameters.py.


@dataclass(frozen=True, slots=True)
class ParameterSpread:
    """Covariance of the logarithms of some machine parameters (relative errors)."""

    paths: tuple[str, ...]
    log_cov: Floats  # P × P

    @property
    def rel_sigma(self) -> Floats:
        return np.sqrt(np.diag(self.log_cov))


RANGE_LEVEL = 0.8
"""A sourced range (``uncertainty.ranges``) is read as the central 80 % of the parameter's prior."""


def prior_spread(sources: dict[str, str] | None = None, machine: Machine | None = None,
                 ranges: dict[str, tuple[float, float]] | None = None) -> ParameterSpread:
    """Diagonal prior from each parameter's sourced range, else its source (measured, vendor figure,
    assumption); with `machine`, only the parameters it sets to a positive value (a spread is relative)."""
    from axoplan.inputs.machine_params import has_value

    chosen = DEFAULT_SOURCES | (sources or {})
    paths = tuple(p for p in chosen if machine is None or has_value(machine, p))
    z = NormalDist().inv_cdf(0.5 + RANGE_LEVEL / 2.0)
    sig = np.array([np.log(ranges[p][1] / ranges[p][0]) / (2.0 * z) if ranges and p in ranges
                    else PRIOR_REL_SIGMA[chosen[p]] for p in paths])
    return ParameterSpread(paths, np.diag(sig**2))


def sensitivities(step_s: Callable[[dict[str, float]], Floats], values: dict[str, float],
                  paths: Sequence[str], step: float = 0.05) -> tuple[Floats, Floats]:
    """Point prediction and ``J = ∂ log t / ∂ log p`` (N × P) by forward differences.

    ``step_s(values)`` evaluates the cost model with the named parameters replaced. An
    efficiency (a fraction of peak, at most 1) at its top is differenced downwards.
    """
    t0 = step_s({})
    cols = []
    for p in paths:
        h = -step if p.endswith("efficiency") and values[p] * np.exp(step) > 1.0 else step  # fractions stay <= 1
        cols.append((np.log(step_s({p: values[p] * np.exp(h)})) - np.log(t0)) / h)
    return t0, np.stack(cols, axis=1) if cols else np.zeros((t0.size, 0))


@dataclass(frozen=True, slots=True)
class Intervals:
    """Per candidate: interval ends, probability of being fastest, tie with the best."""

    low_s: Floats
    high_s: Floats
    p_best: Floats
    tied: npt.NDArray[np.bool_]
    level: float


def intervals(t0: Floats, jac: Floats, log_cov: Floats, model_sigma: float, *, level: float = 0.8,
              contenders: npt.NDArray[np.bool_] | None = None, samples: int = 400, seed: int = 0,
              tie_probability: float = 0.1, beat_s: float = np.inf, reach_sigma: Floats | None = None) -> Intervals:
    """Central `level` interval of every candidate and P(best) over the contenders.

    A candidate is *tied* with the best point prediction when it beats it in at least
    `tie_probability` of the joint draws (the best itself is always tied). `beat_s` is a
    time already measured: a draw's winner counts only if it is faster, so P(best) is the
    probability that the candidate is faster than the measured one and every other
    candidate (the probabilities then sum to at most 1; the rest is the measured one's).

    `reach_sigma` (per candidate, :mod:`axoplan.uncertainty.reach`) widens each interval like the model error, but
    is one error shared by every candidate of the prediction (a framework, device or family priced beyond what
    was measured misses all its layouts the same way): in the draws it moves them together, so it never changes
    which is fastest, only whether one beats `beat_s`.
    """
    reach = np.zeros(t0.shape) if reach_sigma is None else np.broadcast_to(reach_sigma, t0.shape)
    var = np.einsum("np,pq,nq->n", jac, log_cov, jac) + model_sigma**2 + reach**2
    q = NormalDist().inv_cdf(0.5 + level / 2.0) * np.sqrt(var)
    low, high = t0 * np.exp(-q), t0 * np.exp(q)
    mask = np.ones(t0.size, bool) if contenders is None else contenders
    idx = np.flatnonzero(mask)
    p_best, tied = np.zeros(t0.size), np.zeros(t0.size, bool)
    if idx.size:
        rng = np.random.default_rng(seed)
        chol = _sqrt_psd(log_cov)
        z = rng.standard_normal((samples, log_cov.shape[0])) @ chol.T
        eps = rng.standard_normal((samples, idx.size)) * model_sigma
        shared = np.random.default_rng(seed + 1).standard_normal((samples, 1)) * reach[idx][None, :]
        logt = np.log(t0[idx])[None, :] + z @ jac[idx].T + eps + shared
        winner = np.argmin(logt, axis=1)
        won = logt[np.arange(samples), winner] < np.log(beat_s)
        p_best[idx] = np.bincount(winner[won], minlength=idx.size) / samples
        best = int(np.argmin(t0[idx]))
        beats = (logt <= logt[:, [best]]).mean(axis=0)
        tied[idx] = beats >= tie_probability
    return Intervals(low, high, p_best, tied, level)


def _sqrt_psd(cov: Floats) -> Floats:
    w, v = np.linalg.eigh(cov)
    return v * np.sqrt(np.clip(w, 0.0, None))


def machine_spread(machine: Machine) -> tuple[ParameterSpread, float]:
    """The machine's parameter covariance (fitted, else the prior by source) and its model error."""
    u = machine.uncertainty
    if u is not None and u.log_cov:
        spread = ParameterSpread(tuple(u.log_cov_paths), np.array(u.log_cov, dtype=np.float64))
    else:
        spread = prior_spread(dict(u.sources) if u is not None else None, machine,
                              dict(u.ranges) if u is not None else None)
    sigma = u.model_error if u is not None and u.model_error is not None else DEFAULT_MODEL_SIGMA
    return spread, sigma


def with_intervals(r: Ranking, level: float = 0.8, samples: int = 400, seed: int = 0,
                   beat_s: float = np.inf) -> Ranking:
    """`r` with columns ``t_low_s``, ``t_high_s``, ``p_best`` and ``tied`` (1 = tied with the best);
    ``p_best`` counts only draws faster than `beat_s` (a time already measured, see `intervals`). The model
    error is widened by how far the prediction reaches beyond what was measured (:mod:`.reach`)."""
    from axoplan.cost.model import compile_plan, price
    from axoplan.inputs.machine_params import parameter_value, with_values
    from axoplan.uncertainty.reach import reach_sigma, reaches

    t = r.prediction.columns["t_step_s"]
    feasible = r.reason == 0
    n = t.size
    low, high, p_best, tied = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n), np.zeros(n)
    if feasible.any():
        best = float(t[feasible].min())
        idx = r.order[: int(feasible.sum())]
        idx = idx[t[idx] <= CONTENDER_FACTOR * best][:MAX_CONTENDERS]
        spread, sigma = machine_spread(r.machine)
        reach = reach_sigma(r.machine, reaches(r.model, r.options, r.machine,
                                               {k: v[idx] for k, v in r.prediction.columns.items()}, idx.size),
                            idx.size)
        cands = r.candidates.take(idx)
        values = {p: parameter_value(r.machine, p) for p in spread.paths}
        plan = compile_plan(r.model, r.machine, r.options, cands)  # placed once, priced for every parameter moved

        def step_s(v: dict[str, float]) -> Floats:
            return price(plan, with_values(r.machine, v) if v else r.machine).columns["t_step_s"]

        t0, jac = sensitivities(step_s, values, spread.paths)
        iv = intervals(t0, jac, spread.log_cov, sigma, level=level, samples=samples, seed=seed, beat_s=beat_s,
                       reach_sigma=reach)
        low[idx], high[idx], p_best[idx], tied[idx] = iv.low_s, iv.high_s, iv.p_best, iv.tied
    cols = r.prediction.columns | dict(zip(INTERVAL_COLUMNS, (low, high, p_best, tied), strict=True))
    return replace(r, prediction=replace(r.prediction, columns=cols))


def suggest_indices(r: Ranking, k: int) -> list[int]:
    """k candidates whose measurement most likely finds the fastest: highest P(best) first,
    one per 4D layout (micro-batch and option variants of a layout share its bottlenecks),
    then the next layouts by point prediction. `r` must carry `with_intervals` columns."""
    from axoplan.inputs.axes import AXIS_DEFS

    p = r.prediction.columns["p_best"]
    c = r.candidates
    feasible = r.order[r.reason[r.order] == 0]
    by_p = feasible[np.argsort(-p[feasible], kind="stable")]  # ties keep the point-prediction order
    chosen: list[int] = []
    seen: set[tuple[int, ...]] = set()
    for pool in ([i for i in by_p if p[i] > 0], list(feasible)):
        for i in pool:
            key = tuple(int(getattr(c, a.field)[i]) for a in AXIS_DEFS)
            if len(chosen) < k and key not in seen:
                seen.add(key)
                chosen.append(int(i))
    return chosen


def model_sigma(machine: Machine, found: Sequence[Reach], size: int) -> Floats:
    """The time model's whole relative error per candidate: the machine's (fitted, else the default) and every
    reach in quadrature (:mod:`axoplan.uncertainty.reach`)."""
    from axoplan.uncertainty.reach import reach_sigma
    _, base = machine_spread(machine)
    return np.sqrt(base**2 + reach_sigma(machine, found, size) ** 2)


def widened_note(machine: Machine, found: Sequence[Reach], i: int = 0) -> str | None:
    """One line naming what widened candidate `i`'s interval and by how much (None where nothing did)."""
    from axoplan.uncertainty.reach import calibrated
    shown = [r for r in found if r.sigma[i] > 0]
    if not shown or calibrated(machine):
        return None
    parts = "; ".join(f"{r.what} (+{100 * r.sigma[i]:.0f} %)" for r in shown)
    total = float(model_sigma(machine, found, len(found[0].sigma))[i])
    return (f"interval widened: {parts}: the time model's one-sigma error is {100 * total:.0f} %, not "
            f"{100 * machine_spread(machine)[1]:.0f} % (docs/uncertainty.md, 'Reach')")


def ranking_note(r: Ranking, i: int) -> str | None:
    """:func:`widened_note` for candidate `i` of a ranking (``rank --wide``, ``explain``)."""
    from axoplan.uncertainty.reach import reaches
    cols = {k: np.asarray(v)[[i]] for k, v in r.prediction.columns.items()}
    return widened_note(r.machine, reaches(r.model, r.options, r.machine, cols, 1))
