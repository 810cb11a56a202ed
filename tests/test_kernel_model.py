"""Issue 11: GEMMs from tiles and waves, kernel and host-op accounting per framework profile."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from axoplan.cost.compute import gemm_s, wave_quantized_s, waves
from axoplan.cost.model import predict
from axoplan.errors import AxoplanError
from axoplan.inputs.framework import load_framework, shipped_frameworks
from axoplan.inputs.machine import GemmTile, Machine, load_machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout

A100 = load_machine("dgx-a100")


def one_tile(units: int = 108, tm: int = 128, tn: int = 128) -> Machine:
    """The A100 with a single tile shape, full efficiency and an HBM too fast to bind."""
    gemm = A100.gemm.model_copy(update={"tiles": (GemmTile(m=tm, n=tn),), "max_efficiency": 1.0})
    device = A100.device.model_copy(update={"compute_units": units, "hbm_bandwidth_gbs": 1e9})
    return A100.model_copy(update={"gemm": gemm, "device": device})


def test_one_tile_more_than_a_full_wave_costs_a_second_wave() -> None:
    """108 tiles of 128x128 fill 108 SMs once; the 109th tile needs a second wave: twice the time.
    One wave: 2·128·128·k flops at 312/108 TFLOP/s per SM."""
    m = one_tile()
    k = np.array([4096.0])
    full = gemm_s(m, np.array([128.0 * 108]), np.array([128.0]), k)
    over = gemm_s(m, np.array([128.0 * 108 + 1]), np.array([128.0]), k)
    assert full[0] == pytest.approx(2 * 128 * 128 * 4096 / (312e12 / 108))
    assert over[0] == pytest.approx(2 * full[0])


def test_waves_are_the_ceiling_of_tiles_over_units() -> None:
    assert list(waves(np.array([1.0, 108.0, 109.0, 216.0, 217.0]), 108)) == [1, 1, 2, 2, 3]


def test_the_library_takes_the_faster_tile_and_orientation() -> None:
    """m = 64·108 fills one wave of 64x64 tiles but two of 128x128 ones (54·... rows): with both
    tiles offered at equal efficiency the smaller one's single wave of quarter tiles wins."""
    base = one_tile()
    both = base.model_copy(update={"gemm": base.gemm.model_copy(update={"tiles": (
        GemmTile(m=128, n=128), GemmTile(m=64, n=64))})})
    args = np.array([64.0 * 108]), np.array([64.0]), np.array([1024.0])
    big_only = gemm_s(base, *args)[0]  # ceil(6912/128)=54 tiles x 1 = one wave of 128x128 tiles
    assert gemm_s(both, *args)[0] == pytest.approx(min(big_only, 2 * 64 * 64 * 1024 / (312e12 / 108)))
    swapped = gemm_s(both, args[1], args[0], args[2])[0]
    assert swapped == pytest.approx(gemm_s(both, *args)[0])  # Cᵀ = BᵀAᵀ: orientation is free


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(1, 20000), k=st.integers(1, 8192),
       units=st.integers(1, 200), extra=st.integers(1, 100))
def test_more_compute_units_are_never_slower(m: int, n: int, k: int, units: int, extra: int) -> None:
    """More SMs of the same kind (the device's peak grows with them) never make a GEMM slower."""
    args = np.array([float(m)]), np.array([float(n)]), np.array([float(k)])
    per_unit = A100.peak_flops / 108
    t_few = wave_quantized_s(A100.gemm, units, per_unit * units, *args)[0]
    t_more = wave_quantized_s(A100.gemm, units + extra, per_unit * (units + extra), *args)[0]
    assert t_more <= t_few * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(1, 20000), k=st.integers(1, 8192))
def test_a_gemm_never_beats_its_flops_at_full_wave_efficiency(m: int, n: int, k: int) -> None:
    args = np.array([float(m)]), np.array([float(n)]), np.array([float(k)])
    assert gemm_s(A100, *args)[0] >= 2.0 * m * n * k / (A100.peak_flops * A100.gemm.max_efficiency) * (1 - 1e-12)


def test_shipped_profiles_load_and_fused_profiles_launch_fewer_kernels() -> None:
    """Megatron-AxoNN's flash attention replaces the unfused scores' baddbmm, softmax, dropout,
    bmm and copy: it never launches more kernels, nor issues more host ops, per block."""
    assert {"axonn", "megatron-deepspeed", "axoplan-executor"} <= set(shipped_frameworks())
    fused, unfused = load_framework("axonn"), load_framework("megatron-deepspeed")
    assert fused.kernels_per_block[0] <= unfused.kernels_per_block[0]
    assert fused.kernels_per_block[1] <= unfused.kernels_per_block[1]
    assert fused.block.forward.host_ops < unfused.block.forward.host_ops
    # Megatron-DeepSpeed's hand count, per block forward: 10 non-GEMM kernels + 6 GEMM/bmm kernels
    assert unfused.kernels_per_block == (16, 44)


def test_an_unknown_framework_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown framework 'megatron'"):
        RunOptions(framework="megatron")
    with pytest.raises(AxoplanError, match="did you mean 'axonn'"):
        load_framework("axon")


TINY = ModelSpec(name="tiny", num_layers=2, hidden=64, num_heads=4, vocab=256)
OPTS = RunOptions(global_batch=8, seq_len=32, micro_batches=(1,), framework="megatron-deepspeed")
"""A counted profile (frameworks/megatron-deepspeed.yaml), whose kernels and host ops the tests count by hand."""


def test_kernel_gaps_are_counted_per_kernel_on_the_device() -> None:
    """Every kernel costs kernel_gap_us: raising it by 1 µs adds (kernels per micro-batch) µs per
    micro-batch, hand-counted from frameworks/megatron-deepspeed.yaml: 2 blocks x ((10 + 6) + (32 + 12)) + head
    (13 + 14) (each phase's kernels and GEMM kernels)."""
    c = Candidates.single(Layout(1, 1, 1, 8), 1, False, False)
    base = predict(TINY, A100, OPTS, c).columns["t_nongemm_s"][0]
    slower = A100.model_copy(update={"device": A100.device.model_copy(update={"kernel_gap_us": 3.0})})
    diff = predict(TINY, slower, OPTS, c).columns["t_nongemm_s"][0] - base
    assert diff == pytest.approx((2 * (16 + 44) + 13 + 14) * 1e-6)


def test_recompute_repeats_the_forward_ops_and_adds_the_checkpoint_bookkeeping() -> None:
    """With a slow host, recompute adds L·(forward ops + bookkeeping) x op_us per micro-batch."""
    slow = A100.model_copy(update={"host": A100.host.model_copy(update={"op_us": 1000.0, "launch_us": 0.0})})
    plain = predict(TINY, slow, OPTS, Candidates.single(Layout(1, 1, 1, 8), 1, False, False)).columns
    rec = predict(TINY, slow, OPTS, Candidates.single(Layout(1, 1, 1, 8), 1, True, False)).columns
    added = (rec["t_step_s"][0] - plain["t_step_s"][0])
    assert added == pytest.approx(2 * (139 + 32) * 1e-3, rel=1e-6)  # megatron-deepspeed.yaml: forward, checkpoint


def test_every_kernel_launch_costs_the_host_launch_us() -> None:
    """With launches dominating (1 ms each, ops free), a host-bound micro-batch takes kernels x
    launch_us, hand-counted from frameworks/megatron-deepspeed.yaml: 2 blocks x ((10 + 6) + (32 + 12)) + head
    (13 + 14) = 147 kernels; one GPU per group, so no collective calls. Recompute launches the forward again."""
    host = A100.host.model_copy(update={"op_us": 1e-6, "launch_us": 1000.0})
    slow = A100.model_copy(update={"host": host})

    def device_side_free(recompute: bool) -> float:
        col = predict(TINY, slow, OPTS, Candidates.single(Layout(1, 1, 1, 8), 1, recompute, False)).columns
        return float(col["t_step_s"][0] - col["t_optimizer_s"][0] - col["t_exposed_data_s"][0]
                     - col["t_exposed_world_s"][0]) / float(col["grad_accum"][0])

    assert device_side_free(False) == pytest.approx(147 * 1e-3, rel=1e-6)
    assert device_side_free(True) - device_side_free(False) == pytest.approx(2 * 16 * 1e-3, rel=1e-6)
    assert load_machine("local-cpu").host.launch_us == 0.0  # a CPU 'device' launches nothing


def test_a_cpu_device_pays_its_host_overhead_on_top_of_the_work() -> None:
    """A CPU 'device' runs the ops it issues: the host time adds (no max). The executor's blocks cost the host their
    replayed op-equivalents (frameworks/axoplan-executor.yaml `host_replay`, forward and backward, twice: TINY has two
    blocks), more than its traced ledger's aten ops (frameworks/ledgers/executor-fp32-gpt2.json); the rest of the
    step's ops once, as the ledger counts them; no collective on one rank."""
    from axoplan.cost.ledger import load_ledger

    cpu = load_machine("local-cpu")
    c = Candidates.single(Layout(1, 1, 1, 1), 1, False, False)
    opts = RunOptions(global_batch=1, seq_len=32, micro_batches=(1,), framework="axoplan-executor")
    col = predict(TINY, cpu, opts, c).columns
    profile = load_framework("axoplan-executor")
    ledger = load_ledger(str(profile.ledger_for("cpu")), "gpt2")

    def ops_of(scope: str) -> int:
        return sum(op.count for op in ledger.ops(scope))

    replay = profile.host_replay
    assert replay is not None
    traced = ops_of("block_forward") + ops_of("block_backward")
    assert traced > 200 and replay.forward + replay.backward > traced  # the replay adds what is no aten op
    ops = 2 * (replay.forward + replay.backward) + ops_of("rest_forward") + ops_of("rest_backward")
    assert col["t_host_idle_s"][0] == pytest.approx(ops * cpu.host.op_us * 1e-6)
    assert col["t_step_s"][0] == pytest.approx(col["t_compute_s"][0] + col["t_comm_exposed_s"][0]
                                               + col["t_host_idle_s"][0])


def test_bucketed_gradient_reduction_hides_behind_the_backward_and_never_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile whose gradient buckets are reduced during the backward exposes, per layer,
    max(all-reduce − the next backward compute, 0): never more than the serial case, never
    hiding more than the all-reduce itself."""

    opts = RunOptions(global_batch=64, seq_len=1024, micro_batches=(1,))
    spec = ModelSpec(name="m", num_layers=4, hidden=2048, num_heads=16, vocab=8192)
    cands = Candidates.enumerate(16, opts)
    serial = predict(spec, A100, opts, cands)
    profile = load_framework("axonn")
    bucketed = profile.model_copy(update={"grad_reduce_overlaps_backward": True})
    monkeypatch.setattr(RunOptions, "code_profile", lambda self, model: bucketed)
    overlapped = predict(spec, A100, opts, cands)
    before = serial.columns["t_exposed_data_s"]
    after = overlapped.columns["t_exposed_data_s"]
    assert (after <= before + 1e-15).all() and (after >= 0).all()
    assert np.allclose(overlapped.columns["t_comm_data_s"], serial.columns["t_comm_data_s"])
    assert (after < before).any()  # some layouts do hide part of it


def test_ranks_sharing_cores_compute_and_issue_at_their_share() -> None:
    """local-cpu has 2 cores: 4 ranks on the node each get half a core, so every compute column
    and the host's time double against the same box without the core count; 2 ranks fit and
    nothing changes; collectives are left alone."""
    cpu = load_machine("local-cpu")
    assert cpu.device.cores_per_node == 2
    unshared = cpu.model_copy(update={"device": cpu.device.model_copy(update={"cores_per_node": None})})
    opts = RunOptions(global_batch=8, seq_len=32, micro_batches=(1,), framework="axoplan-executor")
    for ranks, factor in ((4, 2.0), (2, 1.0)):
        c = Candidates.single(Layout(1, 1, 1, ranks), 1, False, False)
        shared, alone = predict(TINY, cpu, opts, c).columns, predict(TINY, unshared, opts, c).columns
        for col in ("t_gemm_s", "t_nongemm_s", "t_optimizer_s", "t_host_idle_s"):
            assert shared[col][0] == pytest.approx(factor * alone[col][0]), col
        assert shared["t_comm_exposed_s"][0] == pytest.approx(alone["t_comm_exposed_s"][0])
    assert load_machine("dgx-a100").device.cores_per_node is None  # a GPU computes on its own
