"""The validation figures recorded in README.md ("Validation") and docs/validate.md.

    python benchmarks/validation_report.py            # both data sets (about a minute)
    python benchmarks/validation_report.py --only vtrain

For each shipped measured data set: the error of the shipped machine YAML on all plans,
then a calibration on 70 % of the plans (seed 0) and the error before and after on the
30 % held out, exactly as `axoplan calibrate --holdout 0.3 --seed 0` does.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from axoplan.machine import load_machine
from axoplan.validate.calibrate import calibrate, split_holdout
from axoplan.validate.compare import Predictor, aggregate, plan_table, summarize, validate
from axoplan.validate.records import load_runs
from axoplan.validate.report import format_calibration, format_summary

REPO = Path(__file__).resolve().parent.parent
DATA = {
    "vtrain": (REPO / "data/measured/vtrain_a100_single_node_pp1.csv", "dgx-a100"),
    "cpu-gloo": (REPO / "data/measured/cpu-gloo/runs.jsonl", "local-cpu"),
}


def report(name: str) -> None:
    path, machine_name = DATA[name]
    runs, machine = load_runs([path]), load_machine(machine_name)
    print(f"== {name}: {path.relative_to(REPO)} on {machine_name} ==\n")
    print("shipped machine YAML, all plans:")
    print(format_summary(validate(runs, machine).summary), "\n")
    t0 = time.perf_counter()
    result = calibrate(runs, machine, holdout=0.3, seed=0)
    print(f"calibration ({time.perf_counter() - t0:.1f} s):")
    print(format_calibration(result), "\n")
    plans = aggregate(runs)
    _, hold = split_holdout(len(plans), 0.3, 0)
    after = plan_table(plans, Predictor([p.plan for p in plans])(result.calibrated))
    print("calibrated machine, held-out plans only:")
    print(format_summary(summarize(after.iloc[hold])), "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(DATA))
    args = parser.parse_args()
    for name in [args.only] if args.only else DATA:
        report(name)


if __name__ == "__main__":
    main()
