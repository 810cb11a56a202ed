"""What each batch system a machine YAML may name needs of a job script: one definition per scheduler.

A centre's own conventions (modules, environment, launch line, queues) are data in the machine
YAML's ``launcher:`` block; what is the same at every site that runs a scheduler lives here:

=========  ==============  ===============  ==================================================  ============
scheduler  directive       submit           the next job of a chain, after this one succeeds    wall time
=========  ==============  ===============  ==================================================  ============
slurm      ``#SBATCH``     ``sbatch``       ``sbatch --dependency=afterok:$SLURM_JOB_ID``        ``HH:MM:SS``
flux       ``# flux:``     ``flux batch``   ``flux --parent batch --dependency=afterok:...``     minutes
pbs        ``#PBS``        ``qsub``         ``qsub -W depend=afterok:$PBS_JOBID``                ``HH:MM:SS``
torchrun   (none)          ``bash job.sh``  (none: a plain cluster has no queue)                 (none)
=========  ==============  ===============  ==================================================  ============

Sources: sbatch(1) (``--dependency``, ``--export``, ``--time`` formats); flux-batch(1), flux-environment(7)
and the job-dependency, env-rule and time-limit pages of flux-core's manual (a batch script is the
initial program of a subinstance, so the next job goes to the enclosing instance with ``flux
--parent``, and the batch job's id is ``FLUX_ENCLOSING_ID``; ``-t`` takes minutes or a Flux standard
duration; ``--env=NAME=VALUE`` sets one variable on top of the copied environment; a job runs in the
directory it was submitted from); qsub(1) of PBS Pro (``-W depend=afterok:``, ``-V`` exports the
submitting environment, ``-v`` adds variables; a PBS job starts in the home directory, so the script
first changes to ``$PBS_O_WORKDIR``, as ALCF's examples do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["SchedulerName", "Scheduler", "SCHEDULERS", "scheduler", "format_hms"]

SchedulerName = Literal["slurm", "flux", "pbs", "torchrun"]


def format_hms(seconds: int) -> str:
    """``HH:MM:SS`` (hours may exceed 24, which Slurm and PBS accept)."""
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


@dataclass(frozen=True, slots=True)
class Scheduler:
    """One batch system's fixed conventions; in `chain`, ``<SET>`` is the assignment that gives the next job its
    index (``AXOPLAN_JOB_INDEX=$(( ... ))``) and ``<SCRIPT>`` the job script's file name."""

    name: SchedulerName
    directive: str | None  # prefix of a header line ('#SBATCH '); None: no batch header (torchrun)
    submit: str  # how the script is submitted from its folder, the script's name following (torchrun: run on each node)
    chain: str | None  # the command that submits the next job of a chain; None: no chaining
    minutes_walltime: bool  # the wall time is written as minutes ('27m'), not HH:MM:SS
    start: str | None = None  # a line run first: where the job starts is not the folder it was submitted from

    def format_walltime(self, seconds: int) -> str:
        """The wall time as this scheduler's header takes it."""
        if self.minutes_walltime:
            return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"
        return format_hms(seconds)

    def directive_line(self, text: str) -> str:
        assert self.directive is not None  # the launcher schema refuses a header for a scheduler without one
        return f"{self.directive}{text}"


SCHEDULERS: Final[dict[str, Scheduler]] = {
    "slurm": Scheduler(
        "slurm", "#SBATCH ", "sbatch",
        'sbatch --dependency=afterok:"$SLURM_JOB_ID" --export=ALL,<SET> '
        '"${SLURM_SUBMIT_DIR:-$PWD}/<SCRIPT>"', minutes_walltime=False),
    "flux": Scheduler(
        "flux", "# flux: ", "flux batch",
        'flux --parent batch --dependency=afterok:"$FLUX_ENCLOSING_ID" --env=<SET> '
        '"$PWD/<SCRIPT>"', minutes_walltime=True),
    "pbs": Scheduler(
        "pbs", "#PBS ", "qsub",
        'qsub -W depend=afterok:"$PBS_JOBID" -V -v <SET> "$PBS_O_WORKDIR/<SCRIPT>"',
        minutes_walltime=False, start='cd "$PBS_O_WORKDIR"'),
    "torchrun": Scheduler("torchrun", None, "bash", None, minutes_walltime=False),
}
"""Every scheduler a machine YAML may name, by name."""


def scheduler(name: str) -> Scheduler:
    """The conventions of scheduler `name` (a name the launcher schema accepted)."""
    return SCHEDULERS[name]
