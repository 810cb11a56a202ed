"""`axoplan probe`: the shapes it measures, the fragment it writes, and a real gloo run."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import yaml

from axoplan.commands.probe import _with_host_identity
from axoplan.cost.placement import place
from axoplan.executor import hardware
from axoplan.executor.fragment import (
    CollectivePoint,
    GemmTime,
    ProbeResult,
    bus_bandwidth_gbs,
    fit_gemm_curve,
    group_shapes,
    merge_fragment,
    message_sizes,
    orientation_speedups,
    plan_gemm_phases,
    plan_gemm_shapes,
    render_fragment,
)
from axoplan.executor.hardware import CpuIdentity, cpu_identity
from axoplan.inputs.machine import Machine, load_machine, machines_dir
from axoplan.space.layout import Layout
from tests.conftest import run_cli
from tests.executor_helpers import tiny_plan


def test_group_shapes_of_eight_ranks() -> None:
    # X: stride 1, sizes 2/4/8; Y: stride Gx; Z: stride Gx*Gy; data: stride Gx*Gy*Gz
    assert group_shapes(8) == [(1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 2)]
    assert group_shapes(1) == []


def test_plan_gemm_shapes_are_the_local_blocks() -> None:
    plan = tiny_plan(Layout(2, 1, 2, 1), micro_batch=2)  # m = 2 sequences x 8 tokens; vocab 61 -> 62 (Gx*Gy)
    shapes = plan_gemm_shapes(plan)
    m = 16
    assert shapes[:3] == [(m, 96, 16), (m, 16, 96), (96, 16, m)]  # qkv: k 32/Gx, n 96/Gy
    assert (m, 16, 32) in shapes  # attn_out (transposed): k 32/Gy = 32, n 32/Gx = 16
    assert (m, 62, 16) in shapes  # LM head: padded vocab 62 over Gy = 1, hidden 32 over Gx
    assert len(shapes) == len(set(shapes))


def test_plan_gemm_phases_name_every_layer_and_phase_that_runs_a_shape() -> None:
    plan = tiny_plan(Layout(2, 1, 2, 1), micro_batch=2)
    phases = plan_gemm_phases(plan)
    assert list(phases) == plan_gemm_shapes(plan)
    assert phases[16, 96, 16] == "qkv forward"
    assert phases[96, 16, 16] == "qkv dw"


def test_orientation_rows_and_their_median_speed_go_into_the_fragment() -> None:
    """nn 1 ms on both shapes; nt twice as slow on one and as fast on the other (median 0.75); tn 4x slower."""
    rows = [GemmTime(m=64, n=64, k=64, seconds=1e-3), GemmTime(m=128, n=64, k=64, seconds=1e-3),
            GemmTime(m=64, n=64, k=64, orientation="nt", seconds=2e-3, label="qkv forward"),
            GemmTime(m=128, n=64, k=64, orientation="nt", seconds=1e-3),
            GemmTime(m=64, n=64, k=64, orientation="tn", seconds=4e-3)]
    result = _result().model_copy(update={"gemms": tuple(rows)})
    assert orientation_speedups(result) == {"nt": pytest.approx(0.75), "tn": pytest.approx(0.25)}
    text = render_fragment(result, 0.1, "local-cpu", "now")
    assert "qkv forward" in text
    base = yaml.safe_load((machines_dir() / "local-cpu.yaml").read_text())
    machine = Machine.model_validate(merge_fragment(base, yaml.safe_load(text)))
    gemm = machine.gemm
    assert gemm.orientation_efficiency.nt == pytest.approx(0.75) and gemm.orientation_efficiency.tt == 1.0
    assert [p.orientation for p in gemm.table] == ["nn", "nn", "nt", "nt", "tn"]
    assert gemm.table[4].efficiency == pytest.approx(gemm.table[0].efficiency / 4, rel=1e-3)


def test_message_sizes_and_bus_bandwidth() -> None:
    assert message_sizes(4096, 1 << 20) == [4096, 16384, 65536, 262144, 1048576]
    assert message_sizes(128, 128) == [128] and message_sizes(100, 100) == [64]  # whole 64-byte multiples
    # 1 GB all-reduce over 4 ranks in 1 s: ring volume 2*3/4 GB -> 1.5 GB/s; all-gather 0.75 GB/s
    assert bus_bandwidth_gbs("all_reduce", 10**9, 4, 1.0) == pytest.approx(1.5)
    assert bus_bandwidth_gbs("all_gather", 10**9, 4, 1.0) == pytest.approx(0.75)


def test_fit_recovers_a_curve() -> None:
    dims = [64, 256, 1024, 4096]
    points = [(m, n, k, 0.6 * m / (m + 128) * n / (n + 128) * k / (k + 128)) for m in dims for n in dims for k in dims]
    max_eff, half = fit_gemm_curve(points)
    assert max_eff == pytest.approx(0.6, rel=0.03) and half == pytest.approx(128, rel=0.05)


def _result() -> ProbeResult:
    collectives = []
    for stride, size in group_shapes(4):
        for nbytes, seconds in ((4096, 1e-3), (1 << 20, 2e-3)):
            for op in ("all_reduce", "all_gather", "reduce_scatter"):
                collectives.append(CollectivePoint(op=op, stride=stride, size=size, nbytes=nbytes, seconds=seconds))
    gemms = [GemmTime(m=64, n=64, k=64, seconds=2 * 64**3 / 0.05e12), GemmTime(m=256, n=256, k=256, seconds=1e-9)]
    return ProbeResult(world_size=4, device_name="cpu", backend="gloo", dtype="float32", torch_version="2.13.0",
                       gemms=tuple(gemms), collectives=tuple(collectives))


@pytest.mark.parametrize("name", ["local-cpu", "frontier", "dgx-h100"])
def test_fragment_merges_into_a_machine_and_feeds_placement(name: str) -> None:
    text = render_fragment(_result(), 0.1, name, "now")
    fragment = yaml.safe_load(text)
    base = yaml.safe_load((machines_dir() / f"{name}.yaml").read_text())
    machine = Machine.model_validate(merge_fragment(base, fragment))
    assert [(r.stride, r.size) for r in machine.measured_bandwidth] == [(1, 2), (1, 4), (2, 2)]
    # size 2, 1 MiB in 2 ms: all-reduce 2*(1/2)*1048576/2e-3 B/s = 0.524 GB/s, the others half: median 0.262
    row = machine.measured_bandwidth[0]
    assert row.bandwidth_gbs == pytest.approx(0.5 * 1048576 / 2e-3 / 1e9, rel=1e-3)
    assert place(machine, 1, 2).bandwidth_gbs == row.bandwidth_gbs
    first, fast = machine.gemm.table
    assert first.efficiency == pytest.approx(0.5, rel=1e-3)  # 0.05 of 0.1 TFLOP/s
    assert fast.efficiency == 1.0  # faster than the peak: capped, and the comment says so
    assert "capped at 1" in text
    assert machine.device == load_machine(name).device  # only the measured blocks changed


def test_the_fragments_latency_per_step_counts_the_steps_the_cost_model_prices() -> None:
    """The comment on each measured row gives µs per latency step at the smallest message: gloo's all-reduce is a
    ring, 2(p − 1) steps (4 KiB in 1 ms on 4 ranks: 1000/6 = 167 µs), NCCL's a tree, 2⌈log2 p⌉ (1000/4 = 250 µs);
    all-gather and reduce-scatter half of each (333 and 500 µs)."""
    gloo = render_fragment(_result(), 0.1, "local-cpu", "now")
    nccl = render_fragment(_result().model_copy(update={"backend": "nccl"}), 0.1, "dgx-h100", "now")
    [gloo_row] = [line for line in gloo.splitlines() if "size: 4," in line]
    [nccl_row] = [line for line in nccl.splitlines() if "size: 4," in line]
    assert "all_gather 333, all_reduce 167, reduce_scatter 333" in gloo_row
    assert "all_gather 500, all_reduce 250, reduce_scatter 500" in nccl_row


def test_the_fragment_names_the_host_cpu_and_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU line comes from the one reader (axoplan.executor.hardware), after the header; a GPU
    probe (nccl) names the ranks' device; the fragment still merges and loads."""
    fixed = CpuIdentity(model_name="AMD EPYC 7742 64-Core Processor", arch="x86_64", vendor="AuthenticAMD",
                        family=23, model=49, stepping=0, usable_cores=128, logical_cpus=256, virtualised=False)
    monkeypatch.setattr(hardware, "cpu_identity", lambda: fixed)
    gpu = _result().model_copy(update={"backend": "nccl", "device_name": "NVIDIA A100-SXM4-80GB"})
    text = _with_host_identity(render_fragment(gpu, 312.0, "dgx-a100", "now"), gpu)
    lines = text.splitlines()
    assert lines[0].startswith("# axoplan probe, now: 4 rank(s) on NVIDIA A100-SXM4-80GB")
    assert lines[1] == ("# host CPU (rank 0's node; host.op_us is per op on its cores): AMD EPYC 7742 64-Core "
                        "Processor (AuthenticAMD family 23 model 49 stepping 0, x86_64), 128 usable cores of 256")
    assert lines[2] == "# GPU: NVIDIA A100-SXM4-80GB"
    assert yaml.safe_load(text) == yaml.safe_load(render_fragment(gpu, 312.0, "dgx-a100", "now"))  # comments only
    cpu = _with_host_identity(render_fragment(_result(), 0.1, "local-cpu", "now"), _result())
    assert "# GPU:" not in cpu and "AMD EPYC 7742" in cpu.splitlines()[1]


def test_merge_replaces_lists_and_merges_mappings() -> None:
    base = {"a": {"b": 1, "c": 2}, "rows": [1, 2], "x": 1}
    assert merge_fragment(base, {"a": {"c": 3}, "rows": [9]}) == {"a": {"b": 1, "c": 3}, "rows": [9], "x": 1}
    assert base["a"] == {"b": 1, "c": 2}


@pytest.mark.distributed
def test_probe_with_four_gloo_ranks(tmp_path: Path) -> None:
    plan = tiny_plan(Layout(2, 1, 2, 1))
    (tmp_path / "plan.json").write_text(plan.to_json())
    out = tmp_path / "probe.yaml"
    done = run_cli("probe", "--local", "4", "--plan", str(tmp_path / "plan.json"), "--min-kib", "1", "--max-mib",
                   "0.0625", "--repeats", "2", "--timeout", "30", "-o", str(out))
    assert done.returncode == 0, done.stderr
    fragment = yaml.safe_load(out.read_text())
    assert "gloo" in out.read_text().splitlines()[0]
    assert [(r["stride"], r["size"]) for r in fragment["measured_bandwidth"]] == [(1, 2), (1, 4), (2, 2)]
    assert all(r["bandwidth_gbs"] > 0 for r in fragment["measured_bandwidth"])
    table = fragment["gemm"]["table"]
    shapes = plan_gemm_shapes(plan)
    assert [(p["m"], p["n"], p["k"]) for p in table] == [s for s in shapes for _ in range(4)]
    assert [p.get("orientation", "nn") for p in table[:4]] == ["nn", "nt", "tn", "tt"]  # --plan: every layout
    assert set(fragment["gemm"]["orientation_efficiency"]) == {"nt", "tn", "tt"}
    assert "qkv forward" in out.read_text()
    assert all(0 < p["efficiency"] <= 1 for p in table)
    merged = tmp_path / "measured-cpu.yaml"
    base = yaml.safe_load((machines_dir() / "local-cpu.yaml").read_text())
    merged.write_text(yaml.safe_dump(merge_fragment(base, fragment)))
    machine = load_machine(merged)
    assert math.isfinite(place(machine, 2, 2).bandwidth_gbs)
    done = run_cli("rank", "--machine", str(merged), "--gpus", "4", "--layers", "2", "--hidden", "32", "--heads", "4",
                   "--vocab", "61", "--global-batch", "4", "--seq-len", "8", "--micro-batch", "1")
    assert done.returncode == 0, done.stderr
    again = run_cli("probe", "--local", "4", "--machine", "local-cpu", "-o", str(out))
    assert again.returncode == 2 and "already exists" in again.stderr


@pytest.mark.distributed
def test_probe_on_one_rank_writes_the_gemm_table_and_keeps_the_machines_bandwidth(tmp_path: Path) -> None:
    """One GPU is the smallest probe (issue 4, item 7): no collective group, so no bandwidth rows to merge."""
    out = tmp_path / "probe.yaml"
    done = run_cli("probe", "--local", "1", "--machine", "frontier", "--gemm-sizes", "64,128", "--repeats", "2",
                   "--device", "cpu", "-o", str(out))
    assert done.returncode == 0, done.stderr
    fragment = yaml.safe_load(out.read_text())
    assert "measured_bandwidth" not in fragment and "form no group" in out.read_text()
    # the core host.op_us was measured on is named, second line (this host: the rank ran here)
    assert out.read_text().splitlines()[1] == ("# host CPU (rank 0's node; host.op_us is per op on its cores): "
                                               f"{cpu_identity().describe()}")
    assert "# GPU:" not in out.read_text()  # gloo on CPU ranks: no GPU to name
    assert len(fragment["gemm"]["table"]) == 8  # every (m, n, k) of {64, 128}, nn only without --plan
    assert "orientation_efficiency" not in fragment["gemm"]
    base = yaml.safe_load((machines_dir() / "frontier.yaml").read_text())
    machine = Machine.model_validate(merge_fragment(base, fragment))
    assert machine.measured_bandwidth == load_machine("frontier").measured_bandwidth
    assert [(p.m, p.n, p.k) for p in machine.gemm.table][:2] == [(64, 64, 64), (64, 64, 128)]
    # the host's cost per framework op (issue 11): measured, merged, and of the order a CPU dispatch costs
    assert 0.5 < fragment["host"]["op_us"] < 500 and "measured" in out.read_text()
    assert machine.host.op_us == fragment["host"]["op_us"]
    assert fragment["host"]["launch_us"] == machine.host.launch_us == 0.0  # a CPU launches no kernels
    # the cores ranks share: the affinity mask where the OS has one (Linux), else all of them
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert fragment["device"]["cores_per_node"] == allowed
    assert machine.host.overlaps_device == load_machine("frontier").host.overlaps_device


def test_an_unknown_orientation_is_one_line_exit_2(tmp_path: Path) -> None:
    done = run_cli("probe", "--local", "1", "--machine", "local-cpu", "--orientations", "nn,xt",
                   "-o", str(tmp_path / "p.yaml"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["axoplan: error: --orientations 'nn,xt': each must be one of nn, nt, "
                                                "tn, tt"]
