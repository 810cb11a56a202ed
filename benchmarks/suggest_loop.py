"""The suggest-measure-calibrate loop on the vTrain single-node data (README, docs/uncertainty.md).

    python benchmarks/suggest_loop.py                  # all 120 scenarios, k = 1 and 2
    python benchmarks/suggest_loop.py --scenarios 24 -k 2

Starting from the uncalibrated `dgx-a100`, each scenario (one model, batch and GPU count)
is visited in order; each round times k of its plans (reads their measured time), refits
the machine on everything timed so far, and chooses again, until the scenario's measured
fastest plan has been timed (`axoplan/validate/loop.py`). Prints, per rule, the plans timed
in all, the scenarios settled in the first round, and the wall time.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from axoplan.inputs.machine import load_machine
from axoplan.validate.compare import aggregate
from axoplan.validate.loop import RULES, run_loop, scenarios
from axoplan.validate.records import load_runs

DATA = Path(__file__).resolve().parent.parent / "data/measured/vtrain_a100_single_node_pp1.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=None, help="first N scenarios only")
    parser.add_argument("-k", type=int, action="append", help="plans per round (repeatable; default 1 and 2)")
    parser.add_argument("--rule", choices=RULES, action="append", help="rule (repeatable; default both)")
    args = parser.parse_args()
    groups = scenarios(aggregate(load_runs([DATA])))[: args.scenarios]
    machine = load_machine("dgx-a100")
    plans = sum(len(g) for g in groups)
    print(f"{len(groups)} scenarios, {plans} plans (all of them would be timed without a planner)")
    for k in args.k or [1, 2]:
        for rule in args.rule or RULES:
            started = time.perf_counter()
            r = run_loop(groups, machine, k, rule)
            print(f"k={k} {rule:8s}: {r.total} plans timed ({r.total / plans:.0%} of all), fastest found in the "
                  f"first round for {r.first_round} of {len(groups)} scenarios, {r.fits} refits, "
                  f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
