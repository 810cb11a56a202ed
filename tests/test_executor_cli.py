"""`axoplan run` end to end through the real entry points, with 4 local CPU ranks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from axoplan.executor.spec import Scale, scale_plan
from axoplan.records.runs import read_runs
from axoplan.space.layout import Layout
from tests.conftest import REPO, run_cli
from tests.executor_helpers import tiny_plan

pytestmark = pytest.mark.distributed


def test_run_appends_one_record_of_the_scaled_plan(tmp_path: Path) -> None:
    plan = tiny_plan(Layout(2, 1, 2, 1), oar=True, ors=True, oag=True, recompute=True)
    (tmp_path / "plan.json").write_text(plan.to_json())
    done = run_cli("run", str(tmp_path / "plan.json"), "--local", "4", "--warmup", "1", "--layers", "1",
                   "--timeout", "30", env={"AXOPLAN_ITERATIONS": "2"})  # as an exported job script sets it
    assert done.returncode == 0, done.stderr
    assert "s/iteration" in done.stdout and "all_gather_z" in done.stdout and ", float32\n" in done.stdout
    [record] = list(read_runs(tmp_path / "runs.jsonl"))
    as_run = scale_plan(plan, Scale(layers=1))
    assert record.plan == as_run and record.plan_id == as_run.plan_id != plan.plan_id
    assert record.plan.model.num_layers == 1 and record.plan.layout == plan.layout
    assert (record.world_size, record.nodes, record.iterations, record.backend, record.dtype) == \
        (4, 1, 2, "gloo", "float32")
    assert record.t_step_s > 0 and record.phase_s["gemm"] > 0 and record.phase_s["all_reduce_x"] > 0


def test_a_scaled_down_run_is_short_by_default_and_shows_progress(tmp_path: Path) -> None:
    plan = tiny_plan(Layout(1, 1, 2, 1), accum=16)  # 16 micro-batches per step in the plan
    (tmp_path / "plan.json").write_text(plan.to_json())
    done = run_cli("run", str(tmp_path / "plan.json"), "--local", "2", "--warmup", "1", "--iterations", "2",
                   "--layers", "1", "--timeout", "30")
    assert done.returncode == 0, done.stderr
    assert "scaled-down run: 2 micro-batches per iteration instead of the plan's 16" in done.stderr
    assert [ln for ln in done.stderr.splitlines() if ln.startswith("iteration ")] == \
        [ln for ln in done.stderr.splitlines() if ln.startswith(("iteration 1 of 3 (warm-up)", "iteration 2 of 3 "
                                                                  "(timed)", "iteration 3 of 3 (timed)"))]
    assert done.stderr.count("\niteration ") + done.stderr.startswith("iteration ") == 3
    [record] = list(read_runs(tmp_path / "runs.jsonl"))
    assert record.plan.grad_accum_steps == 2 and record.plan.options.global_batch == 2 * 1 * 2


def test_a_dead_rank_ends_the_run_with_its_name_and_no_record(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(tiny_plan(Layout(1, 2, 1, 2)).to_json())
    done = subprocess.run([sys.executable, "-m", "axoplan", "run", str(tmp_path / "plan.json"), "--local", "4",
                           "--iterations", "2", "--fault", "1:kill@1", "--timeout", "20"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 1
    assert "rank 1 died (killed by signal SIGKILL)" in done.stderr and "no record written" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs.jsonl").exists()
