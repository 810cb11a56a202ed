"""What one rank knows of where it runs: its place in a torchrun or srun job (`dist_env`), the
task functions it is sent by name (`resolve_task`), and how it reports an exception in one line
(`describe_exception`). Shared by the launcher (`launch`) and the ranks (`worker`), and imports
no torch.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

from axoplan.errors import AxoplanError

__all__ = ["DistEnv", "dist_env", "describe_exception", "resolve_task"]


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in a job started by torchrun or srun."""

    rank: int
    world_size: int
    local_rank: int
    nodes: int
    launcher: str


def dist_env(environ: dict[str, str] | None = None) -> DistEnv | None:
    """This process's rank from the launcher's environment, or None outside a launcher.

    torchrun's RANK / WORLD_SIZE / LOCAL_RANK win (job scripts under srun often export
    them from SLURM_*); plain srun's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID work too.
    """
    env = dict(os.environ if environ is None else environ)
    slurm = "SLURM_PROCID" in env and "SLURM_NTASKS" in env
    if "RANK" in env and "WORLD_SIZE" in env:
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    elif slurm:
        keys = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
    else:
        return None
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise AxoplanError(f"{' and '.join(missing)} not set; export them in the job script (MASTER_ADDR = the "
                           f"first node's hostname, MASTER_PORT = a free port such as 29500)")
    try:
        rank, world, local = (int(env.get(k, "0")) for k in keys)
        nodes = _node_count(env, world)
    except ValueError:
        raise AxoplanError(f"launcher environment has a non-integer rank: "
                           f"{', '.join(f'{k}={env.get(k)}' for k in keys)}") from None
    return DistEnv(rank, world, local, nodes, "srun" if slurm else "torchrun")


def _node_count(env: dict[str, str], world: int) -> int:
    if "SLURM_NNODES" in env:
        return int(env["SLURM_NNODES"])
    if "GROUP_WORLD_SIZE" in env:
        return int(env["GROUP_WORLD_SIZE"])
    if "LOCAL_WORLD_SIZE" in env:
        return max(1, world // int(env["LOCAL_WORLD_SIZE"]))
    return 1


def describe_exception(exc: BaseException) -> str:
    """One line: the exception type and the first line of its message (gloo's are long)."""
    first = (str(exc).strip().splitlines() or [""])[0]
    if "]" in first and first.startswith("["):
        first = first.split("]", 1)[1].strip()  # drop gloo's "[/path/to/file.cc:123]"
    first = first.split(" This is typically caused", 1)[0]  # gloo's advice after a lost peer
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text[:400]


def resolve_task(name: str) -> Any:
    """'package.module:function' -> the function."""
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)
