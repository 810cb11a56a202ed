"""The optional AxoNN backend: argument mapping, AxoNN's groups, and its expert-mode linears.

AxoNN 0.2.0 needs CUDA and NCCL; on CPU its hard-coded CUDA spots are patched by
`axonn_cpu_shim` inside the ranks of this module's own cluster (so no other test's ranks
see the patches). Few tests on purpose: the shim patches private code of an unmaintained
package (``executor.md`` §6).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from axoplan.executor.axonn_backend import axonn_init_kwargs
from axoplan.executor.launch import LocalCluster
from axoplan.space.layout import Layout
from tests.executor_helpers import check_settings, reference_run, tiny_plan, worst_gradient_error


def test_plan_maps_onto_axonn_init() -> None:
    plan = tiny_plan(Layout(2, 4, 8, 16))
    assert axonn_init_kwargs(plan) == {"G_inter": 1, "G_data": 16, "G_intra_r": 4, "G_intra_c": 2, "G_intra_d": 8,
                                       "gpus_per_node": 8}
    assert axonn_init_kwargs(plan, gpus_per_node=4)["gpus_per_node"] == 4


@pytest.fixture(scope="module")
def eight() -> Iterator[LocalCluster]:
    with LocalCluster(8, timeout_s=30) as cluster:
        yield cluster


@pytest.mark.distributed
@pytest.mark.parametrize("sizes", [(2, 2, 2, 1), (1, 2, 1, 4)])
def test_axonn_groups_are_the_planners(eight: LocalCluster, sizes: tuple[int, int, int, int]) -> None:
    layout = Layout(*sizes)
    got = eight.run("tests.executor_helpers:axonn_groups_task", *sizes)
    for rank, groups in enumerate(got):
        for axis, members in groups.items():
            assert rank in members
            assert members == next([int(r) for r in row] for row in layout.groups(axis) if rank in row)


@pytest.mark.distributed
def test_axonn_expert_linears_match_single_process(eight: LocalCluster) -> None:
    # OAG stays off: AxoNN prefetches with an async all-gather of a Parameter, which gloo rejects
    plan = tiny_plan(Layout(2, 2, 2, 1), oar=True, ors=True, recompute=True)
    settings = check_settings().model_copy(update={"engine": "axonn"})
    results = eight.run("tests.executor_helpers:axonn_train_task", plan.to_json(), settings.model_dump_json())
    ref_losses, ref_grads = reference_run(plan, settings)
    for losses, _, _ in results:
        np.testing.assert_allclose(losses, ref_losses, rtol=2e-6)
    assert worst_gradient_error(plan, results, ref_grads) < 2e-6
