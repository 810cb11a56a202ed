"""`axoplan validate`, `calibrate` and `plot` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from axoplan.inputs.machine import load_machine
from axoplan.validate.compare import validate
from axoplan.validate.records import load_runs
from tests.conftest import REPO, run_cli
from tests.validate_helpers import TRUE_VALUES, small_plans, synthetic_runs, write_jsonl

VTRAIN = REPO / "data" / "measured" / "vtrain_a100_single_node_pp1.csv"


def _one_error_line(r: object, *fragments: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for fragment in fragments:
        assert fragment in r.stderr, r.stderr


@pytest.fixture(scope="module")
def runs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs on the shipped perlmutter measured 10 % faster than it predicts."""
    machine = load_machine("perlmutter")
    plans = small_plans(worlds=(4, 8), micro_batches=(1, 2), recompute=(False,))
    return write_jsonl(tmp_path_factory.mktemp("runs") / "runs.jsonl",
                       synthetic_runs(plans, machine, [1 / 1.1] * len(plans)))


def test_validate_prints_each_plan_and_the_summary(runs_file: Path, tmp_path: Path) -> None:
    table, figs = tmp_path / "table.csv", tmp_path / "figs"
    r = run_cli("validate", str(runs_file), "--out", str(table), "--plots", str(figs))
    assert r.returncode == 0, r.stderr
    assert "MAPE 10.0% (median 10.0%), worst +10.0%" in r.stdout
    assert "Kendall tau 1.000, Spearman rho 1.000" in r.stdout
    assert "in the predicted top 3 in 2" in r.stdout
    rows = pd.read_csv(table)
    assert len(rows) == len(load_runs([runs_file]))
    assert sum("+10.0%" in line for line in r.stdout.splitlines()) == len(rows) + 1  # every row, and "worst"
    assert sorted(p.name for p in figs.iterdir()) == ["breakdown.png", "breakdown.svg", "predicted_vs_measured.png",
                                                      "predicted_vs_measured.svg"]
    again = run_cli("validate", str(runs_file), "--out", str(table))
    _one_error_line(again, "already exists", "--force")


def test_validate_the_vtrain_data_through_the_entry_point() -> None:
    r = run_cli("validate", str(VTRAIN), "--summary-only")
    assert r.returncode == 0, r.stderr
    s = validate(load_runs([VTRAIN]), load_machine("dgx-a100")).summary
    assert f"MAPE {s.mape_pct:.1f}%" in r.stdout and "over 720 plans (720 runs)" in r.stdout
    assert "within 120 scenarios" in r.stdout
    assert "vtrain_a100_single_node_pp1.csv:" not in r.stdout.split("MAPE")[0]  # no per-run rows


def test_validate_errors_are_one_line(runs_file: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("machine,layers\nperlmutter,4\n")
    _one_error_line(run_cli("validate", str(bad)), "bad.csv:1: missing columns hidden, heads")
    broken = tmp_path / "broken.jsonl"
    broken.write_text(runs_file.read_text().splitlines()[0] + "\n{not json\n")
    _one_error_line(run_cli("validate", str(broken)), "broken.jsonl:2: malformed record")
    stale = tmp_path / "stale.jsonl"
    record = json.loads(runs_file.read_text().splitlines()[0])
    record["plan"]["micro_batch"] = 3  # the plan's batch arithmetic no longer adds up
    stale.write_text(json.dumps(record) + "\n")
    _one_error_line(run_cli("validate", str(stale)), "stale.jsonl:1 (its plan)", "global batch")
    _one_error_line(run_cli("validate", str(runs_file), "--machine", "frontier"),
                    "runs.jsonl:1: run was recorded on machine 'perlmutter', not 'frontier'")


def test_calibrate_writes_a_yaml_that_rank_accepts(tmp_path: Path) -> None:
    truth = load_machine("perlmutter").model_copy(update={"measured_bandwidth": ()})
    from axoplan.validate.calibrate import with_values

    runs = write_jsonl(tmp_path / "runs.jsonl", synthetic_runs(small_plans(), with_values(truth, TRUE_VALUES)))
    source = tmp_path / "perlmutter.yaml"
    source.write_text("\n".join(line for line in (REPO / "machines" / "perlmutter.yaml").read_text().splitlines()
                                if "stride" not in line and "measured_bandwidth" not in line) + "\n")
    out = tmp_path / "perlmutter-calibrated.yaml"
    r = run_cli("calibrate", str(runs), "--machine", str(source), "-o", str(out), "--holdout", "0.25", "--seed", "3",
                "--no-prior")  # plain least squares recovers the truth exactly from noise-free runs
    assert r.returncode == 0, r.stderr
    assert "held out (" in r.stdout and f"wrote {out}" in r.stdout
    text = out.read_text()
    assert text.startswith("# Calibrated by `axoplan calibrate` on ")
    assert "held out (25%, seed 3)" in text
    data = yaml.safe_load(text)
    assert data["gemm"]["max_efficiency"] == pytest.approx(TRUE_VALUES["gemm.max_efficiency"], rel=1e-3)
    assert data["inter_node"]["latency_us"] == pytest.approx(TRUE_VALUES["inter_node.latency_us"], rel=1e-3)
    assert "# 4 NVLink3 links per pair" in text  # the original's comments are kept
    ranked = run_cli("rank", "--model", "5B", "--gpus", "16", "--machine", str(out), "--top", "1")
    assert ranked.returncode == 0, ranked.stderr
    validated = run_cli("validate", str(runs), "--machine", str(out), "--summary-only")
    assert validated.returncode == 0 and "MAPE 0.0%" in validated.stdout
    _one_error_line(run_cli("calibrate", str(runs), "--machine", str(source), "-o", str(out)), "already exists")


def test_calibrate_refuses_bad_input(runs_file: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "m.yaml")
    _one_error_line(run_cli("calibrate", str(runs_file), "--machine", "frontier", "-o", out),
                    "recorded on machine 'perlmutter', not 'frontier'")
    _one_error_line(run_cli("calibrate", str(runs_file), "--machine", "perlmutter", "-o", out, "--holdout", "1.5"),
                    "--holdout 1.5")
    _one_error_line(run_cli("calibrate", str(runs_file), "--machine", "perlmutter", "-o", str(tmp_path / "m.txt")),
                    "must end in .yaml")
    _one_error_line(run_cli("calibrate", str(runs_file), "--machine", "perlmutter", "-o", out, "--params", "gem"),
                    "unknown parameter 'gem'")
    assert not (tmp_path / "m.yaml").exists()


def test_plot_scaling_and_breakdown(tmp_path: Path) -> None:
    r = run_cli("plot", "scaling", "--machine", "perlmutter", "--models", "5B,20B", "--gpus", "64,128",
                "-o", str(tmp_path / "s.svg"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "s.svg").read_text().lstrip().startswith("<?xml")
    assert len([ln for ln in r.stdout.splitlines() if ln.startswith(("5B", "20B"))]) == 4
    r = run_cli("plot", "breakdown", "--model", "5B", "--gpus", "64", "--machine", "perlmutter", "-o",
                str(tmp_path / "b.png"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"
    _one_error_line(run_cli("plot", "breakdown", "--model", "5B", "--gpus", "64", "-o", str(tmp_path / "b.gif")),
                    "must end in .png, .svg, .pdf")


_ORDER_CSV_HEADER = ("machine,model_name,layers,hidden,heads,vocab,max_positions,seq_len,global_batch,micro_batch,"
                     "gx,gy,gz,gdata,recompute,cache_weights,tp_order,t_step_s")


def _explained_s(*args: str) -> float:
    r = run_cli("explain", "--model", "20B", "--gpus", "128", "--machine", "frontier", "--micro-batch", "4",
                "--recompute", "off", "--cache-weights", "on", *args)
    assert r.returncode == 0, r.stderr
    return float(r.stdout.split("predicted ", 1)[1].split(" s/iter", 1)[0])


def test_validate_predicts_a_plan_in_its_own_tensor_parallel_order(tmp_path: Path) -> None:
    """Issue 29: validate priced every measured plan in AxoNN's default order; a 20B-shaped
    4x2x8x2/zxy plan on Frontier must get explain's figure for 4x2x8x2/zxy, not the xyz one."""
    zxy = _explained_s("--layout", "4x2x8x2/zxy")
    xyz = _explained_s("--layout", "4x2x8x2", "--tp-order", "xyz")
    assert abs(zxy / xyz - 1) > 0.05  # the order matters for this layout, so the test can fail
    runs = tmp_path / "runs.csv"
    row = "frontier,20B,32,7168,56,51200,2048,2048,2048,4,4,2,8,2,false,true,{order},100.0"
    runs.write_text("\n".join([_ORDER_CSV_HEADER, row.format(order="zxy"), row.format(order="xyz")]) + "\n")
    table = tmp_path / "table.json"
    r = run_cli("validate", str(runs), "--out", str(table))
    assert r.returncode == 0, r.stderr
    predicted = [rec["predicted_s"] for rec in json.loads(table.read_text())]
    assert predicted == [pytest.approx(zxy, abs=5e-5), pytest.approx(xyz, abs=5e-5)]
