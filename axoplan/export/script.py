"""Render one launch config into a job script from the machine YAML's launcher block.

The script knows nothing about any particular centre: the header, modules, environment,
setup and launch line all come from ``launcher:`` in the machine YAML; the layout and
the prediction come from the launch config; the account and other site values come from
the user (or stay visible placeholders such as ``<ACCOUNT>``).

No value can change what the script means, and nothing is checked here: the machine YAML's values
were checked when it was read (axoplan.inputs.launcher), the user's when they were given
(:class:`axoplan.export.job.SiteSettings`, ``--command``) and against where this machine puts them once
per export (:func:`axoplan.export.job.check_site`), each by the one rule of axoplan.inputs.shell. A value
in a shell line is quoted for where it stands (:func:`axoplan.inputs.shell.quote_for`); comment lines show
a line break in a name as ``\n``. Each plan's job (nodes, the queue and its split into chained jobs, the
wall time, every placeholder's value) is worked out once, by :func:`plan_job`, and passed down.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from axoplan.cost.budget import describe_cost
from axoplan.errors import AxoplanError
from axoplan.export.job import ENV_PREFIX, JobSettings, format_hms, node_counts, site_values, walltime_s
from axoplan.inputs.axes import AXIS_DEFS, axonn_order
from axoplan.inputs.launcher import SITE_VALUES, LauncherSpec, fill, placeholder_end, placeholders_in
from axoplan.inputs.machine import Machine
from axoplan.inputs.queues import QueueChoice, choose_queue
from axoplan.inputs.schedulers import Scheduler, scheduler
from axoplan.inputs.shell import Unquotable, has_control, quote_for, scan_shell
from axoplan.inputs.staging import margin_minutes, staged
from axoplan.records.plan import LaunchConfig
from axoplan.search.fit import memory_fit

__all__ = ["render_job_script", "Job", "plan_job", "queue_choice", "time_warning", "payload_env",
           "check_bash_syntax", "submit_command", "benchmark_spend", "fill_shell", "one_line", "EXECUTOR_PAYLOAD",
           "SCRIPT_NAME", "PLAN_NAME"]

SCRIPT_NAME = "job.sh"
PLAN_NAME = "plan.json"
EXECUTOR_PAYLOAD = 'python -u -m axoplan run "$AXOPLAN_PLAN"'
_INDENT = "    "


def require_launcher(machine: Machine) -> LauncherSpec:
    if machine.launcher is None:
        raise AxoplanError(f"machine {machine.name!r} has no 'launcher:' block, so axoplan cannot write its job "
                           f"scripts; add one to its YAML (see docs/export.md)")
    return machine.launcher


@dataclass(frozen=True, slots=True)
class Job:
    """One plan's job, worked out once (:func:`plan_job`) and passed to everything that writes or warns.

    `choice` is the queue and the split into chained jobs (None: the machine lists no queues, or none holds
    `nodes`); `walltime_s` the wall time of each job (--time, else the chosen queue's, else the predicted);
    `values` every placeholder's value."""

    plan: LaunchConfig
    nodes: int
    margin_minutes: float
    choice: QueueChoice | None
    walltime_s: int
    values: dict[str, str]


def plan_job(plan: LaunchConfig, machine: Machine, settings: JobSettings, name: str) -> Job:
    """`plan`'s job: nodes, start-up margin, queue (chosen once, :func:`queue_choice`), wall time and every
    placeholder's value; `name` is the plan's folder (the job's name is ``axoplan-<name>``)."""
    launcher = require_launcher(machine)
    nodes, per_node = node_counts(plan.world_size, machine.devices_per_node, settings.allow_partial_nodes,
                                  machine.name)
    if plan.prediction is None:
        raise AxoplanError(f"launch config {plan.plan_id} has no prediction, so no wall time can be set; "
                           f"export it from a ranking")
    margin = job_margin(machine, nodes, settings)
    wall = walltime_s(plan.prediction.t_step_s, settings.iterations, margin)
    site = site_values(launcher, settings.site)
    choice = queue_choice(plan, machine, settings)
    if choice is not None:
        wall = choice.walltime_s
        for key in ("partition", "qos", "queue"):  # the queue's own, unless the user gave one
            if getattr(settings.site, key) is None and getattr(choice.queue, key) is not None:
                site[key] = getattr(choice.queue, key)
    if settings.walltime_override_s is not None:
        wall = settings.walltime_override_s
    values = {**site, "nodes": str(nodes), "tasks": str(plan.world_size),
              "tasks_per_node": str(per_node), "gpus_per_node": str(per_node),
              "walltime": scheduler(launcher.scheduler).format_walltime(wall),
              "job_name": f"axoplan-{name}", "plan_id": plan.plan_id}
    return Job(plan, nodes, margin, choice, wall, values)


def queue_choice(plan: LaunchConfig, machine: Machine, settings: JobSettings) -> QueueChoice | None:
    """The machine's queue for this job and its split into chained jobs (None: no queues, or none holds it).
    :func:`plan_job` calls it once per plan; everything else reads :attr:`Job.choice`."""
    launcher = require_launcher(machine)
    if not launcher.queues or plan.prediction is None:
        return None
    nodes, _ = node_counts(plan.world_size, machine.devices_per_node, settings.allow_partial_nodes, machine.name)
    return choose_queue(launcher.queues, nodes, plan.prediction.t_step_s, settings.iterations,
                        job_margin(machine, nodes, settings))


def time_warning(job: Job, settings: JobSettings) -> str | None:
    """One line when --time asks for more than the chosen queue allows, or less than the job's predicted need."""
    asked, plan, choice = settings.walltime_override_s, job.plan, job.choice
    if asked is None or plan.prediction is None:
        return None
    if choice is not None and asked > choice.queue.max_walltime_minutes * 60:
        return (f"--time {format_hms(asked)} exceeds queue {choice.queue.name}'s limit of "
                f"{format_hms(choice.queue.max_walltime_minutes * 60)} {choice.queue.source}; the scheduler "
                f"will refuse or cap the job")
    needed = choice.walltime_s if choice is not None else walltime_s(
        plan.prediction.t_step_s, settings.iterations, job.margin_minutes)
    if asked < needed:
        return (f"--time {format_hms(asked)} is under the predicted {format_hms(needed)} a job needs "
                f"({_job_iterations(job, settings)} iterations + margin); it may be stopped before it ends")
    return None


def benchmark_spend(job: Job, settings: JobSettings) -> str | None:
    """What a long export of the built-in benchmark spends, as a phrase; None for a short test or a --command.

    Long: --tokens, or a run the queues split into chained jobs. Node-hours are the run's
    (nodes x iterations x predicted s/iter; with --tokens, the plan's training cost)."""
    plan = job.plan
    if settings.command is not None or plan.prediction is None:
        return None
    jobs = job.choice.jobs if job.choice is not None else 1
    if settings.tokens is None and jobs == 1:
        return None
    node_hours = job.nodes * settings.iterations * plan.prediction.t_step_s / 3600
    return (f"{settings.iterations:,} iterations of axoplan's synthetic benchmark, not training: "
            f"{jobs} job{'s' if jobs > 1 else ''} on {job.nodes:,} node{'s' if job.nodes > 1 else ''}, about "
            f"{node_hours:,.0f} node-hours")


def job_margin(machine: Machine, nodes: int, settings: JobSettings) -> float:
    """Start-up margin in minutes: --margin-minutes, plus the staging term when the job is staged."""
    return margin_minutes(require_launcher(machine).staging, nodes, settings.margin_minutes)


def payload_env(plan: LaunchConfig, settings: JobSettings) -> dict[str, str]:
    """The AXOPLAN_* variables every script exports for its payload (names documented in docs/export.md).

    The AxoNN ones are ``AXOPLAN_`` + the upper-cased ``axonn.init`` keyword
    (``AXOPLAN_G_INTRA_C`` = Gx, ...), taken from the launch config's ``axonn_init``;
    ``AXOPLAN_TP_ORDER`` is AxoNN's ``tensor_parallel_order`` (``c,r,d`` = X innermost, the default).
    """
    env = {f"{ENV_PREFIX}PLAN_ID": plan.plan_id}
    env.update({ENV_PREFIX + key.upper(): str(value) for key, value in plan.axonn_init.items()})
    env[f"{ENV_PREFIX}TP_ORDER"] = ",".join(axonn_order(plan.layout.to_layout().order))
    env.update({
        f"{ENV_PREFIX}MICRO_BATCH": str(plan.micro_batch),
        f"{ENV_PREFIX}GRAD_ACCUM_STEPS": str(plan.grad_accum_steps),
        f"{ENV_PREFIX}GLOBAL_BATCH": str(plan.options.global_batch),
        f"{ENV_PREFIX}SEQ_LEN": str(plan.options.seq_len),
        f"{ENV_PREFIX}RECOMPUTE": str(int(plan.recompute)),
        f"{ENV_PREFIX}CACHE_WEIGHTS": str(int(plan.cache_weights)),
        f"{ENV_PREFIX}ITERATIONS": str(settings.iterations),
    })
    return env


def render_job_script(plan: LaunchConfig, machine: Machine, settings: JobSettings, name: str, rank: int,
                      job: Job | None = None) -> str:
    """The job script for `plan`, checked with ``bash -n``; `name` is its folder, `rank` its place in the ranking,
    `job` its :func:`plan_job` where the caller has it already (else it is worked out here)."""
    launcher = require_launcher(machine)
    job = plan_job(plan, machine, settings, name) if job is None else job
    values = job.values
    conventions = scheduler(launcher.scheduler)
    parts = [
        ["#!/bin/bash", *map(one_line, _comments(job, machine, settings, rank)),
         *_header(launcher, values), *_staging_header(launcher, values)],
        ["set -eo pipefail", *([conventions.start] if conventions.start else [])],
        _modules(launcher, values),
        _exports(launcher.env, values, machine.name),
        _setup(launcher, values, machine.name),
        _staging_setup(launcher, values, machine.name),
        _plan_block(plan, settings),
        [one_line(line) for line in _chain_block(job.choice, settings, conventions)],
        _launch(launcher, values, EXECUTOR_PAYLOAD if settings.command is None else settings.command, machine.name),
    ]
    text = "\n\n".join("\n".join(p) for p in parts if p) + "\n"
    check_bash_syntax(text, f"the job script for machine {machine.name!r}")
    return text


def _comments(job: Job, machine: Machine, settings: JobSettings, rank: int) -> list[str]:
    plan, values = job.plan, job.values
    lay, pred = plan.layout, plan.prediction
    assert pred is not None  # plan_job refused a plan without one
    init = " ".join(f"{k}={v}" for k, v in plan.axonn_init.items())
    opts = ["recompute" if plan.recompute else "no recompute"]
    if plan.cache_weights and lay.gz > 1:
        opts.append("cached weights")
    predicted = (f"# predicted {pred.t_step_s:.3f} s/iteration x {_job_iterations(job, settings)} "
                 f"iterations + {job.margin_minutes:g} min margin")
    lines = [
        f"# axoplan export, rank {rank}: {plan.model.name} on {plan.world_size} x {machine.device.name} "
        f"({machine.name}), {_count(values['nodes'], 'node')}",
        f"# layout {' '.join(f'{a.label}={getattr(lay, a.field)}' for a in AXIS_DEFS)}, tensor-parallel order "
        f"{lay.tp_order}; axonn.init({init})",
        f"# micro-batch {plan.micro_batch}, {', '.join(opts)}, {plan.grad_accum_steps} micro-batch"
        f"{'es' if plan.grad_accum_steps > 1 else ''} per step; "
        f"global batch {plan.options.global_batch} x {plan.options.seq_len} tokens",
        f"{predicted} = wall time {values['walltime']}" if settings.walltime_override_s is None
        else f"{predicted}; wall time {values['walltime']} from --time",
        f"# memory per GPU: {memory_fit(pred.mem_total_bytes, machine, plan.model, plan.options).describe()}",
        *([f"# {describe_cost(plan.training)}"] if plan.training is not None else []),
        *([f"# BENCHMARK, NOT TRAINING: this job runs {spend}"]
          if (spend := benchmark_spend(job, settings)) is not None else []),
        f"# plan {plan.plan_id}; its launch config is {PLAN_NAME}, next to this script",
    ]
    launcher = require_launcher(machine)
    if scheduler(launcher.scheduler).directive is not None:
        lines.append(f"# submit from this folder:  {submit_command(launcher)}")
    else:
        where = "on the node" if values["nodes"] == "1" else f"on each of the {values['nodes']} nodes at once"
        lines += [f"# run from this folder {where}:",
                  f"#   {submit_command(launcher)}"]
    return lines


_REQUIRED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?")  # ${NAME:?message}: the script stops unless NAME is set
_LABELS = {"MASTER_ADDR": "<first node>", "NODE_RANK": "<this node's place>"}


def submit_command(launcher: LauncherSpec) -> str:
    """How the script is started from its folder: ``sbatch job.sh``, or, with no batch system, ``bash job.sh``
    after the variables its environment requires (``${NAME:?...}``), e.g. ``MASTER_ADDR=<first node> bash job.sh``."""
    conventions = scheduler(launcher.scheduler)
    if conventions.directive is not None:
        return f"{conventions.submit} {SCRIPT_NAME}"
    needed = [m.group(1) for value in launcher.env.values() for m in _REQUIRED.finditer(value)]
    given = " ".join(f"{name}={_LABELS.get(name, f'<{name.lower()}>')}" for name in dict.fromkeys(needed))
    return f"{given} {conventions.submit} {SCRIPT_NAME}".lstrip()


def _count(number: str | int, noun: str) -> str:
    """'1 node', '2 nodes'."""
    return f"{number} {noun}{'' if str(number) == '1' else 's'}"


def _job_iterations(job: Job, settings: JobSettings) -> int:
    """Iterations of one job: all of them, or at most a chained job's share."""
    return settings.iterations if job.choice is None else job.choice.iterations_per_job


def _exports(env: dict[str, str], values: dict[str, str], machine: str) -> list[str]:
    """``export K="V"``; with a command substitution, assign first so a failing command stops the script."""
    lines = []
    for key, value in env.items():
        text = fill_shell(value, values, f"machine {machine!r} launcher.env {key}", quote='"')
        lines += [f'{key}="{text}"', f"export {key}"] if "$(" in text else [f'export {key}="{text}"']
    return lines


def _header(launcher: LauncherSpec, values: dict[str, str]) -> list[str]:
    """The scheduler's directive lines; a line that uses an empty site value (e.g. no QOS) is left out."""
    out = []
    for line in launcher.header:
        if any(values[p] == "" for p in placeholders_in(line) if p in SITE_VALUES):
            continue
        out.append(_directive(scheduler(launcher.scheduler), line, values))
    return out


def _directive(conventions: Scheduler, line: str, values: dict[str, str]) -> str:
    """The directive prefix (``#SBATCH``) + the filled line (every value in it a directive word: checked when the
    machine was read and the values given)."""
    return conventions.directive_line(fill(line, values))


def _modules(launcher: LauncherSpec, values: dict[str, str]) -> list[str]:
    """``module use`` for each module path, then ``module load`` for each module, in order."""
    lines = []
    for verb, entries in (("use", launcher.module_use), ("load", launcher.modules)):
        lines += [f"module {verb} {fill(entry, values)}" for entry in entries]
    return lines


def _option(name: str) -> str:
    """How the user sets a placeholder's value: its flag, or what computes it."""
    return f"--{name.replace('_', '-')}" if name in SITE_VALUES else name


def one_line(text: str) -> str:
    """`text` with control characters (a line break in a model's name) shown escaped, so a comment stays one line."""
    if not has_control(text):
        return text
    return "".join(c.encode("unicode_escape").decode() if has_control(c) else c for c in text)


def fill_shell(text: str, values: dict[str, str], where: str, *, quote: str = "", nested: bool = False) -> str:
    """Fill the placeholders of a shell line, each value quoted for where it stands.

    The line's quoting is read by :func:`axoplan.inputs.shell.scan_shell` (`quote` is the quoting it starts
    in: ``'"'`` when the line is written inside double quotes) and each value written by
    :func:`axoplan.inputs.shell.quote_for` (`nested`: the line runs inside ``bash -c '...'``). A value that no
    quoting can write there (an unchecked one: the checked ones never are) is refused naming its option.
    """
    out = []
    for piece in scan_shell(text, quote, placeholder_end(text, values))[0]:
        if not piece.kept:
            out.append(piece.text)
            continue
        name = piece.text[1:-1]
        try:
            out.append(quote_for(values[name], piece.context, nested=nested))
        except Unquotable as what:
            raise AxoplanError(f"{_option(name)} {values[name]!r} cannot go into the line {text!r} of {where}: it "
                               f"holds {what}") from None
    return "".join(out)


def _plan_block(plan: LaunchConfig, settings: JobSettings) -> list[str]:
    lines = [
        "# the launch config, and the layout as variables for the payload (see docs/export.md)",
        f'export {ENV_PREFIX}PLAN="${{{ENV_PREFIX}PLAN:-$PWD/{PLAN_NAME}}}"',
        f'if [ ! -f "${ENV_PREFIX}PLAN" ]; then',
        f'{_INDENT}echo "{SCRIPT_NAME}: no launch config at ${ENV_PREFIX}PLAN; submit from the folder holding '
        f'{PLAN_NAME}, or set {ENV_PREFIX}PLAN" >&2',
        f"{_INDENT}exit 1",
        "fi",
    ]
    return lines + [f"export {k}={quote_for(v)}" for k, v in payload_env(plan, settings).items()]


def _staging_header(launcher: LauncherSpec, values: dict[str, str]) -> list[str]:
    if launcher.staging is None or not staged(launcher.staging, int(values["nodes"])):
        return []
    return [_directive(scheduler(launcher.scheduler), line, values) for line in launcher.staging.header]


def _setup(launcher: LauncherSpec, values: dict[str, str], machine: str) -> list[str]:
    """The launcher's setup lines, unless a staged job's staging block replaces them."""
    spec = launcher.staging
    if spec is not None and spec.replace_setup and staged(spec, int(values["nodes"])):
        return []
    return [fill_shell(line, values, f"machine {machine!r} launcher.setup") for line in launcher.setup]


def _staging_setup(launcher: LauncherSpec, values: dict[str, str], machine: str) -> list[str]:
    spec = launcher.staging
    if spec is None or not staged(spec, int(values["nodes"])):
        return []
    return [one_line(f"# {_count(values['nodes'], 'node')} >= {spec.min_nodes}: stage the Python environment to "
                     f"node-local storage {spec.source}"),
            *(fill_shell(line, values, f"machine {machine!r} launcher.staging.setup") for line in spec.setup)]


def _chain_block(choice: QueueChoice | None, settings: JobSettings, conventions: Scheduler) -> list[str]:
    """For a run split over chained jobs: this job's index and iterations, and the submission of the next.

    Job k (1-based, from AXOPLAN_JOB_INDEX) submits job k+1 with the scheduler's own dependency (``sbatch
    --dependency=afterok``, ``flux --parent batch --dependency=afterok``, ``qsub -W depend=afterok``; see
    axoplan.inputs.schedulers) before it launches, so the next starts only if this one succeeds;
    AXOPLAN_RESUME=1 tells the payload to resume from its last checkpoint (every job but the first), and
    AXOPLAN_SAVE_CHECKPOINT=1 makes the executor write one at the end of every job.
    """
    if choice is None or choice.jobs == 1 or conventions.chain is None:
        return []
    p, per, jobs = ENV_PREFIX, choice.iterations_per_job, choice.jobs
    last = settings.iterations - (jobs - 1) * per
    return [
        f"# chained run: {settings.iterations} iterations in {jobs} jobs of at most {per} iterations, queue "
        f"{choice.queue.name} (limit {choice.queue.max_walltime_minutes} min {choice.queue.source})",
        f'export {p}JOB_INDEX="${{{p}JOB_INDEX:-1}}"',
        f"export {p}JOBS={jobs}",
        f"export {p}TOTAL_ITERATIONS={settings.iterations}",
        f"export {p}ITERATIONS=$(( {p}JOB_INDEX < {p}JOBS ? {per} : {last} ))",
        f"export {p}RESUME=$(( {p}JOB_INDEX > 1 ? 1 : 0 ))",
        f"export {p}SAVE_CHECKPOINT=1  # axoplan run writes checkpoint/ beside the plan; the next job resumes from it",
        f"export {p}WARMUP=0  # axoplan run: every step counts toward {p}TOTAL_ITERATIONS",
        f"if (( {p}JOB_INDEX < {p}JOBS )); then",
        _INDENT + conventions.chain.replace("<SET>", f"{p}JOB_INDEX=$(( {p}JOB_INDEX + 1 ))")
        .replace("<SCRIPT>", SCRIPT_NAME),
        "fi",
    ]


def _launch(launcher: LauncherSpec, values: dict[str, str], payload: str, machine: str) -> list[str]:
    """The launch line; with task_env / task_setup the payload runs inside a per-task bash."""
    where = f"machine {machine!r} launcher"
    head = fill_shell(launcher.launch, values, f"{where}.launch")
    inner = [fill_shell(line, values, f"{where}.task_setup", nested=True) for line in launcher.task_setup]
    if launcher.task_env:
        inner.insert(0, "export " + " ".join(
            f'{k}="{fill_shell(v, values, f"{where}.task_env {k}", quote=chr(34), nested=True)}"'
            for k, v in launcher.task_env.items()))
    if not inner:
        return [f"{head} \\", f"{_INDENT}{payload}"]
    body = "\n".join(f"{_INDENT * 2}{line}" for line in [*inner, 'exec "$@"'])
    return ["# shellcheck disable=SC2016  # the quoted lines run, and expand, inside every task",
            f"{head} \\", f"{_INDENT}bash -c '", f"{body}' axoplan-task \\", f"{_INDENT}{payload}"]


def check_bash_syntax(text: str, what: str) -> None:
    """Refuse a script that ``bash -n`` cannot parse (skipped where there is no bash)."""
    bash = shutil.which("bash")
    if bash is None:
        return
    done = subprocess.run([bash, "-n"], input=text, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["syntax error"])[0]
        raise AxoplanError(f"{what} does not parse as bash ({first}); check the quotes in its launcher block "
                           f"or --command")
