"""Metrics on hand-made data: every expected value is worked out in the comment beside it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from axoplan.validate import metrics


def test_percent_errors_are_signed_relative_to_measured() -> None:
    # (1.1 - 1)/1 = +10 %, (0.9 - 1)/1 = -10 %, (3 - 2)/2 = +50 %
    assert metrics.percent_errors([1.1, 0.9, 3.0], [1.0, 1.0, 2.0]) == pytest.approx([10.0, -10.0, 50.0])


def test_mape_is_the_mean_absolute_percentage_error() -> None:
    # |+10| + |-10| + |+50| = 70, over 3 runs
    assert metrics.mape([1.1, 0.9, 3.0], [1.0, 1.0, 2.0]) == pytest.approx(70.0 / 3)


def test_worst_error_keeps_its_sign_and_index() -> None:
    # errors +10 %, -50 %, +20 %: the worst is run 1 at -50 %
    assert metrics.worst_error([1.1, 0.5, 1.2], [1.0, 1.0, 1.0]) == (1, pytest.approx(-50.0))


def test_kendall_tau_of_one_swapped_pair() -> None:
    # 4 items, 6 pairs; swapping the last two makes 1 discordant: (5 - 1)/6
    assert metrics.kendall_tau([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(4 / 6)


def test_kendall_tau_of_a_reversal_is_minus_one() -> None:
    assert metrics.kendall_tau([1, 2, 3, 4, 5], [5, 4, 3, 2, 1]) == pytest.approx(-1.0)


def test_spearman_rho_of_one_swapped_pair() -> None:
    # rank differences 0,0,1,1: sum d^2 = 2; rho = 1 - 6*2/(4*(16-1)) = 0.8
    assert metrics.spearman_rho([1, 2, 3, 4], [1, 2, 4, 3]) == pytest.approx(0.8)


@pytest.mark.parametrize(("pred", "meas"), [([1.0], [1.0]), ([1.0, 1.0], [1.0, 2.0]), ([1.0, 2.0], [3.0, 3.0])])
def test_correlations_are_nan_without_two_distinct_values(pred: list[float], meas: list[float]) -> None:
    assert math.isnan(metrics.kendall_tau(pred, meas))
    assert math.isnan(metrics.spearman_rho(pred, meas))


def test_predicted_rank_of_the_measured_best() -> None:
    # measured best is run 1 (1.0); its prediction 3.0 is beaten by 1.0 and 2.0: rank 3
    assert metrics.predicted_rank_of_best([1.0, 3.0, 2.0], [3.0, 1.0, 2.0]) == 3
    assert not metrics.best_in_top_k([1.0, 3.0, 2.0], [3.0, 1.0, 2.0], 2)
    assert metrics.best_in_top_k([1.0, 3.0, 2.0], [3.0, 1.0, 2.0], 3)


def test_a_tie_in_the_prediction_counts_for_the_measured_best() -> None:
    # runs 0 and 1 are predicted equal; the measured best (run 1) still ranks first
    assert metrics.predicted_rank_of_best([1.0, 1.0, 2.0], [2.0, 1.0, 3.0]) == 1


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="1-D arrays of one length"):
        metrics.mape([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        metrics.mape([1.0], [0.0])
    with pytest.raises(ValueError, match="at least 1"):
        metrics.best_in_top_k([1.0], [1.0], 0)


def test_grouped_keeps_first_appearance_order() -> None:
    groups = metrics.grouped(["b", "a", "b", "c", "a"])
    assert [g.tolist() for g in groups] == [[0, 2], [1, 4], [3]]


def test_empty_inputs_give_nan_not_errors() -> None:
    assert math.isnan(metrics.mape([], []))
    assert metrics.worst_error([], [])[0] == -1


times = st.lists(st.integers(min_value=1, max_value=10**6), min_size=2, max_size=30, unique=True).map(
    lambda ms: [m / 1000.0 for m in ms])  # distinct times from 1 ms to 1000 s


@given(times)
def test_tau_and_rho_are_one_against_any_increasing_transform(values: list[float]) -> None:
    pred = np.array(values)
    meas = 3.0 * pred**1.5 + 0.1  # strictly increasing in pred
    assert metrics.kendall_tau(pred, meas) == pytest.approx(1.0)
    assert metrics.spearman_rho(pred, meas) == pytest.approx(1.0)
    assert metrics.predicted_rank_of_best(pred, meas) == 1


@given(times, times)
def test_metric_ranges(pred: list[float], meas: list[float]) -> None:
    n = min(len(pred), len(meas))
    p, m = np.array(pred[:n]), np.array(meas[:n])
    assert metrics.mape(p, m) >= 0
    assert abs(metrics.worst_error(p, m)[1]) >= metrics.mape(p, m) - 1e-9
    assert 1 <= metrics.predicted_rank_of_best(p, m) <= n
    tau = metrics.kendall_tau(p, m)
    assert -1.0 - 1e-12 <= tau <= 1.0 + 1e-12
    assert metrics.mape(m, m) == 0.0
