"""Machine YAMLs: shipped machines load, user YAMLs load by path, bad fields get one clear line."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import yaml

from axoplan.errors import AxoplanError
from axoplan.inputs.machine import load_machine, machines_dir, shipped_machines

REQUIRED = {"frontier", "perlmutter", "perlmutter-80gb", "alps", "dgx-h100"}


def test_required_machines_ship():
    assert set(shipped_machines()) >= REQUIRED


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_shipped_machine_loads_and_cites_sources(name: str):
    m = load_machine(name)
    assert m.name == name
    text = (machines_dir() / f"{name}.yaml").read_text()
    # every number-bearing field of the device and links carries a source tag in a comment
    for key in ("peak_bf16_tflops", "hbm_gb", "hbm_bandwidth_gbs", "nic_bandwidth_gbs", "nics_per_node"):
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"{key}:"))
        assert "#" in line and "[" in line.split("#", 1)[1], f"{name}: {key} has no [source] comment"


def test_published_facts():
    f, p, p80 = load_machine("frontier"), load_machine("perlmutter"), load_machine("perlmutter-80gb")
    assert f.devices_per_node == 8 and f.device.peak_bf16_tflops == pytest.approx(191.5)
    assert f.pair_bandwidth_gbs[0, 1] == 200 and f.pair_bandwidth_gbs[0, 2] < 200  # same MI250X is faster
    assert p.devices_per_node == 4 and p.device.hbm_gb == 40 and p80.device.hbm_gb == 80
    assert f.inter_node.injection_gbs == 100 and load_machine("dgx-h100").inter_node.injection_gbs == 400
    assert load_machine("alps").device.hbm_gb == 96


def _frontier_dict() -> dict:
    return yaml.safe_load((machines_dir() / "frontier.yaml").read_text())


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_user_yaml_by_path(tmp_path: Path):
    data = _frontier_dict()
    data["name"] = "my-frontier"
    data["device"]["peak_bf16_tflops"] = 100.0
    m = load_machine(_write(tmp_path, data))
    assert m.name == "my-frontier" and m.device.peak_bf16_tflops == 100.0


@pytest.mark.parametrize(("mutate", "expect"), [
    (lambda d: d["device"].pop("hbm_gb"), "missing field 'device.hbm_gb'"),
    (lambda d: d["device"].update(peek_bf16_tflops=1.0), "did you mean 'peak_bf16_tflops'"),
    (lambda d: d["device"].update(hbm_gb="lots"), "'device.hbm_gb'"),
    (lambda d: d["device"].update(peak_bf16_tflops=-3), "'device.peak_bf16_tflops' = -3 TFLOP/s is outside"),
    (lambda d: d.update(devices_per_node=0), "'devices_per_node'"),
    (lambda d: d["intra_node"]["link_classes"][0].update(pairs=[[0, 9]]), "pair (0, 9)"),
])
def test_bad_yaml_gets_one_line(tmp_path: Path, mutate, expect: str):
    data = _frontier_dict()
    mutate(data)
    with pytest.raises(AxoplanError) as err:
        load_machine(_write(tmp_path, data))
    message = str(err.value)
    assert expect in message and "\n" not in message and "mine.yaml" in message


def test_unknown_machine_suggests_closest():
    with pytest.raises(AxoplanError, match="did you mean 'frontier'"):
        load_machine("frontir")


def test_missing_and_malformed_files(tmp_path: Path):
    with pytest.raises(AxoplanError, match="does not exist"):
        load_machine(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(AxoplanError, match="not valid YAML at line"):
        load_machine(bad)


def test_wheel_contains_machine_yamls(tmp_path: Path):
    """A non-editable install must find machines/: the wheel carries them under axoplan/machines."""
    from hatchling.builders.wheel import WheelBuilder  # the build backend, a test dependency

    builder = WheelBuilder(str(Path(__file__).resolve().parent.parent))
    wheel = next(iter(builder.build(directory=str(tmp_path), versions=["standard"])))
    names = zipfile.ZipFile(wheel).namelist()
    for name in REQUIRED:
        assert f"axoplan/machines/{name}.yaml" in names


def test_dgx_a100_80gb_differs_from_dgx_a100_only_in_memory():
    """The 80 GB DGX A100 is the 40 GB file with the 80 GB part's capacity and HBM2e bandwidth
    (NVIDIA A100 datasheet: 80 GB, 2,039 GB/s); links, NICs and GEMM figures are the same."""
    a40, a80 = load_machine("dgx-a100"), load_machine("dgx-a100-80gb")
    assert a80.device.hbm_gb == 80 and a80.device.hbm_bandwidth_gbs == 2039
    assert a80.device.peak_bf16_tflops == a40.device.peak_bf16_tflops == 312
    assert a80.devices_per_node == 8 and a80.inter_node.injection_gbs == a40.inter_node.injection_gbs
    # the reserve is taken off capacity once: 80 - (1.0 + 5 x 0.6 + 0.115 x 80 = 13.2) GB usable under AxoNN's
    # five communicators
    assert a80.reserved_gb(5) == pytest.approx(13.2)
    assert a80.hbm_usable_bytes(5) == pytest.approx(66.8e9)


def test_the_reserve_is_the_sum_of_its_sourced_parts():
    """Hand-derived: runtime 1.0 GB + the framework's communicators x 0.6 GB (NCCL) + 11.5% of HBM
    (GMLake), plus what the system hides (Alps: 2 GB of 96), RCCL's own per-communicator figure on
    Frontier (1.4 + 5 x 0.7 + 0.115 x 64); a CPU box states its measured figure instead."""
    assert load_machine("dgx-a100").reserved_gb(5) == pytest.approx(1.0 + 3.0 + 4.6)
    assert load_machine("dgx-a100").reserved_gb(1) == pytest.approx(1.0 + 0.6 + 4.6)  # FSDP's one process group
    assert load_machine("alps").reserved_gb(5) == pytest.approx(2.0 + 1.0 + 3.0 + 0.115 * 96)
    assert load_machine("frontier").reserved_gb(5) == pytest.approx(1.4 + 3.5 + 0.115 * 64)
    assert load_machine("local-cpu").reserved_gb(5) == load_machine("local-cpu").reserved_gb(1) == 0.5


def test_a_measured_reserve_replaces_the_parts(tmp_path: Path):
    data = yaml.safe_load((machines_dir() / "dgx-a100.yaml").read_text())
    data["device"]["reserved_gb"] = 2.5
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    m = load_machine(str(tmp_path / "m.yaml"))
    assert m.reserved_gb(5) == 2.5 and m.hbm_usable_bytes(1) == pytest.approx(37.5e9)


