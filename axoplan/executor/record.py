"""The measured-run record of a finished run (``axoplan.records.runs.MeasuredRun``).

``t_step_s`` is the median over timed iterations of the slowest rank's time, and
``t_step_std_s`` their standard deviation. ``phase_s`` holds seconds per iteration,
averaged over ranks: ``gemm``, ``attention``, ``optimizer``, each collective kind and
axis (``all_gather_z``, ``reduce_scatter_z``, ``all_reduce_x`` / ``_y`` / ``_data`` /
``_world``, ``stats_all_reduce_x`` / ``_y``), ``wait`` (blocked on overlapped
collectives) and ``other`` (the rest: element-wise work, the embedding lookup, the loss,
Python). ``nodes`` is the node count of the run itself (1 for a local run).
"""

from __future__ import annotations

import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from axoplan.executor.spec import ExecSettings
from axoplan.records.plan import LaunchConfig
from axoplan.records.runs import MeasuredRun, append_run

__all__ = ["build_record", "write_record", "runs_path"]


class _Result(Protocol):
    @property
    def iter_s(self) -> list[float]: ...
    @property
    def phase_s(self) -> dict[str, float]: ...
    @property
    def device_name(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def dtype(self) -> str: ...


def build_record(plan: LaunchConfig, settings: ExecSettings, result: _Result, torch_version: str,
                 nodes: int) -> MeasuredRun:
    """The record of `plan` as run (its plan embedded, scaled model included)."""
    times = result.iter_s
    t_step = statistics.median(times)
    phases = {k: v for k, v in result.phase_s.items() if v > 0.0}
    phases["other"] = max(0.0, t_step - sum(phases.values()))
    return MeasuredRun(
        plan_id=plan.plan_id, plan=plan, measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        t_step_s=t_step, t_step_std_s=statistics.pstdev(times) if len(times) > 1 else 0.0,
        iterations=settings.iterations, warmup=settings.warmup, phase_s=phases, torch_version=torch_version,
        backend=result.backend, device_name=result.device_name, dtype=result.dtype,
        world_size=plan.world_size, nodes=nodes,
    )


def runs_path(plan_path: Path) -> Path:
    """Where records go by default: ``runs.jsonl`` beside the plan."""
    return plan_path.parent / "runs.jsonl"


def write_record(path: Path, record_json: str) -> MeasuredRun:
    """Validate a record and append it as one line (one write)."""
    record = MeasuredRun.model_validate_json(record_json)
    append_run(path, record)
    return record
