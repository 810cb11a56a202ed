"""Is the uncertainty itself right? Share of measured plans inside their predicted interval.

For each plan the machine's prediction interval (:mod:`axoplan.uncertainty`: parameter
covariance plus model error, linearised) is compared with its measured time (the median of
its repetitions). A well-calibrated 80% interval holds about 80% of the plans; the share is
reported overall and per scenario (plans that answer the same "which layout" question).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from axoplan.machine import Machine
from axoplan.validate.compare import PlanRuns, Predictor, scenario_key

__all__ = ["Coverage", "coverage", "format_coverage"]


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
    from axoplan.machine_params import parameter_value, with_values
    from axoplan.uncertainty import intervals, machine_spread, sensitivities

    predictor = Predictor([p.plan for p in plans])
    spread, sigma = machine_spread(machine)
    values = {p: parameter_value(machine, p) for p in spread.paths}

    def step_s(v: dict[str, float]) -> np.ndarray:
        return predictor.step_s(with_values(machine, v) if v else machine)

    t0, jac = sensitivities(step_s, values, spread.paths)
    iv = intervals(t0, jac, spread.log_cov, sigma, level=level, samples=1)
    measured = np.array([p.measured_s for p in plans])
    inside = (measured >= iv.low_s) & (measured <= iv.high_s)
    keys = [scenario_key(p.plan) for p in plans]
    per = []
    for key in dict.fromkeys(keys):
        mask = np.array([k == key for k in keys])
        first = plans[int(np.argmax(mask))].plan
        label = f"{first.model.name}, {first.world_size} GPUs, batch {first.options.global_batch}"
        per.append((label, int(mask.sum()), float(inside[mask].mean())))
    return Coverage(level, len(plans), float(inside.mean()) if len(plans) else float("nan"), tuple(per), inside)


def format_coverage(c: Coverage) -> str:
    """Overall and per-scenario coverage next to the nominal level, as text."""
    lines = [f"\ninterval coverage: {c.covered:.0%} of {c.plans} plans inside their predicted "
             f"{c.level:.0%} interval (nominal {c.level:.0%}; docs/uncertainty.md)"]
    lines += [f"  scenario {key}: {share:.0%} of {n}" for key, n, share in c.per_scenario]
    return "\n".join(lines)
