"""Integers written as integers in the JSON outputs (issue 30): counts, flags and bytes, through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli_here

BASE = ("--model", "5B", "--gpus", "8", "--machine", "dgx-h100")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def test_rank_json_writes_counts_flags_and_bytes_as_integers():
    done = run_cli_here("rank", *BASE, "--top", "3", "--format", "json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    for row in rows:
        # 2048 sequences over Gdata*Gz*micro-batch of 8 GPUs: a whole number of micro-batches
        per_step = row["gdata"] * row["gz"] * row["micro_batch"]
        assert _is_int(row["grad_accum"]) and row["grad_accum"] == 2048 // per_step
        assert all(_is_int(v) for k, v in row.items() if k.endswith("_bytes"))
        assert row["tied"] in (0, 1) and row["mem_tight"] in (0, 1) and _is_int(row["tied"])
        assert all(isinstance(v, float) for k, v in row.items() if k.endswith("_s"))  # seconds stay floats


def test_plan_json_writes_them_as_integers_and_reads_back_the_same(tmp_path: Path):
    out = tmp_path / "plans"
    fresh = run_cli_here("export", *BASE, "--top", "1", "--out-dir", str(out))
    assert fresh.returncode == 0, fresh.stderr
    [plan_path] = out.glob("*/plan.json")
    plan = json.loads(plan_path.read_text())
    assert _is_int(plan["prediction"]["mem_total_bytes"]) and _is_int(plan["prediction"]["breakdown"]["grad_accum"])
    assert plan["prediction"]["breakdown"]["grad_accum"] == plan["grad_accum_steps"]
    # a saved ranking (its rows' integers) exports the same launch config as a fresh one
    saved = tmp_path / "ranking.json"
    assert run_cli_here("rank", *BASE, "--out", str(saved)).returncode == 0
    again = run_cli_here("export", "--ranking", str(saved), "--machine", "dgx-h100", "--top", "1", "--out-dir",
                         str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr
    [again_path] = (tmp_path / "again").glob("*/plan.json")
    assert again_path.read_text() == plan_path.read_text()
