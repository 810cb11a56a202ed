"""`axoplan export --tokens` and `--time` (issue 13), through the real CLI entry point."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from axoplan.errors import AxoplanError
from axoplan.export.job import parse_walltime
from axoplan.records.plan import LaunchConfig
from tests.conftest import run_cli
from tests.test_export import assert_user_error, cli, parse_sbatch

# 20B on 64 Frontier GCDs = 8 nodes; global batch 2048 x 2048 = 4,194,304 tokens per step
# with --tokens and no --command the scripts run axoplan's benchmark: --benchmark says it is meant
_BASE = ("export", "--model", "20B", "--gpus", "64", "--machine", "frontier", "-n", "1", "--account", "abc",
         "--python-env", "/env", "--benchmark")


def _export(tmp_path: Path, *args: str) -> tuple[str, LaunchConfig, str]:
    out = tmp_path / "ex"
    r = cli(*_BASE, "-o", str(out), *args)
    assert r.returncode == 0, r.stderr
    (folder,) = out.iterdir()
    return (folder / "job.sh").read_text(), LaunchConfig.load(folder / "plan.json"), r.stdout + r.stderr


def test_export_tokens_sizes_the_run_and_records_its_cost(tmp_path: Path) -> None:
    script, plan, out = _export(tmp_path, "--tokens", "300B")
    # 300e9 / 4,194,304 = 71,525.57 -> 71,526 steps, the whole run's iterations
    assert plan.training is not None and plan.training.steps == 71_526 and plan.training.tokens == 300 * 10**9
    assert "export AXOPLAN_TOTAL_ITERATIONS=71526" in script
    t = plan.prediction.t_step_s  # type: ignore[union-attr]
    seconds = 71_526 * t
    assert plan.training.seconds == pytest.approx(seconds)
    assert plan.training.days == pytest.approx(seconds / 86_400)
    assert plan.training.nodes == 8
    assert plan.training.node_hours == pytest.approx(8 * seconds / 3600)
    assert plan.training.gpu_hours == pytest.approx(64 * seconds / 3600)
    line = f"# time to train 300B tokens: 71,526 steps, {seconds / 86_400:.1f} days on 8 nodes"
    assert line in script
    assert f"rank 1: time to train 300B tokens: 71,526 steps, {seconds / 86_400:.1f} days" in out
    # 8 nodes: the longest queue is extended (24 h); per job floor((86,400 - 600) / t), minute rounding aside
    per_job = int(re.search(r"in (\d+) jobs of at most (\d+) iterations", script).group(2))  # type: ignore[union-attr]
    assert per_job <= (86_400 - 600) / t
    assert f"in {math.ceil(71_526 / per_job)} jobs" in script
    assert parse_sbatch(script)["partition"] == "extended"


def test_export_iterations_win_over_tokens(tmp_path: Path) -> None:
    script, plan, _ = _export(tmp_path, "--tokens", "1.5T", "--iterations", "50")
    # 1.5e12 / 4,194,304 = 357,627.87 -> 357,628 steps recorded; the job runs the 50 it was told
    assert plan.training is not None and plan.training.steps == 357_628
    assert "export AXOPLAN_ITERATIONS=50" in script and "chained run" not in script
    assert "x 50 iterations" in script


def test_export_without_tokens_records_no_cost(tmp_path: Path) -> None:
    script, plan, _ = _export(tmp_path)
    assert plan.training is None and "time to train" not in script
    assert "export AXOPLAN_ITERATIONS=100" in script


def test_export_time_overrides_the_queue_wall_time(tmp_path: Path) -> None:
    # 100 iterations on 8 nodes need over 2 h (batch-small's limit), so extended (24 h) is chosen; --time 3:30:00
    # replaces the predicted wall time, within the limit and above the need: no warning
    script, plan, out = _export(tmp_path, "--time", "3:30:00")
    needed_s = 100 * plan.prediction.t_step_s + 600  # type: ignore[union-attr]
    assert 7200 < needed_s < 3.5 * 3600
    head = parse_sbatch(script)
    assert head["time"] == "03:30:00" and head["partition"] == "extended"
    assert "wall time 03:30:00 from --time" in script
    assert "warning" not in out


def test_export_time_over_the_queue_limit_warns_once(tmp_path: Path) -> None:
    script, _, out = _export(tmp_path, "--iterations", "2000", "--time", "1-06:00:00")
    assert parse_sbatch(script)["time"] == "30:00:00"
    warnings = [ln for ln in out.splitlines() if ln.startswith("warning:") and "(--benchmark)" not in ln]
    assert warnings == [ln for ln in warnings if "exceeds queue extended's limit of 24:00:00" in ln]
    assert len(warnings) == 1


def test_export_time_under_the_prediction_warns_once(tmp_path: Path) -> None:
    script, plan, out = _export(tmp_path, "--time", "0:10:00")
    t = plan.prediction.t_step_s  # type: ignore[union-attr]
    # 100 iterations x t + 10 min margin, whole minutes: far more than the 10 minutes asked
    needed_min = math.ceil((100 * t + 600) / 60)
    assert parse_sbatch(script)["time"] == "00:10:00"
    warnings = [ln for ln in out.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"warning: --time 00:10:00 is under the predicted {needed_min // 60:02d}:"
                                  f"{needed_min % 60:02d}:00 a job needs (100 iterations + margin)")


@pytest.mark.parametrize(("text", "seconds"), [("90", 5400), ("90:30", 5430), ("2:00:00", 7200),
                                               ("1-00", 86_400), ("1-2:30", 95_400), ("1-02:30:15", 95_415)])
def test_parse_walltime_slurm_formats(text: str, seconds: int) -> None:
    assert parse_walltime(text) == seconds


@pytest.mark.parametrize("text", ["abc", "1:2:3:4", "0:30", "", "-1"])
def test_parse_walltime_refuses(text: str) -> None:
    with pytest.raises(AxoplanError, match="--time"):
        parse_walltime(text)


@pytest.mark.parametrize(("args", "needle"), [(("--tokens", "3X"), "--tokens '3X'"),
                                              (("--time", "soon"), "--time 'soon'")])
def test_export_bad_budget_flags_are_one_line(tmp_path: Path, args: tuple[str, str], needle: str) -> None:
    assert_user_error(cli(*_BASE, "-o", str(tmp_path / "ex"), *args), needle)
    assert not (tmp_path / "ex").exists()


def test_export_tokens_from_a_saved_ranking(tmp_path: Path) -> None:
    saved = tmp_path / "r.json"
    r = cli("rank", "--model", "5B", "--gpus", "16", "--machine", "perlmutter", "--global-batch", "64",
            "--seq-len", "1024", "--out", str(saved))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "ex"
    r = cli("export", "--ranking", str(saved), "-n", "1", "-o", str(out), "--tokens", "1M", "--benchmark")
    assert r.returncode == 0, r.stderr
    (folder,) = out.iterdir()
    plan = LaunchConfig.load(folder / "plan.json")
    # the saved ranking's batch: 1e6 / (64 x 1024 = 65,536) = 15.26 -> 16 steps, on 16 / 4 = 4 nodes
    assert plan.training is not None and (plan.training.steps, plan.training.nodes) == (16, 4)
    assert "export AXOPLAN_ITERATIONS=16" in (folder / "job.sh").read_text()


def test_a_long_export_without_a_command_is_refused_saying_what_it_would_spend(tmp_path: Path) -> None:
    # 300B tokens of 20B on 64 GCDs: 71,526 steps; without --command the scripts would run the benchmark
    args = ("export", "--model", "20B", "--gpus", "64", "--machine", "frontier", "-n", "1", "--tokens", "300B")
    refused = run_cli(*args, "-o", str(tmp_path / "a"))
    assert refused.returncode == 2 and not (tmp_path / "a").exists()
    line = refused.stderr.strip()
    assert line.count("\n") == 0 and "71,526 iterations of axoplan's synthetic benchmark, not training" in line
    assert "--command" in line and "--benchmark" in line
    # with a training command it trains; with --benchmark it runs the benchmark and says so, on screen and in the script
    trained = run_cli(*args, "-o", str(tmp_path / "b"), "--command", "python train.py")
    assert trained.returncode == 0, trained.stderr
    assert "BENCHMARK" not in next((tmp_path / "b").glob("*/job.sh")).read_text()
    meant = run_cli(*args, "-o", str(tmp_path / "c"), "--benchmark")
    assert meant.returncode == 0, meant.stderr
    assert "warning: these job scripts run the benchmark (--benchmark); rank 1: 71,526 iterations" in meant.stderr
    script = next((tmp_path / "c").glob("*/job.sh")).read_text()
    assert "# BENCHMARK, NOT TRAINING: this job runs 71,526 iterations" in script
    both = run_cli(*args, "-o", str(tmp_path / "d"), "--benchmark", "--command", "python train.py")
    assert both.returncode == 2 and "give one" in both.stderr


def test_a_short_benchmark_export_needs_no_flag(tmp_path: Path) -> None:
    done = run_cli("export", "--model", "20B", "--gpus", "64", "--machine", "frontier", "-n", "1",
                   "-o", str(tmp_path / "a"))
    assert done.returncode == 0, done.stderr
    assert "BENCHMARK" not in next((tmp_path / "a").glob("*/job.sh")).read_text()
