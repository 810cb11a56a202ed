"""The machines of issue 25: published facts, unified memory, a 70B model on 1,024 GPUs of each, `axoplan machines`.

Facts are the published figures the YAMLs cite (never read back from the YAMLs to check themselves): dense bf16
peaks, HBM, devices and NICs per node, the size one job can use.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from axoplan.errors import AxoplanError
from axoplan.inputs.machine import load_machine, machines_dir
from axoplan.inputs.model import PRESETS
from axoplan.inputs.options import RunOptions
from axoplan.inputs.plausible import PlausibilityWarning
from axoplan.search.ranking import rank
from tests.conftest import run_cli

ADDED = ("el-capitan", "tuolumne", "aurora", "lumi-g", "jupiter", "polaris", "isambard-ai", "dgx-h200", "dgx-b200",
         "gb200-nvl72", "mi300x")

# name -> (devices per node, dense bf16 TFLOP/s, HBM GB, HBM GB/s, NICs per node, GB/s per NIC, nodes, scheduler)
FACTS = {
    # MI300A: 2048 bf16 flop/clk/CU x 228 CU x 2.1 GHz = 980.6 [ROCm]; 128 GB HBM3 [LLNL]; 44,544 APUs / 4
    "el-capitan": (4, 980.6, 128, 5300, 4, 25, 11136, "flux"),
    "tuolumne": (4, 980.6, 128, 5300, 4, 25, None, "flux"),
    # one device = one tile: 56 Xe cores x 4096 flop/clk x 1.5 GHz = 344 TF; 128 GB per GPU = 64 per tile [ALCF]
    "aurora": (12, 344, 64, 1638, 8, 25, 7300, "pbs"),
    "lumi-g": (8, 191.5, 64, 1600, 4, 25, 1024, "slurm"),  # standard-g: up to 1,024 nodes [LUMI]
    "jupiter": (4, 989, 96, 4000, 4, 25, 5938, "slurm"),  # NDR200 = 25 GB/s [JSC]
    "polaris": (4, 312, 40, 1555, 2, 25, 496, "pbs"),  # prod: up to 496 nodes [ALCF]
    "isambard-ai": (4, 989, 96, 4000, 4, 25, 1320, "slurm"),
    "dgx-h200": (8, 989.4, 141, 4800, 8, 50, None, "torchrun"),
    "dgx-b200": (8, 2250, 180, 8000, 8, 50, None, "torchrun"),
    "gb200-nvl72": (4, 2500, 186, 8000, 4, 50, None, "torchrun"),
    "mi300x": (8, 1307.4, 192, 5300, 8, 50, None, "torchrun"),
}


def test_every_added_machine_is_described() -> None:
    assert set(FACTS) == set(ADDED)


@pytest.mark.parametrize("name", ADDED)
def test_published_facts(name: str) -> None:
    per_node, peak, hbm, hbm_bw, nics, nic_gbs, nodes, scheduler = FACTS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlausibilityWarning)
        m = load_machine(name)
    assert m.devices_per_node == per_node and m.device.peak_bf16_tflops == pytest.approx(peak)
    assert (m.device.hbm_gb, m.device.hbm_bandwidth_gbs) == (hbm, hbm_bw)
    assert (m.inter_node.nics_per_node, m.inter_node.nic_bandwidth_gbs) == (nics, nic_gbs)
    assert m.nodes == nodes
    assert m.launcher is not None and m.launcher.scheduler == scheduler


@pytest.mark.parametrize("name", ADDED)
def test_every_number_of_the_device_and_links_cites_a_source(name: str) -> None:
    text = (machines_dir() / f"{name}.yaml").read_text()
    for key in ("peak_bf16_tflops", "hbm_gb", "hbm_bandwidth_gbs", "nic_bandwidth_gbs", "nics_per_node",
                "max_efficiency", "devices_per_node"):
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"{key}:"))
        assert "#" in line and "[" in line.split("#", 1)[1], f"{name}: {key} has no [source] comment"


@pytest.mark.parametrize("name", ADDED)
def test_a_70b_model_ranks_on_1024_gpus(name: str) -> None:
    """Llama 3.1 70B on 1,024 devices: feasible layouts exist and the best is predicted at a finite step time."""
    result = rank(PRESETS["llama3.1-70B"], load_machine(name), RunOptions(), 1024)
    assert result.num_feasible > 0
    best = result.top_feasible(1)[0]
    t = float(result.prediction.columns["t_step_s"][best])
    assert 0 < t < 3600


def test_a_70b_model_ranks_on_an_nvl72_cluster_through_the_command_line() -> None:
    done = run_cli("rank", "--model", "llama3.1-70B", "--gpus", "1024", "--machine", "gb200-nvl72", "--top", "3")
    assert done.returncode == 0, done.stderr
    assert "1024 x NVIDIA GB200" in done.stdout and "feasible" in done.stdout


# ----------------------------------------------------------------------------- unified memory

def test_an_apu_loses_the_hosts_share_of_its_hbm() -> None:
    """MI300A: 128 GB shared with the CPU. Reserve = RCCL's 1.4 GB runtime + 5 communicators x 0.7 GB + 11.5 % of
    128 GB (14.72) + the host's 8 GB share = 27.62 GB; 100.38 GB left to tensors under AxoNN's five communicators."""
    m = load_machine("el-capitan")
    assert m.reserved_gb(5) == pytest.approx(1.4 + 5 * 0.7 + 0.115 * 128 + 8.0)
    assert m.hbm_usable_bytes(5) == pytest.approx((128 - 27.62) * 1e9)


def test_a_coherent_device_keeps_its_hbm() -> None:
    """GH200 on JUPITER: 120 GB of CPU memory the GPU can address does not add to, nor take from, its HBM:
    2 GB hidden + 1.0 runtime + 5 x 0.6 + 11.5 % of 96 = 17.04 GB reserved, as on Alps."""
    jupiter, alps = load_machine("jupiter"), load_machine("alps")
    assert jupiter.device.unified_memory is not None and jupiter.device.unified_memory.cpu_memory_gb == 120
    assert jupiter.reserved_gb(5) == pytest.approx(2.0 + 1.0 + 3.0 + 0.115 * 96) == alps.reserved_gb(5)


def _copy(tmp_path: Path, base: str, edit: dict) -> Path:
    data = yaml.safe_load((machines_dir() / f"{base}.yaml").read_text())
    data["device"]["unified_memory"] = edit
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_hosts_share_decides_what_fits(tmp_path: Path) -> None:
    """A larger host share leaves fewer layouts that fit: 405B on 256 APUs with 8 GB and with 60 GB per APU."""
    lean = load_machine("el-capitan")
    heavy = load_machine(_copy(tmp_path, "el-capitan", {"kind": "shared", "host_share_gb": 60}))
    assert heavy.hbm_usable_bytes(5) == pytest.approx(lean.hbm_usable_bytes(5) - 52e9)
    model, options = PRESETS["llama3.1-405B"], RunOptions()
    assert rank(model, heavy, options, 256).num_feasible < rank(model, lean, options, 256).num_feasible


@pytest.mark.parametrize(("edit", "needle"), [
    ({"kind": "shared", "host_share_gb": 8, "cpu_memory_gb": 120}, "shared memory has no separate CPU memory"),
    ({"kind": "coherent", "host_share_gb": 8, "cpu_memory_gb": 120}, "coherent memory keeps the operating system"),
    ({"kind": "fused"}, "unified_memory.kind"),
])
def test_a_contradictory_unified_memory_block_is_one_line(tmp_path: Path, edit: dict, needle: str) -> None:
    with pytest.raises(AxoplanError) as err:
        load_machine(_copy(tmp_path, "el-capitan", edit))
    assert needle in str(err.value) and "\n" not in str(err.value) and "mine.yaml" in str(err.value)


# ----------------------------------------------------------------------------- axoplan machines

def test_machines_lists_size_device_peak_hbm_and_scheduler_within_120_columns() -> None:
    done = run_cli("machines")
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 120
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line and line.split()[0] in FACTS}
    assert set(rows) == set(ADDED)
    for name in ("frontier", "dgx-h100"):
        assert name in done.stdout
    el_cap = rows["el-capitan"].split()
    assert el_cap[1:4] == ["11,136", "4", "44,544"] and "980.6" in el_cap and "flux" in el_cap
    assert "128 shared" in rows["el-capitan"] and "96 +120 CPU" in rows["jupiter"]
    assert rows["aurora"].split()[1:4] == ["7,300", "12", "87,600"] and rows["aurora"].rstrip().endswith("pbs")
    assert "4 (72)" in rows["gb200-nvl72"] and rows["dgx-b200"].split()[1] == "-"
