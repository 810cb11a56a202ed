"""Reading measured runs: the executor's JSON lines, axoplan's CSV and the vTrain CSV; every bad
input is one error naming its file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from axoplan.errors import AxoplanError
from axoplan.inputs.machine import load_machine
from axoplan.space.layout import Layout
from axoplan.validate.records import (
    CSV_REQUIRED,
    Measured,
    by_machine,
    load_runs,
    machine_matches,
    runs_of_machine,
    skipped_note,
)
from tests.conftest import REPO
from tests.validate_helpers import small_plans, synthetic_runs, theory_machine, write_jsonl

VTRAIN = REPO / "data" / "measured" / "vtrain_a100_single_node_pp1.csv"
HEADER = ",".join(CSV_REQUIRED)
ROW = "perlmutter,4,1024,16,1024,64,2,1,2,1,2,true,0.5"  # the columns of CSV_REQUIRED, in order


def _csv(tmp_path: Path, *lines: str, header: str = HEADER) -> Path:
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


def test_csv_row_becomes_a_plan(tmp_path: Path) -> None:
    csv_path = _csv(tmp_path, ROW + ",0.3,0.01,false", header=HEADER + ",phase_gemm_s,t_step_std_s,oar")
    [run] = load_runs([csv_path])
    plan = run.plan
    assert plan.layout.to_layout() == Layout(1, 2, 1, 2)
    assert (plan.micro_batch, plan.recompute, plan.cache_weights) == (2, True, False)
    assert (plan.model.num_layers, plan.model.hidden, plan.model.num_heads) == (4, 1024, 16)
    assert (plan.options.global_batch, plan.options.seq_len) == (64, 1024)
    assert plan.options.overlap_all_reduce is False and plan.options.overlap_all_gather is True
    assert plan.devices_per_node == 4  # from the shipped perlmutter machine
    assert plan.grad_accum_steps == 64 // (2 * 1 * 2)
    assert run.t_step_s == 0.5 and run.t_step_std_s == 0.01
    assert run.phase_s == {"gemm": 0.3}
    assert run.where == f"{csv_path}:2"


def test_missing_column_is_named(tmp_path: Path) -> None:
    header = HEADER.replace("micro_batch,", "")
    row = "perlmutter,4,1024,16,1024,64,1,2,1,2,true,0.5"
    with pytest.raises(AxoplanError, match=r"runs.csv:1: missing column micro_batch"):
        load_runs([_csv(tmp_path, row, header=header)])


def test_unknown_column_gets_a_hint(tmp_path: Path) -> None:
    with pytest.raises(AxoplanError, match=r"unknown column 'micro_btach' \(did you mean 'micro_batch'\?\)"):
        load_runs([_csv(tmp_path, ROW + ",1", header=HEADER + ",micro_btach")])


def test_bad_cell_names_line_and_column(tmp_path: Path) -> None:
    bad = ROW.replace(",2,1,2,1,2,", ",two,1,2,1,2,")
    with pytest.raises(AxoplanError, match=r"runs.csv:3: column 'micro_batch': 'two' is not a whole number"):
        load_runs([_csv(tmp_path, ROW, bad)])


def test_malformed_row_is_reported_with_its_line_never_skipped(tmp_path: Path) -> None:
    # line 1 header, 2 good, 3 blank (skipped), 4 short
    with pytest.raises(AxoplanError, match=r"runs.csv:4: malformed row: 3 fields, the header has 13"):
        load_runs([_csv(tmp_path, ROW, "", "a,b,c")])


def test_row_whose_plan_cannot_be_built(tmp_path: Path) -> None:
    bad = ROW.replace(",64,2,", ",63,2,")  # global batch 63 is not divisible by Gdata*Gz*mb = 4
    with pytest.raises(AxoplanError, match=r"runs.csv:2: global batch 63 is not divisible"):
        load_runs([_csv(tmp_path, bad)])


def test_non_positive_time_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AxoplanError, match=r"runs.csv:2: column 't_step_s': 0.0 must be a positive time"):
        load_runs([_csv(tmp_path, ROW[: ROW.rfind(",")] + ",0")])


def test_unknown_machine_without_node_size(tmp_path: Path) -> None:
    with pytest.raises(AxoplanError, match=r"runs.csv:2: machine 'nowhere' .* add a devices_per_node column"):
        load_runs([_csv(tmp_path, ROW.replace("perlmutter", "nowhere"))])


def test_jsonl_records_keep_their_line_numbers(tmp_path: Path) -> None:
    runs = synthetic_runs(small_plans(worlds=(4,), micro_batches=(1,), recompute=(False,))[:2], theory_machine())
    path = write_jsonl(tmp_path / "runs.jsonl", runs)
    path.write_text("\n" + path.read_text())  # a blank first line shifts the records to lines 2 and 3
    loaded = load_runs([path])
    assert [r.where for r in loaded] == [f"{path}:2", f"{path}:3"]
    executed = [r.plan.model_copy(update={"options": r.plan.options.model_copy(
        update={"framework": "axoplan-executor"})}) for r in runs]
    assert [r.plan for r in loaded] == executed  # a record of `axoplan run` is a run of axoplan's executor
    assert [r.t_step_s for r in loaded] == pytest.approx([r.t_step_s for r in runs])


def test_malformed_json_line_is_named(tmp_path: Path) -> None:
    runs = synthetic_runs(small_plans(worlds=(4,), micro_batches=(1,), recompute=(False,))[:1], theory_machine())
    path = write_jsonl(tmp_path / "runs.jsonl", runs)
    path.write_text(path.read_text() + '{"schema_version": 1, "plan_id": \n')
    with pytest.raises(AxoplanError, match=r"runs.jsonl:2: malformed record"):
        load_runs([path])


def test_record_whose_plan_no_longer_validates(tmp_path: Path) -> None:
    runs = synthetic_runs(small_plans(worlds=(4,), micro_batches=(1,), recompute=(False,))[:1], theory_machine())
    path = write_jsonl(tmp_path / "runs.jsonl", runs)
    record = json.loads(path.read_text())
    record["plan"]["world_size"] = 8  # the layout has 4 GPUs
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(AxoplanError, match=r"runs.jsonl:1 \(its plan\).*world_size"):
        load_runs([path])


def test_unknown_file_type_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "runs.txt").write_text("x")
    with pytest.raises(AxoplanError, match="unknown runs file type '.txt'"):
        load_runs([tmp_path / "runs.txt"])
    with pytest.raises(AxoplanError, match="does not exist"):
        load_runs([tmp_path / "nope.jsonl"])
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(AxoplanError, match="no measured runs"):
        load_runs([tmp_path / "empty.jsonl"])


def test_vtrain_rows_map_to_megatron_layouts() -> None:
    runs = load_runs([VTRAIN])
    assert len(runs) == 720
    first = runs[0]  # 4,32,2,2048,16,16,1024,1,4,1,406.355066
    assert first.plan.layout.to_layout() == Layout(1, 1, 1, 4)
    assert (first.plan.options.global_batch, first.plan.micro_batch) == (32, 2)
    assert (first.plan.model.hidden, first.plan.model.num_layers, first.plan.model.num_heads) == (2048, 16, 16)
    assert first.t_step_s == pytest.approx(0.406355066)
    assert first.where.endswith(":2")
    second = runs[1]  # 8,32,2,1024,16,16,1024,4,2,1,...: t = 4 is Gy, d = 2 is Gdata
    assert second.plan.layout.to_layout() == Layout(1, 4, 1, 2)
    assert all(r.plan.recompute and not r.plan.cache_weights and not r.plan.options.overlap_all_reduce
               for r in runs)
    assert {r.plan.machine for r in runs} == {"dgx-a100"}
    assert {r.plan.layout.gx for r in runs} == {1} and {r.plan.layout.gz for r in runs} == {1}


def test_vtrain_pipeline_rows_are_refused(tmp_path: Path) -> None:
    lines = VTRAIN.read_text().splitlines()
    path = tmp_path / "v.csv"
    path.write_text("\n".join([lines[0], lines[1], "4,32,2,2048,16,16,1024,1,2,2,400.0"]) + "\n")
    with pytest.raises(AxoplanError, match=r"v.csv:3: pipeline parallelism 2"):
        load_runs([path])
    path.write_text("\n".join([lines[0], "4,32,2,2048,16,16,1024,2,4,1,400.0"]) + "\n")
    with pytest.raises(AxoplanError, match=r"v.csv:2: t·d = 8 is not the 4 GPUs"):
        load_runs([path])


def test_runs_from_another_machine_are_refused() -> None:
    plans = small_plans(worlds=(4,), micro_batches=(1,), recompute=(False,))[:1]
    runs = [Measured(plans[0], 1.0, "runs.jsonl:7")]
    with pytest.raises(AxoplanError, match=r"runs.jsonl:7: run was recorded on machine 'perlmutter', not 'frontier'"):
        runs_of_machine(runs, load_machine("frontier"), "frontier")
    assert runs_of_machine(runs, load_machine("perlmutter"), "perlmutter") == (runs, [])


def test_a_calibrated_copy_matches_the_runs_of_its_machine() -> None:
    perlmutter = load_machine("perlmutter")
    assert machine_matches("perlmutter", perlmutter, "out/perlmutter-calibrated.yaml")
    assert machine_matches("/elsewhere/perlmutter.yaml", perlmutter, "perlmutter")
    assert not machine_matches("frontier", perlmutter, "perlmutter")


def test_runs_are_grouped_by_the_machine_they_were_recorded_on() -> None:
    """Issue 30 item 4: a file of several machines is one group per machine (a YAML path by its stem), and
    --machine keeps its own runs and names the rest in one note; none of its own is still an error."""
    a = small_plans(worlds=(4,), micro_batches=(1,), recompute=(False,))[0]
    b = a.model_copy(update={"machine": "frontier"})
    c = a.model_copy(update={"machine": "/calibrated/perlmutter.yaml"})
    runs = [Measured(a, 1.0, "x:1"), Measured(b, 1.0, "x:2"), Measured(c, 1.0, "x:3")]
    groups = by_machine(runs)
    assert list(groups) == ["perlmutter", "frontier"] and [r.where for r in groups["perlmutter"]] == ["x:1", "x:3"]
    perlmutter = load_machine("perlmutter")
    kept, skipped = runs_of_machine(runs, perlmutter, "perlmutter")
    assert [r.where for r in kept] == ["x:1", "x:3"] and [r.where for r in skipped] == ["x:2"]
    assert skipped_note(skipped, perlmutter) == ("note: skipped 1 run recorded on frontier (not perlmutter); give "
                                                 "--machine frontier for those, or no --machine for every machine")
    with pytest.raises(AxoplanError, match=r"x:2: run was recorded on machine 'frontier', not 'perlmutter'"):
        runs_of_machine([runs[1]], perlmutter, "perlmutter")
    with pytest.raises(AxoplanError, match=r"^no run was recorded on alps: the runs are of perlmutter, frontier; "):
        runs_of_machine(runs, load_machine("alps"), "alps")


def test_a_launch_config_given_as_runs_says_how_to_measure_it(tmp_path: Path) -> None:
    """Issue 30 item 7: `validate plan.json` pointed at JSON syntax; a plan is named as one, with the run
    that makes its records, and any other single JSON document is named as not records one per line."""
    plan = small_plans(worlds=(4,), micro_batches=(1,), recompute=(False,))[0]
    folder = tmp_path / "01-x1-y2-z1-d2"
    folder.mkdir()
    path = folder / "plan.json"
    path.write_text(plan.model_dump_json(indent=2) + "\n")
    with pytest.raises(AxoplanError, match=rf"^{path} is a launch config \(a plan\), not measured runs: `axoplan "
                                           rf"run {path}` times it and appends its record to {folder}/runs.jsonl"):
        load_runs([path])
    path.write_text(plan.model_dump_json() + "\n")  # on one line too
    with pytest.raises(AxoplanError, match=r"is a launch config \(a plan\)"):
        load_runs([path])
    other = tmp_path / "list.json"
    other.write_text("[1, 2]\n")
    with pytest.raises(AxoplanError, match=r"list.json holds one JSON array, not measured-run records one per line"):
        load_runs([other])


def test_comment_lines_and_a_byte_order_mark_before_the_header_are_read(tmp_path: Path) -> None:
    """A spreadsheet's byte-order mark and '#' lines before the header (a file's provenance) are skipped."""
    path = tmp_path / "runs.csv"
    path.write_text("\ufeff# measured on our cluster\n# by us\n" + HEADER + "\n" + ROW + "\n", encoding="utf-8")
    [run] = load_runs([path])
    assert run.plan.layout.to_layout() == Layout(1, 2, 1, 2) and run.where.endswith(":4")


def test_attention_kernel_and_tensor_parallel_order_columns(tmp_path: Path) -> None:
    path = _csv(tmp_path, ROW + ",flash-triton,zxy,pytorch-fsdp", header=HEADER + ",attention,tp_order,framework")
    [run] = load_runs([path])
    assert run.plan.options.attention == "flash-triton" and run.plan.options.framework == "pytorch-fsdp"
    assert run.plan.layout.tp_order == "zxy"
    with pytest.raises(AxoplanError, match=r"runs.csv:2: .*'xxy'"):
        load_runs([_csv(tmp_path, ROW + ",xxy", header=HEADER + ",tp_order")])


def test_a_row_whose_shape_contradicts_its_parameter_count_is_refused(tmp_path: Path) -> None:
    """num_params is the source's count: the row's model must give exactly it (the llm-foundry rows do)."""
    from axoplan.inputs.model import ModelSpec

    good = ModelSpec(num_layers=4, hidden=1024, num_heads=16).num_params()
    assert load_runs([_csv(tmp_path, ROW + f",{good}", header=HEADER + ",num_params")])
    with pytest.raises(AxoplanError, match=r"runs.csv:2: column 'num_params': the row's shape gives"):
        load_runs([_csv(tmp_path, ROW + f",{good + 1}", header=HEADER + ",num_params")])


def test_the_llm_foundry_csv_is_what_its_tables_give() -> None:
    """data/measured/llm-foundry/runs-a100.csv is made from the published tables, not edited by hand:
    the converter reproduces it, and every row's shape gives the table's NumParams (the reader checks)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "llm_foundry_runs.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = load_runs([REPO / "data" / "measured" / "llm-foundry" / "runs-a100.csv"])
    assert len(runs) == 139 and {r.plan.machine for r in runs} == {"dgx-a100", "dgx-a100-80gb"}
    assert {r.plan.options.framework for r in runs} == {"pytorch-fsdp"}
    seventy = [r for r in runs if r.plan.model.name == "mpt-70b" and r.plan.world_size == 64
               and r.plan.machine == "dgx-a100-80gb"]
    assert len(seventy) == 1 and seventy[0].t_step_s == pytest.approx(4194304 / 26274, rel=1e-5)
