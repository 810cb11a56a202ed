"""Executor pieces that need torch but no process group: sharding, the reference model,
attention grouping, the optimizer, and the timers."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from axoplan.executor.model import activation, attention_core
from axoplan.executor.optim import Optimizer
from axoplan.executor.reference import (
    full_state,
    local_state,
    param_shapes,
    reference_model,
    to_local,
    weight_kind,
)
from axoplan.executor.timing import PhaseTimer
from axoplan.inputs.model import ModelSpec
from axoplan.space.layout import Layout

SPECS = [
    ModelSpec(num_layers=2, hidden=32, num_heads=4, vocab=64, max_positions=16),
    ModelSpec(num_layers=1, hidden=32, num_heads=4, num_kv_heads=2, ffn_kind="swiglu", ffn_hidden=48, biases=False,
              tied_embeddings=False, vocab=64),
]


def _all_coords(layout: Layout) -> list[dict[str, int]]:
    return [layout.coords(r) for r in range(layout.world_size)]


@pytest.mark.parametrize("sizes", [(2, 3, 2, 2), (1, 1, 4, 1), (4, 2, 1, 1)])
@pytest.mark.parametrize("kind", ["plain", "transposed"])
def test_shards_tile_the_weight_once_and_replicas_agree(sizes: tuple[int, int, int, int], kind: str) -> None:
    layout = Layout(*sizes)
    name = "blocks.0.qkv.weight" if kind == "plain" else "blocks.0.attn_out.weight"
    full = torch.arange(24 * 12, dtype=torch.float32).reshape(24, 12)
    pieces = {}
    for coords in _all_coords(layout):
        piece = to_local(name, full, layout, coords)
        key = (coords["x"], coords["y"], coords["z"])
        if key in pieces:  # another data-parallel replica: identical
            assert torch.equal(pieces[key], piece)
        pieces[key] = piece
    values = torch.cat(list(pieces.values()))
    assert values.numel() == full.numel() and torch.equal(values.sort().values, full.reshape(-1))
    # a plain layer's block at (x, y) holds rows of the y-th row block and columns of the x-th column block
    row_axis, col_axis = ("x", "y") if kind == "transposed" else ("y", "x")
    coords = {"x": layout.gx - 1, "y": layout.gy - 1, "z": 0, "data": 0}
    first = to_local(name, full, layout, coords)[0]
    rows, cols = 24 // layout.size(row_axis), 12 // layout.size(col_axis)
    assert first == full[coords[row_axis] * rows, coords[col_axis] * cols]


def test_a_block_gz_does_not_divide_is_zero_padded() -> None:
    layout = Layout(1, 1, 5, 1)  # 24 x 12 = 288 elements: chunks of 58, the last 56 + 2 zeros
    full = torch.arange(1, 289, dtype=torch.float32).reshape(24, 12)
    shards = [to_local("lm_head.weight", full, layout, layout.coords(r)) for r in range(5)]
    assert [s.numel() for s in shards] == [58] * 5
    assert torch.equal(torch.cat(shards), torch.cat([full.reshape(-1), torch.zeros(2)]))
    drawn = local_state(SPECS[0], 61, layout, layout.coords(4), seed=0)["lm_head.weight"]
    # 61 x 32 = 1952 = 5 x 391 - 3: the last chunk ends in 3 zeros
    assert drawn.numel() == 391 and torch.all(drawn[-3:] == 0) and torch.all(drawn[:-3] != 0)


def test_replicated_parameters_are_whole_everywhere() -> None:
    full = torch.randn(32)
    assert to_local("blocks.1.ln2.bias", full, Layout(2, 2, 2, 1), {"x": 1, "y": 1, "z": 1, "data": 0}) is full


def test_weight_kinds() -> None:
    got = {n: weight_kind(n) for n in ("blocks.3.qkv.weight", "blocks.3.mlp_up.weight", "lm_head.weight",
                                       "embed.weight", "blocks.3.attn_out.weight", "blocks.3.mlp_down.weight",
                                       "blocks.3.qkv.bias", "blocks.3.ln1.weight", "pos.weight", "ln_f.bias")}
    assert got == {"blocks.3.qkv.weight": "plain", "blocks.3.mlp_up.weight": "plain", "lm_head.weight": "plain",
                   "embed.weight": "plain", "blocks.3.attn_out.weight": "transposed",
                   "blocks.3.mlp_down.weight": "transposed", "blocks.3.qkv.bias": "replicated",
                   "blocks.3.ln1.weight": "replicated", "pos.weight": "replicated", "ln_f.bias": "replicated"}


@pytest.mark.parametrize("spec", SPECS)
def test_parameter_shapes_match_the_reference_model(spec: ModelSpec) -> None:
    model = reference_model(spec, 64)
    assert {n: tuple(p.shape) for n, p in model.named_parameters()} == param_shapes(spec, 64)
    model.load_state_dict(full_state(spec, 64, seed=1))  # strict: every name and shape


def test_local_draws_agree_across_data_replicas_only() -> None:
    spec, layout = SPECS[0], Layout(2, 1, 2, 2)
    a = local_state(spec, 64, layout, {"x": 1, "y": 0, "z": 1, "data": 0}, seed=3)
    b = local_state(spec, 64, layout, {"x": 1, "y": 0, "z": 1, "data": 1}, seed=3)
    c = local_state(spec, 64, layout, {"x": 1, "y": 0, "z": 0, "data": 1}, seed=3)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not torch.equal(a["blocks.0.qkv.weight"], c["blocks.0.qkv.weight"])
    assert a["blocks.0.qkv.weight"].numel() == 96 * 32 // 4
    assert torch.equal(a["pos.weight"], c["pos.weight"]) and torch.equal(a["ln_f.weight"], torch.ones(32))


def test_a_whole_parameter_is_drawn_whole_and_alike_on_every_rank() -> None:
    """The hf path keeps its token table whole (``train._initial_params``): drawn locally, it is the full
    ``[V, H]`` table, the same on ranks of different X, Z and data coordinates, and not a 4D shard."""
    spec, layout = SPECS[1], Layout(2, 1, 2, 2)  # untied, as the hf path's executor runs
    whole = frozenset({"embed.weight"})
    a = local_state(spec, 64, layout, {"x": 0, "y": 0, "z": 0, "data": 0}, seed=3, whole=whole)
    b = local_state(spec, 64, layout, {"x": 1, "y": 0, "z": 1, "data": 1}, seed=3, whole=whole)
    sharded = local_state(spec, 64, layout, {"x": 1, "y": 0, "z": 1, "data": 1}, seed=3)
    assert a["embed.weight"].shape == param_shapes(spec, 64)["embed.weight"]
    assert torch.equal(a["embed.weight"], b["embed.weight"])
    assert sharded["embed.weight"].numel() < a["embed.weight"].numel()


def test_zero_head_gives_uniform_loss() -> None:
    """All-zero LM head: every logit is 0, so the loss is log(vocabulary) exactly."""
    spec = SPECS[0]
    model = reference_model(spec, 64)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    ids = torch.randint(0, 64, (2, 8))
    assert model(ids, ids).item() == pytest.approx(math.log(64), rel=1e-6)


def test_grouped_attention_is_per_head_softmax_attention() -> None:
    batch, seq, kv, group, d = 2, 5, 2, 3, 4
    qkv = torch.randn(batch * seq, kv * (group + 2) * d)
    got = attention_core(qkv, batch, seq, kv, group, d).view(batch, seq, kv * group, d)
    t = qkv.view(batch, seq, kv, group + 2, d)
    mask = torch.ones(seq, seq).tril().bool()
    for g, j in itertools.product(range(kv), range(group)):
        q, k, v = t[:, :, g, j], t[:, :, g, group], t[:, :, g, group + 1]
        scores = (q @ k.transpose(1, 2) / math.sqrt(d)).masked_fill(~mask, float("-inf"))
        want = scores.softmax(-1) @ v
        torch.testing.assert_close(got[:, :, g * group + j], want, rtol=1e-5, atol=1e-6)


def test_swiglu_pairs_interleaved_gate_and_up() -> None:
    u = torch.tensor([[1.0, 2.0, -1.0, 3.0]])
    torch.testing.assert_close(activation(u, "swiglu"), torch.tensor([[F.silu(torch.tensor(1.0)) * 2,
                                                                       F.silu(torch.tensor(-1.0)) * 3]]))
    torch.testing.assert_close(activation(u, "gelu"), F.gelu(u))


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_optimizer_matches_torch_optim(kind: str) -> None:
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = Optimizer(ours, kind, lr=0.01)
    ref = torch.optim.Adam(theirs, lr=0.01) if kind == "adam" else torch.optim.SGD(theirs, lr=0.01)
    for _ in range(3):
        grads = [torch.randn_like(p) for p in ours]
        for p, q, g in zip(ours, theirs, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    for p, q in zip(ours, theirs, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_sgd_step_by_hand() -> None:
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    p.grad = torch.tensor([0.5, 0.25])
    Optimizer([p], "sgd", lr=0.1).step()
    torch.testing.assert_close(p.detach(), torch.tensor([0.95, -2.025]))


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_bf16_parameters_keep_updates_below_their_rounding_step(kind: str) -> None:
    """bf16 has a step of 2^-7 at 1.0; 100 updates of 1e-4 vanish there but add up in the fp32 master.

    SGD with g = 1: each update is lr = 1e-4; Adam with a constant gradient: m̂/sqrt(v̂) = 1,
    so also 1e-4 per step. After 100 steps the master is 0.99; bf16 rounds that to 0.98828125.
    """
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
    flat = torch.nn.Parameter(torch.ones(3))  # float32: its own master, updated in place
    opt = Optimizer([p, flat], kind, lr=1e-4)
    for _ in range(100):
        p.grad, flat.grad = torch.ones(3, dtype=torch.bfloat16), torch.ones(3)
        opt.step()
    assert p.dtype == torch.bfloat16 and torch.all(p.detach() == torch.tensor(0.98828125, dtype=torch.bfloat16))
    torch.testing.assert_close(flat.detach(), torch.full((3,), 0.99), rtol=0, atol=1e-5)  # fp32 sums: ~2e-6 off
    one = torch.ones((), dtype=torch.bfloat16)
    assert one - 1e-4 == one  # the premise: applied to the bf16 value itself, every update would vanish


def test_phase_timer_accumulates_and_resets() -> None:
    timer = PhaseTimer(torch.device("cpu"))
    for _ in range(2):
        with timer.span("gemm"):
            torch.randn(64, 64) @ torch.randn(64, 64)
    got = timer.collect()
    assert set(got) == {"gemm"} and got["gemm"] > 0
    timer.reset()
    assert timer.collect() == {}
    off = PhaseTimer(torch.device("cpu"), enabled=False)
    with off.span("gemm"):
        pass
    assert off.collect() == {}
