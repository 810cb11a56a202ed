"""Queue (partition/QOS) limits of a machine, and how a long run fits them.

A machine YAML's ``launcher.queues`` lists, in order of preference, each queue's maximum wall
time and node range, with its source. The exporter takes the first queue whose node range holds
the job and whose wall-time limit holds the whole run; when none holds the whole run it takes
the queue with the longest limit for that node count and splits the run into chained jobs
(each submits the next with the scheduler's own dependency, axoplan.inputs.schedulers), every job at most
that limit:

    iterations per job = floor((limit - margin) / step time)
    jobs               = ceil(iterations / iterations per job)
"""

from __future__ import annotations

import math

from pydantic import Field, PositiveInt, field_validator, model_validator

from axoplan.errors import AxoplanError
from axoplan.inputs.schema import Frozen
from axoplan.inputs.shell import directive_word_problem

__all__ = ["QueueLimit", "QueueChoice", "choose_queue", "walltime_s"]


class QueueLimit(Frozen):
    """One queue or QOS: where jobs of `min_nodes`..`max_nodes` nodes may run up to `max_walltime_minutes`."""

    name: str = Field(description="Label shown in the script and warnings.")
    partition: str | None = Field(None, description="Slurm partition (-p) this queue means; None keeps the default.")
    qos: str | None = Field(None, description="Slurm QOS (-q) this queue means; None keeps the default.")
    queue: str | None = Field(None, description="PBS or Flux queue (-q) this limit belongs to (a PBS routing queue "
                              "such as Aurora's prod, whose node ranges have their own limits); None keeps the "
                              "default.")
    max_walltime_minutes: PositiveInt
    min_nodes: PositiveInt = 1
    max_nodes: PositiveInt
    source: str = Field(description="Where the limit is documented, e.g. '[doc OLCF]'.")

    @field_validator("partition", "qos", "queue")
    @classmethod
    def _directive_word(cls, v: str | None) -> str | None:
        problem = directive_word_problem(v) if v is not None else None
        if problem is not None:
            raise ValueError(f"goes into a scheduler directive, where nothing can be quoted, so it {problem}")
        return v

    @model_validator(mode="after")
    def _range(self) -> QueueLimit:
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"queue {self.name!r}: min_nodes {self.min_nodes} > max_nodes {self.max_nodes}")
        return self

    def holds(self, nodes: int) -> bool:
        return self.min_nodes <= nodes <= self.max_nodes


class QueueChoice(Frozen):
    """The queue picked for a run and how the run is split over jobs."""

    queue: QueueLimit
    jobs: PositiveInt
    iterations_per_job: PositiveInt
    walltime_s: PositiveInt


def walltime_s(t_step_s: float, iterations: int, margin_minutes: float) -> int:
    """Predicted run time plus margin, rounded up to whole minutes, at least one minute (the one wall-time rule:
    queue choice, chained jobs and every script's time limit)."""
    if not math.isfinite(t_step_s) or t_step_s < 0:
        raise AxoplanError(f"predicted step time {t_step_s} s is not a usable number; cannot set a wall time")
    seconds = t_step_s * iterations + margin_minutes * 60
    minutes = math.ceil(seconds / 60)
    if minutes * 60 < seconds:  # seconds / 60 rounded down to a whole number
        minutes += 1
    return max(60, minutes * 60)


def choose_queue(queues: tuple[QueueLimit, ...], nodes: int, t_step_s: float, iterations: int,
                 margin_minutes: float) -> QueueChoice | None:
    """The first queue holding the whole run in one job, else chained jobs in the longest; None if no queue
    holds `nodes` nodes. Raises when even one iteration plus the margin overflows the longest limit."""
    fitting = [q for q in queues if q.holds(nodes)]
    if not fitting:
        return None
    whole = walltime_s(t_step_s, iterations, margin_minutes)
    for q in fitting:
        if whole <= q.max_walltime_minutes * 60:
            return QueueChoice(queue=q, jobs=1, iterations_per_job=iterations, walltime_s=whole)
    longest = max(fitting, key=lambda q: q.max_walltime_minutes)
    limit_s = longest.max_walltime_minutes * 60
    per_job = math.floor((limit_s - margin_minutes * 60) / t_step_s) if t_step_s > 0 else iterations
    while per_job > 0 and walltime_s(t_step_s, per_job, margin_minutes) > limit_s:
        per_job -= 1  # the whole-minute rounding of the wall time
    if per_job < 1:
        raise AxoplanError(f"one iteration ({t_step_s:.0f} s) plus the {margin_minutes:g} min margin does not fit "
                           f"queue {longest.name!r} ({longest.max_walltime_minutes} min); use more GPUs or a smaller "
                           f"--margin-minutes")
    per_job = min(per_job, iterations)
    jobs = math.ceil(iterations / per_job)
    return QueueChoice(queue=longest, jobs=jobs, iterations_per_job=per_job,
                       walltime_s=walltime_s(t_step_s, per_job, margin_minutes))
