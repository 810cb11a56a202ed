"""The shipped measured data sets: calibrating on part of them must order the rest better.

Thresholds come from what was measured (docs/validate.md, "Results"), with a margin.
"""

from __future__ import annotations

from axoplan.machine import load_machine
from axoplan.validate.calibrate import calibrate, split_holdout
from axoplan.validate.compare import Predictor, aggregate, plan_table, summarize
from axoplan.validate.records import load_runs
from tests.conftest import REPO

CPU = REPO / "data" / "measured" / "cpu-gloo" / "runs.jsonl"
VTRAIN = REPO / "data" / "measured" / "vtrain_a100_single_node_pp1.csv"


def test_cpu_data_set_is_what_its_readme_says() -> None:
    runs = load_runs([CPU])
    plans = aggregate(runs)
    assert len(runs) == 90 and len(plans) == 30
    assert {p.repetitions for p in plans} == {3}
    assert sorted({p.plan.world_size for p in plans}) == [4, 8]
    assert sum(p.plan.world_size == 8 for p in plans) == 20  # every ordered layout of 8 ranks
    assert {p.plan.machine for p in plans} == {"local-cpu"}


def test_calibrating_on_part_of_the_cpu_runs_orders_the_rest() -> None:
    result = calibrate(load_runs([CPU]), load_machine("local-cpu"), holdout=0.3, seed=0)
    held_before, held_after = result.holdout_before, result.holdout_after
    assert held_before is not None and held_after is not None and held_after.plans == 9
    # measured: Kendall tau 0.33 -> 0.56 and MAPE 89 % -> 24 % on the 9 held-out plans
    assert held_after.kendall_tau >= 0.40
    assert held_after.kendall_tau > held_before.kendall_tau
    assert held_after.mape_pct < held_before.mape_pct / 2


def test_shipped_calibrated_cpu_machine_beats_the_uncalibrated_one_on_held_out_plans() -> None:
    plans = aggregate(load_runs([CPU]))
    _, hold = split_holdout(len(plans), 0.3, 0)
    predict = Predictor([p.plan for p in plans])
    before = summarize(plan_table(plans, predict(load_machine("local-cpu"))).iloc[hold])
    after = summarize(plan_table(plans, predict(load_machine("local-cpu-calibrated"))).iloc[hold])
    assert after.mape_pct < before.mape_pct / 2
    assert after.kendall_tau >= 0.40


def test_the_untuned_a100_meets_issue_11s_accuracy_target_on_all_vtrain_runs() -> None:
    """Issue 11's untuned target: MAPE <= 15 % on all 720 runs with nothing fitted to them.
    Measured: 10.6 % (Kendall tau 0.880; the best in the predicted top 3 in 116 of 120)."""
    plans = aggregate(load_runs([VTRAIN]))
    s = summarize(plan_table(plans, Predictor([p.plan for p in plans])(load_machine("dgx-a100"))))
    assert s.plans == 720 and s.mape_pct <= 15.0
    assert s.kendall_tau >= 0.85 and s.best_in_top_k >= 110


def test_shipped_calibrated_a100_beats_vtrain_on_held_out_plans() -> None:
    plans = aggregate(load_runs([VTRAIN]))
    _, hold = split_holdout(len(plans), 0.3, 0)
    predict = Predictor([p.plan for p in plans])
    before = summarize(plan_table(plans, predict(load_machine("dgx-a100"))).iloc[hold])
    after = summarize(plan_table(plans, predict(load_machine("dgx-a100-calibrated"))).iloc[hold])
    # measured on the 216 held-out plans: MAPE 10.0 % untuned (the replayed host cost, the
    # sourced DGX host CPU and HBM figures and the node's measured all-reduce, issue 11; 33.0 %
    # with counted ops) -> 8.2 % calibrated (vTrain's simulator: 8.37 %), Kendall tau 0.89 -> 0.90;
    # the measured best is in the predicted top 3 in 60 of 61 scenarios
    assert before.mape_pct < 15.0
    assert after.mape_pct < 9.0 and after.mape_pct < 0.85 * before.mape_pct
    assert after.kendall_tau >= 0.85
    assert after.scenario_tau >= 0.7 and after.best_in_top_k >= 0.95 * after.scenarios


def test_cpu_intervals_cover_70_to_90_percent_of_plans_no_fit_saw() -> None:
    """5-fold cross-validation: every CPU plan is compared with the interval of a machine
    calibrated on the other four fifths. Measured: 23 of 30 (76.7%); docs/uncertainty.md."""
    from axoplan.validate.coverage import cross_validated

    c = cross_validated(load_runs([CPU]), load_machine("local-cpu"), folds=5, level=0.8, seed=0)
    assert c.plans == 30
    assert 0.7 <= c.covered <= 0.9


def test_shipped_calibrated_a100_intervals_cover_70_to_90_percent_of_held_out_vtrain_plans() -> None:
    """The shipped calibrated YAML was fitted on the 70% split (seed 0); its 80% intervals hold
    88.4% of the 216 plans it never saw (docs/validate.md, "Interval coverage")."""
    from axoplan.validate.coverage import coverage

    plans = aggregate(load_runs([VTRAIN]))
    _, hold = split_holdout(len(plans), 0.3, 0)
    c = coverage([plans[i] for i in hold], load_machine("dgx-a100-calibrated"), 0.8)
    assert c.plans == 216
    assert 0.7 <= c.covered <= 0.9


def test_parameters_the_cpu_runs_cannot_pin_keep_about_their_prior_spread() -> None:
    """The CPU fit drives efficiencies to their bound of 1, where s²(JᵀJ)⁺ alone gave spreads
    up to ±9,000,000%; the stored covariance is bounded by the prior (each parameter's spread at
    most its prior by source), a parameter at its bound keeps about its prior spread, and the
    runs do pin some others (with the shared cores of issue 11: the GEMM size curve and the
    host's cost per op) well below theirs."""
    from axoplan.uncertainty import DEFAULT_SOURCES, PRIOR_REL_SIGMA

    result = calibrate(load_runs([CPU]), load_machine("local-cpu"), holdout=0.3, seed=0)
    prior = {f.path: PRIOR_REL_SIGMA[DEFAULT_SOURCES[f.path]] for f in result.fitted}
    assert all(0 < f.rel_sigma <= prior[f.path] + 1e-9 for f in result.fitted)
    at_bound = [f for f in result.fitted if f.at_bound]
    assert at_bound and all(f.rel_sigma >= 0.9 * prior[f.path] for f in at_bound)
    pinned = {f.path for f in result.fitted if not f.at_bound and f.rel_sigma < 0.75 * prior[f.path]}
    assert pinned
