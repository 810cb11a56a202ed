"""Prediction intervals and P(best) on synthetic data drawn from known parameters and noise."""

from __future__ import annotations

import numpy as np
import pytest

from axoplan.cost.model import predict
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.uncertainty.intervals import PRIOR_REL_SIGMA, intervals, prior_spread, sensitivities
from axoplan.validate.calibrate import parameter_value, with_values
from tests.validate_helpers import SMALL, theory_machine


def _synthetic(n: int, p: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t0 = rng.uniform(1.0, 1.2, n)
    jac = rng.uniform(-1.0, 1.0, (n, p))
    a = rng.normal(size=(p, p)) * 0.05
    return t0, jac, a @ a.T + np.eye(p) * 0.01


@pytest.mark.parametrize("level", [0.5, 0.8, 0.95])
def test_intervals_reach_nominal_coverage(level: float) -> None:
    t0, jac, cov = _synthetic(50, 4, 1)
    sigma_model = 0.08
    iv = intervals(t0, jac, cov, sigma_model, level=level, samples=10)
    rng = np.random.default_rng(7)
    draws = 4000
    z = rng.multivariate_normal(np.zeros(4), cov, draws)
    truth = t0 * np.exp(z @ jac.T + rng.normal(0, sigma_model, (draws, t0.size)))
    covered = ((truth >= iv.low_s) & (truth <= iv.high_s)).mean()
    assert abs(covered - level) < 0.02


def test_p_best_sums_to_one_and_concentrates_as_noise_falls() -> None:
    t0, jac, cov = _synthetic(30, 3, 2)
    t0[5] = 0.9  # a clear point-best
    spread = []
    for scale in (1.0, 0.1, 0.01):
        iv = intervals(t0, jac, cov * scale**2, 0.1 * scale, samples=2000)
        assert iv.p_best.sum() == pytest.approx(1.0)
        assert iv.tied[5]
        spread.append(iv.p_best[5])
    assert spread[0] < spread[1] < spread[2] or spread[2] == 1.0
    assert spread[2] > 0.99 and spread[0] < 0.9


def test_noncontenders_have_zero_probability_and_ties_need_overlap() -> None:
    t0 = np.array([1.0, 1.001, 2.0])
    jac = np.zeros((3, 1))
    iv = intervals(t0, jac, np.eye(1) * 0.01, 0.05, contenders=np.array([True, True, False]), samples=4000)
    assert iv.p_best[2] == 0.0 and not iv.tied[2]
    assert iv.tied[0] and iv.tied[1]
    assert 0.4 < iv.p_best[0] < 0.6


def test_sensitivities_match_the_cost_model_resampled() -> None:
    """The linearised log-time of a 10% parameter change agrees with re-running the model (away
    from the host-bound kink of max(host, device), which a linearisation cannot follow)."""
    machine = with_values(theory_machine(), {"host.op_us": 0.01})
    opts = RunOptions(global_batch=16, seq_len=512, micro_batches=(1, 2))
    cands = Candidates.enumerate(8, opts)
    paths = ("gemm.max_efficiency", "intra_node.efficiency")
    values = {p: parameter_value(machine, p) for p in paths}

    def step_s(v: dict[str, float]) -> np.ndarray:
        return predict(SMALL, with_values(machine, v), opts, cands).columns["t_step_s"]

    t0, jac = sensitivities(step_s, values, paths, step=0.01)
    moved = step_s({paths[0]: values[paths[0]] * 0.9})
    assert np.allclose(np.log(moved / t0), jac[:, 0] * np.log(0.9), atol=0.02)
    assert jac[:, 0].min() < -0.1  # GEMM-bound layouts are sensitive to GEMM efficiency


def test_prior_spread_follows_the_source() -> None:
    s = prior_spread({"gemm.max_efficiency": "measured"})
    i = s.paths.index("gemm.max_efficiency")
    assert s.rel_sigma[i] == pytest.approx(PRIOR_REL_SIGMA["measured"])
    assert s.rel_sigma[s.paths.index("intra_node.latency_us")] == pytest.approx(PRIOR_REL_SIGMA["assumption"])


def test_rank_json_carries_intervals_and_p_best(tmp_path) -> None:
    """Through the real CLI: every feasible candidate's P(best) sums to 1; the best is tied with itself."""
    import json

    from tests.conftest import run_cli

    out = tmp_path / "all.json"
    r = run_cli("rank", "--model", "5B", "--gpus", "64", "--machine", "alps", "--level", "0.5",
                "--out", str(out), "--top", "3")
    assert r.returncode == 0, r.stderr
    assert "P(best)" in r.stdout and "=" in r.stdout
    rows = json.loads(out.read_text())["rows"]
    assert sum(row["p_best"] for row in rows) == pytest.approx(1.0)
    best = rows[0]
    assert best["tied"] == 1.0 and best["t_low_s"] < best["t_step_s"] < best["t_high_s"]
    assert all(row["p_best"] == 0.0 for row in rows if not row["feasible"])


def test_calibrated_intervals_reach_nominal_coverage_on_held_out_synthetic_runs() -> None:
    """Runs from known parameters with 10% log-normal noise: after calibrating on 70% of the
    plans, the held-out plans' 80% intervals hold about 80% of them, and the stored model
    error recovers the noise."""
    from axoplan.validate.calibrate import calibrate, split_holdout
    from axoplan.validate.compare import aggregate
    from axoplan.validate.coverage import coverage
    from tests.validate_helpers import TRUE_VALUES, small_plans, synthetic_runs

    plans = small_plans()
    noise = np.exp(np.random.default_rng(3).normal(0.0, 0.1, len(plans)))
    runs = synthetic_runs(plans, with_values(theory_machine(), TRUE_VALUES), list(noise))
    cal = calibrate(runs, theory_machine(), holdout=0.3, seed=0)
    assert cal.calibrated.uncertainty is not None
    assert 0.08 < cal.calibrated.uncertainty.model_error < 0.12
    pooled = aggregate(runs)
    _, hold = split_holdout(len(pooled), 0.3, 0)
    c = coverage([pooled[i] for i in hold], cal.calibrated, 0.8)
    assert c.plans >= 30 and 0.7 <= c.covered <= 0.9


def test_suggest_picks_distinct_layouts_by_p_best_and_exports_them(tmp_path) -> None:
    import csv
    import io

    from tests.conftest import run_cli

    r = run_cli("suggest", "--model", "20B", "--gpus", "256", "--machine", "perlmutter", "-k", "4",
                "--out-dir", str(tmp_path / "plans"), "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    layouts = {(row["gx"], row["gy"], row["gz"], row["gdata"]) for row in rows}
    assert len(rows) == 4 and len(layouts) == 4
    p = [float(row["p_best"]) for row in rows]
    assert p == sorted(p, reverse=True) and p[0] > 0
    assert len(list((tmp_path / "plans").iterdir())) == 4


def test_plot_intervals_draws_each_top_layout_with_its_p_best(tmp_path) -> None:
    from axoplan.inputs.machine import load_machine
    from axoplan.inputs.model import load_model
    from axoplan.search.ranking import rank
    from axoplan.uncertainty.intervals import with_intervals
    from axoplan.uncertainty.plot import intervals_figure

    r = with_intervals(rank(load_model("5B"), load_machine("alps"), RunOptions(), 64))
    fig = intervals_figure(r, 6)
    ax, twin = fig.axes
    bars = [p.get_height() for p in twin.patches]
    top = [int(i) for i in r.order if r.reason[i] == 0][:6]
    assert bars == pytest.approx(list(r.prediction.columns["p_best"][top]))
    assert len(ax.get_xticks()) == 6


def test_plot_breakdown_whiskers_are_the_rank_json_intervals(tmp_path) -> None:
    """Through the real CLI: the breakdown's printed (and drawn) interval of the best layout is
    the one `rank --out x.json` reports; the figure's whiskers span the same interval."""
    import json

    from axoplan.inputs.machine import load_machine
    from axoplan.inputs.model import load_model
    from axoplan.search.ranking import rank
    from axoplan.uncertainty.intervals import with_intervals
    from axoplan.validate.plots import top_layouts
    from tests.conftest import run_cli

    args = ("--model", "5B", "--gpus", "64", "--machine", "alps")
    r = run_cli("plot", "breakdown", *args, "--top", "4", "-o", str(tmp_path / "b.png"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    layout, _, t, low, high = r.stdout.splitlines()[2].split()
    ranked = run_cli("rank", *args, "--out", str(tmp_path / "r.json"), "--top", "1")
    assert ranked.returncode == 0, ranked.stderr
    best = json.loads((tmp_path / "r.json").read_text())["rows"][0]
    assert float(t) == pytest.approx(best["t_step_s"], rel=1e-5)
    assert (float(low), float(high)) == pytest.approx((best["t_low_s"], best["t_high_s"]), rel=1e-5)
    assert float(low) < float(t) < float(high)

    ax = top_layouts(with_intervals(rank(load_model("5B"), load_machine("alps"), RunOptions(), 64)), 4).axes[0]
    whisker = ax.collections[-1].get_segments()[0]  # the errorbar's vertical line of the first layout
    assert (whisker[0][1], whisker[1][1]) == pytest.approx((best["t_low_s"], best["t_high_s"]), rel=1e-9)


def test_p_best_counts_only_draws_that_beat_a_measured_time() -> None:
    """With a measured time well below every candidate, almost no draw beats it; with one far
    above, P(best) is the plain one and sums to 1."""
    t0 = np.array([1.0, 1.05, 1.1])
    jac = np.zeros((3, 1))
    cov = np.eye(1) * 0.01
    plain = intervals(t0, jac, cov, 0.05, samples=2000)
    beaten = intervals(t0, jac, cov, 0.05, samples=2000, beat_s=0.8)
    close = intervals(t0, jac, cov, 0.05, samples=2000, beat_s=1.0)
    assert intervals(t0, jac, cov, 0.05, samples=2000, beat_s=10.0).p_best == pytest.approx(plain.p_best)
    assert beaten.p_best.sum() < 0.01
    assert 0.3 < close.p_best.sum() < 0.8 and np.all(close.p_best <= plain.p_best)
