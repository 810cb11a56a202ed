"""Job-level numbers and settings: nodes, tasks, wall time, and the user's site values.

Wall time (seconds) = predicted step time × iterations + margin, rounded up to whole
minutes (Slurm's granularity) and never under one minute; written ``HH:MM:SS`` (hours
may exceed 24, which Slurm accepts). ``export --time`` replaces it, in any of Slurm's
``--time`` formats (sbatch(1): "minutes", "minutes:seconds", "hours:minutes:seconds",
"days-hours", "days-hours:minutes", "days-hours:minutes:seconds").
"""

from __future__ import annotations

import re

from pydantic import Field, PositiveInt, ValidationInfo, field_validator, model_validator

from axoplan.errors import AxoplanError
from axoplan.inputs.launcher import SCHEDULER_NAMES, SITE_VALUES, LauncherSpec, placeholder_text
from axoplan.inputs.queues import walltime_s
from axoplan.inputs.schedulers import format_hms
from axoplan.inputs.schema import Frozen
from axoplan.inputs.shell import directive_word_problem, has_control, scan_shell, unsafe_text
from axoplan.space.layout import nodes_needed

__all__ = ["SiteSettings", "JobSettings", "node_counts", "walltime_s", "format_hms", "parse_walltime",
           "site_values", "check_site", "ENV_PREFIX", "command_problem"]

ENV_PREFIX = "AXOPLAN_"


class SiteSettings(Frozen):
    """Values that belong to the user or the centre; None = not given.

    An account, partition, QOS or queue must be a directive word (axoplan.inputs.shell.DIRECTIVE_WORD:
    letters, digits, ``_ . : + / @ -``, not starting with ``-``): it goes into a scheduler directive. A Python
    environment, container or network plugin path may hold spaces and the like (the script quotes it), but no
    quotes, ``$``, backquotes, backslashes or control characters. Where a machine's launcher block puts a
    value (a directive or module line) can ask more: :func:`check_site`, once per export.
    """

    account: str | None = Field(None, description="Project, account or bank to charge (Slurm and PBS -A, Flux -B).")
    partition: str | None = Field(None, description="Slurm partition.")
    qos: str | None = Field(None, description="Slurm quality of service.")
    queue: str | None = Field(None, description="PBS or Flux queue (-q).")
    python_env: str | None = Field(None, description="Python environment with PyTorch and axoplan (venv or conda).")
    container: str | None = Field(None, description="Container image or environment (Alps: EDF TOML).")
    net_plugin: str | None = Field(None, description="Folder holding the collective library's network plugin where "
                                                     "the centre does not load it (El Capitan: aws-ofi-rccl's "
                                                     "librccl-net.so, the build for your PyTorch's ROCm).")

    @field_validator(*SCHEDULER_NAMES)
    @classmethod
    def _scheduler_name(cls, v: str | None, info: ValidationInfo) -> str | None:
        problem = directive_word_problem(v) if v is not None else None
        if problem is not None:
            flag = f"--{info.field_name}"
            raise ValueError(f"{flag} (or {ENV_PREFIX}{str(info.field_name).upper()}) goes into a scheduler directive "
                             f"(an #SBATCH, #PBS or # flux: line), so it {problem}")
        return v

    @field_validator("python_env", "container", "net_plugin")
    @classmethod
    def _shell_safe(cls, v: str | None, info: ValidationInfo) -> str | None:
        reason = unsafe_text(v) if v is not None else None
        if reason is not None:
            flag = f"--{str(info.field_name).replace('_', '-')}"
            raise ValueError(f"{flag} (or {ENV_PREFIX}{str(info.field_name).upper()}) must not contain {reason}, "
                             f"which would change the job script's meaning")
        return v


class JobSettings(Frozen):
    """How one export turns launch configs into job scripts."""

    iterations: PositiveInt = Field(100, description="Iterations the job runs; sets the wall time.")
    tokens: PositiveInt | None = Field(None, description="Tokens to train (export --tokens): recorded as days, "
                                                         "node-hours and GPU-hours in each plan and script.")
    walltime_override_s: PositiveInt | None = Field(
        None, description="Wall time per job from --time, replacing the predicted (and queue-chosen) one.")
    margin_minutes: float = Field(10.0, ge=0, description="Minutes added to the predicted run time (start-up).")
    command: str | None = Field(None, description="The user's own training command instead of the executor.")
    benchmark: bool = Field(False, description="A long export (--tokens, or a chain of jobs) runs axoplan's "
                            "synthetic benchmark knowingly, with no --command (export --benchmark).")
    allow_partial_nodes: bool = Field(False, description="Allow a GPU count that does not fill whole nodes.")
    site: SiteSettings = Field(default_factory=SiteSettings)

    @field_validator("command")
    @classmethod
    def _one_command(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty")
        if v is not None:
            problem = command_problem(v)
            if problem is not None:
                raise ValueError(f"--command is one command and its arguments, launched in every task; {problem}. "
                                 f"Put anything more in a script and pass --command 'bash my-script.sh'")
        return v

    @model_validator(mode="after")
    def _one_payload(self) -> JobSettings:
        if self.benchmark and self.command is not None:
            raise ValueError("--benchmark runs axoplan's synthetic benchmark and --command your own; give one")
        return self


_OPERATORS = set(";&|<>()")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\}")


def command_problem(command: str) -> str | None:
    """Why `command` cannot be the payload of a job script as written (None: it can).

    The payload is written as given after the launcher (srun / torchrun), so its words, quotes,
    globs and ``$VAR`` mean what they mean in a shell; only what could end the command or run
    other code in the batch script is refused: a line break, an unclosed quote, a shell operator
    (``; & | < > ( )``) or ``#`` outside quotes, a command substitution (``$(...)``, backquotes)
    or ``$`` followed by anything but a variable name. The quoting is read by
    :func:`axoplan.inputs.shell.scan_shell`, as the exporter reads the launcher's lines.
    """
    if has_control(command):
        return "it holds a line break or other control character"
    pieces, end = scan_shell(command)
    for piece in pieces:
        problem = _piece_problem(command, piece.start, piece.text, piece.context)
        if problem is not None:
            return problem
    if end:
        return f"its {end} quote is never closed, so the job script does not parse as bash"
    return None


def _piece_problem(command: str, i: int, text: str, context: str) -> str | None:
    """What the piece `text` at `i` of `command`, read in quoting `context`, would do to the batch script."""
    c = text[0]
    if context == "'":
        return None
    if c == "\\":
        return "it ends with a backslash" if len(text) == 1 else None
    if c == "`":
        return "backquotes would run a command in the job script itself"
    if c == "$":
        if _NAME.match(command, i + 1) is None:
            return (f"'{command[i:i + 2]}' would run or expand code in the job script itself (only $NAME and "
                    f"${{NAME}} expand)")
        return None
    if context == '"':
        return None
    if c in _OPERATORS:
        return f"{c!r} outside quotes would act on the launcher, not on your command"
    if c == "#" and (i == 0 or command[i - 1] in " \t"):
        return "'#' outside quotes would make the rest a comment"
    return None


def check_site(launcher: LauncherSpec, site: SiteSettings, machine: str) -> None:
    """Refuse a site value the user gave that cannot stand where this machine's launcher block puts it
    (:meth:`LauncherSpec.site_value_problem`, the rule its own defaults were held to when it was read).
    Once per export; the scripts are then written without checking again."""
    for name in SITE_VALUES:
        value = getattr(site, name)
        problem = launcher.site_value_problem(name, value) if value is not None else None
        if problem is not None:
            raise AxoplanError(f"--{name.replace('_', '-')} (or {ENV_PREFIX}{name.upper()}) {value!r} {problem} "
                               f"(machine {machine!r}); give another value")


def node_counts(world_size: int, devices_per_node: int, allow_partial: bool, machine: str) -> tuple[int, int]:
    """(nodes, tasks per node) for one task per device; nodes = G / devices per node."""
    nodes, rest = divmod(world_size, devices_per_node)
    if rest == 0:
        return nodes, devices_per_node
    if not allow_partial:
        raise AxoplanError(f"{world_size} GPUs is not a whole number of {machine} nodes ({devices_per_node} per "
                           f"node); use a multiple of {devices_per_node}, or pass --allow-partial-nodes")
    nodes = nodes_needed(world_size, devices_per_node)
    if world_size % nodes:
        raise AxoplanError(f"{world_size} GPUs cannot be spread evenly over {nodes} {machine} nodes; use a "
                           f"multiple of {devices_per_node} GPUs")
    return nodes, world_size // nodes


_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_walltime(text: str) -> int:
    """Seconds of a Slurm ``--time`` value: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S (sbatch(1))."""
    m = _SLURM_TIME.match(text.strip())
    if m is None:
        raise AxoplanError(f"--time {text!r} is not a wall time; write HH:MM:SS, minutes, or D-HH:MM:SS")
    days, first, second, third = (int(g) if g is not None else 0 for g in m.groups())
    if second > 59 or third > 59 or (m.group(1) is not None and first > 23):
        raise AxoplanError(f"--time {text!r} is not a wall time: after the first field, hours are 0-23 and minutes "
                           "and seconds 0-59; write HH:MM:SS, minutes, or D-HH:MM:SS")
    if m.group(1) is not None:  # D-H[:M[:S]]
        seconds = days * 86_400 + first * 3600 + second * 60 + third
    elif m.group(4) is not None:  # H:M:S
        seconds = first * 3600 + second * 60 + third
    else:  # M or M:S
        seconds = first * 60 + second
    if seconds < 60:
        raise AxoplanError(f"--time {text!r} is under one minute; give at least 00:01:00")
    return seconds


"""``HH:MM:SS`` (hours may exceed 24): how wall times are shown and how Slurm and PBS take them."""


def site_values(launcher: LauncherSpec, site: SiteSettings) -> dict[str, str]:
    """Each site value: given > the YAML's default > a visible ``<NAME>`` placeholder ('' = leave out)."""
    out = {}
    for name in SITE_VALUES:
        given = getattr(site, name)
        out[name] = given if given is not None else launcher.defaults.get(name, placeholder_text(name))
    return out
