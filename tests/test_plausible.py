"""Plausible inputs (issue 23): every number in a machine, model or run has a unit and a range in one place.

Absurd values are errors naming the field, its unit and the range; unusual ones a one-line
warning; booleans where numbers belong and keys given twice are refused; a GPU count beyond
the machine, an absurd token count, and a plan that contradicts itself are refused.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel

from axoplan.cost.budget import parse_tokens
from axoplan.errors import AxoplanError
from axoplan.inputs.machine import Machine, load_machine, machines_dir, shipped_machines
from axoplan.inputs.model import ModelSpec, load_model
from axoplan.inputs.options import RunOptions
from axoplan.inputs.plausible import (
    MACHINE_RANGES,
    MODEL_RANGES,
    RUN_RANGES,
    PlausibilityWarning,
    Range,
    check_plausible,
)
from axoplan.records.plan import LaunchConfig
from axoplan.search.ranking import rank
from tests.conftest import run_cli


def _numeric_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Dotted paths (``*`` for list items and mapping values) of every int or float field of `model`."""
    out: set[str] = set()
    for name, field in model.model_fields.items():
        out |= _paths_of(field.annotation, f"{prefix}{name}")
    return out


def _paths_of(annotation: Any, path: str) -> set[str]:
    if annotation in (int, float):
        return {path}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _numeric_paths(annotation, path + ".")
    args = [a for a in get_args(annotation) if a is not type(None) and a is not Ellipsis]
    origin = getattr(annotation, "__origin__", None)
    if origin in (tuple, list) and args:
        return set().union(*(_paths_of(a, path + ".*") for a in args))
    if origin is dict and len(args) == 2:
        return _paths_of(args[1], path + ".*")
    if args:  # a union or Annotated: the numeric members
        return set().union(*(_paths_of(a, path) for a in args))
    return set()


def test_every_numeric_field_of_a_machine_model_and_run_has_a_range():
    skip = {"uncertainty.ranges.*.*"}  # a prior range obeys its own field's range (test below)
    assert _numeric_paths(Machine) - skip <= set(MACHINE_RANGES), _numeric_paths(Machine) - set(MACHINE_RANGES)
    assert _numeric_paths(ModelSpec) <= set(MODEL_RANGES)
    assert _numeric_paths(RunOptions) <= set(RUN_RANGES)
    # and no range names a field that does not exist
    assert set(MACHINE_RANGES) <= _numeric_paths(Machine)
    assert set(MODEL_RANGES) <= _numeric_paths(ModelSpec)


@pytest.mark.parametrize("name", shipped_machines())
def test_every_shipped_machine_is_plausible_without_a_warning(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlausibilityWarning)
        load_machine(name)


def test_a_range_raises_outside_hard_warns_outside_usual_and_names_unit_and_range():
    r = Range("GB/s", (1.0, 100.0), (2.0, 50.0), slip="did you give Gb/s?")
    assert r.check("f", 10.0) is None
    assert "unusual (usually 2-50 GB/s)" in (r.check("f", 60.0) or "")
    with pytest.raises(AxoplanError, match=r"f = 101 GB/s is outside 1-100 GB/s; did you give Gb/s\?"):
        r.check("f", 101.0)
    with pytest.raises(AxoplanError, match="outside 1-100 GB/s$"):  # the slip is named only above the range
        r.check("f", 0.5)


def _machine(tmp_path: Path, edit: dict[str, Any], base: str = "perlmutter") -> Path:
    data = yaml.safe_load((machines_dir() / f"{base}.yaml").read_text())
    for path, value in edit.items():
        *parents, leaf = path.split(".")
        node = data
        for p in parents:
            node = node[p]
        node[leaf] = value
    out = tmp_path / "mine.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


@pytest.mark.parametrize(("edit", "expect"), [
    ({"device.peak_bf16_tflops": 1e9}, "'device.peak_bf16_tflops' = 1000000000 TFLOP/s is outside"),
    ({"device.peak_bf16_tflops": 1e-6}, "'device.peak_bf16_tflops' = 1e-06 TFLOP/s is outside"),
    ({"device.hbm_gb": 1e6}, "'device.hbm_gb' = 1000000 GB is outside 0.1-10000 GB"),
    ({"inter_node.latency_us": 1e9}, "'inter_node.latency_us' = 1000000000 us is outside"),
    ({"gemm.max_efficiency": 1e-9}, "'gemm.max_efficiency' = 1e-09 (fraction) is outside"),
    ({"inter_node.nic_bandwidth_gbs": 400}, "did you give Gb/s? Divide by 8"),
    ({"devices_per_node": True}, "'devices_per_node': expected a number in devices, got true"),
    ({"devices_per_node": 1_000_000}, "'devices_per_node' = 1000000 devices is outside 1-4096"),
])
def test_absurd_machine_values_are_refused_naming_field_unit_and_range(tmp_path: Path, edit, expect: str):
    with pytest.raises(AxoplanError) as err:
        load_machine(_machine(tmp_path, edit))
    assert expect in str(err.value) and "mine.yaml" in str(err.value)


def test_an_unusual_value_is_one_warning_and_the_machine_still_loads(tmp_path: Path):
    with pytest.warns(PlausibilityWarning, match="'inter_node.nic_bandwidth_gbs' = 150 GB/s per NIC is unusual"):
        m = load_machine(_machine(tmp_path, {"inter_node.nic_bandwidth_gbs": 150}))
    assert m.inter_node.nic_bandwidth_gbs == 150


def test_a_prior_range_obeys_its_fields_range(tmp_path: Path):
    path = _machine(tmp_path, {"uncertainty.ranges": {"host.op_us": [1.0, 1e9]}})
    with pytest.raises(AxoplanError, match=r"'uncertainty.ranges.host.op_us.1' = 1000000000 us is outside"):
        load_machine(path)


def test_a_key_given_twice_is_refused_with_its_line(tmp_path: Path):
    path = tmp_path / "dup.yaml"
    path.write_text("num_layers: 4\nhidden: 256\nhidden: 512\nnum_heads: 4\n")
    with pytest.raises(AxoplanError, match="line 3: key 'hidden' is given twice"):
        load_model(path)


def test_model_values_and_overrides_are_checked():
    with pytest.raises(AxoplanError, match="'hidden' = 8388608 features is outside"):
        load_model("5B", hidden=1 << 23)
    with pytest.raises(AxoplanError, match="'num_layers': expected a number"):
        check_plausible({"num_layers": False}, MODEL_RANGES, "m")


@pytest.mark.parametrize(("field", "value"), [("global_batch", 99_999_999_999), ("seq_len", 1 << 25),
                                              ("micro_batches", (1, 1 << 21))])
def test_absurd_run_options_are_refused(field: str, value: object):
    with pytest.raises(AxoplanError, match=f"run options: field '{field}"):
        RunOptions.model_validate({field: value})


def test_token_counts_beyond_any_training_run_are_refused_and_large_ones_warned():
    assert parse_tokens("300B") == 300 * 10**9
    with pytest.raises(AxoplanError, match="more than any training run could use"):
        parse_tokens("1e30")
    with pytest.warns(PlausibilityWarning, match="more than twice the largest published"):
        assert parse_tokens("200T") == 2 * 10**14


def test_more_gpus_than_the_machine_has_are_refused():
    m = load_machine("perlmutter-80gb")
    assert m.total_devices == 256 * 4  # 256 nodes of 4 A100-80GB [doc NERSC]
    with pytest.raises(AxoplanError, match=r"more than perlmutter-80gb has \(256 nodes x 4 = 1024 GPUs\)"):
        rank(load_model("20B"), m, RunOptions(), 65536)
    assert rank(load_model("5B"), m, RunOptions(), 1024).num_feasible > 0


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("plans")
    done = run_cli("export", "--model", "5B", "--gpus", "16", "--machine", "perlmutter", "--top", "1",
                   "--out-dir", str(out))
    assert done.returncode == 0, done.stderr
    [plan] = out.glob("*/plan.json")
    return json.loads(plan.read_text())


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: d.update(nodes=7), "field 'nodes' is 7, but 16 GPUs at 4 per node need 4"),
    (lambda d: d.update(world_size=32), "field 'world_size' is 32"),
    (lambda d: d["model"].update(hidden=8192), "field 'plan_id' is"),
    (lambda d: d["options"].update(micro_batches=[m for m in (1, 2, 4, 8, 16) if m != d["micro_batch"]]),
     "not one of options.micro_batches"),
    (lambda d: d["options"].update(recompute="on" if not d["recompute"] else "off"), "field 'recompute'"),
    (lambda d: d["options"].update(global_batch=d["options"]["global_batch"] * 2), "field 'grad_accum_steps'"),
])
def test_a_plan_that_contradicts_itself_is_refused_naming_the_field(plan_json: dict[str, Any], edit, field: str):
    assert LaunchConfig.from_dict(plan_json).plan_id == plan_json["plan_id"]  # the export itself is consistent
    data = json.loads(json.dumps(plan_json))
    edit(data)
    with pytest.raises(AxoplanError) as err:
        LaunchConfig.from_dict(data, "plan.json")
    assert str(err.value).startswith("plan.json: ") and field in str(err.value)


def test_the_cli_shows_a_warning_as_one_line_and_still_answers(tmp_path: Path):
    path = _machine(tmp_path, {"inter_node.nic_bandwidth_gbs": 150})
    done = run_cli("rank", "--model", "5B", "--gpus", "16", "--machine", str(path), "--top", "1")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"axoplan: warning: {path}: field 'inter_node.nic_bandwidth_gbs' = 150 GB/s per NIC is unusual (usually "
        "0.1-100 GB/s per NIC); no NIC is that fast (the fastest carry 800 Gb/s = 100 GB/s): did you give Gb/s? "
        "Divide by 8"]


def test_a_plan_exported_by_an_earlier_version_keeps_its_id(plan_json: dict[str, Any]):
    # versions of 2026-11 hashed options added after the id scheme (attention, framework, ...) even at their
    # default; such a plan is still consistent, and the measured CPU runs keep the ids they were recorded with
    from axoplan.records.plan import plan_id

    plan = LaunchConfig.from_dict(plan_json)
    earlier = plan_id(plan.machine, plan.model, plan.options, plan.layout.to_layout(), plan.micro_batch,
                      plan.recompute, plan.cache_weights, hashed_defaults=("concurrent_z", "attention", "framework"))
    assert earlier != plan.plan_id
    assert LaunchConfig.from_dict({**plan_json, "plan_id": earlier}).plan_id == earlier
    with pytest.raises(AxoplanError, match="field 'plan_id'"):
        LaunchConfig.from_dict({**plan_json, "plan_id": "0123456789ab"})


@pytest.mark.parametrize(("edit", "expect"), [
    (lambda r: r.update(plan_id="0123456789ab"), "field 'plan_id' is '0123456789ab', but its plan's is"),
    (lambda r: r.update(world_size=r["world_size"] * 2), "field 'world_size' is"),
    (lambda r: r["plan"].update(nodes=99), "(its plan): field 'nodes' is 99"),
])
def test_a_run_record_that_contradicts_itself_is_refused_naming_the_field(tmp_path: Path, edit, expect: str):
    from tests.conftest import REPO

    record = json.loads((REPO / "data" / "measured" / "cpu-gloo" / "runs.jsonl").read_text().splitlines()[0])
    edit(record)
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(record) + "\n")
    done = run_cli("validate", str(path))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"{path}:1" in done.stderr and expect in done.stderr, done.stderr
