"""Fit a machine's efficiency and latency parameters to measured runs (least squares).

The residual of plan *i* is ``log(predicted_i / measured_i)``: a relative error, so a
1-second and a 100-second layout weigh the same, and over- and under-prediction by the
same factor cost the same. ``scipy.optimize.least_squares`` (trust-region reflective)
minimises the sum of squares over the parameters' logarithms, inside the bounds of
:data:`PARAMETERS`. Only parameters the training runs are sensitive to are fitted (a
single-node data set says nothing about the network), and the fit starts from the
machine's current values. One-sigma uncertainties come from the Jacobian at the optimum,
the fit's ``s²·(JᵀJ)⁺`` with ``s² = Σr²/(m − n)`` combined with the prior spread by source
(:func:`_uncertainty`), so a parameter the runs do not pin down keeps about its prior; in
log space they are relative errors.

Plans (not runs: repetitions stay together) are split at random, by ``seed``, into a
training part and a held-out part; the error before and after the fit is reported on
both, so a fit that memorises instead of generalising shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from scipy.optimize import least_squares

from axoplan.errors import AxoplanError, closest_hint
from axoplan.inputs.machine import Machine, ParameterUncertainty
from axoplan.inputs.machine_params import has_value, parameter_value, with_values
from axoplan.inputs.parameters import fittable
from axoplan.validate.compare import PlanRuns, Predictor, Summary, aggregate, plan_table, summarize
from axoplan.validate.records import Measured
from axoplan.validate.yamledit import format_value

if TYPE_CHECKING:
    from axoplan.uncertainty.intervals import ParameterSpread

__all__ = ["Parameter", "PARAMETERS", "FittedParameter", "Calibration", "calibrate", "split_holdout",
           "parameter_value", "with_values", "select_parameters", "split_by_model", "HoldoutBy", "refit"]

_SENSITIVITY_STEP = 0.05  # relative change of a parameter when testing whether the runs see it
_MIN_SENSITIVITY = 1e-4  # smallest log-change of any prediction that counts as "seen"


@dataclass(frozen=True, slots=True)
class Parameter:
    """One fittable machine parameter: its dotted path in the YAML and its bounds."""

    path: str
    low: float
    high: float
    meaning: str
    floor: bool = False  # acts through max(): probed over its range, fit started from a 1-D scan


PARAMETERS: tuple[Parameter, ...] = tuple(Parameter(p.path, p.fit.low, p.fit.high, p.meaning, p.fit.floor)
                                         for p in fittable() if p.fit is not None)
"""What `calibrate` may fit: the registry's parameters with fit bounds (:mod:`axoplan.inputs.parameters`), each
bound inside the field's hard range, so a fitted YAML loads."""


@dataclass(frozen=True, slots=True)
class FittedParameter:
    path: str
    before: float
    after: float
    rel_sigma: float  # one-sigma relative uncertainty (nan when not estimable)
    at_bound: bool


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted machine, what was fitted, and the error before and after on both parts."""

    original: Machine
    calibrated: Machine
    fitted: tuple[FittedParameter, ...]
    unused: tuple[str, ...]  # parameters the training runs do not constrain
    train_before: Summary
    train_after: Summary
    holdout_before: Summary | None
    holdout_after: Summary | None
    holdout_fraction: float
    seed: int

    @property
    def worse_on_holdout(self) -> bool | None:
        """Whether the calibrated machine's MAPE on the held-out plans is above the original's
        (None when nothing was held out: the fitted plans alone cannot tell). The held-out MAPE
        decides because it is the error a user of the calibrated machine meets on plans it never
        saw; a fit that lowers it while the ordering (tau) worsens is still reported in the table."""
        if self.holdout_before is None or self.holdout_after is None:
            return None
        return self.holdout_after.mape_pct > self.holdout_before.mape_pct


def _by_path(names: Sequence[str] | None) -> list[Parameter]:
    known = {p.path: p for p in PARAMETERS}
    if names is None:
        return list(PARAMETERS)
    chosen = []
    for name in names:
        if name not in known:
            raise AxoplanError(f"unknown parameter {name!r}{closest_hint(name, known)}; fittable: "
                               f"{', '.join(known)}")
        chosen.append(known[name])
    return chosen


def split_holdout(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) indices of `n` plans; a seeded permutation, so reproducible."""
    if not 0.0 <= fraction < 1.0:
        raise AxoplanError(f"--holdout {fraction} must be at least 0 and below 1 (a fraction of the plans)")
    n_hold = int(round(fraction * n))
    if n - n_hold < 1:
        raise AxoplanError(f"holding out {fraction:.0%} of {n} plans leaves none to fit; lower --holdout")
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_hold:]), np.sort(perm[:n_hold])


HoldoutBy = Literal["plan", "model"]


def split_by_model(plans: Sequence[PlanRuns], fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) indices holding out whole models (same shape: layers, hidden, heads, ...):
    models are taken in a seeded random order until at least `fraction` of the plans are held
    out, so no held-out plan shares its model with a fitted one (a fit that only memorises
    the fitted sizes shows it)."""
    split_holdout(len(plans), fraction, seed)  # the same checks of the fraction
    keys = [p.plan.model.model_dump_json() for p in plans]
    models = sorted(set(keys))
    if fraction == 0.0:
        return np.arange(len(plans)), np.array([], dtype=np.int64)
    if len(models) < 2:
        raise AxoplanError("--holdout-by model needs runs of at least two model sizes")
    held: set[str] = set()
    for i in np.random.default_rng(seed).permutation(len(models)):
        if sum(k in held for k in keys) >= fraction * len(plans) or len(held) == len(models) - 1:
            break
        held.add(models[i])
    mask = np.array([k in held for k in keys])
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def select_parameters(predictor: Predictor, machine: Machine, params: Sequence[Parameter]) -> list[Parameter]:
    """The parameters whose change moves at least one prediction (the identifiable ones)."""
    base = np.log(predictor.step_s(machine))
    seen = []
    for p in params:
        if not has_value(machine, p.path):  # not set on this machine (or 0): nothing to scale
            continue
        value = parameter_value(machine, p.path)
        for bumped in _probes(p, value):
            moved = np.log(predictor.step_s(with_values(machine, {p.path: bumped}))) - base
            if np.abs(moved).max() > _MIN_SENSITIVITY:
                seen.append(p)
                break
    return seen


def _probes(p: Parameter, value: float) -> list[float]:
    """Values to try when asking whether the runs constrain `p`."""
    if p.floor:  # a floor below every run's time moves nothing; it matters once it binds
        return [v for v in np.geomspace(p.low, p.high, 25) if v != value]
    bumped = value * (1 + _SENSITIVITY_STEP)
    return [bumped if bumped <= p.high else value / (1 + _SENSITIVITY_STEP)]


def _scan_floors(predictor: Predictor, measured: np.ndarray, machine: Machine, params: Sequence[Parameter],
                 start: np.ndarray, points: int = 49) -> np.ndarray:
    """Start each floor parameter at the best of a log-spaced scan and its current value (least
    squares sees no slope where a floor does not bind)."""
    start = start.copy()
    for i, p in enumerate(params):
        if not p.floor:
            continue
        trials = np.append(np.geomspace(p.low, p.high, points), np.exp(start[i]))
        cost = [float(np.sum(np.log(predictor.step_s(with_values(machine, {p.path: v})) / measured) ** 2))
                for v in trials]
        start[i] = np.log(trials[int(np.argmin(cost))])
    return start


def _fit(predictor: Predictor, measured: np.ndarray, machine: Machine, params: Sequence[Parameter],
         scan_points: int = 49, max_nfev: int | None = None, tol: float = 1e-8,
         prior: ParameterSpread | None = None) -> tuple[dict[str, float], np.ndarray, float, list[bool]]:
    """Least squares over the parameters' logarithms; with `prior`, maximum a posteriori: the data
    residuals over the model error and ``(log θ − log θ₀)/σ₀`` per parameter, θ₀ the machine's
    sourced value and σ₀ its prior spread (``axoplan.uncertainty.intervals.prior_spread``)."""
    from axoplan.uncertainty.intervals import DEFAULT_MODEL_SIGMA

    low = np.log([p.low for p in params])
    high = np.log([p.high for p in params])
    origin = np.log([parameter_value(machine, p.path) for p in params])
    start = _scan_floors(predictor, measured, machine, params, origin, scan_points)
    start = np.clip(start, low + 1e-9, high - 1e-9)
    names = [p.path for p in params]
    m = len(measured)
    prior_sigma = (np.array([prior.rel_sigma[prior.paths.index(n)] for n in names]) if prior is not None
                   else None)

    def values(z: np.ndarray) -> dict[str, float]:
        clipped = np.clip(np.exp(z), [p.low for p in params], [p.high for p in params])
        return {n: float(v) for n, v in zip(names, clipped, strict=True)}

    def residuals(z: np.ndarray) -> np.ndarray:
        data = np.log(predictor.step_s(with_values(machine, values(z))) / measured)
        if prior_sigma is None:
            return data
        return np.concatenate([data / DEFAULT_MODEL_SIGMA, (z - origin) / prior_sigma])

    result = least_squares(residuals, start, bounds=(low, high), method="trf", diff_step=1e-3,
                           max_nfev=max_nfev or 60 * len(params), ftol=tol, xtol=tol)
    scale = 1.0 if prior_sigma is None else DEFAULT_MODEL_SIGMA  # the data rows, back in log units
    cov, s = _log_covariance(result.jac[:m] * scale, result.fun[:m] * scale)
    at_bound = [bool(abs(z - lo) < 1e-6 or abs(z - hi) < 1e-6) for z, lo, hi in zip(result.x, low, high, strict=True)]
    return values(result.x), cov, s, at_bound


def _log_covariance(jac: np.ndarray, residuals: np.ndarray) -> tuple[np.ndarray, float]:
    """Covariance of the log-parameters ``s²·(JᵀJ)⁺`` and the residual scale ``s`` (nan if not estimable)."""
    m, n = jac.shape
    if m <= n:
        return np.full((n, n), np.nan), float("nan")
    s2 = float(residuals @ residuals) / (m - n)
    cov = s2 * np.linalg.pinv(jac.T @ jac)
    return (cov + cov.T) / 2.0, float(np.sqrt(s2))


def _relative_sigma(cov: np.ndarray) -> list[float]:
    """One-sigma uncertainty of each log-parameter (nan if not estimable)."""
    return [float(np.sqrt(v)) if v > 0 else float("nan") for v in np.diag(cov)]


def _uncertainty(machine: Machine, params: Sequence[Parameter], cov: np.ndarray, s: float,
                 source: ParameterSpread) -> ParameterUncertainty:
    """The fit's information combined with the prior spread by source, and the model error ``s``.

    Covariance of the fitted log-parameters as in a Laplace approximation with a Gaussian
    prior (Bishop, *Pattern Recognition and Machine Learning*, 2006, §4.4):
    ``Σ = (F + Σ₀⁻¹)⁻¹``, the fit's information ``F = (s²·(JᵀJ)⁺)⁺ = JᵀJ/s²`` and ``Σ₀`` the
    diagonal prior of how each number is sourced (docs/uncertainty.md). A parameter the runs
    barely constrain (at a bound, or seen only through another that dominates) keeps about its
    prior spread instead of an unbounded ``s²·(JᵀJ)⁺``; parameters not fitted keep the
    machine's spread. The prior is the one by source (`source`, :func:`_source_prior`), never an earlier fit's
    covariance, so refitting on runs that include the earlier ones does not count them twice.
    """
    from axoplan.uncertainty.intervals import machine_spread

    current, prior_sigma = machine_spread(machine)
    sources = machine.uncertainty.sources if machine.uncertainty is not None else {}
    ranges = machine.uncertainty.ranges if machine.uncertainty is not None else {}
    prior_var = _variances(source)  # every path: fitted ones are set
    paths = [p.path for p in params]
    n = len(paths)
    info = np.linalg.pinv(cov) if np.isfinite(cov).all() else np.zeros((n, n))
    post = np.linalg.inv(info + np.diag([1.0 / prior_var[p] for p in paths]))
    extra = [p for p in current.paths if p not in paths]
    current_var = _variances(current)
    full = np.zeros((n + len(extra),) * 2)
    full[:n, :n] = (post + post.T) / 2.0
    full[n:, n:] = np.diag([current_var[p] for p in extra])
    return ParameterUncertainty(sources=sources, ranges=ranges, log_cov_paths=(*paths, *extra),
                                log_cov=tuple(tuple(float(format_value(v)) for v in row) for row in full),
                                model_error=float(format_value(s)) if np.isfinite(s) else prior_sigma)


def _source_prior(machine: Machine) -> ParameterSpread:
    """The prior by source and sourced range of every parameter (never an earlier fit's covariance)."""
    from axoplan.uncertainty.intervals import prior_spread

    u = machine.uncertainty
    return prior_spread(dict(u.sources) if u else None, ranges=dict(u.ranges) if u else None)


def _variances(spread: ParameterSpread) -> dict[str, float]:
    """Each parameter's log-variance (the diagonal of the spread's covariance)."""
    return {p: float(v) for p, v in zip(spread.paths, np.diag(spread.log_cov), strict=True)}


def calibrate(runs: Sequence[Measured], machine: Machine, parameters: Sequence[str] | None = None,
              holdout: float = 0.3, seed: int = 0, top_k: int = 3, holdout_by: HoldoutBy = "plan",
              prior: bool = True) -> Calibration:
    """Fit `machine` to the training part of `runs`; report before/after on both parts. The
    held-out part is random plans (``holdout_by="plan"``) or whole models (``"model"``). With
    `prior` (the default) the fit is maximum a posteriori: each parameter stays near its sourced
    value unless the runs outweigh its prior spread (``_fit``); without, plain least squares."""
    plans = aggregate(runs)
    if holdout_by == "model":
        train, hold = split_by_model(plans, holdout, seed)
    else:
        train, hold = split_holdout(len(plans), holdout, seed)
    fit_plans: list[PlanRuns] = [plans[i] for i in train]
    predictor = Predictor([p.plan for p in fit_plans])
    measured = np.array([p.measured_s for p in fit_plans])
    chosen = select_parameters(predictor, machine, _by_path(parameters))
    if not chosen:
        raise AxoplanError("the training runs are not sensitive to any fittable parameter; give runs that "
                           "vary the layout, micro-batch or model")
    if len(fit_plans) <= len(chosen):
        names = ", ".join(p.path for p in chosen)
        raise AxoplanError(f"{len(fit_plans)} training plan(s) cannot determine {len(chosen)} parameters ({names}); "
                           f"give at least {len(chosen) + 1} distinct plans to fit on (more runs, or a smaller "
                           f"--holdout), or fit fewer with --params")
    source = _source_prior(machine)
    fitted_values, cov, s, at_bound = _fit(predictor, measured, machine, chosen, prior=source if prior else None)
    values = {k: float(format_value(v)) for k, v in fitted_values.items()}  # as the YAML will hold them
    spread = _uncertainty(machine, chosen, cov, s, source)
    sigma = _relative_sigma(np.array(spread.log_cov)[: len(chosen), : len(chosen)])  # the stored, prior-bounded one
    calibrated = with_values(machine, values).model_copy(update={"uncertainty": spread})
    fitted = tuple(FittedParameter(p.path, parameter_value(machine, p.path), values[p.path], s, b)
                   for p, s, b in zip(chosen, sigma, at_bound, strict=True))
    unused = tuple(p.path for p in _by_path(parameters) if p not in chosen and has_value(machine, p.path))
    all_plans = Predictor([p.plan for p in plans])
    before, after = plan_table(plans, all_plans(machine)), plan_table(plans, all_plans(calibrated))
    held = (summarize(before.iloc[hold], top_k), summarize(after.iloc[hold], top_k)) if len(hold) else (None, None)
    return Calibration(machine, calibrated, fitted, unused, summarize(before.iloc[train], top_k),
                       summarize(after.iloc[train], top_k), held[0], held[1], holdout, seed)


def refit(plans: Sequence[PlanRuns], machine: Machine, parameters: Sequence[str], max_nfev: int = 30,
          tol: float = 1e-3) -> Machine:
    """`machine` refitted to all `plans` (no held-out part), started from its current values.

    The inner step of the suggest-measure-calibrate loop (:mod:`axoplan.validate.loop`): the
    named parameters only, no sensitivity probes or before/after reports, floors started from
    a coarse 13-point scan or their current value (a floor set from a few plans may stop
    binding, and least squares alone would never move it back), and at most `max_nfev`
    residual evaluations, stopping once the cost or the log-parameters change by less than
    `tol` (relative; 1e-3 is a 0.1% change, far below the model error). The fitted
    machine carries the fit's covariance and model error as :func:`calibrate` stores them.
    Fewer plans than parameters + 1 cannot determine the fit: `machine` comes back unchanged.
    """
    chosen = _by_path(parameters)
    if len(plans) <= len(chosen):
        return machine
    predictor = Predictor([p.plan for p in plans])
    measured = np.array([p.measured_s for p in plans])
    fitted_values, cov, s, _ = _fit(predictor, measured, machine, chosen, scan_points=13, max_nfev=max_nfev, tol=tol)
    values = {k: float(format_value(v)) for k, v in fitted_values.items()}
    spread = _uncertainty(machine, chosen, cov, s, _source_prior(machine))
    return with_values(machine, values).model_copy(update={"uncertainty": spread})
