"""Starting ranks: N local processes (forkserver), or the ones torchrun / srun started.

**Local** (`LocalCluster`): a forkserver with torch, torch.distributed and DeviceMesh
preloaded forks the N ranks (about a second on 2 cores, against about
ten for ``torchrun``: ``executor.md`` §3). Plain ``fork`` from a process that has used
the OpenMP pool can deadlock, which forkserver avoids. Each rank joins one process group
(gloo on CPU, NCCL on GPU) with the run's timeout and then runs the tasks it is sent, so
tests can reuse one cluster for many layouts. When any rank fails or dies, every rank
is stopped and `RankFailure` names the rank and the cause. With ``stop_on_signals``
(``axoplan run --local``), SIGINT or SIGTERM to the parent is forwarded to every rank,
which gets a short grace and then SIGKILL, and `Interrupted` is raised: no rank outlives
an interrupted run.

**torchrun / srun**: `dist_env` reads RANK/WORLD_SIZE/LOCAL_RANK (torchrun) or
SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (srun; MASTER_ADDR and MASTER_PORT must be
exported by the job script), so the world size is checked before any collective.
`exit_on_signals` makes such a rank end at once on SIGINT / SIGTERM with one line, even
while it is blocked in a collective.

This module imports no torch: the parent of a local run never loads it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from axoplan.errors import AxoplanError

__all__ = ["LocalCluster", "RankFailure", "Interrupted", "PRELOAD", "oom_kills", "exit_on_signals", "STOP_SIGNALS"]

PRELOAD = ["torch", "torch.distributed", "torch.distributed.device_mesh", "torch.utils.checkpoint",
           "axoplan.executor.worker"]
_GRACE_S = 1.0  # after the first failure, how long to collect the other ranks' reports
_STOP_GRACE_S = 3.0  # after forwarding SIGINT / SIGTERM to the ranks, how long before SIGKILL
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RankFailure(Exception):
    """A rank raised, died, or timed out; the run was stopped on every rank."""

    def __init__(self, rank: int, cause: str, others: dict[int, str] | None = None) -> None:
        self.rank, self.cause, self.others = rank, cause, dict(others or {})
        tail = f" (then {_ranks(self.others)} stopped)" if self.others else ""
        super().__init__(f"rank {rank} {cause}{tail}")


class Interrupted(AxoplanError):
    """SIGINT or SIGTERM reached the parent of a local run; every rank was stopped."""

    def __init__(self, signum: int, ranks: int) -> None:
        self.signum, self.ranks = signum, ranks
        super().__init__(f"interrupted by {signal_name(signum)}; stopped all {ranks} local rank"
                         f"{'s' if ranks != 1 else ''}")


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _ranks(others: dict[int, str]) -> str:
    ranks = sorted(others)
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


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

    def __init__(self, world_size: int, timeout_s: float = 60.0, device: str = "cpu", *,
                 stop_on_signals: bool = False) -> None:
        if world_size < 1:
            raise AxoplanError(f"--local must be at least 1, got {world_size}")
        self.world_size, self.timeout_s, self.device = world_size, timeout_s, device
        self.stop_on_signals = stop_on_signals
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._results: Any = None
        self._oom_kills_at_start: int | None = None
        self._old_handlers: dict[int, Any] = {}
        self.interrupted: int | None = None  # the first SIGINT / SIGTERM received, while stop_on_signals
        self.broken = False

    def __enter__(self) -> LocalCluster:
        if self.stop_on_signals:
            self._install_handlers()
        try:
            self.start()
        except BaseException:
            self.close(kill=True)
            self._restore_handlers()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        try:
            if isinstance(exc, Interrupted):
                self.stop(exc.signum)
            elif isinstance(exc, KeyboardInterrupt):
                self.stop(signal.SIGINT)
            else:
                self.close()
        finally:
            self._restore_handlers()

    def interrupt(self, signum: int, frame: FrameType | None = None) -> None:
        """Signal handler: remember the first signal; the run loop stops every rank at its next tick."""
        if self.interrupted is None:
            self.interrupted = signum

    def _install_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:  # a background job's ignored SIGINT stays ignored
                self._old_handlers[sig] = signal.signal(sig, self.interrupt)

    def _restore_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers = {}

    def _check_interrupt(self) -> None:
        if self.interrupted is not None:
            raise Interrupted(self.interrupted, self.world_size)

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
        self._check_interrupt()
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
        self._check_interrupt()
        try:
            return self._results.get(timeout=0.05)
        except queue.Empty:
            self._check_interrupt()
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
            self._check_interrupt()
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
        procs = self._started()
        if not procs:
            self._procs = []
            return
        if kill:
            self.broken = True
        else:
            for q in self._tasks:
                q.put(None)
            deadline = time.monotonic() + 10
            alive = [p for p in procs if p.is_alive()]
            while alive and time.monotonic() < deadline:
                if self.interrupted is not None:  # a signal while the ranks finish: stop them now
                    self.stop(self.interrupted)
                    raise Interrupted(self.interrupted, self.world_size)
                alive[0].join(timeout=0.05)
                alive = [p for p in alive if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        self._procs = []

    def stop(self, signum: int) -> None:
        """Forward `signum` to every rank still running; SIGKILL those still there after a short grace."""
        self.broken = True
        procs = self._started()
        for p in procs:
            if p.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signum)
        deadline = time.monotonic() + _STOP_GRACE_S
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        self._procs = []

    def _started(self) -> list[Any]:
        return [p for p in self._procs if p.pid is not None]


def exit_on_signals(message: Callable[[str], str], signals: tuple[int, ...] = STOP_SIGNALS) -> None:
    """On one of `signals`, write ``message(signal name)`` as one line to stderr and exit 128 + the signal.

    For a rank started by torchrun or srun: its main thread may be blocked in a collective (or in
    the rendezvous) for up to the timeout, where a Python signal handler would not run. The C-level
    handler writes the signal number to a pipe (``signal.set_wakeup_fd``), which wakes a watcher
    thread that exits at once. Main thread only; elsewhere it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    signals = tuple(sig for sig in signals if signal.getsignal(sig) is not signal.SIG_IGN)
    if not signals:
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    for sig in signals:
        signal.signal(sig, _ignore)  # a Python-level handler, so the C handler notes the signal
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        while data := os.read(read_fd, 64):
            for signum in data:
                if signum in signals:
                    with contextlib.suppress(OSError):
                        sys.stderr.flush()
                        os.write(2, (message(signal_name(signum)) + "\n").encode())
                    os._exit(128 + signum)

    threading.Thread(target=watch, name="axoplan-signals", daemon=True).start()


def _ignore(signum: int, frame: FrameType | None) -> None:
    """The watcher thread of :func:`exit_on_signals` acts on the signal."""


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
