"""The executor on AxoNN's Hugging Face path (issue 24): 4 and 8 gloo ranks against the single-process model.

Every rank holds its own sequences; each linear moves them into the 4D layout and back with AxoNN's
non-expert transitions (``axoplan/executor/hfmodel.py``). The losses of both iterations and every gradient of
the last one (4D shards, norms, biases, the whole token table) must equal the reference's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from axoplan.executor.launch import LocalCluster
from axoplan.executor.reference import to_local
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.records.plan import LaunchConfig
from axoplan.space.layout import Layout
from tests.executor_helpers import check_settings, reference_run

pytestmark = pytest.mark.distributed

TRAIN = "axoplan.executor.worker:train_task"
GRAD_ATOL = 2e-6
TINY = {"name": "tiny-hf", "num_layers": 2, "hidden": 32, "num_heads": 4, "vocab": 61, "max_positions": 16,
        "tied_embeddings": False}


def hf_plan(layout: Layout, *, micro_batch: int = 1, accum: int = 1, recompute: bool = False, oar: bool = False,
            ors: bool = False, oag: bool = False, cache: bool = False, seq_len: int = 8, **model: Any) -> LaunchConfig:
    spec = ModelSpec(**{**TINY, **model})
    batch = layout.world_size * micro_batch * accum  # every rank its own sequences
    options = RunOptions(global_batch=batch, seq_len=seq_len, micro_batches=(micro_batch,), axonn_path="hf",
                         overlap_all_reduce=oar, overlap_reduce_scatter=ors, overlap_all_gather=oag)
    return LaunchConfig.build(machine="local-cpu", devices_per_node=8, model=spec, options=options, layout=layout,
                              micro_batch=micro_batch, recompute=recompute, cache_weights=cache)


@pytest.fixture(scope="module")
def four() -> Iterator[LocalCluster]:
    with LocalCluster(4, timeout_s=30) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def eight() -> Iterator[LocalCluster]:
    with LocalCluster(8, timeout_s=30) as cluster:
        yield cluster


def _worst(plan: LaunchConfig, results: list[Any], ref: dict[str, np.ndarray]) -> float:
    layout = plan.layout.to_layout()
    worst = 0.0
    for _, grads, coords in results:
        assert set(grads) == set(ref), set(grads) ^ set(ref)
        for name, got in grads.items():
            full = torch.from_numpy(ref[name])
            want = full.numpy() if name == "embed.weight" else to_local(name, full, layout, coords).numpy()
            assert got.shape == want.shape, name
            worst = max(worst, float(np.abs(got - want).max()))
    return worst


def _check(cluster: LocalCluster, plan: LaunchConfig) -> None:
    settings = check_settings()
    results = cluster.run(TRAIN, plan.to_json(), settings.model_dump_json())
    ref_losses, ref_grads = reference_run(plan, settings)
    for losses, _, _ in results:
        np.testing.assert_allclose(losses, ref_losses, rtol=2e-6)
    assert ref_losses[1] < ref_losses[0]
    assert _worst(plan, results, ref_grads) < GRAD_ATOL


CASES_4 = {
    "x2y2-transitions-both-ways": hf_plan(Layout(2, 2, 1, 1)),
    "x4-all-to-all-over-x-only": hf_plan(Layout(4, 1, 1, 1), oar=True),
    "y2z2-swiglu-gqa-no-bias-accum": hf_plan(Layout(1, 2, 2, 1), ffn_kind="swiglu", num_kv_heads=2, biases=False,
                                             max_positions=0, ffn_hidden=48, accum=2, ors=True, oag=True),
    "z2d2-no-transitions-recompute": hf_plan(Layout(1, 1, 2, 2), recompute=True, oag=True, ors=True),
    "x2d2-mb2": hf_plan(Layout(2, 1, 1, 2), micro_batch=2),
}


@pytest.mark.parametrize("case", CASES_4)
def test_hf_path_on_four_ranks_matches_single_process(four: LocalCluster, case: str) -> None:
    _check(four, CASES_4[case])


CASES_8 = {
    "x2y2z2-everything-on": hf_plan(Layout(2, 2, 2, 1), oar=True, ors=True, oag=True, recompute=True, cache=True),
    "x2y2d2-order-default": hf_plan(Layout(2, 2, 1, 2)),
    "x2y4-wide-y": hf_plan(Layout(2, 4, 1, 1), oar=True),
}


@pytest.mark.parametrize("case", CASES_8)
def test_hf_path_on_eight_ranks_matches_single_process(eight: LocalCluster, case: str) -> None:
    _check(eight, CASES_8[case])
