"""Each parameter tagged with what reduces it (``axoplan/executor/tags.py``), on the three paths of the one model
class, and the native MoE's Z split made and owned by ``Groups`` (issue 32 item 4).

The expected tags are read off the layouts by hand (``docs/algorithm.md`` §1, §4b, §4c): on the Megatron path a
plain layer's output block (and bias slice) is repeated over X, a transposed one's over Y, and the residual
stream (norms, positions, the router's input) over Y; on the hf path every rank's tokens are its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from axoplan.executor.launch import LocalCluster
from axoplan.executor.reference import param_shapes, reference_model
from axoplan.executor.tags import tagged
from axoplan.inputs.model import ModelSpec, MoESpec
from axoplan.inputs.options import RunOptions
from axoplan.records.plan import LaunchConfig
from axoplan.space.layout import Layout
from tests.executor_helpers import TINY, check_settings, tiny_plan

SHARD = (("z", "data"), ())
EXPERT = (("z_fsdp", "data"), ())


def test_the_reference_tags_every_parameter_with_its_own_name() -> None:
    spec = ModelSpec(**{**TINY, "tied_embeddings": False})
    model = reference_model(spec, 64)
    tags = [(r.name, r.over, r.redundant) for r, _ in tagged(model)]
    assert [n for n, _, _ in tags] == [n for n, _ in model.named_parameters()]
    assert {n for n, _, _ in tags} == set(param_shapes(spec, 64))
    assert {(over, red) for _, over, red in tags} == {(("world",), ())}  # one process: the world is itself


def test_a_parameter_made_outside_a_path_is_refused_by_name() -> None:
    stray = nn.Module()
    stray.w = nn.Parameter(torch.zeros(2))
    with pytest.raises(RuntimeError, match="parameter w has no reduction tag"):
        list(tagged(stray))


def tags_task(plan_json: str) -> tuple[dict[str, Any], dict[str, list[int]], dict[str, int]]:
    """This rank's model as ``train.build_model`` makes it: every tag by name, and its MoE groups' members."""
    import torch.distributed as dist

    from axoplan.executor.groups import Z_SPLIT
    from axoplan.executor.train import build_model

    plan = LaunchConfig.from_json(plan_json)
    model, rt = build_model(plan, check_settings(), torch.device("cpu"))
    tags = {r.name: (r.over, r.redundant) for r, _ in tagged(model)}
    made = [axis for axis in Z_SPLIT if axis in rt.groups.group]
    return (tags, {a: dist.get_process_group_ranks(rt.groups.group[a]) for a in made},
            {a: rt.groups.size(a) for a in made})


@pytest.fixture(scope="module")
def four() -> Iterator[LocalCluster]:
    with LocalCluster(4, timeout_s=30) as cluster:
        yield cluster


TASK = "tests.test_executor_tags:tags_task"


@pytest.mark.distributed
def test_megatron_path_tags_by_hand(four: LocalCluster) -> None:
    plan = tiny_plan(Layout(2, 2, 1, 1), num_layers=1)
    results = four.run(TASK, plan.to_json())
    tags, groups, _ = results[0]
    assert all(r[0] == tags for r in results)  # the same on every rank
    assert set(tags) == set(param_shapes(plan.model, 64))
    world = ("world",)
    assert tags == {
        "lm_head.weight": SHARD, "pos.weight": (world, ("y",)), "ln_f.weight": (world, ("y",)),
        "ln_f.bias": (world, ("y",)),
        "blocks.0.ln1.weight": (world, ("y",)), "blocks.0.ln1.bias": (world, ("y",)),
        "blocks.0.ln2.weight": (world, ("y",)), "blocks.0.ln2.bias": (world, ("y",)),
        "blocks.0.qkv.weight": SHARD, "blocks.0.qkv.bias": (world, ("x",)),  # plain: output repeated over X
        "blocks.0.attn_out.weight": SHARD, "blocks.0.attn_out.bias": (world, ("y",)),  # transposed: over Y
        "blocks.0.mlp_up.weight": SHARD, "blocks.0.mlp_up.bias": (world, ("x",)),
        "blocks.0.mlp_down.weight": SHARD, "blocks.0.mlp_down.bias": (world, ("y",)),
    }
    assert groups == {}  # a dense model splits no Z


@pytest.mark.distributed
def test_hf_path_tags_by_hand(four: LocalCluster) -> None:
    spec = ModelSpec(**{**TINY, "num_layers": 1, "tied_embeddings": False})
    options = RunOptions(global_batch=4, seq_len=8, micro_batches=(1,), axonn_path="hf")
    plan = LaunchConfig.build(machine="local-cpu", devices_per_node=8, model=spec, options=options,
                              layout=Layout(2, 2, 1, 1), micro_batch=1, recompute=False, cache_weights=False)
    tags, _, _ = four.run(TASK, plan.to_json())[3]
    linears = {f"blocks.0.{n}.weight" for n in ("qkv", "attn_out", "mlp_up", "mlp_down")} | {"lm_head.weight"}
    assert set(tags) == set(param_shapes(spec, 64))
    assert {n for n, t in tags.items() if t == SHARD} == linears
    assert all(tags[n] == (("world",), ()) for n in set(tags) - linears)  # the token table too: whole, own tokens


@pytest.mark.distributed
def test_moe_groups_are_groups_own_and_experts_reduce_over_fsdp(four: LocalCluster) -> None:
    """Z of 4 ranks (rank = z in the default order), expert_tp 2: tensor-parallel pairs {0,1}, {2,3} and FSDP
    pairs {0,2}, {1,3}."""
    spec = ModelSpec(name="tiny-moe", num_layers=1, hidden=32, num_heads=4, num_kv_heads=2, ffn_kind="swiglu",
                     vocab=61, max_positions=0, tied_embeddings=False, biases=False,
                     moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden=24))
    options = RunOptions(global_batch=4, seq_len=8, micro_batches=(1,), expert_tp=2)
    plan = LaunchConfig.build(machine="local-cpu", devices_per_node=8, model=spec, options=options,
                              layout=Layout(1, 1, 4, 1), micro_batch=1, recompute=False, cache_weights=False)
    results = four.run(TASK, plan.to_json())
    assert [r[1] for r in results] == [{"z_tp": [0, 1], "z_fsdp": [0, 2]}, {"z_tp": [0, 1], "z_fsdp": [1, 3]},
                                       {"z_tp": [2, 3], "z_fsdp": [0, 2]}, {"z_tp": [2, 3], "z_fsdp": [1, 3]}]
    assert all(r[2] == {"z_tp": 2, "z_fsdp": 2} for r in results)
    tags = results[0][0]
    assert tags["blocks.0.moe.experts_fc.weight"] == EXPERT and tags["blocks.0.moe.experts_proj.weight"] == EXPERT
    assert tags["blocks.0.moe.router.weight"] == (("world",), ("y",))
    assert tags["blocks.0.qkv.weight"] == SHARD
