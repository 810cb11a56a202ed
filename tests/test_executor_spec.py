"""What the executor decides before any rank starts (no torch): scale-down, refusals,
launcher environment, failure attribution, the record, and the CLI's early errors."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from axoplan.errors import AxoplanError
from axoplan.executor.launch import _is_collateral, _root_cause
from axoplan.executor.ranks import describe_exception, dist_env
from axoplan.executor.record import build_record, runs_path, write_record
from axoplan.executor.spec import (
    ExecSettings,
    Scale,
    check_runnable,
    check_world,
    make_settings,
    scale_plan,
)
from axoplan.inputs.model import padded_vocab
from axoplan.records.runs import read_runs
from axoplan.space.layout import Layout
from tests.conftest import REPO, run_cli
from tests.executor_helpers import tiny_plan


def test_identity_scale_keeps_the_plan() -> None:
    plan = tiny_plan(Layout(2, 1, 2, 1))
    assert scale_plan(plan, Scale()) is plan


def test_scaled_plan_keeps_layout_and_gets_a_new_id() -> None:
    plan = tiny_plan(Layout(2, 1, 2, 1), micro_batch=2, ffn_hidden=48, recompute=True)
    small = scale_plan(plan, Scale(layers=1, hidden=16, grad_accum=3, seq_len=4))
    assert small.model.num_layers == 1 and small.model.hidden == 16 and small.model.num_heads == 4
    assert small.model.ffn_hidden == 24  # 48 * 16 / 32
    assert small.layout == plan.layout and small.micro_batch == 2 and small.recompute
    assert small.grad_accum_steps == 3 and small.options.global_batch == 1 * 2 * 2 * 3
    assert small.options.seq_len == 4 and small.prediction is None
    assert small.plan_id != plan.plan_id
    assert "scaled" in small.model.name


def test_longer_sequence_grows_learned_positions() -> None:
    plan = tiny_plan(Layout(1, 1, 1, 2))
    assert scale_plan(plan, Scale(seq_len=40)).model.max_positions == 40


def test_scaling_to_a_width_the_heads_do_not_divide_is_refused() -> None:
    with pytest.raises(AxoplanError, match="not divisible by num_heads 4"):
        scale_plan(tiny_plan(Layout(1, 1, 1, 2)), Scale(hidden=30))


def test_a_dividing_layout_is_runnable() -> None:
    check_runnable(tiny_plan(Layout(2, 2, 2, 1), ffn_kind="swiglu", num_kv_heads=2, ffn_hidden=48))


@pytest.mark.parametrize(("layout", "model", "message"), [
    (Layout(3, 1, 1, 1), {}, r"Gx=3 does not divide every layer dimension sharded over X \(hidden 32, FFN 128\)"),
    (Layout(1, 4, 1, 1), {"num_kv_heads": 2}, r"Gy=4 does not divide the 2 KV heads \(grouped-query attention"),
    (Layout(1, 4, 1, 1), {"ffn_kind": "swiglu", "ffn_hidden": 6},
     r"Gy=4 does not divide every layer dimension sharded over Y \(hidden 32, FFN 6\)"),
])
def test_a_layout_that_does_not_divide_the_model_is_refused(layout: Layout, model: dict, message: str) -> None:
    with pytest.raises(AxoplanError, match=message):
        check_runnable(tiny_plan(layout, **model))


def test_a_block_gz_does_not_divide_is_padded_natively_but_refused_for_axonn() -> None:
    plan = tiny_plan(Layout(1, 1, 5, 1))
    check_runnable(plan)
    with pytest.raises(AxoplanError, match=r"qkv weight block 3072 not divisible by Gz=5 \(AxoNN's"):
        check_runnable(plan, engine="axonn")


def test_sequences_longer_than_the_learned_positions_are_refused() -> None:
    with pytest.raises(AxoplanError, match="sequence length 32 exceeds the 16 learned positions"):
        check_runnable(tiny_plan(Layout(1, 1, 1, 1), seq_len=32))


def test_world_size_mismatch_names_both_sizes() -> None:
    with pytest.raises(AxoplanError, match=r"--local has 3 ranks but layout 2x1x2x1 needs 4"):
        check_world(tiny_plan(Layout(2, 1, 2, 1)), 3, "--local")


@pytest.mark.parametrize(("vocab", "sizes", "want"), [(61, (2, 2), 64), (64, (1, 1), 64), (50257, (8, 2), 50272),
                                                      (1, (2, 3), 6)])
def test_padded_vocab(vocab: int, sizes: tuple[int, int], want: int) -> None:
    assert padded_vocab(vocab, *sizes) == want


@given(st.integers(1, 200_000), st.integers(1, 16), st.integers(1, 16))
def test_padded_vocab_is_the_next_multiple(vocab: int, gx: int, gy: int) -> None:
    v = padded_vocab(vocab, gx, gy)
    assert v % (gx * gy) == 0 and vocab <= v < vocab + gx * gy


def test_fault_drill_parsing() -> None:
    s = ExecSettings(fault="2:kill@3")
    assert s.fault_at(2, 3) == "kill"
    assert s.fault_at(2, 2) is None and s.fault_at(1, 3) is None
    assert ExecSettings().fault_at(0, 0) is None
    with pytest.raises(AxoplanError, match="fault"):
        make_settings(fault="2:explode@1")


def test_torchrun_environment() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "h",
           "MASTER_PORT": "1"}
    got = dist_env(env)
    assert got is not None and (got.rank, got.world_size, got.local_rank, got.nodes, got.launcher) == \
        (5, 8, 1, 2, "torchrun")


def test_srun_environment() -> None:
    env = {"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_NNODES": "4",
           "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    got = dist_env(env)
    assert got is not None and (got.rank, got.world_size, got.local_rank, got.nodes, got.launcher) == \
        (9, 16, 1, 4, "srun")


def test_no_launcher_and_missing_master_address() -> None:
    assert dist_env({"HOME": "/root"}) is None
    with pytest.raises(AxoplanError, match="MASTER_ADDR and MASTER_PORT not set"):
        dist_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})


def test_gloo_messages_shortened_to_their_cause() -> None:
    exc = RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                       "[127.0.0.1]:27012. This is typically caused by a remote worker crashing. GLHF!\nmore")
    assert describe_exception(exc) == "RuntimeError: Connection closed by peer [127.0.0.1]:27012."
    assert describe_exception(ValueError()) == "ValueError"


def test_root_cause_prefers_a_dead_rank_then_an_own_failure() -> None:
    lost = "RuntimeError: Connection closed by peer"
    assert _root_cause({0: lost, 3: "died (killed by signal SIGKILL)"}, {0: lost}) == 3
    assert _root_cause({0: lost, 2: "RuntimeError: injected fault"}, {0: lost}) == 2
    assert _root_cause({1: "RuntimeError: Timed out waiting 3000ms", 0: lost}, {1: "x"}) == 1
    assert _is_collateral(lost) and not _is_collateral("ValueError: bad shape")


@dataclass
class _Result:
    iter_s: list[float]
    phase_s: dict[str, float] = field(default_factory=dict)
    device_name: str = "cpu"
    backend: str = "gloo"
    dtype: str = "float32"


def test_record_median_spread_and_other(tmp_path: Path) -> None:
    plan = tiny_plan(Layout(2, 1, 2, 1))
    result = _Result([0.5, 0.3, 0.4], {"gemm": 0.1, "all_gather_z": 0.05, "all_reduce_x": 0.0})
    record = build_record(plan, ExecSettings(iterations=3, warmup=1), result, "2.13.0", nodes=1)
    assert record.t_step_s == 0.4
    assert record.t_step_std_s == pytest.approx((2 * 0.1**2 / 3) ** 0.5)
    assert record.phase_s == pytest.approx({"gemm": 0.1, "all_gather_z": 0.05, "other": 0.25})
    assert record.plan_id == plan.plan_id and record.world_size == 4 and record.iterations == 3
    path = runs_path(tmp_path / "plan.json")
    assert path == tmp_path / "runs.jsonl"
    write_record(path, record.model_dump_json())
    write_record(path, record.model_dump_json())
    assert [r.t_step_s for r in read_runs(path)] == [0.4, 0.4]


def test_cli_start_up_and_executor_front_do_not_import_torch() -> None:
    code = ("import sys, axoplan, axoplan.cli, axoplan.commands.run, axoplan.commands.probe, axoplan.executor, "
            "axoplan.executor.spec, axoplan.executor.launch, axoplan.executor.record, axoplan.executor.fragment; "
            "assert 'torch' not in sys.modules, 'torch loaded'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(text)
    return path


def test_cli_refuses_a_corrupt_plan_without_a_record(tmp_path: Path) -> None:
    good = json.loads(tiny_plan(Layout(2, 1, 2, 1)).to_json())
    for text, message in (('{"schema_version": 1,', "not valid JSON at line 1"),
                          (json.dumps({**good, "world_size": 8}),
                           "field 'world_size' is 8, but layout 2x1x2x1 has 4 GPUs"),
                          (json.dumps({**good, "schema_version": 9}), "schema version 9 is not supported")):
        done = run_cli("run", str(_write(tmp_path, text)), "--local", "4")
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs.jsonl").exists()


def test_cli_refuses_a_world_size_mismatch(tmp_path: Path) -> None:
    plan = _write(tmp_path, tiny_plan(Layout(2, 1, 2, 1)).to_json())
    done = run_cli("run", str(plan), "--local", "3")
    assert done.returncode == 2
    assert "--local has 3 ranks but layout 2x1x2x1 needs 4" in done.stderr
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
    done = run_cli("run", str(plan), env=env)
    assert done.returncode == 2 and "torchrun has 2 ranks but layout 2x1x2x1 needs 4" in done.stderr
    assert not (tmp_path / "runs.jsonl").exists()


def test_cli_refuses_a_layout_that_does_not_divide_and_a_missing_launcher(tmp_path: Path) -> None:
    done = run_cli("run", str(_write(tmp_path, tiny_plan(Layout(3, 1, 1, 1)).to_json())), "--local", "3")
    assert done.returncode == 2
    assert "cannot run tiny: Gx=3 does not divide every layer dimension sharded over X" in done.stderr
    done = run_cli("run", str(_write(tmp_path, tiny_plan(Layout(1, 1, 1, 2)).to_json())))
    assert done.returncode == 2 and "not started by torchrun or srun" in done.stderr


def test_the_axonn_engine_refuses_concurrent_z_communicators() -> None:
    plan = tiny_plan(Layout(1, 1, 2, 1), oag=True, ors=True, concurrent_z=True)
    check_runnable(plan)  # the native engine has them
    with pytest.raises(AxoplanError, match="no second Z communicator"):
        check_runnable(plan, engine="axonn")
