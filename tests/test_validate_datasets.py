"""The shipped measured data sets: the untuned machines' headline figures, and what calibration does.

A headline figure is asserted within about 1.5 points of what was measured (docs/validate.md,
"Across sources"); a figure that moves is changed here with the reason in the commit.
"""

from __future__ import annotations

from axoplan.inputs.machine import Machine, load_machine
from axoplan.validate.calibrate import calibrate, split_holdout
from axoplan.validate.compare import Predictor, aggregate, plan_table, summarize
from axoplan.validate.records import load_runs
from tests.conftest import REPO

CPU = REPO / "data" / "measured" / "cpu-gloo" / "runs.jsonl"
VTRAIN = REPO / "data" / "measured" / "vtrain_a100_single_node_pp1.csv"
LLM_FOUNDRY = REPO / "data" / "measured" / "llm-foundry" / "runs-a100.csv"


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


def test_the_untuned_a100_on_all_vtrain_runs() -> None:
    """The headline (docs/validate.md, "Across sources"): the shipped dgx-a100, nothing fitted to these
    runs, on all 720: MAPE 8.9 % (bias -2.9 %), Kendall tau 0.885, the best in the predicted top 3 in
    116 of 120 scenarios, no run called out of memory. Asserted within 1.5 points."""
    plans = aggregate(load_runs([VTRAIN]))
    s = summarize(plan_table(plans, Predictor([p.plan for p in plans])(load_machine("dgx-a100"))))
    assert s.plans == 720 and abs(s.mape_pct - 8.9) <= 1.5 and abs(s.bias_pct + 2.9) <= 1.5
    assert s.kendall_tau >= 0.87 and s.best_in_top_k >= 114 and s.does_not_fit == 0


def test_calibrating_on_vtrain_does_not_beat_the_untuned_machine_on_held_out_plans() -> None:
    """The shipped calibrated YAML is the maximum-a-posteriori fit to 504 of the 720 plans. On the
    216 it never saw: untuned 8.1 %, calibrated 8.5 % (the sourced machine already sits near the
    fit's optimum; docs/validate.md), Kendall tau 0.90, the measured best in the predicted top 3
    in 60 of 61 scenarios. Asserted within 1.5 points, and under issue 11's bounds (calibrated
    below 9 %, scenario tau at least 0.7). Issue 11's "calibrated at most 0.85 x untuned" no longer
    holds (8.5 against 8.1 %: the untuned machine improved from 10.0 %, the calibrated one moved
    from 8.2 %); it was removed, not loosened, and this test's name says so."""
    plans = aggregate(load_runs([VTRAIN]))
    _, hold = split_holdout(len(plans), 0.3, 0)
    predict = Predictor([p.plan for p in plans])
    before = summarize(plan_table(plans, predict(load_machine("dgx-a100"))).iloc[hold])
    after = summarize(plan_table(plans, predict(load_machine("dgx-a100-calibrated"))).iloc[hold])
    assert abs(before.mape_pct - 8.1) <= 1.5 and abs(after.mape_pct - 8.5) <= 1.5
    assert after.mape_pct < 9.0  # the calibrated bound of issue 11, kept
    assert after.kendall_tau >= 0.88 and after.best_in_top_k >= 60 and after.scenarios == 61
    assert after.scenario_tau >= 0.7  # issue 11's bound, kept (measured 0.78)


def test_the_untuned_a100s_on_llm_foundrys_fsdp_runs() -> None:
    """Issue 22's targets on the 139 published FSDP steps nobody fitted to (docs/validate.md, "Across
    sources"), priced since issue 29 from the traced op ledger of llm-foundry's MPT (frameworks/pytorch-fsdp.yaml):
    MAPE 6.9 % on the 40 GB runs and 7.3 % on the 80 GB ones (10.6 % and 8.6 % counted), 7.0 % over all (target
    <= 10 %), bias -3.8 % over all (target |bias| <= 5 %; -7.2 % counted), no run called out of memory,
    throughput per GPU ordered across GPU counts with Kendall tau 0.76 (target >= 0.5), 86 % of runs inside their
    80 % interval (target 70-90 %: the machine's parameter spread and the 10 % model error).

    Issue 29 widens an untuned interval by how far it reaches beyond what was measured; these are the very runs
    the profile was held against on these devices (``measured_on``), so the A100s' derived op classes do not
    widen it here (the counted profile's rule, decided after a first version covered 100 %; for the ledger, after
    the derived classes' reach covered 91-92 %: docs/decisions.md)."""
    import numpy as np

    from axoplan.inputs.machine import ParameterUncertainty
    from axoplan.uncertainty.intervals import DEFAULT_MODEL_SIGMA
    from axoplan.validate.coverage import coverage

    def issue_22(machine: Machine) -> Machine:  # the model error marked known: no reach term
        u = machine.uncertainty or ParameterUncertainty()
        return machine.model_copy(update={"uncertainty": u.model_copy(update={"model_error": DEFAULT_MODEL_SIGMA})})

    runs = load_runs([LLM_FOUNDRY])
    errors, inside, widened = [], [], []
    for machine, mape in (("dgx-a100", 6.9), ("dgx-a100-80gb", 7.3)):
        plans = aggregate([r for r in runs if r.plan.machine == machine])
        table = plan_table(plans, Predictor([p.plan for p in plans])(load_machine(machine)))
        s = summarize(table)
        assert abs(s.mape_pct - mape) <= 1.5 and s.does_not_fit == 0
        if machine == "dgx-a100":
            assert s.scaling_groups == 9 and s.scaling_tau >= 0.5
        errors += list(table["error_pct"])
        inside += list(coverage(plans, issue_22(load_machine(machine)), 0.8).inside)
        widened += list(coverage(plans, load_machine(machine), 0.8).inside)
    assert len(errors) == 139
    assert abs(np.abs(errors).mean() - 7.0) <= 1.5 and abs(np.mean(errors) + 3.8) <= 1.5
    assert 0.70 <= np.mean(inside) <= 0.90
    assert 0.70 <= np.mean(widened) <= 0.90 and widened == inside


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
    from axoplan.uncertainty.intervals import DEFAULT_SOURCES, PRIOR_REL_SIGMA

    result = calibrate(load_runs([CPU]), load_machine("local-cpu"), holdout=0.3, seed=0)
    prior = {f.path: PRIOR_REL_SIGMA[DEFAULT_SOURCES[f.path]] for f in result.fitted}
    assert all(0 < f.rel_sigma <= prior[f.path] + 1e-9 for f in result.fitted)
    at_bound = [f for f in result.fitted if f.at_bound]
    assert at_bound and all(f.rel_sigma >= 0.9 * prior[f.path] for f in at_bound)
    pinned = {f.path for f in result.fitted if not f.at_bound and f.rel_sigma < 0.75 * prior[f.path]}
    assert pinned
