"""The validation figures recorded in README.md ("Validation") and docs/validate.md.

    python benchmarks/validation_report.py                 # both data sets (several minutes)
    python benchmarks/validation_report.py --only vtrain
    python benchmarks/validation_report.py --only vtrain --skip-model-folds

For each shipped measured data set: the error of the shipped machine YAML on all plans (the
untuned prediction), then a calibration on 70 % of the plans (seed 0) and the error before and
after on the 30 % held out, exactly as `axoplan calibrate --holdout 0.3 --seed 0` does; then the
share of plans inside their 80 % interval, on that held-out part and over all plans by 5-fold
cross-validation (every plan against a fit that never saw it; docs/uncertainty.md). For the
vTrain data, also cross-validation that holds out whole model sizes: fit on the runs of one
hidden size and check on the other, and the same for two of the four layer counts, so a fit
that only memorises the sizes it saw shows it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from axoplan.machine import load_machine
from axoplan.validate.calibrate import calibrate, split_holdout
from axoplan.validate.compare import PlanRuns, Predictor, aggregate, plan_table, summarize, validate
from axoplan.validate.coverage import coverage, cross_validated
from axoplan.validate.records import Measured, load_runs
from axoplan.validate.report import format_calibration, format_summary

REPO = Path(__file__).resolve().parent.parent
DATA = {
    "vtrain": (REPO / "data/measured/vtrain_a100_single_node_pp1.csv", "dgx-a100"),
    "cpu-gloo": (REPO / "data/measured/cpu-gloo/runs.jsonl", "local-cpu"),
}
MODEL_FOLDS: dict[str, Callable[[PlanRuns], bool]] = {
    "hold out hidden 1024 (fit on 2048)": lambda p: p.plan.model.hidden == 1024,
    "hold out hidden 2048 (fit on 1024)": lambda p: p.plan.model.hidden == 2048,
    "hold out 12 and 20 layers (fit on 16, 24)": lambda p: p.plan.model.num_layers in (12, 20),
    "hold out 16 and 24 layers (fit on 12, 20)": lambda p: p.plan.model.num_layers in (16, 24),
}


def report(name: str, model_folds: bool) -> None:
    path, machine_name = DATA[name]
    runs, machine = load_runs([path]), load_machine(machine_name)
    print(f"== {name}: {path.relative_to(REPO)} on {machine_name} ==\n")
    print("shipped machine YAML, all plans (untuned):")
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
    held = coverage([plans[i] for i in hold], result.calibrated, 0.8)
    print(f"80% interval coverage, held-out plans: {held.covered:.1%} of {held.plans}")
    t0 = time.perf_counter()
    cv = cross_validated(runs, machine, folds=5, level=0.8, seed=0)
    print(f"80% interval coverage, 5-fold cross-validation: {cv.covered:.1%} of {cv.plans} plans "
          f"({time.perf_counter() - t0:.0f} s)\n")
    if model_folds and name == "vtrain":
        held_out_by_model(runs, machine_name)


def held_out_by_model(runs: list[Measured], machine_name: str) -> None:
    """Fit on some model sizes, report the error on the others (never fitted on)."""
    machine = load_machine(machine_name)
    plans = aggregate(runs)
    by_where = {r.where: r for r in runs}
    for label, held in MODEL_FOLDS.items():
        train_runs = [by_where[p.where] for p in plans if not held(p)]
        held_plans = [p for p in plans if held(p)]
        fit = calibrate(train_runs, machine, holdout=0.0)
        table = plan_table(held_plans, Predictor([p.plan for p in held_plans])(fit.calibrated))
        s = summarize(table)
        print(f"{label}: {len(train_runs)} fitted, {s.plans} held out: MAPE {s.mape_pct:.1f} %, worst "
              f"{s.worst_pct:+.1f} %, best predicted first in {s.best_predicted_first} of {s.scenarios} scenarios")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(DATA))
    parser.add_argument("--skip-model-folds", action="store_true", help="skip the model-size cross-validation")
    args = parser.parse_args()
    for name in [args.only] if args.only else DATA:
        report(name, not args.skip_model_folds)


if __name__ == "__main__":
    main()
