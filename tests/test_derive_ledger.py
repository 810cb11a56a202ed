"""The ledger tracer (``benchmarks/derive_ledger.py``, ``benchmarks/tracing/``) on plain PyTorch: CUDA autocast's
fp32 list emulated on CPU, every aten op recorded, sizes read back as monomials. (Hugging Face models are traced
by the same code where transformers is installed; the shipped ledgers record the versions that made them.)"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.tracing.autocast import cuda_autocast_on_cpu
from benchmarks.tracing.fit import _exponents, _monomial
from benchmarks.tracing.recorder import Recorder, op_class


def test_pow_runs_in_fp32_under_emulated_cuda_autocast() -> None:
    """CPU autocast leaves pow in bf16; CUDA's upcasts it (fp32 list), and so does the emulation, with the cast
    as a real op that the recorder sees."""
    x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.pow(x, 3.0).dtype == torch.bfloat16
    rec = Recorder()
    with cuda_autocast_on_cpu(), rec, torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.pow(x, 3.0)
    assert y.dtype == torch.float32
    names = [op["op"] for op in rec.ops["rest_forward"]]
    assert names[0] == "_to_copy.default" and names[1].startswith("pow.")
    assert rec.ops["rest_forward"][0]["out"] == [(32, 4)]  # 4 x 8 elements, 4 bytes each


def test_a_matmul_is_cast_to_bf16_and_recorded_as_a_gemm() -> None:
    w = torch.randn(16, 8, requires_grad=True)
    x = torch.randn(4, 8)
    rec = Recorder()
    with cuda_autocast_on_cpu(), rec, torch.autocast("cpu", dtype=torch.bfloat16):
        torch.nn.functional.linear(x, w).sum().backward()
    classes = [op_class(op["op"]) for scope in rec.ops.values() for op in scope]
    assert "gemm" in classes and "copy_cast" in classes


def test_exponents_are_read_from_doubling() -> None:
    assert _exponents(24, {"B": 48, "S": 96, "H": 24}, "x") == {"B": 1, "S": 2}
    assert _monomial(24, {"B": 1, "S": 2}, {"B": 2, "S": 2}) == (3.0, {"B": 1, "S": 2})
    with pytest.raises(SystemExit, match="not a power of two"):
        _exponents(24, {"B": 72}, "x")


@pytest.mark.parametrize(("framework", "family", "package", "install"), [
    ("torchtitan", "llama", "torchtitan", "install torchtitan==0.3.0"),
    ("llm-foundry", "mpt", "llmfoundry", "install llm-foundry==0.22.0"),
    ("megatron", "gpt2", "megatron", "install megatron-core==0.16.1"),
])
def test_a_framework_is_traced_where_installed_and_refused_in_one_line_where_not(
        tmp_path: Path, framework: str, family: str, package: str, install: str) -> None:
    """torchtitan and llm-foundry are no dependencies (CI's venv lacks them): where one is installed, the tracer
    reproduces the shipped ledger's op list; where it is not, it says in one line what to install, and writes
    nothing."""
    out = tmp_path / f"{framework}-{family}.json"
    done = subprocess.run([sys.executable, "benchmarks/derive_ledger.py", "--framework", framework, "--family",
                           family, "--precision", "bf16", "--out", str(out)], capture_output=True, text=True,
                          check=False, cwd=Path(__file__).resolve().parents[1])
    if importlib.util.find_spec(package) is not None:
        assert done.returncode == 0, done.stderr
        shipped = json.loads((Path(__file__).resolve().parents[1] / "frameworks" / "ledgers"
                              / f"{framework}-{family}.json").read_text())
        assert json.loads(out.read_text())["scopes"] == shipped["scopes"]
    else:
        assert done.returncode != 0 and not out.exists()
        assert done.stderr.strip().count("\n") == 0 and install in done.stderr
        assert "Traceback" not in done.stderr


def test_ops_that_make_the_host_wait_are_recorded_as_host_syncs() -> None:
    """A read-back (``.item()``), a data-dependent shape (``nonzero``, a boolean-mask index) and CUDA's fp32
    ``_grouped_mm`` (its fallback copies the offsets to the host) are host syncs; an integer index, a fixed-shape
    reduction and the bf16 grouped GEMM are not."""
    from benchmarks.tracing.recorder import waits_for_device

    x = torch.randn(8, 4)
    rec = Recorder()
    with rec:
        x.sum().item()
        torch.nonzero(x > 0)
        x[x[:, 0] > 0]
        x[torch.tensor([0, 2])]
    synced = {op["op"]: op["sync"] for op in rec.ops["rest_forward"]}
    assert synced["_local_scalar_dense.default"] and synced["nonzero.default"]
    assert synced["sum.default"] is False and synced["gt.Scalar"] is False
    index_syncs = [op["sync"] for op in rec.ops["rest_forward"] if op["op"] == "index.Tensor"]
    assert index_syncs == [True, False]  # the boolean mask, then the integer index
    assert waits_for_device("repeat_interleave.self_Tensor", (x, torch.tensor([1])), {}) is True
    a, offs = torch.randn(8, 8), torch.tensor([4, 8], dtype=torch.int32)  # rows and columns of 16 bytes or more
    for dtype, syncs in ((torch.float32, 1), (torch.bfloat16, 0)):
        rec = Recorder()
        with rec:
            torch._grouped_mm(a.to(dtype), torch.randn(2, 8, 8, dtype=dtype), offs=offs)
        assert sum(op["sync"] for op in rec.ops["rest_forward"]) == syncs


def test_each_framework_is_traced_by_its_own_module_and_the_command_offers_exactly_those() -> None:
    """The step tracers are looked up by name (``benchmarks/tracing/fit.py`` ``STEP_TRACERS``), each in its own module
    of ``benchmarks/tracing``; the command's ``--framework`` takes those names and refuses another."""
    from benchmarks.tracing.fit import STEP_TRACERS, step_tracer
    from benchmarks.tracing.hf import trace_step

    modules = {name: step_tracer(name).__module__ for name in STEP_TRACERS}
    assert modules == {"hf": "benchmarks.tracing.hf", "executor": "benchmarks.tracing.executor",
                       "torchtitan": "benchmarks.tracing.torchtitan", "llm-foundry": "benchmarks.tracing.llm_foundry",
                       "megatron": "benchmarks.tracing.megatron", "axonn": "benchmarks.tracing.megatron_axonn",
                       "megatron-deepspeed": "benchmarks.tracing.megatron_deepspeed"}
    assert step_tracer("hf") is trace_step
    done = subprocess.run([sys.executable, "benchmarks/derive_ledger.py", "--family", "gpt2", "--framework", "nemo"],
                          capture_output=True, text=True, check=False, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert "invalid choice: 'nemo'" in error and all(f"'{name}'" in error for name in STEP_TRACERS)
