"""What each rank runs: join the process group, then run tasks until told to stop.

Preloaded by the local launcher's forkserver, so it imports torch at the top. A task
that raises is reported as one line (its rank and cause) and the process exits at once:
its peers are then blocked in, or about to enter, a collective with it, and the launcher
(or the collective timeout) stops them.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from axoplan.executor.ranks import DistEnv, describe_exception, resolve_task
from axoplan.executor.record import build_record
from axoplan.executor.spec import ExecSettings
from axoplan.executor.train import run_rank
from axoplan.records.plan import LaunchConfig

__all__ = ["serve", "init_group", "run_plan_task", "run_in_process", "train_task", "leave_group",
           "native_thread_names"]


def init_group(rank: int, world_size: int, timeout_s: float, device: str, init_method: str | None = None,
               local_rank: int | None = None) -> None:
    """Join the default process group (NCCL on CUDA, else gloo) with a timeout on every collective.

    ``torch.distributed.nn.functional`` is imported first: its functions take ``group=group.WORLD`` as a
    default argument, evaluated when the module is imported, so importing it once the default group exists
    keeps that group alive in the functions' defaults after ``destroy_process_group``, with its gloo threads
    (which abort the rank at interpreter exit, issue 12). torch's activation checkpoint imports it (through
    ``torch._dynamo``) on a recomputed run's first block; imported here, the defaults hold None.
    """
    importlib.import_module("torch.distributed.nn.functional")
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device((rank if local_rank is None else local_rank) % torch.cuda.device_count())
    else:
        torch.set_num_threads(1)  # N ranks share the cores; avoids the fork/OpenMP hang too
    dist.init_process_group("nccl" if use_cuda else "gloo", init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=timeout_s))


def serve(rank: int, world_size: int, port: int, timeout_s: float, device: str, tasks: Any, results: Any) -> None:
    """Process body of a local rank."""
    try:
        gpus = torch.cuda.device_count() if device != "cpu" else 0
        if (device == "cuda" or gpus) and world_size > gpus:
            raise RuntimeError(f"{world_size} local ranks need {world_size} GPUs, this machine has {gpus}; "
                               f"use --local {gpus} or --device cpu")
        init_group(rank, world_size, timeout_s, device, f"tcp://127.0.0.1:{port}")
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, then exit
        _report_and_exit(results, rank, f"could not join the process group: {describe_exception(exc)}")
    while (item := tasks.get()) is not None:
        name, args = item
        try:
            out = resolve_task(name)(*args)
        except BaseException as exc:  # noqa: BLE001
            if os.environ.get("AXOPLAN_TRACEBACK"):
                traceback.print_exc(file=sys.stderr)
            _report_and_exit(results, rank, describe_exception(exc))
        results.put((rank, "ok", out))
    leave_group()


def _report_and_exit(results: Any, rank: int, cause: str) -> None:
    results.put((rank, "error", cause))
    results.close()
    results.join_thread()
    os._exit(1)


def run_plan_task(plan_json: str, settings_json: str) -> str | None:
    """Run the plan; rank 0 returns the measured-run record as JSON, the others None."""
    plan = LaunchConfig.from_json(plan_json)
    settings = ExecSettings.model_validate_json(settings_json)
    result = run_rank(plan, settings, local_rank=dist.get_rank())
    if result.rank != 0:
        return None
    return build_record(plan, settings, result, torch.__version__, nodes=1).model_dump_json()


def run_in_process(plan_json: str, settings_json: str, env: DistEnv) -> str | None:
    """Run the plan as one rank of a torchrun / srun job; rank 0 returns the record as JSON."""
    plan = LaunchConfig.from_json(plan_json)
    settings = ExecSettings.model_validate_json(settings_json)
    init_group(env.rank, env.world_size, settings.timeout_s, settings.device, "env://", env.local_rank)
    result = run_rank(plan, settings, local_rank=env.local_rank)
    record = build_record(plan, settings, result, torch.__version__, nodes=env.nodes) if env.rank == 0 else None
    del result
    leave_group()
    return record.model_dump_json() if record is not None else None


def leave_group() -> None:
    """Destroy every process group while the interpreter is fully alive, joining gloo's threads.

    A run leaves its process groups in reference cycles (model, runtime, gatherer, groups), so
    ``destroy_process_group`` alone only unregisters them: each group's worker threads live on
    until the garbage collector or interpreter shutdown frees the group. A worker thread that
    drops the last reference to a finished collective's tensor must take the GIL to free it;
    during ``Py_FinalizeEx`` that ends the thread with a forced unwind, and C++ calls
    ``std::terminate`` ("terminate called without an active exception", SIGABRT), so torchrun
    kills rank 0 before it writes its record. Collecting the cycles first lets the destroy drop
    the last reference to every group, whose destructor joins its threads here.
    """
    if not dist.is_initialized():  # left already (a task may leave before the serve loop ends)
        return
    gc.collect()
    dist.destroy_process_group()
    gc.collect()


def native_thread_names() -> list[str]:
    """Names of this process's OS threads (Linux ``/proc``; empty elsewhere), for the shutdown tests."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    names = []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                names.append(fh.read().strip())
        except OSError:
            continue
    return sorted(names)


def train_task(plan_json: str, settings_json: str) -> tuple[list[float], dict[str, Any], dict[str, int]]:
    """Run the plan and return the losses, this rank's last gradients and its coordinates (tests)."""
    plan = LaunchConfig.from_json(plan_json)
    settings = ExecSettings.model_validate_json(settings_json)
    result = run_rank(plan, settings, local_rank=dist.get_rank(), collect_grads=True)
    return result.losses, result.grads or {}, plan.layout.to_layout().coords(result.rank)
