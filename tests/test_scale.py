"""What grows with scale, hand-derived: the slowest of N GPUs, compute lost to hidden collectives, the
waits nothing hides (drains), FSDP's per-block gathers, and fused attention under the causal mask."""

from __future__ import annotations

import math

import numpy as np
import pytest

from axoplan.cost import collectives as coll
from axoplan.cost.attention import causal_fraction
from axoplan.cost.model import predict
from axoplan.cost.placement import place
from axoplan.cost.scale import expected_max_normal, straggler_factor
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout

MODEL = ModelSpec(name="t", num_layers=4, hidden=1024, num_heads=16, vocab=4096, max_positions=2048)


def test_the_expected_slowest_of_n_normals_by_hand() -> None:
    """E[max] of 2 standard normals is 1/√π, of 3 is 3/(2√π) (order statistics), of one is 0."""
    got = expected_max_normal([1, 2, 3, 8])
    assert got[0] == 0.0
    assert got[1] == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert got[2] == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-6)
    assert got[3] == pytest.approx(1.42360, rel=1e-4)  # tabulated (Harter 1961)
    assert straggler_factor(0.02, [2])[0] == pytest.approx(0.02 / math.sqrt(math.pi), rel=1e-6)


def test_a_step_waits_for_its_slowest_gpu() -> None:
    """The step adds σ·E[max of N] of the device's busy time: 1.5 % x 1/√π for 2 GPUs on a DGX A100."""
    machine = load_machine("dgx-a100")
    opts = RunOptions(global_batch=8, seq_len=1024, micro_batches=(2,), framework="pytorch-fsdp")
    col = predict(MODEL, machine, opts, Candidates.single(Layout(1, 1, 2, 1), 2, False, False)).columns
    busy = col["t_gemm_s"][0] + col["t_nongemm_s"][0] + col["t_interference_s"][0]
    assert machine.device.speed_variation == 0.015
    assert col["t_straggler_s"][0] == pytest.approx(busy * 0.015 / math.sqrt(math.pi), rel=1e-6)
    one = predict(MODEL, machine, opts.model_copy(update={"global_batch": 4}),
                  Candidates.single(Layout(1, 1, 1, 1), 2, False, False)).columns
    assert one["t_straggler_s"][0] == 0.0


def test_hidden_collectives_take_their_share_of_the_compute_beside_them() -> None:
    """Every group inside one 8-GPU node: the compute lost is 0.15 (NVLink's processor_usage) of the
    communication time the step does not wait for."""
    machine = load_machine("dgx-a100")
    opts = RunOptions(global_batch=16, seq_len=1024, micro_batches=(2,), framework="pytorch-fsdp")
    col = predict(MODEL, machine, opts, Candidates.single(Layout(1, 1, 8, 1), 2, False, False)).columns
    hidden = col["t_comm_total_s"][0] - col["t_comm_exposed_s"][0]
    assert hidden > 0
    assert col["t_interference_s"][0] == pytest.approx(0.15 * hidden, rel=1e-9)


def test_fsdp_gathers_each_block_whole_and_drains_twice_per_micro_batch() -> None:
    """pytorch-fsdp: one all-gather per block of its four linears' 12·H² bf16 weights (L per micro-batch
    and pass), the LM head kept gathered (no backward gather); per micro-batch the first block's
    gather and the root's, and the last reduce-scatters, wait in full (the drains)."""
    machine = load_machine("dgx-a100")
    opts = RunOptions(global_batch=32, seq_len=1024, micro_batches=(2,), framework="pytorch-fsdp",
                      grad_reduce_dtype="bf16")
    pred = predict(MODEL, machine, opts, Candidates.single(Layout(1, 1, 8, 1), 2, False, False))
    z = {(t.layer, t.phase, t.op): t for t in pred.collectives if t.axis == "z"}
    n_micro = 32 / (8 * 2)
    block = z["block", "forward", "all-gather"]
    assert block.nbytes[0] == 12 * 1024 * 1024 * 2 and block.calls_per_step[0] == n_micro * 4
    assert z["lm_head", "backward", "all-gather"].seconds_per_call[0] == 0.0  # the root stays gathered
    g = place(machine, 1, 8)
    ag = coll.all_gather_s(np.array([block.nbytes[0]]), np.array([8.0]), np.array([g.bandwidth_gbs]),
                           np.array([g.ring_latency_us]))[0]
    assert block.seconds_per_call[0] == pytest.approx(ag)
    drain = z["block", "backward", "reduce-scatter (drain)"]
    rs = z["block", "backward", "reduce-scatter"]
    assert drain.calls_per_step[0] == n_micro and drain.total_s[0] == 0.0
    assert drain.exposed_per_call[0] + rs.exposed_per_call[0] == pytest.approx(rs.seconds_per_call[0])
    first = z["block", "forward", "all-gather (drain)"]
    assert first.exposed_per_call[0] + block.exposed_per_call[0] == pytest.approx(block.seconds_per_call[0])


def test_axonn_gathers_each_linear_on_its_own() -> None:
    pred = predict(MODEL, load_machine("dgx-a100"), RunOptions(global_batch=32, seq_len=1024, micro_batches=(2,)),
                   Candidates.single(Layout(1, 1, 8, 1), 2, False, False))
    layers = {t.layer for t in pred.collectives if t.axis == "z"}
    assert layers == {"qkv", "attn_out", "mlp_up", "mlp_down", "lm_head"}


@pytest.mark.parametrize(("seq", "fraction"), [(128, 1.0), (256, 3 / 4), (2048, 17 / 32), (512, 5 / 8)])
def test_causal_fused_attention_computes_the_tiles_on_and_below_the_diagonal(seq: int, fraction: float) -> None:
    """n = S/128 row blocks: n(n+1)/2 of n² tiles."""
    assert causal_fraction(seq) == pytest.approx(fraction)


def test_the_triton_kernel_runs_at_its_own_efficiency() -> None:
    """--attention flash-triton prices the same flops at attention_triton_efficiency (0.30 of peak on the
    DGX A100) where flash uses attention_efficiency (0.56), under a counted profile (a ledger's attention takes
    the measured curves)."""
    machine = load_machine("dgx-a100")
    c = Candidates.single(Layout(1, 1, 1, 1), 1, False, False)
    cols = {k: predict(MODEL, machine, RunOptions(global_batch=1, seq_len=2048, micro_batches=(1,), attention=k,
                                                  framework="megatron-deepspeed"),
                       c).columns["t_nongemm_s"][0] for k in ("flash", "flash-triton")}
    flops = 4 * 2048**2 * 1024 * causal_fraction(2048) * 3.5 * 4  # forward + backward, 4 layers
    expected = flops / machine.peak_flops * (1 / 0.30 - 1 / 0.56)
    assert cols["flash-triton"] - cols["flash"] == pytest.approx(expected, rel=1e-9)


def test_megatron_lm_reduces_gradients_during_the_backward_megatron_deepspeed_after_it() -> None:
    """--overlap-grad-reduce: each layer's data all-reduce hides behind the backward of the layer before
    it in forward order; Megatron-DeepSpeed without gradient buckets waits for all of it."""
    machine = load_machine("dgx-a100")
    c = Candidates.single(Layout(1, 2, 1, 4), 2, False, False)
    by = {}
    for framework in ("megatron-lm", "megatron-deepspeed"):
        opts = RunOptions(global_batch=32, seq_len=1024, micro_batches=(2,), framework=framework)
        by[framework] = {(t.layer, t.phase, t.axis): t for t in predict(MODEL, machine, opts, c).collectives}
    lm, ds = by["megatron-lm"]["mlp_up", "step", "data"], by["megatron-deepspeed"]["mlp_up", "step", "data"]
    assert ds.exposed_s[0] == pytest.approx(ds.total_s[0]) and ds.total_s[0] > 0
    assert lm.exposed_s[0] < lm.total_s[0]
