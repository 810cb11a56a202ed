"""The kernels: section `axoplan probe` writes: one derivation (axoplan.executor.kernel_constants) for the probe
and benchmarks/kernel_constants.py, checked by hand on made-up records and against the H100 numbers it set; the
CPU sweep writes a section every machine loads; the real `axoplan probe --local 1 --quick` (slow tier)."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from axoplan.executor.fragment import GemmTime, ProbeResult, merge_fragment, render_fragment
from axoplan.executor.kernel_constants import CLASSES, kernel_constants, kernels_yaml, read_records
from axoplan.executor.kernel_sweep import kernel_sweep
from axoplan.inputs.machine import Machine, load_machine, machines_dir
from tests.conftest import REPO, run_cli

MEASURED = REPO / "data" / "measured" / "gpu-h100-h200"
HBM_GBS, PEAK_TFLOPS = 1000.0, 1.0  # round numbers for the hand derivations below


def _attention(heads: int, eff: float) -> dict[str, Any]:
    """A 1024-token causal record at `eff` of 1 TFLOP/s, plus the leaf-gradient adds the derivation takes off:
    forward 4·1·heads·1024²·128/2 flops, 3.5× that forward+backward; adds 18·heads·1024·128 bytes at 0.8 of
    1000 GB/s."""
    flops = 3.5 * 4 * heads * 1024**2 * 128 / 2
    adds = 18 * heads * 1024 * 128 / (0.8 * HBM_GBS * 1e9)
    return {"kind": "attention", "backend": "cudnn", "batch": 1, "heads": heads, "head_dim": 128, "seq": 1024,
            "causal": True, "fwd_bwd_s": flops / (eff * PEAK_TFLOPS * 1e12) + adds}


def _records() -> list[dict[str, Any]]:
    """Made-up measurements whose shares of 1000 GB/s are round by construction."""
    logits = 1000 * 1_000_000
    casts_and_add = logits * (12 / 0.6 + 6 / 0.8) / (HBM_GBS * 1e9)  # 27.5 ms taken off the loss
    return [
        {"kind": "elementwise", "rows": 8192, "hidden": 2048, "add_gbs": 800, "layer_norm_gbs": 500,
         "rms_norm_gbs": 450, "silu_mul_gbs": 600},
        {"kind": "elementwise", "rows": 8192, "hidden": 4096, "add_gbs": 820, "layer_norm_gbs": 520,
         "rms_norm_gbs": 460, "silu_mul_gbs": 640},
        {"kind": "elementwise", "rows": 8192, "hidden": 8192, "add_gbs": 780, "layer_norm_gbs": 480,
         "rms_norm_gbs": 470, "silu_mul_gbs": 560},
        {"kind": "cast", "elements": 10**9, "fp32_to_bf16_s": 0.01},  # 6 GB in 10 ms: 600 GB/s
        {"kind": "optimizer", "impl": "AdamW fused fp32", "params": 10**9, "step_s": 0.064},  # 32 GB: 500 GB/s
        {"kind": "optimizer", "impl": "AdamW foreach fp32", "params": 10**9, "step_s": 0.16},  # not the class
        {"kind": "loss", "tokens": 1000, "vocab": 1_000_000, "upcast_fwd_bwd_s": casts_and_add + 0.064},
        {"kind": "reduction", "rows": 8192, "hidden": 4096, "sum_rows_gbs": 300},
        {"kind": "memset", "elements": 5 * 10**8, "bytes": 10**9, "zero_s": 0.00125},  # 800 GB/s
        {"kind": "gemm_unaligned", "m": 8192, "k": 2048, "n": 50257, "n_aligned": 50304, "aligned_s": 1.0,
         "unaligned_s": 5 * 50257 / 50304},  # five times as long per flop
        _attention(16, 0.4), _attention(32, 0.6),
        {"kind": "attention", "backend": "flash", "batch": 1, "heads": 32, "head_dim": 128, "seq": 1024,
         "error": "not supported"},  # a backend that did not run: left out
        {"kind": "attention_default", "backend": "cudnn"},
    ]


def test_each_class_by_hand() -> None:
    c = kernel_constants(_records(), HBM_GBS, PEAK_TFLOPS)
    expected = {"elementwise": 0.8, "norm": 0.5, "activation": 0.6, "copy_cast": 0.6, "optimizer": 0.5,
                "loss": 0.5, "reduction": 0.3, "memset": 0.8, "unaligned_gemm_efficiency": 0.2}
    assert {k: c[k] for k in expected} == pytest.approx(expected, rel=1e-9)
    # heads 16 and 32 at 0.4 and 0.6: the median of two; flash's error record gives no curve
    assert c["attention"] == {"cudnn": {"seq": [1024], "efficiency": [0.5]}}
    assert c["default_attention"] == "cudnn"


def test_fp32_attention_takes_off_fp32_leaf_adds() -> None:
    """A CPU probe times attention in fp32: its three leaf-gradient adds move 12 bytes per element, not 6."""
    bf16 = _attention(32, 0.5)
    adds_bf16 = 18 * 32 * 1024 * 128 / (0.8 * HBM_GBS * 1e9)
    fp32 = {**bf16, "dtype": "float32", "backend": "flash", "fwd_bwd_s": bf16["fwd_bwd_s"] + adds_bf16}
    ew = _records()[:3]
    curves = kernel_constants([*ew, {**bf16, "dtype": "bfloat16"}, fp32], HBM_GBS, PEAK_TFLOPS)["attention"]
    assert curves == {"cudnn": {"seq": [1024], "efficiency": [0.5]}, "flash": {"seq": [1024], "efficiency": [0.5]}}


def test_a_loss_its_casts_explain_is_infinite_and_written_capped_at_one() -> None:
    recs = [r if r["kind"] != "loss" else {**r, "upcast_fwd_bwd_s": 0.02} for r in _records()]  # < the 27.5 ms
    assert math.isinf(kernel_constants(recs, HBM_GBS, PEAK_TFLOPS)["loss"])
    lines = kernels_yaml(recs, [], HBM_GBS, PEAK_TFLOPS, "made-up")
    loss = next(line for line in lines if line.startswith("  loss:"))
    assert loss.startswith("  loss: 1.000  #") and "capped at 1" in loss


def test_the_h100_kernels_section_is_this_derivation() -> None:
    """machines/dgx-h100.yaml's kernels: numbers come from the 2026-11-26 micro-benchmarks through this one
    derivation, and benchmarks/kernel_constants.py prints them."""
    recs = read_records([MEASURED / "micro-h100.jsonl", MEASURED / "micro2-h100.jsonl"])
    machine = load_machine("dgx-h100")
    kernels = machine.kernels
    assert kernels is not None
    c = kernel_constants(recs, machine.device.hbm_bandwidth_gbs, machine.device.peak_bf16_tflops)
    for name in ("elementwise", "norm", "activation", "copy_cast", "loss", "optimizer"):
        assert round(c[name], 3) == kernels.of(name), name  # type: ignore[arg-type]
    for backend, curve in kernels.attention.items():
        assert (tuple(c["attention"][backend]["seq"]), tuple(c["attention"][backend]["efficiency"])) == \
            (curve.seq, curve.efficiency)
    done = subprocess.run([sys.executable, "benchmarks/kernel_constants.py", str(MEASURED / "micro-h100.jsonl"),
                           str(MEASURED / "micro2-h100.jsonl"), "--hbm-gbs", "3350", "--peak-tflops", "989.4"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:6] == ["elementwise: 0.869", "norm: 0.552", "activation: 0.511",
                                            "copy_cast: 0.77", "optimizer: 0.773", "loss: 0.783"]


def test_the_section_loads_into_a_machine_with_every_class_measured() -> None:
    text = "\n".join(kernels_yaml(_records(), ["attention flash: not measured (x)"], HBM_GBS, PEAK_TFLOPS,
                                  "made-up")) + "\n"
    assert "# attention flash: not measured (x)" in text
    for name in ("dgx-h200", "local-cpu"):  # the H200's derived classes are measured now: derived is emptied
        base = yaml.safe_load((machines_dir() / f"{name}.yaml").read_text())
        kernels = Machine.model_validate(merge_fragment(base, yaml.safe_load(text))).kernels
        assert kernels is not None
        assert (kernels.elementwise, kernels.norm, kernels.loss, kernels.unaligned_gemm_efficiency) == \
            (0.8, 0.5, 0.5, 0.2)
        assert kernels.derived == () and kernels.default_attention == "cudnn"
        assert kernels.attention["cudnn"].efficiency == (0.5,)


def test_without_every_class_no_section_is_written() -> None:
    recs = [r for r in _records() if r["kind"] != "cast"]  # no cast: no copy_cast, hence no loss either
    lines = kernels_yaml(recs, [], HBM_GBS, PEAK_TFLOPS, "made-up")
    assert "kernels:" not in lines
    assert lines[0].startswith("# no kernels: section: copy_cast, loss not measured")


@pytest.mark.slow
def test_the_cpu_sweep_writes_a_section_every_value_in_range() -> None:
    """The sweep on host tensors: every record kind, attention on SDPA's CPU flash kernel only (the CUDA-only
    backends say why they were skipped); the section written from it loads as local-cpu's kernels with every
    class in (0, 1] and a flash curve. Slow tier: 4-18 s on the 2-core box, most of it torch.optim's first steps."""
    t0 = time.perf_counter()
    recs, notes = kernel_sweep(torch.device("cpu"), torch.float32, quick=True)
    assert time.perf_counter() - t0 < 60
    kinds = sorted({r["kind"] for r in recs})
    assert kinds == ["attention", "attention_default", "cast", "elementwise", "gemm_unaligned", "loss", "memset",
                     "optimizer", "reduction"]
    attention = {(r["backend"], r["seq"], r["dtype"]) for r in recs if r["kind"] == "attention"}
    assert attention == {("flash", 256, "float32")}  # --quick: one length
    assert {r["impl"] for r in recs if r["kind"] == "optimizer"} == {"AdamW fused fp32", "AdamW foreach fp32"}
    assert all(v > 0 for r in recs for k, v in r.items() if k.endswith(("_s", "_gbs")))
    assert notes == ["attention: SDPA's cudnn, efficient backends need CUDA; skipped on cpu"]
    fragment = yaml.safe_load("\n".join(kernels_yaml(recs, notes, 10.0, 0.16, "local-cpu")))
    base = yaml.safe_load((machines_dir() / "local-cpu.yaml").read_text())
    kernels = Machine.model_validate(merge_fragment(base, {"kernels": fragment["kernels"]})).kernels
    assert kernels is not None and list(kernels.attention) == ["flash"] and kernels.derived == ()
    assert kernels.attention["flash"].seq == (256,) and kernels.default_attention == "flash"
    assert all(0 < kernels.of(name) <= 1 for name in CLASSES)  # type: ignore[arg-type]
    assert 0 < kernels.unaligned_gemm_efficiency <= 1


@pytest.mark.distributed
def test_probe_quick_on_one_cpu_rank_through_the_entry_point(tmp_path: Path) -> None:
    out = tmp_path / "probe.yaml"
    t0 = time.perf_counter()
    done = run_cli("probe", "--local", "1", "--quick", "--machine", "local-cpu", "--device", "cpu", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert time.perf_counter() - t0 < 60  # --quick: under a minute
    text = out.read_text()
    assert "# attention: SDPA's cudnn, efficient backends need CUDA; skipped on cpu" in text
    assert "probe: kernels 1/6" in done.stderr and "probe: GEMMs" in done.stderr  # progress on stderr
    assert len(yaml.safe_load(text)["gemm"]["table"]) == 8  # --quick: the grid's two ends, 64 and 1024
    merged = tmp_path / "measured-cpu.yaml"
    base = yaml.safe_load((machines_dir() / "local-cpu.yaml").read_text())
    merged.write_text(yaml.safe_dump(merge_fragment(base, yaml.safe_load(text))))
    kernels = load_machine(merged).kernels
    assert kernels is not None and all(0 < kernels.of(n) <= 1 for n in CLASSES)  # type: ignore[arg-type]
    plain = tmp_path / "plain.yaml"
    done = run_cli("probe", "--local", "1", "--quick", "--no-kernels", "--machine", "local-cpu", "--device", "cpu",
                   "-o", str(plain))
    assert done.returncode == 0, done.stderr
    assert "kernels" not in yaml.safe_load(plain.read_text()) and "probe: kernels" not in done.stderr


def test_the_probe_fragment_carries_the_section_and_the_sync_and_survives_the_ranks_json() -> None:
    """Rank 0's result crosses to the command as JSON (LocalCluster): the records come back as they were (a bool
    stays a bool, an int an int); the fragment with them merges into dgx-h100 with the hand-derived classes, the
    host's sync in a comment (no machine field reads it)."""
    result = ProbeResult(world_size=1, device_name="NVIDIA H100 80GB HBM3", backend="nccl", dtype="bfloat16",
                         torch_version="2.13.0", gemms=(GemmTime(m=512, n=512, k=512, seconds=2 * 512**3 / 0.5e12),),
                         collectives=(), host_op_us=4.0, host_launch_us=2.5, host_sync_us=12.5,
                         kernel_records=tuple(_records()), kernel_notes=("attention flash: not measured (x)",))
    again = ProbeResult.model_validate_json(result.model_dump_json())
    assert again == result and again.kernel_records[10]["causal"] is True
    assert again.kernel_records[3]["elements"] == 10**9 and isinstance(again.kernel_records[3]["elements"], int)
    text = render_fragment(again, PEAK_TFLOPS, "dgx-h100", "now", hbm_gbs=HBM_GBS)
    assert "  # sync: 12.5 us per cudaStreamSynchronize round trip" in text
    assert "# attention flash: not measured (x)" in text
    base = yaml.safe_load((machines_dir() / "dgx-h100.yaml").read_text())
    machine = Machine.model_validate(merge_fragment(base, yaml.safe_load(text)))
    assert machine.kernels is not None and (machine.kernels.norm, machine.kernels.optimizer) == (0.5, 0.5)
    assert machine.kernels.attention["cudnn"].efficiency == (0.5,)
    assert machine.kernels.attention["flash"] == load_machine("dgx-h100").kernels.attention["flash"]  # kept
    assert (machine.host.op_us, machine.host.launch_us) == (4.0, 2.5)
    without = render_fragment(again.model_copy(update={"kernel_records": ()}), PEAK_TFLOPS, "dgx-h100", "now",
                              hbm_gbs=HBM_GBS)
    assert "kernels" not in yaml.safe_load(without)  # --no-kernels: the machine's own section stays
