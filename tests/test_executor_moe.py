"""The executor's mixture-of-experts block, sharded as AxoNN's native DroplessMoEMLP shards it (issue 24),
on 4 and 8 gloo ranks against the single-process model: the tensor-parallel group of `expert_tp` ranks inside Z
gathers tokens and routing, the FSDP group across them holds the grouped expert weights. Losses of both
iterations and every gradient of the last (router, every expert's tensor-parallel slice and FSDP shard,
attention, norms, embeddings) must equal the reference's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from axoplan.executor.launch import LocalCluster
from axoplan.executor.reference import to_local
from axoplan.inputs.model import ModelSpec, MoESpec
from axoplan.inputs.options import RunOptions
from axoplan.records.plan import LaunchConfig
from axoplan.space.layout import Layout
from tests.executor_helpers import check_settings, reference_run

pytestmark = pytest.mark.distributed

TRAIN = "axoplan.executor.worker:train_task"
GRAD_ATOL = 2e-6


def moe_plan(layout: Layout, expert_tp: int, *, experts: int = 4, top_k: int = 2, accum: int = 1,
             recompute: bool = False, oag: bool = False, ors: bool = False) -> LaunchConfig:
    spec = ModelSpec(name="tiny-moe", num_layers=2, hidden=32, num_heads=4, num_kv_heads=2, ffn_kind="swiglu",
                     vocab=61, max_positions=0, tied_embeddings=False, biases=False,
                     moe=MoESpec(num_experts=experts, top_k=top_k, expert_ffn_hidden=24))
    batch = layout.gdata * layout.gz * accum
    options = RunOptions(global_batch=batch, seq_len=8, micro_batches=(1,), expert_tp=expert_tp,
                         overlap_all_gather=oag, overlap_reduce_scatter=ors)
    return LaunchConfig.build(machine="local-cpu", devices_per_node=8, model=spec, options=options, layout=layout,
                              micro_batch=1, recompute=recompute, cache_weights=False)


@pytest.fixture(scope="module")
def four() -> Iterator[LocalCluster]:
    with LocalCluster(4, timeout_s=30) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def eight() -> Iterator[LocalCluster]:
    with LocalCluster(8, timeout_s=30) as cluster:
        yield cluster


def _check(cluster: LocalCluster, plan: LaunchConfig) -> None:
    settings = check_settings()
    results = cluster.run(TRAIN, plan.to_json(), settings.model_dump_json())
    ref_losses, ref_grads = reference_run(plan, settings)
    for losses, _, _ in results:
        np.testing.assert_allclose(losses, ref_losses, rtol=2e-6)
    assert ref_losses[1] < ref_losses[0]
    layout, tp = plan.layout.to_layout(), plan.options.expert_tp
    worst = 0.0
    for _, grads, coords in results:
        assert set(grads) == set(ref_grads), set(grads) ^ set(ref_grads)
        for name, got in grads.items():
            want = to_local(name, torch.from_numpy(ref_grads[name]), layout, coords, tp).numpy()
            assert got.shape == want.shape, name
            worst = max(worst, float(np.abs(got - want).max()))
    assert worst < GRAD_ATOL
    assert any(np.abs(g).max() > 0 for _, grads, _ in results for n, g in grads.items() if "router" in n)


CASES_4 = {
    "z4-tp2-fsdp2": moe_plan(Layout(1, 1, 4, 1), 2),
    "z4-tp4-no-fsdp": moe_plan(Layout(1, 1, 4, 1), 4),
    "z4-tp1-pure-fsdp-accum": moe_plan(Layout(1, 1, 4, 1), 1, accum=2),
    "z2d2-tp2-recompute": moe_plan(Layout(1, 1, 2, 2), 2, recompute=True, oag=True, ors=True),
}


@pytest.mark.parametrize("case", CASES_4)
def test_native_moe_on_four_ranks_matches_single_process(four: LocalCluster, case: str) -> None:
    _check(four, CASES_4[case])


CASES_8 = {
    "z8-tp2-fsdp4": moe_plan(Layout(1, 1, 8, 1), 2),
    "z4d2-tp4-top1-8-experts": moe_plan(Layout(1, 1, 4, 2), 4, experts=8, top_k=1),
}


@pytest.mark.parametrize("case", CASES_8)
def test_native_moe_on_eight_ranks_matches_single_process(eight: LocalCluster, case: str) -> None:
    _check(eight, CASES_8[case])


def test_local_run_of_an_moe_plan_records_a_run(tmp_path: Any) -> None:
    """`axoplan run plan.json --local 4` on an exported MoE plan runs and appends its record."""
    from tests.conftest import run_cli

    plan = moe_plan(Layout(1, 1, 4, 1), 2)
    (tmp_path / "plan.json").write_text(plan.to_json())
    done = run_cli("run", str(tmp_path / "plan.json"), "--local", "4", "--iterations", "1", "--warmup", "1")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "runs.jsonl").read_text().count("\n") == 1
