"""The launcher block of a machine YAML: how a centre wants jobs submitted.

Only the schema lives here; :mod:`axoplan.export` renders it into job scripts, so a new
machine needs YAML, not code. Strings may hold ``{name}`` placeholders (``{nodes}``,
``{account}``, ...; see :data:`PLACEHOLDERS`) that the exporter fills per layout. Shell
syntax such as ``${VAR}`` or ``$((N*8))`` is left alone: a ``{`` right after ``$`` is
never a placeholder.

    launcher:
      scheduler: slurm
      header: ["-A {account}", "-N {nodes}", "-t {walltime}"]
      launch: "srun -N {nodes} -n {tasks}"
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Final, Literal

from pydantic import Field, model_validator

from axoplan.errors import closest_hint
from axoplan.inputs.queues import QueueLimit
from axoplan.inputs.schedulers import SchedulerName, scheduler
from axoplan.inputs.schema import Frozen
from axoplan.inputs.shell import (
    MODULE_WORD,
    MODULE_WORD_RULE,
    directive_word_problem,
    has_control,
    scan_shell,
    unsafe_text,
)
from axoplan.inputs.staging import StagingSpec

__all__ = ["LauncherSpec", "SITE_VALUES", "SCHEDULER_NAMES", "JOB_VALUES", "PLACEHOLDERS", "PLACEHOLDER", "fill",
           "placeholders_in", "placeholder_text", "placeholder_end", "TorchDevice", "EXECUTOR_DEVICES",
           "executor_drives"]

TorchDevice = Literal["cuda", "xpu", "cpu"]
"""PyTorch's device type of a machine's devices, as its PyTorch build reports them: 'cuda' for NVIDIA GPUs and
for AMD GPUs (ROCm builds of PyTorch expose HIP through the ``torch.cuda`` API, with RCCL as 'nccl'), 'xpu' for
Intel GPUs (``torch.xpu``, collectives through oneCCL as the 'xccl' backend), 'cpu' for CPU ranks."""

EXECUTOR_DEVICES: tuple[TorchDevice, ...] = ("cuda", "cpu")
"""The device types the executor drives: ``axoplan.executor.train.resolve_device`` picks ``torch.cuda`` when it
is available (collectives through NCCL, or RCCL on ROCm) and otherwise the CPU (gloo); it has no 'xpu' path, so
on Intel GPUs its ranks would run a CPU benchmark (``ExecSettings.device`` offers 'auto', 'cpu', 'cuda')."""


def executor_drives(device: str) -> bool:
    """Whether ``axoplan run`` can run a plan on devices of PyTorch type `device` ('cuda', 'xpu', 'cpu')."""
    return device in EXECUTOR_DEVICES


SITE_VALUES: Final = ("account", "partition", "qos", "python_env", "container", "queue", "net_plugin")
"""Values that belong to the user or the site: flags, AXOPLAN_* variables, YAML defaults, else ``<NAME>``."""

SCHEDULER_NAMES: Final = ("account", "partition", "qos", "queue")
"""The site values that are scheduler names: always directive words (axoplan.inputs.shell.DIRECTIVE_WORD)."""

JOB_VALUES: Final = ("nodes", "tasks", "tasks_per_node", "gpus_per_node", "walltime", "job_name", "plan_id")
"""Values computed per exported layout."""

PLACEHOLDERS: Final = SITE_VALUES + JOB_VALUES

PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def placeholders_in(text: str) -> list[str]:
    """Names of the ``{name}`` placeholders in `text`, in order."""
    return PLACEHOLDER.findall(text)


def placeholder_end(text: str, names: Collection[str] | None = None) -> Callable[[int], int | None]:
    """For :func:`axoplan.inputs.shell.scan_shell`: the end of the ``{name}`` placeholder that starts at i in
    `text` (one of `names`, when given), or None."""
    def end(i: int) -> int | None:
        m = PLACEHOLDER.match(text, i)
        return m.end() if m is not None and (names is None or m.group(1) in names) else None
    return end


def placeholder_text(name: str) -> str:
    """The visible stand-in for a site value nobody gave: ``account`` -> ``<ACCOUNT>``."""
    return f"<{name.upper()}>"


def fill(text: str, values: dict[str, str]) -> str:
    """Replace every ``{name}`` in `text` by ``values[name]``."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


class LauncherSpec(Frozen):
    """Scheduler header, modules, environment and launch line for one machine.

    The job script runs, in order: the header directives, ``set -eo pipefail`` (and, under PBS,
    the change to the folder the job was submitted from), the module paths and modules, the
    ``env`` exports, the ``setup`` lines, the AXOPLAN_* exports, and finally ``launch``
    followed by the payload. When ``task_env`` or ``task_setup`` is given, the
    payload runs inside ``bash -c '...; exec "$@"'`` so those lines run in every task
    (on every node), after the launcher has set the task's own variables.
    """

    scheduler: SchedulerName = Field(
        description="Batch system the script targets: 'slurm' (sbatch job.sh), 'flux' (flux batch job.sh), 'pbs' "
                    "(qsub job.sh) or 'torchrun' (bash job.sh on every node of a plain cluster); "
                    "axoplan.inputs.schedulers holds what each needs.")
    header: tuple[str, ...] = Field(
        (), description="Scheduler directives without their prefix ('#SBATCH ', '# flux: ', '#PBS '); not for "
                        "torchrun. A line whose site value is empty (see 'defaults') is left out.")
    defaults: dict[str, str] = Field(
        default_factory=dict, description="Default site values (partition, qos, ...) when neither a flag nor an "
                                          "AXOPLAN_* variable gives one; '' leaves out the header lines using it.")
    module_use: tuple[str, ...] = Field(
        (), description="Module paths to add ('module use PATH') before the modules are loaded, in order.")
    modules: tuple[str, ...] = Field((), description="Modules to load, in order.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Variables exported by the batch script, in order; each value is "
                                          "written inside double quotes, so $VAR and $(cmd) expand.")
    setup: tuple[str, ...] = Field((), description="Shell lines run once by the batch script, before the launch.")
    launch: str = Field(description="Launch command (srun or torchrun with its options); the payload follows it.")
    task_env: dict[str, str] = Field(
        default_factory=dict, description="Variables set inside every task, e.g. RANK: $SLURM_PROCID "
                                          "(expanded in the task; no single quotes).")
    task_setup: tuple[str, ...] = Field(
        (), description="Shell lines run inside every task before the payload, e.g. creating a node-local "
                        "cache folder (no single quotes).")
    queues: tuple[QueueLimit, ...] = Field(
        (), description="Queues/QOS in order of preference, each with max wall time, node range and source; "
                        "export picks one that fits and chains jobs when none holds the run "
                        "(axoplan.inputs.queues).")
    staging: StagingSpec | None = Field(
        None, description="Broadcast the Python environment to node-local storage above a node count.")
    torch_device: TorchDevice = Field(
        "cuda", description="PyTorch's device type in the job's environment: 'cuda' (NVIDIA, and AMD through ROCm), "
                            "'xpu' (Intel GPUs) or 'cpu'. Where `axoplan run` cannot drive it "
                            "(EXECUTOR_DEVICES), export requires --command.")

    @model_validator(mode="after")
    def _check(self) -> LauncherSpec:
        if self.header and scheduler(self.scheduler).directive is None:
            raise ValueError(f"'header' holds scheduler directives, but scheduler is {self.scheduler!r}")
        for key in self.defaults:
            if key not in SITE_VALUES:
                raise ValueError(f"defaults: {key!r} is not a site value{closest_hint(key, SITE_VALUES)}; "
                                 f"known: {', '.join(SITE_VALUES)}")
        for name in (*self.env, *self.task_env):
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        for text in self._texts():
            for name in placeholders_in(text):
                if name not in PLACEHOLDERS:
                    raise ValueError(f"unknown placeholder {{{name}}} in {text!r}{closest_hint(name, PLACEHOLDERS)}"
                                     f"; known: {', '.join(PLACEHOLDERS)}")
        for text in (*self.task_env.values(), *self.task_setup):
            if "'" in text:
                raise ValueError(f"task_env and task_setup run inside bash -c '...' and cannot hold a single "
                                 f"quote: {text!r}")
        self._check_site_values()
        return self

    def _check_site_values(self) -> None:
        """What the exporter writes as it is, checked once here (axoplan.inputs.shell): directive lines, module
        entries, the values written inside double quotes, and the site values this block gives."""
        for field, lines in (("header", self.header), ("staging.header", self.staging.header if self.staging else ())):
            for line in lines:
                if has_control(line):
                    raise ValueError(f"launcher.{field} line {line!r} holds a line break or other control character")
        for field, entries in (("module_use", self.module_use), ("modules", self.modules)):
            for entry in entries:
                if not MODULE_WORD.fullmatch(PLACEHOLDER.sub("x", entry)):
                    raise ValueError(f"launcher.{field} entry {entry!r} is not a module name or path "
                                     f"({MODULE_WORD_RULE}); fix its launcher block")
        for field, env in (("env", self.env), ("task_env", self.task_env)):
            for key, value in env.items():
                pieces, end = scan_shell(value, '"', placeholder_end(value))
                if end != '"' or (pieces and pieces[-1].text == "\\"):
                    raise ValueError(f"launcher.{field} {key} {value!r} is written inside double quotes "
                                     f"({key}=\"...\") and would not leave them closed, so the job script does not "
                                     f"parse as bash; fix its launcher block")
        for name, value in self.defaults.items():
            problem = self.site_value_problem(name, value)
            if problem is not None:
                raise ValueError(f"launcher.defaults gives {name} {value!r}, which {problem}; fix its launcher "
                                 f"block, or leave it out and pass --{name.replace('_', '-')}")

    def site_value_problem(self, name: str, value: str) -> str | None:
        """Why `value` cannot be site value `name` in this block's job scripts (None: it can).

        One rule, by where the value stands (axoplan.inputs.shell): an account, partition, QOS or queue, or
        any value in a directive line, is a directive word; a value in a module entry a module word; any
        other value shell-safe text (the script quotes it). '' leaves out the directive lines using it.
        """
        if value == "":
            return None
        directives = (*self.header, *(self.staging.header if self.staging else ()))
        line = next((d for d in directives if name in placeholders_in(d)), None)
        if line is not None or name in SCHEDULER_NAMES:
            problem = directive_word_problem(value)
            if problem is None:
                return None
            prefix = scheduler(self.scheduler).directive
            where = (f"the {prefix.strip()} line {line!r}" if line is not None and prefix is not None
                     else "a scheduler directive (an #SBATCH, #PBS or # flux: line)")
            return f"goes into {where}, where nothing can be quoted, so it {problem}"
        entry = next((e for e in (*self.module_use, *self.modules) if name in placeholders_in(e)), None)
        if entry is not None and not MODULE_WORD.fullmatch(value):
            return f"goes into the module entry {entry!r}, so it may hold only {MODULE_WORD_RULE}"
        reason = unsafe_text(value)
        return None if reason is None else f"holds {reason}, which would change the job script's meaning"

    def _texts(self) -> tuple[str, ...]:
        staging = (*self.staging.header, *self.staging.setup) if self.staging else ()
        return (*self.header, *self.module_use, *self.modules, *self.env.values(), *self.setup, *staging, self.launch,
                *self.task_env.values(), *self.task_setup)

    def placeholders(self) -> set[str]:
        """Every placeholder name the block uses."""
        return {name for text in self._texts() for name in placeholders_in(text)}
