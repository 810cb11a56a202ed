"""Rules a framework profile sets for the step: a ledger profile's replayed host work (``FrameworkProfile.host_replay``:
the blocks' host op-equivalents as measured by replaying the framework's Python, in place of the ledger's count of
aten ops), and an optimizer step split over data where the profile's optimizer states are."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from axoplan.cost.ledger import load_ledger, price_ledger
from axoplan.cost.step import _per_micro_counts
from axoplan.inputs.framework import FrameworkProfile, HostReplay, load_framework
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import ModelSpec
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout

MODEL = ModelSpec(name="gpt-l4", num_layers=4, hidden=2048, num_heads=16, vocab=32000, max_positions=2048,
                  tied_embeddings=True, biases=True, ffn_kind="gelu")


def _counts(profile: FrameworkProfile, recompute: bool) -> tuple[float, float, dict[str, float]]:
    ledger = load_ledger(profile.ledger or "", "gpt2")
    c = Candidates.single(Layout(1, 1, 1, 1), 1, recompute, False)
    cost = price_ledger(ledger, load_machine("dgx-h100"), MODEL, 2048, c)
    host, kernels = _per_micro_counts(profile, MODEL, c, None, cost)
    return float(np.asarray(host)[0]), float(np.asarray(kernels)[0]), cost.host_ops


@pytest.mark.parametrize("recompute", [False, True])
def test_replayed_block_host_work_replaces_the_ledgers_op_count_and_keeps_its_kernels(recompute: bool) -> None:
    """Per micro-batch: layers x (forward x (1 + recompute) + backward + extra x recompute) replayed op-equivalents,
    plus the head's ops as the ledger counts them; the kernels stay the ledger's."""
    shipped = load_framework("megatron-lm").model_copy(update={"host_replay": None})
    replay = HostReplay(forward=200.0, backward=300.0, recompute_extra=25.0)
    replayed = shipped.model_copy(update={"host_replay": replay})
    host0, kernels0, per_scope = _counts(shipped, recompute)
    host1, kernels1, _ = _counts(replayed, recompute)
    rec = 1.0 if recompute else 0.0
    assert host0 == pytest.approx(4 * (per_scope["block_forward"] * (1 + rec) + per_scope["block_backward"])
                                  + per_scope["rest_forward"] + per_scope["rest_backward"])
    assert host1 == pytest.approx(4 * (200.0 * (1 + rec) + 300.0 + 25.0 * rec)
                                  + per_scope["rest_forward"] + per_scope["rest_backward"])
    assert kernels1 == kernels0


def test_host_replay_needs_a_ledger() -> None:
    """A counted profile gives its measured op-equivalents in block.forward/backward.host_ops already."""
    counted = load_framework("megatron-deepspeed").model_dump()
    with pytest.raises(ValidationError, match="host_replay replaces a ledger's host op count"):
        FrameworkProfile.model_validate({**counted, "host_replay": {"forward": 1.0, "backward": 1.0}})


def test_a_counted_profile_with_optimizer_states_sharded_over_data_steps_its_shard_only() -> None:
    """ZeRO-1 (Megatron-DeepSpeed's memory rule): each data-parallel rank updates 1/Gdata of the master weights and
    moments, so its optimizer step takes 1/Gdata of the time it takes on one data-parallel rank holding the same
    parameters (Gx·Gy·Gz unchanged); AxoNN shards none of them over data."""
    from axoplan.cost.model import predict
    from axoplan.inputs.options import RunOptions

    machine = load_machine("dgx-a100")

    def optimizer_s(framework: str, layout: Layout) -> float:
        options = RunOptions(global_batch=16, seq_len=1024, micro_batches=(1,), framework=framework,
                             recompute="on", cache_weights="off")
        c = Candidates.single(layout, 1, True, False)
        return float(predict(MODEL, machine, options, c).columns["t_optimizer_s"][0])

    alone = optimizer_s("megatron-deepspeed", Layout(1, 1, 1, 1))
    for gdata in (2, 4):
        assert optimizer_s("megatron-deepspeed", Layout(1, 1, 1, gdata)) * gdata == pytest.approx(alone)
    assert load_framework("megatron-deepspeed").memory.optimizer.sharded_over_data
    assert not load_framework("axonn").memory.optimizer.sharded_over_data


def test_a_chunked_loss_keeps_one_chunks_logits() -> None:
    """torchtitan's ChunkedLossWrapper (8 chunks in its Llama 3 configs) runs the LM head, the loss and its backward
    one eighth of the sequence at a time: of the logits line (10 bytes per logit beyond the saved tensors) and of the
    ledger's saved fp32 log-probabilities (4 bytes per logit) one eighth is alive. Llama 3.1 8B, 8,192 tokens on one
    H100 of eight: 8,192 x 128,256 logits x 14 B x 7/8 fewer bytes than an unchunked loss; nothing else moves."""
    from axoplan.cost.memory import memory_per_gpu
    from axoplan.inputs.model import PRESETS
    from axoplan.inputs.options import RunOptions

    model = PRESETS["llama3.1-8B"]
    options = RunOptions(global_batch=8, seq_len=8192, micro_batches=(1,), framework="torchtitan", recompute="on",
                         cache_weights="off")
    c = Candidates.single(Layout(1, 1, 8, 1), 1, True, False)
    chunked = load_framework("torchtitan")
    whole = chunked.model_copy(update={"memory": chunked.memory.model_copy(update={"loss_chunks": 1})})
    ledger = load_ledger("torchtitan", "llama")
    cost = price_ledger(ledger, load_machine("dgx-h100"), model, 8192, c)
    a, b = (memory_per_gpu(model, options, c, p, cost) for p in (chunked, whole))
    logits = 8192 * model.vocab
    assert chunked.memory.loss_chunks == 8 and model.vocab == 128256
    assert float(b.logits[0] - a.logits[0]) == pytest.approx(logits * 10 * 7 / 8)
    assert float(b.activations[0] - a.activations[0]) == pytest.approx(logits * 4 * 7 / 8)
    assert float(a.weights[0]) == float(b.weights[0]) and float(a.gathered[0]) == float(b.gathered[0])


def test_megatron_lms_distributed_optimizer_runs_its_traced_shard_part_on_one_data_rank_in_d() -> None:
    """Megatron-LM's distributed optimizer (its ledger's step, traced from megatron-core): the gradient buffer's NaN
    check (4 bytes per parameter), its 1/d scaling (8) and its zeroing (8) run on the whole buffer on every rank;
    the clip's norm (4), the fused Adam (32) and the copy into the bf16 weights (8) on the rank's 1/d shard. Priced
    from the H100's measured op classes, the step on 4 data ranks over one rank's is (16/eff + 44/eff / 4) over all
    of it, class by class."""
    from axoplan.cost.ledger import _efficiency
    from axoplan.cost.model import predict
    from axoplan.inputs.options import RunOptions

    ledger = load_ledger("megatron", "gpt2")
    assert ledger.optimizer_shard_bytes_per_param is not None
    shard = {c: round(v) for c, v in ledger.optimizer_shard_bytes_per_param.items() if v > 0.01}
    assert shard == {"reduction": 4, "optimizer": 32, "copy_cast": 8}
    machine = load_machine("dgx-h100")

    def optimizer_s(gdata: int) -> float:
        options = RunOptions(global_batch=16, seq_len=1024, micro_batches=(1,), framework="megatron-lm",
                             recompute="off", cache_weights="off")
        c = Candidates.single(Layout(1, 1, 1, gdata), 1, False, False)
        return float(predict(MODEL, machine, options, c).columns["t_optimizer_s"][0])

    whole = {c: round(v) for c, v in ledger.optimizer_bytes_per_param.items()}
    per_byte = {c: 1.0 / _efficiency(machine, c) for c in whole}
    expected = (sum((whole[c] - shard.get(c, 0)) * per_byte[c] for c in whole)
                + sum(shard[c] * per_byte[c] for c in shard) / 4) / sum(whole[c] * per_byte[c] for c in whole)
    assert optimizer_s(4) / optimizer_s(1) == pytest.approx(expected, rel=1e-3)
    assert 0.4 < expected < 0.5
