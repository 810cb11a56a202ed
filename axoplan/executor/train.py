"""One rank's run: build the model, make synthetic tokens, train, time every phase.

An iteration is one optimizer step: ``grad_accum_steps`` micro-batches of
``micro_batch`` sequences (forward, backward, drain the overlapped reduce-scatters),
then the gradient reductions and the optimizer step::

    data   all-reduce of every 4D weight shard's gradient (one flat buffer, in the plan's
           grad_reduce_dtype)                            — ``docs/algorithm.md`` §4 "step"
    world  all-reduce of the whole parameters' gradients (norms, biases, positions), each
           counted once (copies on redundant members are zeroed), with the loss appended

Each rank's loss is its tokens' mean divided by ``Gdata·Gz·grad_accum_steps``, so the
reductions yield exactly the gradient of the global batch's mean loss.
"""

from __future__ import annotations

import functools
import os
import platform
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from axoplan.executor.comm import Comm
from axoplan.executor.groups import Groups, build_groups
from axoplan.executor.layers import megatron_model
from axoplan.executor.linear4d import Runtime
from axoplan.executor.model import GPT
from axoplan.executor.optim import Optimizer
from axoplan.executor.overlap import GradReducer, WeightGatherer
from axoplan.executor.reference import full_state, local_state, to_local
from axoplan.executor.spec import ExecSettings
from axoplan.executor.tags import tagged
from axoplan.executor.timing import PHASES, PhaseTimer
from axoplan.executor.tuned_matmul import GemmTuner
from axoplan.inputs.model import padded_vocab
from axoplan.records.plan import LaunchConfig

__all__ = ["RankResult", "run_rank", "build_model", "synthetic_tokens", "local_batches", "resolve_device",
           "resolve_dtype", "plan_vocab"]


@dataclass(frozen=True)
class RankResult:
    """What one rank measured; timing fields are already reduced over all ranks."""

    rank: int
    losses: list[float]  # global mean loss of every iteration, warm-up included
    iter_s: list[float]  # per timed iteration, the slowest rank's seconds
    phase_s: dict[str, float]  # seconds per iteration by phase, mean over ranks
    grads: dict[str, np.ndarray] | None  # this rank's gradients of the last iteration (before its step)
    device_name: str
    backend: str
    dtype: str
    trace: list[tuple[str, tuple]] | None = None  # the last iteration's ops (ExecSettings.trace)


def resolve_device(settings: ExecSettings, local_rank: int) -> torch.device:
    if settings.device == "cpu" or (settings.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))


def resolve_dtype(settings: ExecSettings, device: torch.device) -> torch.dtype:
    if settings.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, settings.dtype)


def plan_vocab(plan: LaunchConfig) -> int:
    lay = plan.layout
    return padded_vocab(plan.model.vocab, lay.gx, lay.gy)


def synthetic_tokens(plan: LaunchConfig, seed: int) -> torch.Tensor:
    """The global batch ``[B, S+1]`` of token ids, identical on every rank."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, plan.model.vocab, (plan.options.global_batch, plan.options.seq_len + 1), generator=gen)


def local_batches(plan: LaunchConfig, tokens: torch.Tensor, coords: dict[str, int],
                  device: torch.device, rank: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's (inputs, targets) per micro-batch: shard ``d·Gz + z`` of the batch (AxoNN's order), or on
    the hf path shard `rank` of the world's (Lightning's sampler over the whole world)."""
    lay = plan.layout
    if plan.options.hf_path:
        per_rank = plan.options.global_batch // lay.world_size
        start = rank * per_rank
    else:
        per_rank = plan.options.global_batch // (lay.gdata * lay.gz)
        start = (coords["data"] * lay.gz + coords["z"]) * per_rank
    mine = tokens[start:start + per_rank]
    mb = plan.micro_batch
    return [(mine[i * mb:(i + 1) * mb, :-1].to(device), mine[i * mb:(i + 1) * mb, 1:].to(device))
            for i in range(plan.grad_accum_steps)]


def run_rank(plan: LaunchConfig, settings: ExecSettings, local_rank: int = 0,
             collect_grads: bool = False) -> RankResult:
    """Run `plan` on this rank of an initialised default process group."""
    device = resolve_device(settings, local_rank)
    model, rt = build_model(plan, settings, device)
    groups, timer = rt.groups, rt.timer
    batches = local_batches(plan, synthetic_tokens(plan, settings.seed), groups.coords, device, groups.rank)
    optimizer = _optimizer(model, settings)
    if settings.resume:
        _resume(plan, settings, groups.rank, model, optimizer)
    holders = plan.world_size if plan.options.hf_path else plan.layout.gdata * plan.layout.gz
    scale = 1.0 / (holders * plan.grad_accum_steps)
    losses, times, phases, grads = [], [], [], None
    for it in range(settings.warmup + settings.iterations):
        last = it == settings.warmup + settings.iterations - 1
        _drill(settings.fault_at(groups.rank, it))
        timer.reset()
        timer.trace = [] if settings.trace and last else None
        t0 = time.perf_counter()
        loss, snapshot = _step(model, rt, batches, optimizer, scale, collect_grads and last)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - t0
        losses.append(loss)
        grads = snapshot if snapshot is not None else grads
        if it >= settings.warmup:
            times.append(elapsed)
            phases.append(timer.collect())
        if settings.progress and groups.rank == 0:
            _progress(it, settings, elapsed)
    trace, timer.trace = timer.trace, None
    if settings.save_checkpoint:
        from axoplan.executor import checkpoint

        checkpoint.save(_folder(settings), groups.rank, plan.plan_id, plan.world_size, model, optimizer, losses[-1])
    iter_s, phase_s = _reduce_timings(rt.comm, times, phases, device)
    dtype = str(resolve_dtype(settings, device)).removeprefix("torch.")
    return RankResult(groups.rank, losses, iter_s, phase_s, grads, device_name(device),
                      torch.distributed.get_backend(), dtype, trace)


def build_model(plan: LaunchConfig, settings: ExecSettings, device: torch.device) -> tuple[GPT, Runtime]:
    """This rank's groups (``Groups``, the MoE's Z split included), runtime and model on its path (the engine's
    cores on the Megatron path, the hf path's, or ``megatron_model``), initialised as `settings` say."""
    groups = build_groups(plan.layout.to_layout(), device.type, settings.timeout_s,
                          second_z=plan.options.concurrent_z,
                          expert_tp=plan.options.expert_tp if plan.model.moe is not None else None)
    rt = _runtime(plan, groups, PhaseTimer(device, settings.phase_timing))
    vocab = plan_vocab(plan)
    dtype = resolve_dtype(settings, device)
    params = {k: v.to(device, dtype) for k, v in _initial_params(plan, settings, groups, vocab).items()}
    if settings.engine == "axonn":
        return _axonn_model(plan, params, rt, vocab, device), rt
    if plan.options.hf_path:
        from axoplan.executor.hfmodel import hf_model

        return hf_model(plan.model, vocab, params, rt, plan.recompute), rt
    return megatron_model(plan.model, vocab, params, rt, plan.recompute), rt


def _folder(settings: ExecSettings) -> Path:
    if settings.checkpoint_dir is None:
        raise RuntimeError("a checkpoint needs ExecSettings.checkpoint_dir")
    return Path(settings.checkpoint_dir)


def _resume(plan: LaunchConfig, settings: ExecSettings, rank: int, model: GPT, optimizer: Optimizer) -> None:
    """Load this rank's state from the checkpoint (rank 0 says from which step)."""
    from axoplan.executor import checkpoint

    steps = checkpoint.load(_folder(settings), rank, plan.plan_id, model, optimizer)
    if settings.progress and rank == 0:
        sys.stderr.write(f"resumed from the checkpoint of step {steps} in {settings.checkpoint_dir}\n")
        sys.stderr.flush()


def _progress(it: int, settings: ExecSettings, elapsed_s: float) -> None:
    """One line per iteration on stderr (rank 0), so a long run is never silent."""
    total = settings.warmup + settings.iterations
    kind = "warm-up" if it < settings.warmup else "timed"
    sys.stderr.write(f"iteration {it + 1} of {total} ({kind}): {elapsed_s:.3f} s\n")
    sys.stderr.flush()


def _axonn_model(plan: LaunchConfig, params: dict[str, torch.Tensor], rt: Runtime, vocab: int,
                 device: torch.device) -> GPT:
    """The model with AxoNN's expert-mode block linears, and AxoNN's overlap contexts."""
    from axoplan.executor import axonn_backend as axb

    axb.init_axonn(plan, torch.cuda.device_count() if device.type == "cuda" else 1)
    factory = functools.partial(axb.axonn_linear_class(), cache=plan.cache_weights)
    model = megatron_model(plan.model, vocab, params, rt, plan.recompute, factory, reentrant=True)
    rt.micro_batch_context = axb.micro_batch_context(plan, model)
    rt.recompute_hook = axb.recompute_context(plan, model)
    return model


def _drill(kind: str | None) -> None:
    """Fail on purpose (ExecSettings.fault)."""
    if kind == "raise":
        raise RuntimeError("injected fault (--fault drill)")
    if kind == "exit":
        os._exit(3)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        time.sleep(1e6)


def _runtime(plan: LaunchConfig, groups: Groups, timer: PhaseTimer) -> Runtime:
    comm = Comm(groups, timer)
    o = plan.options
    return Runtime(groups, comm, timer, WeightGatherer(comm, o.overlap_all_gather, plan.cache_weights),
                   GradReducer(comm, o.overlap_reduce_scatter), o.overlap_all_reduce, o.overlap_forward_all_reduce,
                   o.grad_reduce_dtype, tuner=GemmTuner() if o.tuned_gemm else None)


def _initial_params(plan: LaunchConfig, settings: ExecSettings, groups: Groups, vocab: int) -> dict[str, torch.Tensor]:
    lay, coords = groups.layout, groups.coords
    whole = frozenset({"embed.weight"} if plan.options.hf_path else ())  # the hf path keeps its token table whole
    tp = plan.options.expert_tp
    if settings.init == "local":
        return local_state(plan.model, vocab, lay, coords, settings.seed, expert_tp=tp, whole=whole)
    full = full_state(plan.model, vocab, settings.seed)
    return {name: t if name in whole else to_local(name, t, lay, coords, tp) for name, t in full.items()}


def _optimizer(model: GPT, settings: ExecSettings) -> Optimizer:
    return Optimizer(model.parameters(), settings.optimizer, settings.lr)


def _step(model: GPT, rt: Runtime, batches: list[tuple[torch.Tensor, torch.Tensor]],
          optimizer: Optimizer, scale: float,
          snapshot: bool) -> tuple[float, dict[str, np.ndarray] | None]:
    rt.gatherer.start_iteration()
    optimizer.zero_grad()
    total = torch.zeros((), dtype=torch.float32, device=batches[0][0].device)
    for ids, targets in batches:
        rt.phase = "forward"
        with rt.micro_batch_context():
            loss = model(ids, targets) * scale
            loss.backward()
        rt.reducer.drain()
        rt.gatherer.end_micro_batch()
        total += loss.detach().float()
    global_loss = sync_gradients(model, rt, total)
    grads = _snapshot(model) if snapshot else None
    with rt.timer.span("optimizer"):
        optimizer.step()
    return global_loss, grads


def sync_gradients(model: GPT, rt: Runtime, loss_part: torch.Tensor) -> float:
    """All-reduce the gradients each parameter's tag sends to the step (``tags``): shards' over data (in the
    plan's grad_reduce_dtype), whole ones' (each repeated copy once) and the loss over the world. The loss of a
    rank counts where it owns its tokens along its path's `loss_redundant` axes (the X·Y members of Megatron's
    layout repeat theirs; on the hf path every rank's tokens are its own)."""
    reduce_dtype = torch.float32 if rt.grad_reduce_dtype == "fp32" else torch.bfloat16
    params = list(tagged(model))
    shards = [_grad(p) for r, p in params if r.step_axis == "data"]
    _all_reduce_flat(shards, rt.comm, "data", reduce_dtype)
    whole = [(r, _grad(p)) for r, p in params if r.step_axis == "world"]
    flat = torch.cat([g.reshape(-1).float() * float(rt.groups.is_owner(r.redundant)) for r, g in whole]
                     + [loss_part.reshape(1) * float(rt.groups.is_owner(model.path.loss_redundant))])
    rt.comm.all_reduce(flat, "world")
    _unflatten(flat[:-1], [g for _, g in whole])
    return float(flat[-1])


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad


def _all_reduce_flat(tensors: list[torch.Tensor], comm: Comm, axis: str, dtype: torch.dtype) -> None:
    if comm.size(axis) == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1).to(dtype) for t in tensors])
    comm.all_reduce(flat, axis)
    _unflatten(flat, tensors)


def _unflatten(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def _snapshot(model: GPT) -> dict[str, np.ndarray]:
    """Every parameter's gradient by its reference name (after the reductions)."""
    return {r.name: p.grad.detach().float().cpu().numpy().copy() for r, p in tagged(model)}  # type: ignore[union-attr]


def _reduce_timings(comm: Comm, times: list[float], phases: list[dict[str, float]],
                    device: torch.device) -> tuple[list[float], dict[str, float]]:
    """Per-iteration maximum over ranks, and phase means over iterations and ranks."""
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    comm.all_reduce(slowest, "world", op=torch.distributed.ReduceOp.MAX)
    mean = [statistics.fmean(p.get(k, 0.0) for p in phases) if phases else 0.0 for k in PHASES]
    per_phase = torch.tensor(mean, dtype=torch.float64, device=device)
    comm.all_reduce(per_phase, "world")
    per_phase /= comm.size("world")
    return slowest.cpu().tolist(), dict(zip(PHASES, per_phase.cpu().tolist(), strict=True))


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _cpu_model() or platform.processor() or platform.machine()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return ""
    return ""
