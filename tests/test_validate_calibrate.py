"""Calibration: recovering known parameters (plain least squares, ``prior=False``: the synthetic runs start
far from the truth on purpose), the prior's pull, the held-out split, and what may be fitted."""

from __future__ import annotations

import numpy as np
import pytest

from axoplan.errors import AxoplanError
from axoplan.validate.calibrate import PARAMETERS, calibrate, parameter_value, split_holdout, with_values
from axoplan.validate.compare import Predictor
from tests.validate_helpers import TRUE_VALUES, small_plans, synthetic_runs, theory_machine

START_FACTORS = [1.3, 0.5, 1.5, 0.7, 1.4, 3.0, 0.7, 0.4]  # how far from the truth each fit starts


def test_fit_recovers_the_parameters_the_runs_were_made_with() -> None:
    truth = with_values(theory_machine(), TRUE_VALUES)
    runs = synthetic_runs(small_plans(), truth)  # 2..16 GPUs on 4-GPU nodes: both link levels are used
    start = with_values(truth, {k: v * f for (k, v), f in zip(TRUE_VALUES.items(), START_FACTORS, strict=True)})
    result = calibrate(runs, start, parameters=list(TRUE_VALUES), holdout=0.3, seed=0, prior=False)
    assert {f.path for f in result.fitted} == set(TRUE_VALUES)
    for f in result.fitted:
        assert f.after == pytest.approx(TRUE_VALUES[f.path], rel=1e-3), f.path
        assert f.before == pytest.approx(parameter_value(start, f.path))
    assert result.holdout_after is not None and result.holdout_before is not None
    assert result.holdout_after.mape_pct < 0.1 < result.holdout_before.mape_pct


def test_a_host_op_cost_that_binds_is_found_from_far_away() -> None:
    """The host acts through max(host, device): least squares sees no slope where the host
    does not bind, so the fit starts from a scan. Truth: an op cost that makes the host bind
    for the small micro-batches only (the median plan's device time per host op)."""
    plans = small_plans()
    base = with_values(theory_machine(), {**TRUE_VALUES, "host.op_us": 0.01})
    per_op_us = [float(Predictor([p])(base)["t_step_s"][0]) / p.grad_accum_steps / (p.model.num_layers * 60) * 1e6
                 for p in plans]
    cost = float(np.median(per_op_us))
    truth = with_values(base, {"host.op_us": cost})
    runs = synthetic_runs(plans, truth)
    start = with_values(truth, {"host.op_us": 10.0 if cost < 5 else 0.5})
    result = calibrate(runs, start, parameters=["host.op_us"], holdout=0.0, prior=False)
    assert result.fitted[0].after == pytest.approx(cost, rel=1e-2)
    assert result.train_after.mape_pct < 0.5 < result.train_before.mape_pct


def test_noisy_runs_still_land_near_the_truth() -> None:
    truth = with_values(theory_machine(), TRUE_VALUES)
    plans = small_plans()
    noise = np.exp(np.random.default_rng(1).normal(0.0, 0.03, len(plans)))  # ~3 % multiplicative noise
    start = with_values(truth, {"gemm.max_efficiency": 0.9, "intra_node.latency_us": 5.0})
    result = calibrate(synthetic_runs(plans, truth, list(noise)), start,
                       parameters=["gemm.max_efficiency", "intra_node.latency_us"], holdout=0.3, seed=0,
                       prior=False)
    fitted = {f.path: f for f in result.fitted}
    assert fitted["gemm.max_efficiency"].after == pytest.approx(0.6, rel=0.03)
    assert fitted["intra_node.latency_us"].after == pytest.approx(20.0, rel=0.25)
    assert all(0 < f.rel_sigma < 0.5 for f in result.fitted)
    assert result.holdout_after.mape_pct < result.holdout_before.mape_pct


def test_single_node_runs_leave_the_network_alone() -> None:
    truth = with_values(theory_machine(), TRUE_VALUES)
    runs = synthetic_runs(small_plans(worlds=(2, 4)), truth)  # 4 GPUs per node: nothing crosses nodes
    result = calibrate(runs, theory_machine(), holdout=0.0, prior=False)
    # nothing crosses nodes, and the runs use FlashAttention-2, not the Triton kernel
    assert set(result.unused) == {"inter_node.efficiency", "inter_node.latency_us", "inter_node.scale_exponent",
                                  "attention_triton_efficiency"}
    assert result.calibrated.inter_node == theory_machine().inter_node
    assert result.holdout_before is None and result.holdout_after is None


def test_split_is_seeded_disjoint_and_complete() -> None:
    train, hold = split_holdout(10, 0.3, seed=0)
    assert len(hold) == 3 and len(train) == 7
    assert sorted([*train, *hold]) == list(range(10))
    again_train, again_hold = split_holdout(10, 0.3, seed=0)
    assert hold.tolist() == again_hold.tolist()
    assert any(split_holdout(10, 0.3, seed=s)[1].tolist() != hold.tolist() for s in range(1, 5))
    assert len(split_holdout(10, 0.0, seed=0)[1]) == 0


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5])
def test_bad_holdout_fraction(fraction: float) -> None:
    with pytest.raises(AxoplanError, match="--holdout"):
        split_holdout(10, fraction, 0)


def test_holding_out_everything_is_refused() -> None:
    with pytest.raises(AxoplanError, match="leaves none to fit"):
        split_holdout(1, 0.6, 0)


def test_unknown_parameter_gets_a_hint() -> None:
    runs = synthetic_runs(small_plans(worlds=(4,)), theory_machine())
    with pytest.raises(AxoplanError, match=r"unknown parameter 'gemm.max_eff' \(did you mean 'gemm.max_efficiency'"):
        calibrate(runs, theory_machine(), parameters=["gemm.max_eff"])


def test_insensitive_runs_are_refused() -> None:
    runs = synthetic_runs(small_plans(worlds=(4,)), theory_machine())
    with pytest.raises(AxoplanError, match="not sensitive to any fittable parameter"):
        calibrate(runs, theory_machine(), parameters=["inter_node.latency_us"])


def test_every_parameter_path_exists_and_its_bounds_hold_the_shipped_values() -> None:
    m = theory_machine()
    for p in PARAMETERS:
        value = parameter_value(m, p.path)
        assert p.low <= value <= p.high, p.path
        assert parameter_value(with_values(m, {p.path: p.high}), p.path) == p.high


def test_the_loss_of_bandwidth_with_scale_is_fitted_from_multi_node_runs() -> None:
    """Runs on 2 to 64 nodes made with a known scale exponent: the fit finds it."""
    base = with_values(theory_machine(), TRUE_VALUES)
    plans = [p for p in small_plans(worlds=(8, 32, 128, 256), micro_batches=(1,), recompute=(False,),
                                    global_batch=256) if p.layout.gdata >= 8]
    truth = with_values(base, {"inter_node.scale_exponent": 0.3})
    runs = synthetic_runs(plans, truth)
    start = with_values(base, {"inter_node.scale_exponent": 0.05})
    result = calibrate(runs, start, parameters=["inter_node.scale_exponent"], holdout=0.0, prior=False)
    assert result.fitted[0].after == pytest.approx(0.3, rel=1e-2)


def test_the_prior_keeps_a_fit_between_the_sourced_value_and_what_the_runs_say() -> None:
    """Maximum a posteriori: from few noisy runs, a parameter lands between the machine's sourced value
    and the plain least-squares estimate (the prior's pull), and the prior's residuals are exactly
    ``(log θ − log θ₀)/σ₀``: a parameter the runs say nothing about does not move."""
    truth = with_values(theory_machine(), TRUE_VALUES)
    plans = small_plans(worlds=(2, 4))
    noise = np.exp(np.random.default_rng(1).normal(0.0, 0.3, len(plans)))
    runs = synthetic_runs(plans, truth, list(noise))
    start = theory_machine()
    plain = calibrate(runs, start, parameters=["gemm.max_efficiency"], holdout=0.0, prior=False)
    shrunk = calibrate(runs, start, parameters=["gemm.max_efficiency"], holdout=0.0, prior=True)
    sourced = start.gemm.max_efficiency
    (p_fit,), (s_fit,) = plain.fitted, shrunk.fitted
    assert p_fit.after != pytest.approx(sourced, rel=1e-3)
    assert min(sourced, p_fit.after) <= s_fit.after <= max(sourced, p_fit.after)
    assert s_fit.after != pytest.approx(p_fit.after, rel=1e-4)  # the prior pulls
