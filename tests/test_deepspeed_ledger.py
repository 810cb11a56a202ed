"""Megatron-DeepSpeed's traced op ledger (``frameworks/ledgers/megatron-deepspeed-gpt2.json``,
``benchmarks/tracing/megatron_deepspeed.py``), the ``megatron-deepspeed-traced`` profile that prices from it, and the
ledger routine's one rule for a GEMM no 4D linear holds: the unfused attention core's batched GEMMs, priced by the tile
model from their traced shapes. The op list is held to what Megatron-DeepSpeed's GPT layer runs on a GPU (066632b:
``baddbmm`` into a buffer, the fused causal softmax reading the causal half of each row, dropout, ``bmm``), its sizes
to formulas derived by hand, and the profile to its base and to the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from axoplan.cost.attention import unfused_attention_s
from axoplan.cost.compute import gemm_s
from axoplan.cost.ledger import Ledger, LedgerOp, evaluate_ledger, load_ledger
from axoplan.inputs.framework import load_framework
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout
from tests import ledger_helpers

DIMS = {"B": 4.0, "S": 1024.0, "H": 2048.0, "NH": 16.0, "KV": 16.0, "F": 8192.0, "V": 50304.0}
"""A vTrain model's block (H = 2,048, 16 heads, F = 4·H, S = 1,024) at micro-batch 4."""
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ledger() -> Ledger:
    return load_ledger("megatron-deepspeed", "gpt2")


def _ops(ledger: Ledger, scope: str, name: str) -> list[LedgerOp]:
    return [op for op in ledger.ops(scope) for _ in range(op.count) if op.op == name]


def test_a_block_runs_the_unfused_core_between_four_linears(ledger: Ledger) -> None:
    """Forward: two fused LayerNorms, the scores by one ``baddbmm``, one fused causal softmax, one ``native_dropout``
    on the probabilities (plus the hidden ones inside the two bias-dropout-adds), the context by one ``bmm``, the
    four linears (the QKV's bias inside ``addmm``); backward: four ``bmm`` (two for each batched GEMM), the softmax's
    and the dropout's backward once, a dX and a dW GEMM per linear; no flash attention."""
    fwd, bwd = ledger_helpers.calls(ledger, "block_forward"), ledger_helpers.calls(ledger, "block_backward")
    assert fwd["fused_layer_norm.default"] == 2 and bwd["fused_layer_norm_backward.default"] == 2
    assert fwd["baddbmm.default"] == 1 and fwd["bmm.default"] == 1 and bwd["bmm.default"] == 4
    assert fwd["softmax.upper_triang"] == 1 and bwd["softmax_backward_data.upper_triang"] == 1
    assert fwd["native_dropout.default"] == 1 and bwd["native_dropout_backward.default"] == 1
    assert fwd["bias_dropout_add.default"] == 2 and fwd["gelu.bias"] == 1
    assert fwd["addmm.default"] + fwd["mm.default"] == 4 and bwd["mm.default"] == 8
    names = {op.op.split(".")[0] for scope in ("block_forward", "block_backward") for op in ledger.ops(scope)}
    assert not any("flash" in n for n in names)


def test_the_scores_are_written_whole_and_the_softmax_reads_their_causal_half(ledger: Ledger) -> None:
    """``b = B·NH`` score matrices of S × S, 2 bytes each: the softmax reads half of them (the causal part of each row,
    ``scaled_upper_triang_masked_softmax_warp_forward``) and writes all; its backward reads half the gradient and
    half the probabilities and writes all; dropout reads all and writes all plus a one-byte mask."""
    scores = DIMS["B"] * DIMS["NH"] * DIMS["S"] ** 2
    (softmax,) = _ops(ledger, "block_forward", "softmax.upper_triang")
    (back,) = _ops(ledger, "block_backward", "softmax_backward_data.upper_triang")
    (drop,) = _ops(ledger, "block_forward", "native_dropout.default")
    value = ledger_helpers.value
    assert value(softmax.read, DIMS) == 2 * scores / 2 and value(softmax.write, DIMS) == 2 * scores
    assert value(back.read, DIMS) == 2 * 2 * scores / 2 and value(back.write, DIMS) == 2 * scores
    assert value(drop.read, DIMS) == 2 * scores and value(drop.write, DIMS) == 3 * scores
    assert softmax.axis == back.axis == drop.axis == "y" and softmax.op_class == "reduction"


def _vtrain_block(gy: int, micro_batch: int) -> tuple[ModelSpec, RunOptions, Candidates]:
    model = ModelSpec(name="gpt-h2048-l16", num_layers=16, hidden=2048, num_heads=16, vocab=50304, max_positions=1024,
                      family="gpt2")
    options = RunOptions(global_batch=32, seq_len=1024, micro_batches=(micro_batch,), attention="unfused",
                         framework="megatron-deepspeed-traced")
    layout = Layout(1, gy, 1, 8 // gy)
    return model, options, Candidates.single(layout, micro_batch, recompute=True, cache_weights=False)


@pytest.mark.parametrize("gy", [1, 4])
def test_the_batched_gemms_are_the_tile_models_and_the_counted_rules_forward(ledger: Ledger, gy: int) -> None:
    """The forward's ``baddbmm`` is ``[S × d]·[d × S]`` and its ``bmm`` ``[S × S]·[S × d]`` over the ``mbs·NH/Gy``
    heads a GPU holds, stacked as rows (``d`` = 128): each priced by :func:`gemm_s` from that shape, so together they
    are, to the bit, the GEMMs of ``unfused_attention_s``'s forward (the counted rule: its forward less its HBM
    traffic of 9 bytes per score)."""
    machine = load_machine("dgx-a100")
    model, options, c = _vtrain_block(gy, micro_batch=4)
    evaluated = evaluate_ledger(ledger, model, 1024, c, hf_path=False, attention="unfused")
    rows, s, d = 4 * 16 / gy * 1024.0, 1024.0, 128.0
    one = np.ones(1)
    by_hand = {"baddbmm.default": gemm_s(machine, rows * one, s * one, d * one),
               "bmm.default": gemm_s(machine, rows * one, d * one, s * one)}
    attn = evaluated.attention_rate(machine)
    got = {e.op.op: evaluated.seconds(e, machine, attn) for e in evaluated.ops
           if e.scope == "block_forward" and e.op.op in by_hand}
    assert set(got) == set(by_hand) and all(np.array_equal(got[k], by_hand[k]) for k in by_hand)
    counted_fwd, _ = unfused_attention_s(model, machine, options, c)
    traffic = 9.0 * 4 * 16 / gy * s * s / (machine.device.hbm_bandwidth_gbs * 1e9 * machine.memory_efficiency)
    assert float(got["baddbmm.default"][0] + got["bmm.default"][0]) == pytest.approx(
        float(counted_fwd[0]) - traffic, rel=1e-12)


def test_the_traced_profile_is_its_base_with_the_ledger_and_the_ledgers_logits() -> None:
    """``megatron-deepspeed-traced`` extends ``megatron-deepspeed``: the same memory rules (ZeRO-1's 2 + 2 + 12/d bytes
    per parameter), collectives and measured host replay, the ledger in place of the counts, and 2 bytes per logit
    beyond the ledger's saved fp32 copy (the counted profile's 6 hold that copy)."""
    base, traced = load_framework("megatron-deepspeed"), load_framework("megatron-deepspeed-traced")
    assert base.ledger is None and traced.ledger == "megatron-deepspeed"
    assert traced.memory.model_copy(update={"logits_bytes": 6.0}) == base.memory
    assert (base.memory.logits_bytes, traced.memory.logits_bytes) == (6.0, 2.0)
    assert traced.host_replay is not None and base.block is not None
    assert (traced.host_replay.forward, traced.host_replay.backward, traced.host_replay.recompute_extra) == (
        base.block.forward.host_ops, base.block.backward.host_ops, base.block.recompute_extra_host_ops)
    assert traced.measured_on == base.measured_on and traced.z_gather_unit == base.z_gather_unit


def test_explain_prices_the_scores_gemm_in_the_ledger_and_a_linears_in_the_tile_model() -> None:
    """Through the real entry point: ``explain`` under ``--framework megatron-deepspeed-traced`` shows the ledger op by
    op, the scores' ``baddbmm`` priced by the ledger (its microseconds shown), a 4D linear's GEMM left to the tile
    model with its collectives (shown as such)."""
    done = subprocess.run([sys.executable, "-m", "axoplan", "explain", "--layers", "16", "--hidden", "2048", "--heads",
                           "16", "--vocab", "50304", "--seq-len", "1024", "--global-batch", "32", "--micro-batch", "4",
                           "--machine", "dgx-a100", "--framework", "megatron-deepspeed-traced", "--attention",
                           "unfused", "--layout", "1x4x1x2", "--gpus", "8", "--wide"],
                          capture_output=True, text=True, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("block_forward")]
    baddbmm = [r for r in rows if r[1] == "baddbmm.default"]
    linear = [r for r in rows if r[1] == "addmm.default"]
    assert len(baddbmm) == 1 and float(baddbmm[0][-1]) > 0
    assert len(linear) == 1 and linear[0][-1] == "model"


@pytest.mark.slow  # a tracing subprocess (about 10 s)
def test_the_shipped_ledger_is_what_its_made_by_command_derives(tmp_path: Path) -> None:
    shipped = json.loads((REPO / "frameworks/ledgers/megatron-deepspeed-gpt2.json").read_text())
    out = tmp_path / "ledger.json"
    done = subprocess.run([sys.executable, "benchmarks/derive_ledger.py", "--framework", "megatron-deepspeed",
                           "--family", "gpt2", "--precision", "bf16", "--out", str(out)],
                          capture_output=True, text=True, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    derived = json.loads(out.read_text())
    assert shipped["made_by"] == ("python benchmarks/derive_ledger.py --framework megatron-deepspeed --family gpt2 "
                                  "--precision bf16")
    assert {k: v for k, v in derived.items() if k != "made_by"} == {k: v for k, v in shipped.items() if k != "made_by"}


def _rank_lines(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "axoplan", "rank", "--model", "5B", "--gpus", "64", "--machine",
                           "dgx-h100", "--top", "1", *args], capture_output=True, text=True, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_rank_says_the_traced_code_runs_unfused_attention_whatever_the_option() -> None:
    """Its ledger runs the unfused core, so the default ``--attention flash`` is not what prices it: ``rank`` says so
    under its table; nothing where the option names what runs (``unfused``), or under the counted profile, which
    prices the option's kernel."""
    lines = _rank_lines("--framework", "megatron-deepspeed-traced")
    (at,) = [i for i, line in enumerate(lines) if line.startswith("attention:")]
    said = " ".join(lines[at:at + 2])
    assert said.startswith("attention: the code of megatron-deepspeed-traced runs unfused attention")
    assert said.endswith("which prices it whatever --attention says")
    assert not any(line.startswith("attention:") for line in _rank_lines(
        "--framework", "megatron-deepspeed-traced", "--attention", "unfused"))
    assert not any(line.startswith("attention:") for line in _rank_lines("--framework", "megatron-deepspeed"))
