"""Joining runs with predictions: pooling repetitions, per-plan errors, scenario metrics."""

from __future__ import annotations

import numpy as np
import pytest

from axoplan.cost.model import predict
from axoplan.space.candidates import Candidates
from axoplan.validate.compare import Predictor, aggregate, validate
from axoplan.validate.records import Measured
from tests.validate_helpers import small_plans, synthetic_runs, theory_machine


def test_repetitions_of_a_plan_are_pooled_by_median() -> None:
    plan = small_plans(worlds=(4,), micro_batches=(1,), recompute=(False,))[0]
    runs = [Measured(plan, t, f"r:{i}", phase_s={"gemm": g}) for i, (t, g) in enumerate([(1.0, 0.1), (4.0, 0.3),
                                                                                         (2.0, 0.2)])]
    [pooled] = aggregate(runs)
    assert pooled.measured_s == 2.0 and pooled.repetitions == 3
    assert pooled.spread_s == pytest.approx(np.std([1.0, 4.0, 2.0], ddof=1))
    assert pooled.phase_s == {"gemm": pytest.approx(0.2)}
    assert pooled.where == "r:0"


def test_predictor_equals_predicting_each_plan_alone() -> None:
    machine = theory_machine()
    plans = small_plans(worlds=(4, 8), micro_batches=(1, 4), recompute=(False, True))
    got = Predictor(plans)(machine)["t_step_s"]
    for plan, t in zip(plans, got, strict=True):
        one = Candidates.single(plan.layout.to_layout(), plan.micro_batch, plan.recompute, plan.cache_weights)
        assert t == pytest.approx(predict(plan.model, machine, plan.options, one).columns["t_step_s"][0], rel=1e-12)
    assert Predictor(plans).step_s(machine) == pytest.approx(got, rel=1e-12)


def test_errors_are_what_the_measurements_were_made_off_by() -> None:
    machine = theory_machine()
    plans = small_plans(worlds=(4,), micro_batches=(1, 2), recompute=(False,))
    off = [1.25 if i % 2 else 0.8 for i in range(len(plans))]  # measured = predicted x factor
    result = validate(synthetic_runs(plans, machine, off), machine)
    expected = [100 * (1 / f - 1) for f in off]  # predicted/measured - 1 = 1/f - 1: -20 % or +25 %
    assert result.table["error_pct"].to_numpy() == pytest.approx(expected)
    assert result.summary.mape_pct == pytest.approx(np.mean(np.abs(expected)))
    assert result.summary.worst_pct == pytest.approx(25.0)
    assert result.summary.plans == len(plans) == result.summary.runs


def test_perfect_predictions_rank_every_scenario_right() -> None:
    machine = theory_machine()
    plans = small_plans(worlds=(4, 8), micro_batches=(1, 2), recompute=(False,))
    s = validate(synthetic_runs(plans, machine), machine, top_k=1).summary
    assert s.mape_pct == pytest.approx(0.0, abs=1e-9)
    assert s.kendall_tau == pytest.approx(1.0) and s.spearman_rho == pytest.approx(1.0)
    assert s.scenarios == 2  # one per world size (same model and batch)
    assert s.best_in_top_k == s.best_predicted_first == 2
    assert s.scenario_tau == pytest.approx(1.0)


def test_reversed_measurements_give_negative_tau_within_the_scenario() -> None:
    machine = theory_machine()
    plans = small_plans(worlds=(8,), micro_batches=(1,), recompute=(False,))
    predicted = Predictor(plans).step_s(machine)
    runs = [Measured(p, float(10.0 / t), f"r:{i}") for i, (p, t) in enumerate(zip(plans, predicted, strict=True))]
    s = validate(runs, machine).summary
    assert s.scenarios == 1
    assert s.scenario_tau < -0.9
    assert s.best_predicted_first == 0


def test_table_carries_the_predicted_parts_that_sum_to_the_step() -> None:
    machine = theory_machine()
    table = validate(synthetic_runs(small_plans(worlds=(8,), micro_batches=(2,)), machine), machine).table
    parts = table.filter(like="pred_t_").sum(axis=1)
    assert parts.to_numpy() == pytest.approx(table["predicted_s"].to_numpy(), rel=1e-9)
    assert table["feasible"].all()


def test_a_validation_of_several_files_gives_each_files_error() -> None:
    """Runs of one machine from two files: one line per file, with that file's plans, MAPE and signed error."""
    from axoplan.validate.report import format_validation

    machine = theory_machine()
    plans = small_plans(worlds=(4,), micro_batches=(1, 2), recompute=(False,))
    times = Predictor(plans).step_s(machine)
    runs = [Measured(p, float(t / 1.1) if i % 2 else float(t * 1.25), f"{'a' if i % 2 else 'b'}.jsonl:{i + 1}")
            for i, (p, t) in enumerate(zip(plans, times, strict=True))]
    text = format_validation(validate(runs, machine), rows=False)
    n_a, n_b = len(plans) // 2, len(plans) - len(plans) // 2
    assert f"\n  from b.jsonl: {n_b} plans, MAPE 20.0%, mean signed error -20.0%" in text
    assert f"\n  from a.jsonl: {n_a} plans, MAPE 10.0%, mean signed error +10.0%" in text
    one_file = [Measured(r.plan, r.t_step_s, "a.jsonl:" + r.where.split(":")[1]) for r in runs]
    assert "  from " not in format_validation(validate(one_file, machine), rows=False)
