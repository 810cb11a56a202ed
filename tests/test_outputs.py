"""Outputs people and programs can read (issue 23): strict JSON, CSV with every column the table shows,
`suggest` as a table, help whole at 80 columns, tables within 120 columns, loops that close."""

from __future__ import annotations

import csv
import enum
import io
import json
import re

import pytest

from tests.conftest import run_cli

RANK_5B = ("rank", "--model", "5B", "--gpus", "64", "--machine", "perlmutter")


def _strict(text: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_json_is_strict_with_null_for_missing_values_and_carries_the_token_costs():
    done = run_cli("rank", "--model", "320B", "--gpus", "256", "--machine", "frontier", "--infeasible", "--top", "3",
                   "--format", "json", "--tokens", "1T")
    assert done.returncode == 0, done.stderr
    doc = _strict(done.stdout)
    row = doc["rows"][0]
    assert row["feasible"] is False and row["t_low_s"] is None  # no interval for an infeasible layout: null
    assert doc["tokens"] == 10**12 and "days" in row and "node_hours" in row and "gpu_hours" in row


def test_csv_and_json_carry_every_column_the_table_shows():
    table = run_cli(*RANK_5B, "--top", "2", "--tokens", "300B")
    rows = list(csv.DictReader(io.StringIO(run_cli(*RANK_5B, "--top", "2", "--tokens", "300B",
                                                   "--format", "csv").stdout)))
    doc = _strict(run_cli(*RANK_5B, "--top", "2", "--tokens", "300B", "--format", "json").stdout)
    wide = run_cli(*RANK_5B, "--top", "2", "--tokens", "300B", "--wide")

    def first_row(text: str) -> list[str]:
        lines = text.splitlines()
        at = next(k for k, line in enumerate(lines) if line.startswith("rank"))
        return lines[at + 2].split()

    first, first_wide = first_row(table.stdout), first_row(wide.stdout)
    for record in (rows[0], doc["rows"][0]):
        assert str(record["layout"]) == first[1]
        assert float(record["t_step_s"]) == pytest.approx(float(first[4]), abs=5e-4)
        assert float(record["mfu"]) == pytest.approx(float(first[7]), abs=0.05)
        assert float(record["mem_need_bytes"]) / 1e9 == pytest.approx(float(first[-4].rstrip("*")), abs=0.05)
        assert float(record["p_fit"]) == pytest.approx(float(first[-3]), abs=0.005)
        assert float(record["days"]) == pytest.approx(float(first[-2]), abs=0.05)
        assert float(record["node_hours"]) == pytest.approx(float(first[-1].replace(",", "")), abs=0.5)
        # GPU-hours: in the --wide table (the default one leaves them out to stay within 120 columns)
        assert float(record["gpu_hours"]) == pytest.approx(float(first_wide[-1].replace(",", "")), abs=0.5)
    assert float(rows[0]["node_hours"]) == pytest.approx(doc["rows"][0]["node_hours"])


def test_suggest_prints_a_table_on_a_terminal_and_csv_on_request():
    args = ("suggest", "--model", "20B", "--gpus", "256", "--machine", "perlmutter", "-k", "3")
    table = run_cli(*args)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    header = next(line for line in lines if line.startswith("rank"))
    assert header.split()[:4] == ["rank", "layout", "mbs", "options"] and "P(best)" in header
    assert max(map(len, lines)) <= 120
    rows = list(csv.DictReader(io.StringIO(run_cli(*args, "--format", "csv").stdout)))
    assert len(rows) == 3 and "p_best" in rows[0]


@pytest.mark.parametrize("command", ["rank", "explain", "export", "run", "validate", "calibrate", "suggest",
                                     "probe", "plot scaling"])
def test_help_at_80_columns_shows_every_flag_and_choice_whole(command: str):
    done = run_cli(*command.split(), "--help", env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout and max(map(len, done.stdout.splitlines())) <= 80
    from typer.main import get_command

    from axoplan.cli import app

    click_command = get_command(app)
    for part in command.split():
        click_command = click_command.commands[part]  # type: ignore[attr-defined]
    for param in (p for p in click_command.params if not getattr(p, "hidden", False)):
        for flag in [*param.opts, *param.secondary_opts]:
            if flag.startswith("-"):
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", done.stdout), flag
        kind = param.type_descriptor.annotation  # type: ignore[attr-defined]
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            assert "<" + "|".join(str(c.value) for c in kind) + ">" in done.stdout, kind


def test_the_command_list_is_whole_at_80_columns():
    done = run_cli("--help", env={"COLUMNS": "80"})
    commands = done.stdout.split("Commands:")[1]
    assert "..." not in commands and "…" not in commands


def test_explain_fits_120_columns_and_says_one_micro_batch():
    done = run_cli("explain", "--model", "320B", "--gpus", "32768", "--machine", "frontier",
                   "--layout", "2x8x64x32/zxy")
    assert done.returncode == 0, done.stderr
    assert max(map(len, done.stdout.splitlines())) <= 120
    text = " ".join(done.stdout.split())
    assert "1 micro-batch per step" in text


def test_explain_of_a_recomputed_layout_fits_120_columns_and_names_the_rerun_forward():
    """The recompute phase beside cross-package placements made the narrow collective table 124 wide: it is
    'refwd' there, with a line saying what that is; --wide spells it out."""
    args = ("explain", "--model", "320B", "--gpus", "32768", "--machine", "frontier", "--layout", "2x8x64x32/zxy",
            "--recompute", "on")
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    assert max(map(len, done.stdout.splitlines())) <= 120
    assert " refwd " in done.stdout and "refwd: the forward that activation recompute runs again" in done.stdout
    wide = run_cli(*args, "--wide")
    assert " recompute " in wide.stdout and " refwd " not in wide.stdout


@pytest.mark.parametrize("spelling", ["1x1x8x8", "1x1x8x8/zxy", "1x1x8x8/yzx"])
def test_every_spelling_of_one_placement_is_accepted(spelling: str):
    # with X and Y of one GPU, every rank order places the Z and data groups the same way: one candidate
    done = run_cli("explain", "--model", "5B", "--gpus", "64", "--machine", "dgx-a100", "--layout", spelling)
    assert done.returncode == 0, done.stderr
    assert "Gx=1 Gy=1 Gz=8 Gdata=8" in done.stdout


def test_a_cpu_rehearsal_of_a_gpu_plan_validates_with_the_machine_the_error_names(tmp_path):
    from tests.conftest import REPO
    from tests.test_bad_input import _plan_id_of

    records = [json.loads(line) for line in
               (REPO / "data" / "measured" / "cpu-gloo" / "runs.jsonl").read_text().splitlines()[:6]]
    for rec in records:
        rec["plan"]["machine"] = "frontier"
        rec["plan_id"] = rec["plan"]["plan_id"] = _plan_id_of(rec["plan"])
    path = tmp_path / "rehearsal.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    refused = run_cli("validate", str(path))
    assert refused.returncode == 2 and "--machine local-cpu" in refused.stderr
    advised = run_cli("validate", str(path), "--machine", "local-cpu")
    assert advised.returncode == 0, advised.stderr
    assert "MAPE" in advised.stdout


def test_suggest_takes_the_allow_partial_nodes_its_error_advises(tmp_path):
    args = ("suggest", "--model", "5B", "--gpus", "6", "--machine", "dgx-a100", "--global-batch", "24", "-k", "2",
            "--out-dir", str(tmp_path / "plans"))
    refused = run_cli(*args)
    assert refused.returncode == 2 and "--allow-partial-nodes" in refused.stderr
    done = run_cli(*args, "--allow-partial-nodes")
    assert done.returncode == 0, done.stderr
    assert len(list((tmp_path / "plans").glob("*/plan.json"))) == 2
