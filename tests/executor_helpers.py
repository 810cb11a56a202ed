"""Shared by the executor tests: tiny plans, the single-process reference run, and rank tasks.

Functions named ``*_task`` run on the ranks of a `LocalCluster` (by name,
``tests.executor_helpers:NAME``); the rest run in the pytest process.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from axoplan.executor.spec import ExecSettings
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.records.plan import LaunchConfig
from axoplan.space.layout import Layout

TINY = {"name": "tiny", "num_layers": 2, "hidden": 32, "num_heads": 4, "vocab": 61, "max_positions": 16}


def tiny_plan(layout: Layout, *, micro_batch: int = 1, accum: int = 1, recompute: bool = False, cache: bool = False,
              oar: bool = False, ors: bool = False, oag: bool = False, fwd: bool = False, seq_len: int = 8,
              grad_reduce_dtype: str = "fp32", concurrent_z: bool = False, tuned: bool = False,
              **model: Any) -> LaunchConfig:
    """A plan of a 2-layer, width-32 GPT for `layout` (the vocabulary 61 gets padded)."""
    spec = ModelSpec(**{**TINY, **model})
    batch = layout.gdata * layout.gz * micro_batch * accum
    options = RunOptions(global_batch=batch, seq_len=seq_len, micro_batches=(micro_batch,), overlap_all_reduce=oar,
                         overlap_reduce_scatter=ors, overlap_all_gather=oag, overlap_forward_all_reduce=fwd,
                         grad_reduce_dtype=grad_reduce_dtype, concurrent_z=concurrent_z, tuned_gemm=tuned)
    return LaunchConfig.build(machine="local-cpu", devices_per_node=8, model=spec, options=options, layout=layout,
                              micro_batch=micro_batch, recompute=recompute, cache_weights=cache)


def check_settings(optimizer: str = "sgd") -> ExecSettings:
    """Two iterations (the second replays the recorded all-gather order), exact init, float32."""
    return ExecSettings(iterations=1, warmup=1, init="full", optimizer=optimizer, lr=0.05, timeout_s=30,
                        device="cpu", dtype="float32")


def reference_run(plan: LaunchConfig, settings: ExecSettings) -> tuple[list[float], dict[str, np.ndarray]]:
    """The same model and steps in this process: the losses, and the last iteration's gradients."""
    import torch

    from axoplan.executor.optim import Optimizer
    from axoplan.executor.reference import full_state, reference_model
    from axoplan.executor.train import plan_vocab, synthetic_tokens

    vocab = plan_vocab(plan)
    model = reference_model(plan.model, vocab)
    model.load_state_dict(full_state(plan.model, vocab, settings.seed))
    opt = Optimizer(model.parameters(), settings.optimizer, settings.lr)
    tokens = synthetic_tokens(plan, settings.seed)
    losses, grads = [], {}
    for _ in range(settings.warmup + settings.iterations):
        opt.zero_grad()
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        losses.append(loss.item())
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
    with torch.no_grad():
        return losses, {n: g.numpy() for n, g in grads.items()}


def worst_gradient_error(plan: LaunchConfig, results: list[Any], ref_grads: dict[str, np.ndarray]) -> float:
    """Largest |rank gradient - its slice of the reference gradient| over all ranks and parameters.

    Fails if any rank misses a parameter of the reference model or has an extra one.
    """
    import torch

    from axoplan.executor.reference import to_local

    layout = plan.layout.to_layout()
    worst = 0.0
    for _, grads, coords in results:
        assert set(grads) == set(ref_grads), f"rank {coords}: {set(grads) ^ set(ref_grads)}"
        for name, got in grads.items():
            want = to_local(name, torch.from_numpy(ref_grads[name]), layout, coords).numpy()
            assert got.shape == want.shape, name
            worst = max(worst, float(np.abs(got - want).max()))
    return worst


def group_ranks_task(gx: int, gy: int, gz: int, gdata: int, native: bool,
                     order: tuple[str, ...] = ("x", "y", "z", "data")) -> dict[str, list[int]]:
    """This rank's group members along each axis, from the mesh's own lookup by dimension name."""
    import torch.distributed as dist

    from axoplan.executor.groups import build_groups

    groups = build_groups(Layout(gx, gy, gz, gdata, order=tuple(order)), "cpu", 30.0, native=native)
    assert groups.mesh.mesh_dim_names == tuple(reversed(order))
    return {axis: dist.get_process_group_ranks(groups.mesh.get_group(axis)) for axis in ("x", "y", "z", "data")}


def late_peer_task(native: bool, timeout_s: float) -> tuple[str, float]:
    """On a 2x1x1x2 mesh, rank 1 comes late to an X all-reduce; how each rank's call ends, and when."""
    import time

    import torch
    import torch.distributed as dist

    from axoplan.executor.groups import build_groups

    groups = build_groups(Layout(2, 1, 1, 2), "cpu", timeout_s, native=native)
    t0 = time.perf_counter()
    if groups.rank == 1:
        time.sleep(3 * timeout_s)  # then arrive late, so that without the timeout rank 0 ends "done", not hung
    try:
        dist.all_reduce(torch.ones(4), group=groups.group["x"])
    except RuntimeError as exc:
        return f"failed: {exc}"[:200], time.perf_counter() - t0
    return "done", time.perf_counter() - t0


def axonn_cpu_shim() -> None:
    """Let AxoNN 0.2.0 run on CPU with gloo in this process (``executor.md`` §1.3).

    AxoNN hard-codes CUDA and NCCL; these patches replace exactly those spots. They patch
    private internals of an unmaintained package, so they live in the tests only.
    """
    import torch
    import torch.distributed as dist
    from axonn.intra_layer import fully_connected, overlap_communication

    if getattr(dist.new_group, "_axoplan_shim", False):
        return
    original = dist.new_group

    def new_group(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("backend") == "nccl":
            kwargs["backend"] = "gloo"
        return original(*args, **kwargs)

    def clear_handles() -> None:  # NCCL relies on stream order; gloo needs every handle waited
        for handle in overlap_communication.handles:
            if handle is not None:
                handle.wait()
        overlap_communication.handles = []

    def all_gather(tensor_list: list[Any], tensor: Any, *args: Any, **kwargs: Any) -> Any:
        # AxoNN puts its Parameter in its own output slot; gloo in torch 2.4 writes every slot on
        # its own thread, where grad mode is on, and refuses the in-place write to a leaf
        return original_all_gather([t.detach() for t in tensor_list], tensor.detach(), *args, **kwargs)

    original_all_gather = dist.all_gather
    new_group._axoplan_shim = True  # type: ignore[attr-defined]
    dist.new_group = new_group
    dist.all_gather = all_gather
    torch.cuda.set_device = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    fully_connected.initialize_params.__wrapped__.__defaults__ = ("cpu",)
    overlap_communication.clear_handles = clear_handles


def axonn_groups_task(gx: int, gy: int, gz: int, gdata: int) -> dict[str, list[int]]:
    """``axonn.init`` from a plan of this layout (through the CPU shim); AxoNN's groups."""
    from axoplan.executor.axonn_backend import axonn_groups, init_axonn

    axonn_cpu_shim()
    init_axonn(tiny_plan(Layout(gx, gy, gz, gdata)), gpus_per_node=1)
    return axonn_groups()


def axonn_train_task(plan_json: str, settings_json: str) -> Any:
    """`train_task` with the AxoNN engine, through the CPU shim."""
    from axoplan.executor.worker import train_task

    axonn_cpu_shim()
    return train_task(plan_json, settings_json)


def second_z_task(gx: int, gy: int, gz: int, gdata: int) -> tuple[list[int], list[int], bool]:
    """With a second Z communicator: this rank's Z members, its scatter group's members, and
    whether the two are different communicators."""
    import torch.distributed as dist

    from axoplan.executor.groups import build_groups

    groups = build_groups(Layout(gx, gy, gz, gdata), "cpu", 30.0, second_z=True)
    z, scatter = groups.group["z"], groups.scatter_group("z")
    return dist.get_process_group_ranks(z), dist.get_process_group_ranks(scatter), z is not scatter


def run_then_leave_task(plan_json: str, settings_json: str) -> list[str]:
    """Run the plan, leave the process group, and name this rank's gloo threads still alive (a rank's last task)."""
    from axoplan.executor.worker import leave_group, native_thread_names, run_plan_task

    run_plan_task(plan_json, settings_json)
    leave_group()
    return [name for name in native_thread_names() if "gloo" in name]
