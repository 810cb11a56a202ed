"""How much an untuned error figure rests on each constant: the error as each moves across its range.

For every uncertain parameter of the machine (``axoplan.uncertainty.intervals.machine_spread``), the
prediction is repeated with the parameter at each end of its sourced range (the YAML's
``uncertainty.ranges``), or, where none is given, at the ends of its prior's central 80 %
(``value·exp(±z·σ)``, σ by how the number is sourced), one parameter at a time. The
*sensitivity band* is the lowest and highest error any single move gives: an error figure
whose band is wide rests on a constant, not on the model. The plans are compiled once
(:class:`axoplan.validate.compare.Predictor`, ``axoplan.cost.model.compile_plan``): each move prices them again
without placing a group twice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from axoplan.inputs.machine import Machine
from axoplan.inputs.machine_params import parameter_value, with_values
from axoplan.validate import metrics
from axoplan.validate.compare import PlanRuns, Predictor

__all__ = ["Move", "Sensitivity", "sensitivity"]

_CEILINGS = {"efficiency": 1.0, "processor_usage": 0.99, "speed_variation": 0.49}


@dataclass(frozen=True, slots=True)
class Move:
    """One parameter moved to the ends of its range, and the error at each end."""

    path: str
    value: float
    low: float
    high: float
    sourced: bool  # the range is the YAML's (else the prior's 80 %)
    mape_low_pct: float
    mape_high_pct: float


@dataclass(frozen=True, slots=True)
class Sensitivity:
    """The error as the machine stands, each parameter's move, and the band they span."""

    mape_pct: float
    moves: tuple[Move, ...]

    @property
    def band(self) -> tuple[float, float]:
        ends = [self.mape_pct, *(m.mape_low_pct for m in self.moves), *(m.mape_high_pct for m in self.moves)]
        return min(ends), max(ends)


def sensitivity(plans: Sequence[PlanRuns], machine: Machine, level: float = 0.8) -> Sensitivity:
    """The error of `machine` on `plans`, and with each uncertain parameter at either end of its range."""
    from axoplan.uncertainty.intervals import machine_spread

    predictor = Predictor([p.plan for p in plans])
    measured = np.array([p.measured_s for p in plans])
    ranges = dict(machine.uncertainty.ranges) if machine.uncertainty is not None else {}
    spread, _ = machine_spread(machine)
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    moves = []
    for path, sigma in zip(spread.paths, spread.rel_sigma, strict=True):
        value = parameter_value(machine, path)
        low, high = ranges.get(path, (value * math.exp(-z * sigma), value * math.exp(z * sigma)))
        high = min(high, next((c for key, c in _CEILINGS.items() if path.endswith(key)), math.inf))
        errors = [metrics.mape(predictor.step_s(with_values(machine, {path: v})), measured) for v in (low, high)]
        moves.append(Move(path, value, low, high, path in ranges, *errors))
    return Sensitivity(metrics.mape(predictor.step_s(machine), measured), tuple(moves))
