"""`benchmarks/measure_gpu.py` rehearsed on CPU ranks: the GPU measurement is one command that works.

The script is what a session or user with a GPU node runs for issue 4's item 7 and issue 31's item 4; here
it runs its every step (probe with kernels, every layout of 1 and 2 ranks under the executor's framework,
a traced executor step, traced steps of tiny GPT-2 and Llama models, environment, validate) with gloo and
tiny models, so the only untested part left is the device itself.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from axoplan.executor.hardware import cpu_identity
from axoplan.records.runs import read_runs
from tests.conftest import REPO

TINY = ["--layers", "1", "--hidden", "32,64", "--head-dim", "16", "--seq-len", "16", "--vocab", "128",
        "--hf-size", "tiny"]


def _measure(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "benchmarks/measure_gpu.py", "--machine", "dgx-h100", "--out", str(out), "--device", "cpu",
           "--gpus", "2", "--reps", "1", "--iterations", "1", "--warmup", "1", *TINY, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("measure_gpu", REPO / "benchmarks" / "measure_gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plans_run_under_the_executors_own_framework() -> None:
    """Every ordered layout of 4 ranks (2² over four axes: C(5, 3) = 10 of them), each plan saying framework
    axoplan-executor (the profile validate prices the executor's runs with), on the Megatron path the executor
    runs, with the model the flags describe."""
    args = argparse.Namespace(layers=2, head_dim=16, vocab=128, seq_len=16, global_batch=8, machine="dgx-h100")
    plans = _script().plans(args, 64, 4, 8)
    assert len(plans) == 10 and len({str(p.layout.to_layout()) for p in plans}) == 10
    assert {(p.options.framework, p.options.axonn_path) for p in plans} == {("axoplan-executor", "megatron")}
    assert {(p.model.hidden, p.model.num_heads, p.model.num_layers, p.world_size) for p in plans} == {(64, 4, 2, 4)}


@pytest.mark.distributed
def test_rehearsal_on_cpu_ranks_writes_probe_records_and_environment(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    done = _measure(out)
    assert done.returncode == 0, done.stderr
    records = list(read_runs(out / "runs.jsonl"))
    every_layout = ["1x1x1x1", "1x1x1x2", "1x1x2x1", "1x2x1x1", "2x1x1x1"]  # of 1 and 2 ranks
    for hidden in (32, 64):
        mine = [r for r in records if r.plan.model.hidden == hidden]
        assert sorted(str(r.plan.layout.to_layout()) for r in mine) == every_layout
        assert {r.plan.model.num_heads for r in mine} == {hidden // 16}
    assert len(records) == 10
    assert {(r.backend, r.dtype, r.plan.machine) for r in records} == {("gloo", "float32", "dgx-h100")}
    assert {r.plan.options.framework for r in records} == {"axoplan-executor"}  # priced as the executor runs
    fragment = yaml.safe_load((out / "probe.yaml").read_text())
    assert fragment["gemm"]["table"] and fragment["measured_bandwidth"]
    assert {"elementwise", "norm", "loss", "optimizer", "derived"} <= set(fragment["kernels"])  # the op classes
    hf = importlib.util.find_spec("transformers") is not None  # not a dependency: the HF traces only where it is
    traces = ("trace-executor", "trace-hf-gpt2", "trace-hf-llama") if hf else ("trace-executor",)
    assert hf or not list(out.glob("trace-hf-*"))
    for name in traces:  # one traced step each, after warm-up
        events = json.loads(gzip.decompress((out / f"{name}.json.gz").read_bytes()))["traceEvents"]
        steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
        assert len(steps) == 1 and sum(e.get("cat") == "cpu_op" for e in events) > 100, name
    env = json.loads((out / "environment.json").read_text())
    assert (env["ranks"], env["backend"], env["machine_yaml"]) == (2, "gloo", "dgx-h100")
    assert env["started"] <= env["finished"] and "--gpus 2" in env["command"]
    assert env["cpu"] == cpu_identity().as_dict() and env["cpu"]["model_name"]  # the host CPU, from the one reader
    assert env["gpu"] is None and env["python"]  # CPU ranks: no GPU named
    written = ["probe.yaml", "runs.jsonl", "trace-executor.json.gz"]
    written += ["trace-hf-gpt2.json.gz", "trace-hf-llama.json.gz"] if hf else ["trace-hf-*.json.gz"]
    assert sorted(env["files"]) == sorted(written)  # every file written (or not, and why), with how it was made
    assert env["files"]["probe.yaml"]["how"].startswith("axoplan probe --local 2 --machine dgx-h100")
    assert "framework axoplan-executor" in env["files"]["trace-executor.json.gz"]["what"]
    if hf:
        assert env["files"]["trace-hf-llama.json.gz"]["config"]["num_key_value_heads"] == 2
    else:
        assert env["files"]["trace-hf-*.json.gz"] == "not written: transformers is not installed"
    assert env["framework"] == "axoplan-executor" and bool(env["transformers"]) == hf
    assert "MAPE" in done.stdout and "10 plans measured on dgx-h100" in done.stdout


@pytest.mark.distributed
def test_an_existing_output_is_never_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    out.mkdir()
    (out / "runs.jsonl").write_text("mine\n")
    done = _measure(out, "--no-probe")
    assert done.returncode != 0 and "exists; choose another --out" in done.stderr
    assert (out / "runs.jsonl").read_text() == "mine\n" and sorted(p.name for p in out.iterdir()) == ["runs.jsonl"]
    (out / "runs.jsonl").unlink()
    (out / "trace-executor.json.gz").write_bytes(b"mine")  # a trace of an earlier session is kept too
    done = _measure(out, "--no-probe")
    assert done.returncode != 0 and "trace-executor.json.gz exists" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["trace-executor.json.gz"]
