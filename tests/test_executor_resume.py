"""`axoplan run` checkpoints and AXOPLAN_RESUME=1 (issue 13): a chained run equals one run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from axoplan.space.layout import Layout
from tests.conftest import run_cli
from tests.executor_helpers import tiny_plan
from tests.test_export import assert_user_error

pytestmark = pytest.mark.distributed

_NO_ENV = {"AXOPLAN_RESUME": "0", "AXOPLAN_SAVE_CHECKPOINT": "0", "AXOPLAN_WARMUP": "0"}


def _run(plan: Path, iterations: int, folder: Path, resume: bool = False) -> None:
    """A run with flags; a resumed one with the variables a chained job script exports instead."""
    if resume:
        done = run_cli("run", str(plan), "--local", "2", "--timeout", "30",
                       env={"AXOPLAN_RESUME": "1", "AXOPLAN_SAVE_CHECKPOINT": "1", "AXOPLAN_WARMUP": "0",
                            "AXOPLAN_ITERATIONS": str(iterations), "AXOPLAN_CHECKPOINT_DIR": str(folder)})
    else:
        done = run_cli("run", str(plan), "--local", "2", "--warmup", "0", "--iterations", str(iterations),
                       "--save-checkpoint", "--checkpoint-dir", str(folder), "--timeout", "30", env=_NO_ENV)
    assert done.returncode == 0, done.stderr
    assert ("resumed from the checkpoint of step" in done.stderr) == resume


def _state(folder: Path) -> tuple[dict, list[dict]]:
    import torch

    manifest = json.loads((folder / "checkpoint.json").read_text())
    ranks = [torch.load(folder / f"rank-{r:05d}.pt", weights_only=True) for r in range(2)]
    return manifest, ranks


def _same(a: list[dict], b: list[dict]) -> bool:
    import torch

    return all(set(x["params"]) == set(y["params"]) and
               all(torch.allclose(x["params"][n], y["params"][n], rtol=1e-6, atol=1e-7) for n in x["params"])
               for x, y in zip(a, b, strict=True))


def test_two_chained_runs_equal_one_run(tmp_path: Path) -> None:
    # Z = 2 shards the weights over the two ranks; Adam, so the moments and step count must carry over
    plan = tmp_path / "plan.json"
    plan.write_text(tiny_plan(Layout(1, 1, 2, 1), accum=2).to_json())
    _run(plan, 4, tmp_path / "one")
    _run(plan, 2, tmp_path / "chained")
    half, half_ranks = _state(tmp_path / "chained")
    _run(plan, 2, tmp_path / "chained", resume=True)
    whole, whole_ranks = _state(tmp_path / "one")
    chained, chained_ranks = _state(tmp_path / "chained")
    assert whole["steps"] == chained["steps"] == 4 and half["steps"] == 2
    assert chained["loss"] == pytest.approx(whole["loss"], rel=1e-6)
    assert _same(whole_ranks, chained_ranks)
    assert [r["optimizer"]["steps"] for r in chained_ranks] == [4, 4]
    # not vacuous: two more steps changed the loss and the parameters
    assert half["loss"] != pytest.approx(whole["loss"], rel=1e-4)
    assert not _same(whole_ranks, half_ranks)


def test_resume_without_a_checkpoint_is_one_line(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(tiny_plan(Layout(1, 1, 2, 1)).to_json())
    done = run_cli("run", str(plan), "--local", "2", env={**_NO_ENV, "AXOPLAN_RESUME": "1"})
    assert_user_error(done, "AXOPLAN_RESUME=1 but there is no checkpoint at", str(tmp_path / "checkpoint"))
    assert not (tmp_path / "runs.jsonl").exists()


def test_resume_refuses_another_plans_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "checkpoint.json").write_text(json.dumps({"plan_id": "0123456789ab", "world_size": 2, "steps": 3,
                                                        "loss": 4.0}))
    plan = tmp_path / "plan.json"
    plan.write_text(tiny_plan(Layout(1, 1, 2, 1)).to_json())
    done = run_cli("run", str(plan), "--local", "2", env={**_NO_ENV, "AXOPLAN_RESUME": "1"})
    assert_user_error(done, "is of plan 0123456789ab on 2 ranks")


def test_save_into_a_file_is_refused_before_start(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(tiny_plan(Layout(1, 1, 2, 1)).to_json())
    (tmp_path / "afile").write_text("")
    done = run_cli("run", str(plan), "--local", "2", "--save-checkpoint", "--checkpoint-dir", str(tmp_path / "afile"),
                   env=_NO_ENV)
    assert_user_error(done, "is a file, not a folder")
