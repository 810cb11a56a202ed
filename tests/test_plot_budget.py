"""`axoplan plot scaling --tokens`: days to train and node-hours against GPU count (issue 13)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from axoplan.inputs.machine import load_machine
from axoplan.inputs.options import RunOptions
from axoplan.validate import plots
from tests.conftest import run_cli


def _points() -> pd.DataFrame:
    """Hand-set step times, independent of the cost model: 8 GPUs 20 s, 16 GPUs 12 s, 32 GPUs 10 s, 64 none."""
    return pd.DataFrame({"model": ["m"] * 4, "gpus": [8, 16, 32, 64], "t_step_s": [20.0, 12.0, 10.0, math.nan],
                         "tflops_per_gpu": [1.0, 1.0, 1.0, math.nan], "mfu": [0.5, 0.5, 0.5, math.nan],
                         "model_tflops_per_gpu": [1.0, 1.0, 1.0, math.nan], "layout": ["a", "b", "c", ""]})


def test_scaling_costs_by_hand() -> None:
    # 300e9 / (2048 x 2048) -> 71,526 steps; 8 GPUs per node
    # 8 GPUs: 71,526 x 20 = 1,430,520 s = 16.5569 days; 1 node -> 397.37 node-hours
    # 16 GPUs: 71,526 x 12 = 858,312 s = 9.9342 days; 2 nodes -> 476.84 node-hours
    # 32 GPUs: 71,526 x 10 = 715,260 s = 8.2785 days; 4 nodes -> 794.73 node-hours
    out = plots.scaling_costs(_points(), 300 * 10**9, RunOptions(), 8)
    assert out["days"].iloc[:3].to_list() == pytest.approx([16.5569, 9.9342, 8.2785], abs=1e-4)
    assert out["node_hours"].iloc[:3].to_list() == pytest.approx([397.37, 476.84, 794.73], abs=0.01)
    assert out["gpu_hours"].iloc[1] == pytest.approx(16 * 858_312 / 3600)
    assert np.isnan(out["days"].iloc[3]) and np.isnan(out["node_hours"].iloc[3])


def test_cost_summary_names_where_adding_gpus_stops_paying() -> None:
    # 8 -> 16: 16.5569 / 9.9342 = 1.667x for 2x (83% >= 75%); 16 -> 32: 1.2x for 2x (60%): stops paying
    [line] = plots.cost_summary(plots.scaling_costs(_points(), 300 * 10**9, RunOptions(), 8))
    assert line.startswith("m: fewest days 8.3 at 32 GPUs (795 node-hours); fewest node-hours 397 at 8 GPUs "
                           "(16.6 days)")
    assert line.endswith("from 16 to 32 GPUs the days fall only 1.20x for 2x the GPUs (60% of ideal)")


def test_cost_panels_only_with_tokens() -> None:
    machine, options = load_machine("frontier"), RunOptions()
    assert len(plots.scaling(_points(), machine, options).axes) == 2  # the default figure is unchanged
    fig = plots.scaling(plots.scaling_costs(_points(), 10**12, options, 8), machine, options, 10**12)
    assert len(fig.axes) == 4
    days_ax, hours_ax = fig.axes[2], fig.axes[3]
    assert "days to train 1T tokens" in days_ax.get_ylabel() and "node-hours" in hours_ax.get_ylabel()
    assert list(hours_ax.lines[0].get_xdata()) == [8, 16, 32, 64]


def test_plot_scaling_tokens_cli(tmp_path: Path) -> None:
    r = run_cli("plot", "scaling", "--machine", "perlmutter", "--models", "5B", "--gpus", "64,128", "--tokens",
                "300B", "-o", str(tmp_path / "s.png"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    head = r.stdout.splitlines()[0].split()
    assert head[-2:] == ["days", "node-hours"]
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("5B ")]
    for row in rows:  # days = 71,526 x s/iter / 86,400; node-hours = GPUs / 4 x 71,526 x s/iter / 3,600
        t = float(row[3])
        assert float(row[5]) == pytest.approx(71_526 * t / 86_400, abs=0.06)
        assert float(row[6].replace(",", "")) == pytest.approx(int(row[1]) / 4 * 71_526 * t / 3600, rel=2e-3)
    assert any(ln.startswith("5B: fewest days") for ln in r.stdout.splitlines())


def test_plot_scaling_bad_tokens_is_one_line(tmp_path: Path) -> None:
    r = run_cli("plot", "scaling", "--models", "5B", "--gpus", "8", "--tokens", "lots", "-o", str(tmp_path / "s.png"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "--tokens 'lots'" in r.stderr
    assert not (tmp_path / "s.png").exists()
