"""Starting ranks: N local processes (forkserver), or the ones torchrun / srun started.

**Local** (`LocalCluster`): a forkserver with torch, torch.distributed and DeviceMesh
preloaded forks the N ranks (about a second on 2 cores, against about
ten for ``torchrun``: ``executor.md`` §3). Plain ``fork`` from a process that has used
the OpenMP pool can deadlock, which forkserver avoids. Each rank joins one process group
(gloo on CPU, NCCL on GPU) with the run's timeout and then runs the tasks it is sent, so
tests can reuse one cluster for many layouts. When any rank fails or dies, every rank
is stopped and `RankFailure` names the rank and the cause.

**torchrun / srun**: `dist_env` reads RANK/WORLD_SIZE/LOCAL_RANK (torchrun) or
SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (srun; MASTER_ADDR and MASTER_PORT must be
exported by the job script), so the world size is checked before any collective.

This module imports no torch: the parent of a local run never loads it.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import queue
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

from axoplan.errors import AxoplanError

__all__ = ["LocalCluster", "RankFailure", "DistEnv", "dist_env", "PRELOAD", "describe_exception", "resolve_task",
           "oom_kills"]

PRELOAD = ["torch", "torch.distributed", "torch.distributed.device_mesh", "torch.utils.checkpoint",
           "axoplan.executor.worker"]
_GRACE_S = 1.0  # after the first failure, how long to collect the other ranks' reports


class RankFailure(Exception):
    """A rank raised, died, or timed out; the run was stopped on every rank."""

    def __init__(self, rank: int, cause: str, others: dict[int, str] | None = None) -> None:
        self.rank, self.cause, self.others = rank, cause, dict(others or {})
        tail = f" (then {_ranks(self.others)} stopped)" if self.others else ""
        super().__init__(f"rank {rank} {cause}{tail}")


def _ranks(others: dict[int, str]) -> str:
    ranks = sorted(others)
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(*args: Any) -> None:
    """Process target (imports torch in the child only)."""
    from axoplan.executor.worker import serve

    serve(*args)


class LocalCluster:
    """N ranks on this machine that stay up between tasks.

        with LocalCluster(4, timeout_s=30) as cluster:
            results = cluster.run("axoplan.executor.worker:run_plan_task", plan_json, settings_json)
    """

    def __init__(self, world_size: int, timeout_s: float = 60.0, device: str = "cpu") -> None:
        if world_size < 1:
            raise AxoplanError(f"--local must be at least 1, got {world_size}")
        self.world_size, self.timeout_s, self.device = world_size, timeout_s, device
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._results: Any = None
        self._oom_kills_at_start: int | None = None
        self.broken = False

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self._oom_kills_at_start = oom_kills()
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        port = _free_port()
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        self._procs = [ctx.Process(target=_serve, name=f"axoplan-rank{r}", daemon=True,
                                   args=(r, self.world_size, port, self.timeout_s, self.device, self._tasks[r],
                                         self._results))
                       for r in range(self.world_size)]
        for p in self._procs:
            p.start()

    def run(self, task: str, *args: Any) -> list[Any]:
        """Run `task` ('module:function') with `args` on every rank; the per-rank results."""
        if self.broken:
            raise RuntimeError("this cluster lost a rank earlier; start a new one")
        for q in self._tasks:
            q.put((task, args))
        results: dict[int, Any] = {}
        while len(results) < self.world_size:
            event = self._next_event()
            if event is None:
                continue
            rank, status, payload = event
            if status != "ok":
                self._fail({rank: payload})
            results[rank] = payload
        return [results[r] for r in range(self.world_size)]

    def _next_event(self) -> tuple[int, str, Any] | None:
        try:
            return self._results.get(timeout=0.05)
        except queue.Empty:
            dead = self._dead()
            if dead:
                self._fail(dead)
            return None

    def _dead(self) -> dict[int, str]:
        return {r: f"died ({self._death(p.exitcode)})" for r, p in enumerate(self._procs) if p.exitcode is not None}

    def _death(self, code: int | None) -> str:
        """How a rank ended; a SIGKILL while this cgroup's OOM-kill count rose is named as out of memory."""
        text = _exit_text(code)
        if code != -signal.SIGKILL:
            return text
        now, start = oom_kills(), self._oom_kills_at_start
        if now is None or start is None:
            return f"{text}; often the kernel's OOM killer: {_OOM_FIX}"
        return f"out of memory: the kernel's OOM killer sent SIGKILL; {_OOM_FIX}" if now > start else text

    def _fail(self, first: dict[int, str]) -> None:
        """Collect the other ranks' reports, stop every rank, raise for the root cause.

        Reports are collected for a second; while every report so far only says "lost a
        peer" or "timed out" and more than one rank is silent, for up to one more timeout,
        so that the one rank left silent is the one that hung.
        """
        reports = dict(first)
        start = time.monotonic()
        while len(reports) < self.world_size:
            patient = all(map(_is_collateral, reports.values())) and self.world_size - len(reports) > 1
            if time.monotonic() - start > (self.timeout_s + _GRACE_S if patient else _GRACE_S):
                break
            try:
                rank, status, payload = self._results.get(timeout=0.05)
                if status != "ok":
                    reports.setdefault(rank, payload)
            except queue.Empty:
                for rank, cause in self._dead().items():
                    reports.setdefault(rank, cause)
        for rank, cause in self._dead().items():
            if "signal" in cause or rank not in reports:
                reports[rank] = cause
        silent = [r for r in range(self.world_size) if r not in reports]
        self.close(kill=True)
        rank = _root_cause(reports, first)
        if _is_collateral(reports[rank]) and silent:
            rank = silent[0]
            timed_out = [c for c in reports.values() if "imed out" in c] or list(first.values())
            reports[rank] = f"did not respond (its peers timed out or lost it: {timed_out[0]})"
        cause = reports.pop(rank)
        verb = "" if cause.startswith(("died", "did not")) else "failed: "
        raise RankFailure(rank, verb + cause, reports)

    def close(self, kill: bool = False) -> None:
        """Stop the ranks: politely (finish, leave the group) unless `kill`."""
        if not self._procs:
            return
        if kill:
            self.broken = True
        else:
            for q in self._tasks:
                q.put(None)
            for p in self._procs:
                p.join(timeout=10)
        for p in self._procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        self._procs = []


_OOM_FIX = "scale the model down (--layers, --hidden, --seq-len) or run fewer --local ranks"
_OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")  # cgroup v2, v1


def oom_kills(paths: tuple[str, ...] = _OOM_COUNTERS) -> int | None:
    """How many processes the kernel's OOM killer has ended in this cgroup (None where it cannot be read)."""
    for path in paths:
        try:
            with open(path) as fh:
                for line in fh:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


_COLLATERAL = ("Connection closed by peer", "Connection reset", "Timed out", "timed out", "Read error")


def _is_collateral(cause: str) -> bool:
    """A failure caused by another rank (lost connection, timeout), not by this one."""
    return any(s in cause for s in _COLLATERAL)


def _root_cause(reports: dict[int, str], first: dict[int, str]) -> int:
    """A rank that died, else one whose failure is its own, else the first to report."""
    died = [r for r, c in reports.items() if c.startswith("died")]
    if died:
        return min(died)
    own = [r for r, c in reports.items() if not _is_collateral(c)]
    return min(own) if own else min(first)


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
