"""Memory per GPU by framework, hand-derived, and the verdict every measured run must pass."""

from __future__ import annotations

import numpy as np
import pytest

from axoplan.cost.memory import memory_per_gpu, memory_verdict
from axoplan.cost.model import predict
from axoplan.inputs.framework import FrameworkProfile, load_framework
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout
from axoplan.validate.compare import Predictor, aggregate, plan_table, summarize
from axoplan.validate.records import load_runs
from tests.conftest import REPO

TINY = ModelSpec(name="tiny", num_layers=2, hidden=64, num_heads=4, vocab=128, max_positions=32)
TINY_MPT = TINY.model_copy(update={"family": "mpt"})
MEASURED = {
    "vtrain_a100_single_node_pp1.csv": None,
    "llm-foundry/runs-a100.csv": None,
    "cpu-gloo/runs.jsonl": None,
}


def _memory(framework: str, layout: Layout, recompute: bool = False,  # type: ignore[no-untyped-def]
            profile: FrameworkProfile | None = None, **opts: object):
    options = RunOptions(global_batch=8, seq_len=32, micro_batches=(2,), framework=framework, **opts)
    c = Candidates.single(layout, 2, recompute, False)
    return memory_per_gpu(TINY, options, c, profile or load_framework(framework))


def _fsdp(model: ModelSpec, recompute: bool = False, **opts: object):  # type: ignore[no-untyped-def]
    """PyTorch FSDP's memory as `predict` makes it: with its traced ledger's saved tensors (llm-foundry's MPT)."""
    options = RunOptions(global_batch=8, seq_len=32, micro_batches=(2,), framework="pytorch-fsdp",
                         recompute="on" if recompute else "off", cache_weights="off", **opts)
    c = Candidates.single(Layout(1, 1, 4, 1), 2, recompute, False)
    return predict(model, load_machine("dgx-a100"), options, c).memory


def test_an_fsdp_block_by_hand() -> None:
    """FULL_SHARD over 4 GPUs (Gz = 4), reduce_dtype fp32, micro-batch 2 of 32 tokens, no recompute.

    Parameters on a GPU: the four linears' 49,152 weights per block, the 128 x 64 tied embedding (FSDP keeps the
    tie: one copy) and 32 x 64 positions, a quarter each (27,136), plus a quarter of the 1,792 norms and biases FSDP
    flattens into its shards (448): 27,584, at 4 (fp32 flat parameter) + 4 (fp32 gradient) + 8 (Adam)
    bytes. Gathered: two bf16 blocks (limit_all_gathers) and one block's gradient in bf16 and its fp32
    copy (49,152 x (2·2 + 2 + 4)), and the root unit's 10,240 embedding parameters kept gathered with
    their gradient (x (2 + 2 + 4)). Activations: the traced MPT block keeps 16·H + 4·F + 4·NH + 8 bytes per token
    (docs/algorithm.md §5e): one more layer adds 64 tokens x (1,024 + 1,024 + 16 + 8). Logits: the fused
    cross-entropy's bf16 gradient, 64 tokens x 128 x 2 bytes (its bf16 logits are in the ledger's saved tensors)."""
    mem = _fsdp(TINY_MPT)
    params = 27_136 + 448
    assert mem.weights[0] == 4 * params and mem.gradients[0] == 4 * params and mem.optimizer[0] == 8 * params
    assert mem.gathered[0] == 49_152 * (2 * 2 + 2 + 4) + 10_240 * (2 + 2 + 4)
    one_layer = _fsdp(TINY_MPT.model_copy(update={"num_layers": 1}))
    assert mem.activations[0] - one_layer.activations[0] == 64 * (16 * 64 + 4 * 256 + 4 * 4 + 8)
    assert mem.logits[0] == 64 * 128 * 2
    bf16 = _fsdp(TINY_MPT, grad_reduce_dtype="bf16")  # PURE: no fp32 copy
    assert mem.gathered[0] - bf16.gathered[0] == (49_152 + 10_240) * 4


def test_full_recompute_keeps_block_inputs_and_one_blocks_working_set() -> None:
    """Under full recompute each of the 2 blocks keeps its bf16 input (FSDP's PURE param_dtype: the residual stream
    is bf16, 2 bytes) instead of its working set, and one block's working set is alive: full minus recomputed is
    one block's 64 x 2,072 bytes less two inputs of 64 x 64 x 2."""
    full, recomputed = _fsdp(TINY_MPT), _fsdp(TINY_MPT, recompute=True)
    assert full.activations[0] - recomputed.activations[0] == 64 * 2_072 - 2 * 64 * 64 * 2


def _counted_no_dropout() -> FrameworkProfile:
    """Megatron-DeepSpeed's counted rules without dropout: the counted activation formula's dropout-free case."""
    profile = load_framework("megatron-deepspeed")
    return profile.model_copy(update={"memory": profile.memory.model_copy(update={"dropout": False})})


def test_zero_stage_1_shards_only_the_optimizer_over_data() -> None:
    """Megatron-DeepSpeed with ZeRO-1 (Rajbhandari et al., 2Ψ + 2Ψ + 12Ψ/Nd): tensor parallelism 2
    and data parallelism 4; AxoNN keeps all 18 bytes on every data-parallel rank."""
    zero = _memory("megatron-deepspeed", Layout(1, 2, 1, 4))
    axonn = _memory("axonn", Layout(1, 2, 1, 4))
    shard = zero.weights[0] / 2.0
    assert zero.gradients[0] == 2 * shard and zero.optimizer[0] == 12 * shard / 4
    assert axonn.weights[0] == 2 * shard and axonn.gradients[0] == 4 * shard and axonn.optimizer[0] == 12 * shard
    dropout = _memory("megatron-deepspeed", Layout(1, 1, 1, 4)).activations[0]
    no_dropout = _memory("megatron-deepspeed", Layout(1, 1, 1, 4), profile=_counted_no_dropout()).activations[0]
    assert dropout - no_dropout == 2 * 64 * 64 * 2  # a 1-byte mask after attention and after the MLP


def test_the_verdict_is_the_interval_against_the_hbm() -> None:
    """A 40 GB A100 under FSDP (one process group): reserve 1.0 + 0.6 + 0.115 x 40 = 6.2 GB; the need's
    80 % interval is exp(±1.2816 x 0.10). Fits while the need is under 40/e^0.128 = 35.19 GB (live
    28.99 GB), does not fit once it is over 40·e^0.128 = 45.47 GB (live 39.27 GB), tight between."""
    machine, profile = load_machine("dgx-a100"), load_framework("pytorch-fsdp")
    live = np.array([28.9e9, 29.1e9, 39.2e9, 39.4e9])
    v = memory_verdict(live, machine, profile)
    assert v.verdict.tolist() == [0, 1, 1, 2]
    assert v.need_bytes[0] == pytest.approx(28.9e9 + 6.2e9)
    assert v.usable_bytes == pytest.approx(33.8e9)


@pytest.mark.parametrize("path", list(MEASURED))
def test_every_shipped_measured_run_fits_or_is_tight(path: str) -> None:
    """Every run of every shipped data set ran, so none may be called 'does not fit' (issue 22)."""
    runs = load_runs([REPO / "data" / "measured" / path])
    for machine in sorted({r.plan.machine for r in runs}):
        plans = aggregate([r for r in runs if r.plan.machine == machine])
        summary = summarize(plan_table(plans, Predictor([p.plan for p in plans])(load_machine(machine))))
        assert summary.does_not_fit == 0, (path, machine)
        if "vtrain" in path:  # as before issue 22: every vTrain plan fits outright (docs/validate.md: tight 0)
            assert summary.tight == 0, (path, machine)


def test_megatrons_distributed_optimizer_keeps_six_bytes_and_shards_twelve() -> None:
    """Megatron-LM's distributed optimizer, bf16 with fp32 gradients: 6 + 12/d bytes per parameter
    (Megatron-LM docs/source/distrib_optimizer.md)."""
    mem = _memory("megatron-lm", Layout(1, 2, 1, 4))
    shard = mem.weights[0] / 2.0
    assert mem.gradients[0] == 4 * shard and mem.optimizer[0] == 12 * shard / 4


def test_axoplans_executor_keeps_sixteen_bytes_and_no_dropout() -> None:
    """axoplan/executor/optim.py: 16-bit weights and gradients with fp32 master and moments (or fp32
    throughout on a CPU): 16 bytes per parameter; its blocks have no dropout; fp32 logits and softmax."""
    mem = _memory("axoplan-executor", Layout(1, 2, 1, 4))
    shard = mem.weights[0] / 2.0
    assert mem.gradients[0] == 2 * shard and mem.optimizer[0] == 12 * shard
    assert mem.activations[0] == _memory("megatron-deepspeed", Layout(1, 2, 1, 4),
                                         profile=_counted_no_dropout()).activations[0]
    assert mem.logits[0] == 64 * 128 / 2 * 8
