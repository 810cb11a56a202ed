"""`axoplan validate --probe`: runs predicted on their machine as a probe measured the host they ran on."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from axoplan.errors import AxoplanError
from axoplan.inputs.machine import load_machine, machines_dir, merge_fragment
from tests.conftest import REPO, run_cli_here

H100 = REPO / "data" / "measured" / "gpu-h100-h200" / "axoplan-measure-gpu-h100"
FRAGMENT = {"host": {"op_us": 8.0, "launch_us": 17.0}}


def _write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_fragment_replaces_what_it_measured_and_marks_it_measured(tmp_path: Path) -> None:
    """The fragment's numbers replace the machine's; each becomes a measured parameter (its prior the registry's
    measured spread), so the shipped range, which described the replaced value, no longer applies."""
    shipped = load_machine("dgx-h100")
    assert shipped.uncertainty.ranges["host.op_us"] == (3.36, 4.26)  # the shipped YAML's sourced range
    probed = load_machine("dgx-h100", _write(tmp_path / "probe.yaml", FRAGMENT))
    assert (probed.host.op_us, probed.host.launch_us) == (8.0, 17.0)
    assert probed.host.overlaps_device is shipped.host.overlaps_device  # a mapping merges: the rest is kept
    assert probed.uncertainty.sources["host.op_us"] == probed.uncertainty.sources["host.launch_us"] == "measured"
    assert "host.op_us" not in probed.uncertainty.ranges and "host.launch_us" not in probed.uncertainty.ranges
    assert probed.uncertainty.ranges["gemm.max_efficiency"] == shipped.uncertainty.ranges["gemm.max_efficiency"]
    assert probed.gemm == shipped.gemm and probed.name == shipped.name


def test_a_fragment_with_an_implausible_value_is_refused_naming_both_files(tmp_path: Path) -> None:
    bad = _write(tmp_path / "probe.yaml", {"host": {"op_us": -1.0}})
    with pytest.raises(AxoplanError) as err:
        load_machine("dgx-h100", bad)
    assert "dgx-h100.yaml + " in str(err.value) and "probe.yaml" in str(err.value) and "op_us" in str(err.value)


def _predicted(stdout: str) -> list[float]:
    rows = [line.split() for line in stdout.splitlines() if line.startswith("runs.jsonl:")]
    return [float(row[-2]) for row in rows]


def test_validate_with_a_probe_predicts_as_the_merged_machine_does(tmp_path: Path) -> None:
    """--probe is the user's own merge (`merge_fragment` into a copy of the YAML) in one flag, and a host the
    probe found slower than the shipped machine's makes the executor's host-bound step slower."""
    runs = H100 / "runs.jsonl"
    plain = run_cli_here("validate", str(runs))
    probed = run_cli_here("validate", str(runs), "--probe", str(H100 / "probe.yaml"))
    base = yaml.safe_load((machines_dir() / "dgx-h100.yaml").read_text())
    merged = _write(tmp_path / "dgx-h100.yaml", merge_fragment(base, yaml.safe_load((H100 / "probe.yaml").read_text())))
    by_hand = run_cli_here("validate", str(runs), "--machine", str(merged))
    for r in (plain, probed, by_hand):
        assert r.returncode == 0, r.stderr
    assert "merged into each machine" in probed.stderr
    assert _predicted(probed.stdout) == _predicted(by_hand.stdout)
    probe = yaml.safe_load((H100 / "probe.yaml").read_text())["host"]
    assert probe["op_us"] > load_machine("dgx-h100").host.op_us  # the records' host is slower per op
    assert all(p > q for p, q in zip(_predicted(probed.stdout), _predicted(plain.stdout), strict=True))


def test_validate_writes_the_probed_predictions_to_its_table(tmp_path: Path) -> None:
    out = tmp_path / "table.csv"
    r = run_cli_here("validate", str(H100 / "runs.jsonl"), "--probe", str(H100 / "probe.yaml"), "--out", str(out),
                     "--summary-only")
    assert r.returncode == 0, r.stderr
    table = pd.read_csv(out)
    assert len(table) == 2 and (table["predicted_s"] > 0).all()


def test_a_missing_probe_is_one_line(tmp_path: Path) -> None:
    r = run_cli_here("validate", str(H100 / "runs.jsonl"), "--probe", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "--probe" in r.stderr and "does not exist" in r.stderr


def test_rank_and_explain_take_the_probe_as_the_merged_machine_with_measured_spreads(tmp_path: Path) -> None:
    """`rank` and `explain` read --probe as `validate` does: the hand-merged YAML's prediction, with an interval no
    wider (what the probe measured spreads by the measured prior, not the shipped range of the value it replaced),
    and a host twice as slow per op makes the host-bound executor step slower than on the shipped machine."""
    fragment = _write(tmp_path / "probe.yaml", {"host": {"op_us": 8.0, "launch_us": 17.0}})
    base = yaml.safe_load((machines_dir() / "dgx-h100.yaml").read_text())
    merged = _write(tmp_path / "dgx-h100.yaml", merge_fragment(base, yaml.safe_load(fragment.read_text())))
    model = ["--layers", "4", "--hidden", "2048", "--heads", "16", "--vocab", "32000", "-g", "1", "--global-batch", "8",
             "--micro-batch", "1", "--recompute", "off", "--framework", "axoplan-executor"]
    rows = {}
    for name, machine in (("probed", ["--machine", "dgx-h100", "--probe", str(fragment)]),
                          ("by_hand", ["--machine", str(merged)]), ("shipped", ["--machine", "dgx-h100"])):
        out = tmp_path / f"{name}.json"
        r = run_cli_here("rank", *model, *machine, "-o", str(out))
        assert r.returncode == 0, r.stderr
        rows[name] = json.loads(out.read_text())["rows"][0]
        explained = run_cli_here("explain", *model, *machine, "-l", "1x1x1x1")
        assert explained.returncode == 0, explained.stderr
        assert f"predicted {rows[name]['t_step_s']:.4f} s/iter" in explained.stdout
    assert rows["probed"]["t_step_s"] == rows["by_hand"]["t_step_s"] > 1.3 * rows["shipped"]["t_step_s"]
    width = {k: r["t_high_s"] / r["t_low_s"] for k, r in rows.items()}
    assert width["probed"] < width["by_hand"]
