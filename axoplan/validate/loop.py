"""The suggest-measure-calibrate loop, replayed on a data set where every layout was measured.

A user of a new machine does not time every layout. They time the k that `axoplan suggest`
picks, calibrate the machine on everything timed so far, and suggest again. Replayed on
measured data, "timing" a plan is reading its recorded time, and the loop's cost for one
scenario (one model, batch and GPU count) is the number of plans timed until the
scenario's measured fastest plan is among them.

Two rules choose the next k plans of a scenario among those not yet timed:

* ``suggest``: highest probability of being fastest first, one per 4D layout per round
  (:func:`axoplan.uncertainty.intervals.suggest_indices`, as `axoplan suggest` does);
* ``point``: the k best by point prediction.

Both refit the machine after every round (:func:`axoplan.validate.calibrate.refit`, warm-
started from the previous round), so the only difference is the choice. Scenarios are
visited in order and what was learnt on earlier ones is kept, as on a real machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from axoplan.errors import AxoplanError
from axoplan.inputs.machine import Machine
from axoplan.search.ranking import Ranking, rank_candidates
from axoplan.validate.calibrate import refit
from axoplan.validate.compare import PlanRuns, plan_candidates, scenario_key

__all__ = ["Rule", "RULES", "LoopResult", "scenarios", "next_plans", "run_loop", "LOOP_PARAMETERS"]

Rule = Literal["suggest", "point"]
RULES: tuple[Rule, ...] = ("suggest", "point")
LOOP_PARAMETERS: tuple[str, ...] = ("gemm.max_efficiency", "memory_efficiency", "intra_node.latency_us",
                                    "host.op_us")
"""Parameters refitted between rounds on single-node data: the ones that order one scenario's
layouts (GEMM efficiency, unfused attention's memory traffic, tensor-parallel collectives, the
host's cost per op that sets the floor of small micro-batches) [decision, docs/uncertainty.md]."""


@dataclass(frozen=True, slots=True)
class LoopResult:
    """Plans timed per scenario until its measured fastest was among them, by one rule."""

    rule: Rule
    k: int
    measured: tuple[int, ...]
    sizes: tuple[int, ...]  # plans in each scenario
    fits: int
    machine: Machine  # after the last scenario

    @property
    def total(self) -> int:
        return sum(self.measured)

    @property
    def first_round(self) -> int:
        """Scenarios whose fastest was among the first k plans timed."""
        return sum(m <= self.k for m in self.measured)


def scenarios(plans: Sequence[PlanRuns], min_plans: int = 2) -> list[list[PlanRuns]]:
    """The plans grouped by scenario, in order of first appearance; groups of at least `min_plans`."""
    groups: dict[str, list[PlanRuns]] = {}
    for p in plans:
        groups.setdefault(scenario_key(p.plan), []).append(p)
    return [g for g in groups.values() if len(g) >= min_plans]


def _ranking(plans: Sequence[PlanRuns], machine: Machine) -> Ranking:
    first = plans[0].plan
    return rank_candidates(first.model, machine, first.options, first.world_size,
                           plan_candidates([p.plan for p in plans]), framework_code=False)  # measured: they ran


def next_plans(plans: Sequence[PlanRuns], machine: Machine, timed: Sequence[int], k: int, rule: Rule) -> list[int]:
    """The next k plans of one scenario to time (indices into `plans`), none of `timed`.

    ``suggest`` ranks the untimed plans by the probability of being faster than every other
    untimed plan *and* the fastest time measured so far (``beat_s`` of
    :func:`axoplan.uncertainty.intervals.with_intervals`): what is measured is known, not predicted.
    """
    from axoplan.uncertainty.intervals import suggest_indices, with_intervals

    untimed = [i for i in range(len(plans)) if i not in timed]
    r = _ranking([plans[i] for i in untimed], machine)
    if rule == "suggest":
        beat = min((plans[i].measured_s for i in timed), default=np.inf)
        chosen = suggest_indices(with_intervals(r, beat_s=beat), k)
    else:
        chosen = []
    chosen += [int(i) for i in r.order if int(i) not in chosen][: k - len(chosen)]  # infeasible last
    return [untimed[i] for i in chosen]


def run_loop(groups: Sequence[Sequence[PlanRuns]], machine: Machine, k: int, rule: Rule,
             parameters: Sequence[str] = LOOP_PARAMETERS, max_nfev: int = 30) -> LoopResult:
    """Replay the loop over the scenarios `groups`, starting from `machine`."""
    if k < 1 or rule not in RULES:
        raise AxoplanError(f"the loop needs k >= 1 (got {k}) and a rule among {', '.join(RULES)} (got {rule!r})")
    history: list[PlanRuns] = []
    counts, fits = [], 0
    for plans in groups:
        best = int(np.argmin([p.measured_s for p in plans]))
        timed: list[int] = []
        while best not in timed:
            new = next_plans(plans, machine, timed, k, rule)
            timed += new
            history += [plans[i] for i in new]
            machine = refit(history, machine, parameters, max_nfev)
            fits += 1
        counts.append(len(timed))
    return LoopResult(rule, k, tuple(counts), tuple(len(g) for g in groups), fits, machine)
