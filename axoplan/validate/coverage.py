"""Is the uncertainty itself right? Share of measured plans inside their predicted interval.

For each plan the machine's prediction interval (:mod:`axoplan.uncertainty.intervals`: parameter
covariance plus model error, linearised) is compared with its measured time (the median of
its repetitions). A well-calibrated 80% interval holds about 80% of the plans; the share is
reported overall and per scenario (plans that answer the same "which layout" question).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from axoplan.errors import AxoplanError
from axoplan.inputs.machine import Machine
from axoplan.records.plan import LaunchConfig
from axoplan.report import plural
from axoplan.validate.compare import PlanRuns, Predictor, aggregate, scenario_key
from axoplan.validate.records import Measured

__all__ = ["Coverage", "coverage", "cross_validated", "format_coverage", "plan_reach_sigma"]


@dataclass(frozen=True, slots=True)
class Coverage:
    """Nominal level, overall share covered, and per-scenario (label, plans, share)."""

    level: float
    plans: int
    covered: float
    per_scenario: tuple[tuple[str, int, float], ...]
    inside: np.ndarray  # per plan


def coverage(plans: Sequence[PlanRuns], machine: Machine, level: float = 0.8) -> Coverage:
    """Interval coverage of `plans` (pooled runs) under `machine`'s uncertainty."""
    return _summary(plans, _inside(plans, machine, level), level)


def cross_validated(runs: Sequence[Measured], machine: Machine, folds: int = 5, level: float = 0.8,
                    seed: int = 0) -> Coverage:
    """Coverage of every plan's interval from a calibration that never saw it (k-fold).

    The plans are dealt into `folds` parts by a seeded permutation; each part is compared
    with the intervals of `machine` calibrated (:func:`~axoplan.validate.calibrate.calibrate`,
    nothing held out) on the runs of the other parts. Every plan is held out exactly once, so
    the share rests on all plans instead of one 30% split (9 plans of the CPU data, where a
    well-calibrated 80% interval still covers all 9 with probability 0.8⁹ = 13%).
    """
    from axoplan.validate.calibrate import calibrate

    plans = aggregate(runs)
    if not 2 <= folds <= len(plans):
        raise AxoplanError(f"cross-validation needs 2 to {len(plans)} folds for {len(plans)} plans (got {folds})")
    part = np.empty(len(plans), dtype=np.int64)
    part[np.random.default_rng(seed).permutation(len(plans))] = np.arange(len(plans)) % folds
    inside = np.zeros(len(plans), dtype=bool)
    for f in range(folds):
        held = np.flatnonzero(part == f)
        fitted_ids = {plans[i].plan.plan_id for i in np.flatnonzero(part != f)}
        fit = calibrate([r for r in runs if r.plan.plan_id in fitted_ids], machine, holdout=0.0)
        inside[held] = _inside([plans[i] for i in held], fit.calibrated, level)
    return _summary(plans, inside, level)


def _inside(plans: Sequence[PlanRuns], machine: Machine, level: float) -> np.ndarray:
    """Per plan: is its measured time inside `machine`'s central `level` interval?"""
    from axoplan.inputs.machine_params import parameter_value, with_values
    from axoplan.uncertainty.intervals import intervals, machine_spread, sensitivities

    predictor = Predictor([p.plan for p in plans])
    spread, sigma = machine_spread(machine)
    values = {p: parameter_value(machine, p) for p in spread.paths}

    def step_s(v: dict[str, float]) -> np.ndarray:
        return predictor.step_s(with_values(machine, v) if v else machine)

    t0, jac = sensitivities(step_s, values, spread.paths)
    reach = plan_reach_sigma([p.plan for p in plans], machine)  # how far each plan reaches beyond what was measured
    iv = intervals(t0, jac, spread.log_cov, sigma, level=level, samples=1, reach_sigma=reach)
    measured = np.array([p.measured_s for p in plans])
    return np.asarray((measured >= iv.low_s) & (measured <= iv.high_s))


def _summary(plans: Sequence[PlanRuns], inside: np.ndarray, level: float) -> Coverage:
    keys = [scenario_key(p.plan) for p in plans]
    per = []
    for key in dict.fromkeys(keys):
        mask = np.array([k == key for k in keys])
        first = plans[int(np.argmax(mask))].plan
        label = f"{first.model.name}, {first.world_size} GPUs, batch {first.options.global_batch}"
        per.append((label, int(mask.sum()), float(inside[mask].mean())))
    return Coverage(level, len(plans), float(inside.mean()) if len(plans) else float("nan"), tuple(per), inside)


def format_coverage(c: Coverage, per_scenario: bool = True) -> str:
    """Overall coverage next to the nominal level, then each scenario's (`per_scenario`) or, in
    a summary, one line with the range over the scenarios of two or more plans."""
    lines = [f"\ninterval coverage: {c.covered:.0%} of {plural(c.plans, 'plan')} inside their predicted "
             f"{c.level:.0%} interval (nominal {c.level:.0%}; docs/uncertainty.md)"]
    if per_scenario:
        lines += [f"  scenario {key}: {share:.0%} of {n}" for key, n, share in c.per_scenario]
        return "\n".join(lines)
    shares = [share for _, n, share in c.per_scenario if n >= 2]
    if shares:
        lines.append(f"  per scenario ({len(shares)} of two or more plans): {min(shares):.0%} to {max(shares):.0%}, "
                     f"median {float(np.median(shares)):.0%}; without --summary-only each is listed")
    return "\n".join(lines)


def plan_reach_sigma(plans: Sequence[LaunchConfig], machine: Machine) -> np.ndarray:
    """:func:`reach_sigma` for each of `plans` (measured plans of any models and options)."""
    from axoplan.cost.model import predict
    from axoplan.uncertainty.reach import reach_sigma, reaches
    from axoplan.validate.compare import plan_candidates

    out = np.empty(len(plans))
    groups: dict[str, list[int]] = {}
    for i, plan in enumerate(plans):
        groups.setdefault(plan.model.model_dump_json() + plan.options.model_dump_json(), []).append(i)
    for idx in groups.values():
        first = plans[idx[0]]
        found = reaches(first.model, first.options, machine, size=len(idx))
        if any(r.by_share for r in found):  # its share of the step needs the prediction
            cols = predict(first.model, machine, first.options, plan_candidates([plans[i] for i in idx])).columns
            found = reaches(first.model, first.options, machine, cols, len(idx))
        out[idx] = reach_sigma(machine, found, len(idx))
    return out
