"""Memory per GPU against peaks measured on CPU (data/measured/cpu-peak-memory/), and the rule that puts
gradients and activations apart where a framework frees its gradients each step."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from axoplan.cost.memory import MEMORY_MODEL_SIGMA
from axoplan.cost.model import predict
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import load_hf_config
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout

DATA = Path(__file__).resolve().parents[1] / "data" / "measured" / "cpu-peak-memory" / "peaks.jsonl"
FRAMEWORK = {"autocast": "hf-transformers", "bf16": "hf-transformers-bf16"}

# the largest relative miss per precision when this test was written, rounded up (bf16 was 0.21 until the tracer
# stopped counting the parameters autograd keeps as saved tensors; docs/decisions.md)
BOUND = {"autocast": 0.06, "bf16": 0.08}


def _cases() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines()]


def _predicted(case: dict, tmp_path: Path, global_batch: int | None = None) -> dict[str, float]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(case["config"]))
    b = case["B"]
    options = RunOptions(global_batch=global_batch or b, seq_len=case["S"], micro_batches=(b,), recompute="off",
                         cache_weights="off", framework=FRAMEWORK[case["precision"]])
    p = predict(load_hf_config(path), load_machine("dgx-h100"), options,
                Candidates.single(Layout(1, 1, 1, 1), b, False, False))
    return {k: float(v[0]) for k, v in p.columns.items() if k.startswith("mem_")}


@pytest.mark.parametrize("i", range(8))
def test_peak_within_bound(i: int, tmp_path: Path) -> None:
    case = _cases()[i]
    predicted = _predicted(case, tmp_path)["mem_total_bytes"]
    assert abs(predicted / case["measured_peak_bytes"] - 1.0) <= BOUND[case["precision"]]


def test_interval_width_covers_the_measured_spread(tmp_path: Path) -> None:
    """The memory interval's sigma is no narrower than the spread of log(predicted/measured) on these peaks."""
    logs = [math.log(_predicted(c, tmp_path)["mem_total_bytes"] / c["measured_peak_bytes"]) for c in _cases()]
    rms = math.sqrt(sum(x * x for x in logs) / len(logs))
    assert 0.0 < rms <= MEMORY_MODEL_SIGMA


def test_gradients_apart_with_one_micro_step(tmp_path: Path) -> None:
    """One micro-step per step: the peak is the states plus the larger of gradients and activations with logits
    (hand-derived from the parts); with two micro-steps (accumulation) gradients and activations add up."""
    case = _cases()[3]  # Llama, autocast
    one = _predicted(case, tmp_path)
    parts = {k: one[f"mem_{k}_bytes"] for k in ("weights", "gradients", "optimizer", "gathered", "activations",
                                                 "logits")}
    working = parts["activations"] + parts["logits"]
    assert working > parts["gradients"] > 0
    assert one["mem_total_bytes"] == pytest.approx(parts["weights"] + parts["optimizer"] + parts["gathered"] + working)
    two = _predicted(case, tmp_path, global_batch=2 * case["B"])
    assert two["mem_total_bytes"] == pytest.approx(sum(parts.values()))


def test_persistent_gradient_buffers_add_up() -> None:
    """A framework that keeps its gradient buffer (Megatron-AxoNN's) adds gradients to the activations."""
    from axoplan.inputs.model import load_model

    options = RunOptions(global_batch=1, seq_len=2048, micro_batches=(1,), recompute="off", cache_weights="off",
                         framework="axonn")
    p = predict(load_model("5B"), load_machine("dgx-h100"), options,
                Candidates.single(Layout(1, 1, 1, 1), 1, False, False))
    m = p.memory
    assert not m.gradients_apart.any()
    parts = sum(getattr(m, k) for k in m.CATEGORIES)
    assert np.array_equal(m.total, parts)
