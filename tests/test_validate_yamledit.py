"""The calibrated YAML: fitted values replaced in place, comments kept, always the right machine."""

from __future__ import annotations

import pytest
import yaml

from axoplan.inputs.machine import Machine, load_machine, machines_dir, shipped_machines
from axoplan.validate.calibrate import PARAMETERS, with_values
from axoplan.validate.yamledit import edit_values, format_value, machine_yaml

NEW = {p.path: round((p.low * p.high) ** 0.5, 3) if p.high > 1 else 0.123 for p in PARAMETERS}


@pytest.mark.parametrize("name", shipped_machines())
def test_every_shipped_machine_is_edited_in_place(name: str) -> None:
    text = (machines_dir() / f"{name}.yaml").read_text()
    machine = with_values(load_machine(name), {k: float(format_value(v)) for k, v in NEW.items()})
    out = machine_yaml(text, machine, NEW, "# header\n", "calibrated today")
    assert Machine.model_validate(yaml.safe_load(out)) == machine
    assert out.startswith("# header\n")
    kept = [line for line in text.splitlines() if line.lstrip().startswith("#")]
    assert all(line in out.splitlines() for line in kept)  # every comment-only line survives
    assert out.count("calibrated today") == len(NEW)


def test_a_replaced_line_keeps_its_source_comment() -> None:
    text = "gemm:\n  max_efficiency: 0.8               # cuBLAS [assumed]\n  half_efficiency_dim: 96\n"
    out = edit_values(text, {"gemm.max_efficiency": 0.61}, "calibrated 2026-01-01")
    line = out.splitlines()[1]
    assert line.startswith("  max_efficiency: 0.61 ")
    assert line.endswith("# calibrated 2026-01-01, was 0.8; cuBLAS [assumed]")
    assert line.index("#") == text.splitlines()[1].index("#")  # comment column kept
    assert yaml.safe_load(out)["gemm"] == {"max_efficiency": 0.61, "half_efficiency_dim": 96}


def test_missing_keys_are_added_under_their_parent() -> None:
    text = "intra_node:\n  latency_us: 2.0\n  link_classes:\n    - name: a\n      bandwidth_gbs: 100\nname: m\n"
    out = edit_values(text, {"intra_node.efficiency": 0.5, "memory_efficiency": 0.4}, "fit")
    data = yaml.safe_load(out)
    assert data["intra_node"]["efficiency"] == 0.5
    assert data["intra_node"]["link_classes"] == [{"name": "a", "bandwidth_gbs": 100}]
    assert data["memory_efficiency"] == 0.4


def test_keys_inside_lists_are_not_mistaken_for_parameters() -> None:
    text = "intra_node:\n  link_classes:\n    - name: a\n      efficiency: 0.3\n  efficiency: 0.75\n"
    out = edit_values(text, {"intra_node.efficiency": 0.5}, "fit")
    assert yaml.safe_load(out)["intra_node"] == {"link_classes": [{"name": "a", "efficiency": 0.3}], "efficiency": 0.5}


def test_flow_style_yaml_falls_back_to_a_full_dump() -> None:
    original = load_machine("perlmutter")
    data = original.model_dump(mode="json", exclude_none=True)
    text = yaml.safe_dump(data, default_flow_style=True)  # one line of flow mappings: nothing to edit in place
    machine = with_values(original, {"gemm.max_efficiency": 0.5})
    out = machine_yaml(text, machine, {"gemm.max_efficiency": 0.5}, "# fitted\n", "fit")
    assert out.startswith("# fitted\n")
    assert Machine.model_validate(yaml.safe_load(out)) == machine


@pytest.mark.parametrize(("value", "text"), [(0.8, "0.8"), (1.0, "1.0"), (817.93, "817.9"), (123456.0, "1.235e+05"),
                                             (20.0, "20.0")])
def test_format_value_reads_back_as_a_float(value: float, text: str) -> None:
    assert format_value(value) == text
    assert isinstance(yaml.safe_load(f"x: {text}")["x"], float)
