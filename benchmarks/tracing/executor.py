"""The ledger tracer's step of axoplan's own executor (``benchmarks/derive_ledger.py --framework executor``;
``axoplan/executor``, ``docs/executor.md``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from .recorder import Recorder, saved_bytes


def trace_executor_step(family: str, dims: dict[str, int], precision: str) -> tuple[
        dict[str, list[dict[str, Any]]], dict[str, list[tuple[int, int]]], int]:
    """The same for axoplan's own executor (``axoplan/executor``) on one rank (gloo, CPU, bf16 as it runs on a GPU):
    one block, one micro-batch, the second step (its optimizer's master copies and moments exist)."""
    import torch.distributed as dist

    from axoplan.executor import train
    from axoplan.executor.layers import megatron_model
    from axoplan.executor.spec import ExecSettings
    from axoplan.executor.timing import PhaseTimer
    from axoplan.inputs.model import ModelSpec
    from axoplan.inputs.options import RunOptions
    from axoplan.records.plan import LaunchConfig
    from axoplan.space.layout import Layout

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)
    llama = family == "llama"
    spec = ModelSpec(name="trace", num_layers=1, hidden=dims["H"], num_heads=dims["NH"],
                     num_kv_heads=dims["KV"] if llama else None, ffn_hidden=dims["F"], vocab=dims["V"],
                     max_positions=dims["S"], ffn_kind="swiglu" if llama else "gelu", biases=not llama)
    options = RunOptions(global_batch=dims["B"], seq_len=dims["S"], micro_batches=(dims["B"],), recompute="off",
                         cache_weights="off", framework="axoplan-executor")
    plan = LaunchConfig.build(machine="dgx-h100", devices_per_node=8, model=spec, options=options,
                              layout=Layout(1, 1, 1, 1), micro_batch=dims["B"], recompute=False, cache_weights=False)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    settings = ExecSettings(device="cpu", dtype="bfloat16" if precision == "bf16" else "float32")
    device = torch.device("cpu")
    groups = train.build_groups(plan.layout.to_layout(), "cpu", 60.0)
    rt = train._runtime(plan, groups, PhaseTimer(device, True))
    vocab = train.plan_vocab(plan)
    torch.manual_seed(0)
    params = {k: v.to(device, dtype) for k, v in train._initial_params(plan, settings, groups, vocab).items()}
    model = megatron_model(plan.model, vocab, params, rt, plan.recompute)
    batches = train.local_batches(plan, train.synthetic_tokens(plan, 0), groups.coords, device, groups.rank)
    optimizer = train._optimizer(model, settings)
    train._step(model, rt, batches, optimizer, 1.0, False)
    rec = Recorder()
    saved: dict[str, list[tuple[int, int]]] = defaultdict(list)

    block = model.blocks[0]
    rec.follow(block)
    model.register_forward_hook(rec.setter("rest_backward"))  # the loss's scaling and backward follow the forward
    step = optimizer.step

    def traced_step() -> None:
        rec.scope = "step"
        step()

    optimizer.step = traced_step  # type: ignore[method-assign]
    with rec, saved_bytes(rec, saved):
        rec.scope = "rest_forward"
        train._step(model, rt, batches, optimizer, 1.0, False)
    return dict(rec.ops), dict(saved), sum(p.numel() for p in model.parameters())
