"""Render one launch config into a job script from the machine YAML's launcher block.

The script knows nothing about any particular centre: the header, modules, environment,
setup and launch line all come from ``launcher:`` in the machine YAML; the layout and
the prediction come from the launch config; the account and other site values come from
the user (or stay visible placeholders such as ``<ACCOUNT>``).

No value can change what the script means. A value in a scheduler directive (an ``#SBATCH``,
``#PBS`` or ``# flux:`` line), where nothing can be quoted, must be a plain word (letters, digits,
``_ . : + / @ -``); a value in a shell line is quoted for where it stands (``shlex.quote``
outside quotes, as is inside quotes, where the site values' rules keep out quotes, ``$``,
backquotes and backslashes); comment
lines show a line break in a name as ``\n``; module names must be plain names; ``--command``
is written as given once :func:`axoplan.export.job.command_problem` has found nothing in it
that could end the command or run code in the batch script. Anything else is refused with
one line naming the option or the machine YAML's entry.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

from axoplan.cost.budget import describe_cost
from axoplan.errors import AxoplanError
from axoplan.export.job import (
    ENV_PREFIX,
    SCHEDULER_NAME,
    SCHEDULER_NAMES,
    JobSettings,
    command_problem,
    format_hms,
    has_control,
    node_counts,
    site_values,
    unsafe_text,
    walltime_s,
)
from axoplan.inputs.axes import AXIS_DEFS, axonn_order
from axoplan.inputs.launcher import PLACEHOLDER, SITE_VALUES, LauncherSpec, fill, placeholder_text, placeholders_in
from axoplan.inputs.machine import Machine
from axoplan.inputs.queues import QueueChoice, choose_queue
from axoplan.inputs.schedulers import Scheduler, scheduler
from axoplan.inputs.staging import margin_minutes, staged
from axoplan.records.plan import LaunchConfig
from axoplan.search.fit import memory_fit

__all__ = ["render_job_script", "job_values", "time_warning", "payload_env", "check_bash_syntax", "submit_command",
           "EXECUTOR_PAYLOAD", "SCRIPT_NAME", "PLAN_NAME"]

SCRIPT_NAME = "job.sh"
PLAN_NAME = "plan.json"
EXECUTOR_PAYLOAD = 'python -u -m axoplan run "$AXOPLAN_PLAN"'
_INDENT = "    "
_DIRECTIVE_VALUE = re.compile(r"[A-Za-z0-9_.:+/@-]+")  # what a value in a scheduler directive may be
_MODULE = re.compile(r"[A-Za-z0-9_.:+/@%,=-]+")  # a module name, or a module path to add


def require_launcher(machine: Machine) -> LauncherSpec:
    if machine.launcher is None:
        raise AxoplanError(f"machine {machine.name!r} has no 'launcher:' block, so axoplan cannot write its job "
                           f"scripts; add one to its YAML (see docs/export.md)")
    return machine.launcher


def job_values(plan: LaunchConfig, machine: Machine, settings: JobSettings, name: str) -> dict[str, str]:
    """Every placeholder's value for this plan: site values, nodes, tasks, wall time, job name."""
    launcher = require_launcher(machine)
    nodes, per_node = node_counts(plan.world_size, machine.devices_per_node, settings.allow_partial_nodes,
                                  machine.name)
    if plan.prediction is None:
        raise AxoplanError(f"launch config {plan.plan_id} has no prediction, so no wall time can be set; "
                           f"export it from a ranking")
    wall = walltime_s(plan.prediction.t_step_s, settings.iterations, job_margin(machine, nodes, settings))
    site = site_values(launcher, settings.site)
    choice = queue_choice(plan, machine, settings)
    if choice is not None:
        wall = choice.walltime_s
    if settings.walltime_override_s is not None:
        wall = settings.walltime_override_s
    if choice is not None:
        for key in ("partition", "qos", "queue"):
            if getattr(settings.site, key) is None and getattr(choice.queue, key) is not None:
                site[key] = getattr(choice.queue, key)
    _check_site_values(site, machine.name)
    return {**site, "nodes": str(nodes), "tasks": str(plan.world_size),
            "tasks_per_node": str(per_node), "gpus_per_node": str(per_node),
            "walltime": scheduler(launcher.scheduler).format_walltime(wall),
            "job_name": f"axoplan-{name}", "plan_id": plan.plan_id}


def _check_site_values(site: dict[str, str], machine: str) -> None:
    """Site values from the machine YAML (defaults, queues) obey the rules the flags do (job.SiteSettings)."""
    for name, value in site.items():
        if value in ("", placeholder_text(name)):
            continue
        if name in SCHEDULER_NAMES:
            if not SCHEDULER_NAME.fullmatch(value):
                raise AxoplanError(f"machine {machine!r} gives {name} {value!r}, which goes into a scheduler directive "
                                   f"and may hold only letters, digits and _ . : + -; fix its launcher block, or pass "
                                   f"--{name}")
        elif (reason := unsafe_text(value)) is not None:
            raise AxoplanError(f"machine {machine!r} gives {name} {value!r}, which holds {reason}; fix its launcher "
                               f"block, or pass --{name.replace('_', '-')}")


def queue_choice(plan: LaunchConfig, machine: Machine, settings: JobSettings) -> QueueChoice | None:
    """The machine's queue for this job and its split into chained jobs (None: no queues, or none holds it)."""
    launcher = require_launcher(machine)
    if not launcher.queues or plan.prediction is None:
        return None
    nodes, _ = node_counts(plan.world_size, machine.devices_per_node, settings.allow_partial_nodes, machine.name)
    return choose_queue(launcher.queues, nodes, plan.prediction.t_step_s, settings.iterations,
                        job_margin(machine, nodes, settings))


def time_warning(plan: LaunchConfig, machine: Machine, settings: JobSettings) -> str | None:
    """One line when --time asks for more than the chosen queue allows, or less than the job's predicted need."""
    asked = settings.walltime_override_s
    if asked is None or plan.prediction is None:
        return None
    choice = queue_choice(plan, machine, settings)
    if choice is not None and asked > choice.queue.max_walltime_minutes * 60:
        return (f"--time {format_hms(asked)} exceeds queue {choice.queue.name}'s limit of "
                f"{format_hms(choice.queue.max_walltime_minutes * 60)} {choice.queue.source}; the scheduler "
                f"will refuse or cap the job")
    nodes, _ = node_counts(plan.world_size, machine.devices_per_node, settings.allow_partial_nodes, machine.name)
    needed = choice.walltime_s if choice is not None else walltime_s(
        plan.prediction.t_step_s, settings.iterations, job_margin(machine, nodes, settings))
    if asked < needed:
        return (f"--time {format_hms(asked)} is under the predicted {format_hms(needed)} a job needs "
                f"({_job_iterations(plan, machine, settings)} iterations + margin); it may be stopped before it ends")
    return None


def benchmark_spend(plan: LaunchConfig, machine: Machine, settings: JobSettings) -> str | None:
    """What a long export of the built-in benchmark spends, as a phrase; None for a short test or a --command.

    Long: --tokens, or a run the queues split into chained jobs. Node-hours are the run's
    (nodes x iterations x predicted s/iter; with --tokens, the plan's training cost)."""
    if settings.command is not None or plan.prediction is None:
        return None
    choice = queue_choice(plan, machine, settings)
    jobs = choice.jobs if choice is not None else 1
    if settings.tokens is None and jobs == 1:
        return None
    nodes, _ = node_counts(plan.world_size, machine.devices_per_node, settings.allow_partial_nodes, machine.name)
    node_hours = nodes * settings.iterations * plan.prediction.t_step_s / 3600
    return (f"{settings.iterations:,} iterations of axoplan's synthetic benchmark, not training: "
            f"{jobs} job{'s' if jobs > 1 else ''} on {nodes:,} node{'s' if nodes > 1 else ''}, about "
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


def render_job_script(plan: LaunchConfig, machine: Machine, settings: JobSettings, name: str, rank: int) -> str:
    """The job script for `plan`, checked with ``bash -n``; `name` is its folder, `rank` its place in the ranking."""
    launcher = require_launcher(machine)
    values = job_values(plan, machine, settings, name)
    conventions = scheduler(launcher.scheduler)
    parts = [
        ["#!/bin/bash", *map(one_line, _comments(plan, machine, settings, values, rank)),
         *_header(launcher, values, machine.name), *_staging_header(launcher, values, machine.name)],
        ["set -eo pipefail", *([conventions.start] if conventions.start else [])],
        _modules(launcher, values, machine.name),
        _exports(launcher.env, values, machine.name),
        _setup(launcher, values, machine.name),
        _staging_setup(launcher, values, machine.name),
        _plan_block(plan, settings),
        [one_line(line) for line in _chain_block(queue_choice(plan, machine, settings), settings, conventions)],
        _launch(launcher, values, _payload(settings), machine.name),
    ]
    text = "\n\n".join("\n".join(p) for p in parts if p) + "\n"
    check_bash_syntax(text, f"the job script for machine {machine.name!r}")
    return text


def _comments(plan: LaunchConfig, machine: Machine, settings: JobSettings, values: dict[str, str],
              rank: int) -> list[str]:
    lay, pred = plan.layout, plan.prediction
    assert pred is not None  # job_values refused a plan without one
    init = " ".join(f"{k}={v}" for k, v in plan.axonn_init.items())
    opts = ["recompute" if plan.recompute else "no recompute"]
    if plan.cache_weights and lay.gz > 1:
        opts.append("cached weights")
    predicted = (f"# predicted {pred.t_step_s:.3f} s/iteration x {_job_iterations(plan, machine, settings)} "
                 f"iterations + {_margin(plan, machine, settings, values):g} min margin")
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
        f"# memory per GPU: {memory_fit(pred.mem_total_bytes, machine, plan.options.framework).describe()}",
        *([f"# {describe_cost(plan.training)}"] if plan.training is not None else []),
        *([f"# BENCHMARK, NOT TRAINING: this job runs {spend}"]
          if (spend := benchmark_spend(plan, machine, settings)) is not None else []),
        f"# plan {plan.plan_id}; its launch config is {PLAN_NAME}, next to this script",
    ]
    launcher = require_launcher(machine)
    if scheduler(launcher.scheduler).directive is not None:
        lines.append(f"# submit from this folder:  {submit_command(launcher)}")
    else:
        where = "on the node" if values["nodes"] == "1" else f"on each of the {values['nodes']} nodes at once"
        lines += [f"# run from this folder {where}:",
                  f"#   {submit_command(require_launcher(machine))}"]
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


def _margin(plan: LaunchConfig, machine: Machine, settings: JobSettings, values: dict[str, str]) -> float:
    return job_margin(machine, int(values["nodes"]), settings)


def _job_iterations(plan: LaunchConfig, machine: Machine, settings: JobSettings) -> int:
    """Iterations of one job: all of them, or at most a chained job's share."""
    choice = queue_choice(plan, machine, settings)
    return settings.iterations if choice is None else choice.iterations_per_job


def _exports(env: dict[str, str], values: dict[str, str], machine: str) -> list[str]:
    """``export K="V"``; with a command substitution, assign first so a failing command stops the script."""
    lines = []
    for key, value in env.items():
        text = fill_shell(value, values, f"machine {machine!r} launcher.env {key}", quote='"')
        lines += [f'{key}="{text}"', f"export {key}"] if "$(" in text else [f'export {key}="{text}"']
    return lines


def _header(launcher: LauncherSpec, values: dict[str, str], machine: str) -> list[str]:
    """The scheduler's directive lines; a line that uses an empty site value (e.g. no QOS) is left out."""
    out = []
    for line in launcher.header:
        if any(values[p] == "" for p in placeholders_in(line) if p in SITE_VALUES):
            continue
        out.append(_directive(scheduler(launcher.scheduler), line, values, f"machine {machine!r} launcher.header"))
    return out


def _directive(conventions: Scheduler, line: str, values: dict[str, str], where: str) -> str:
    """The directive prefix (``#SBATCH``) + the filled line; nothing can be quoted there, so every value in it must
    be a plain word."""
    prefix = conventions.directive_line("").strip()
    for name in placeholders_in(line):
        value = values[name]
        if value != placeholder_text(name) and not _DIRECTIVE_VALUE.fullmatch(value):
            raise AxoplanError(f"{_option(name)} {value!r} cannot go into the {prefix} line {line!r} of {where}: "
                               f"only letters, digits and _ . : + / @ - can be written there")
    text = fill(line, values)
    if has_control(text):
        raise AxoplanError(f"{where} line {line!r} holds a line break or other control character")
    return conventions.directive_line(text)


def _modules(launcher: LauncherSpec, values: dict[str, str], machine: str) -> list[str]:
    """``module use`` for each module path, then ``module load`` for each module, in order."""
    lines = []
    for verb, field, entries in (("use", "module_use", launcher.module_use), ("load", "modules", launcher.modules)):
        for entry in entries:
            name = fill(entry, values)
            if not _MODULE.fullmatch(name):
                raise AxoplanError(f"machine {machine!r} launcher.{field} entry {entry!r} is not a module name or path "
                                   f"(letters, digits and _ . : + / @ % , = -); fix its launcher block")
            lines.append(f"module {verb} {name}")
    return lines


def _payload(settings: JobSettings) -> str:
    if settings.command is None:
        return EXECUTOR_PAYLOAD
    problem = command_problem(settings.command)
    if problem is not None:  # JobSettings refuses it first; kept for settings built some other way
        raise AxoplanError(f"--command {settings.command!r}: {problem}")
    return settings.command


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

    A value outside quotes is ``shlex.quote``d (in double quotes instead when `nested`: the line
    runs inside ``bash -c '...'``); one inside double or single quotes goes in as it is, and is
    refused if it holds what would end those quotes or expand there. `quote` is the quoting the
    line starts in (``'"'``: the line is written inside double quotes). ``$(...)`` and backquotes
    start a new, unquoted level, so a placeholder inside one is quoted as well.
    """
    stack = [quote]  # "" unquoted, "'" or '"' quoted, "(" or "`" inside a command substitution (unquoted)
    out: list[str] = []
    i = 0
    while i < len(text):
        m = PLACEHOLDER.match(text, i)
        if m is not None and m.group(1) in values:
            out.append(_quoted(values[m.group(1)], m.group(1), stack[-1], nested, text, where))
            i = m.end()
            continue
        c, top = text[i], stack[-1]
        step = 1
        if top == "'":
            if c == "'":
                stack.pop()
        elif c == "\\":
            step = 2
        elif c == "$" and text.startswith("$(", i):
            stack.append("(")
            step = 2
        elif c == "`":
            if top == "`":
                stack.pop()
            else:
                stack.append("`")
        elif top == '"':
            if c == '"':
                stack.pop()
        elif c in "'\"":
            stack.append(c)
        elif c == "(":
            stack.append("(")
        elif c == ")" and top == "(":
            stack.pop()
        out.append(text[i:i + step])
        i += step
        if not stack:  # more closing quotes than opening ones: the line itself is odd; keep counting from here
            stack.append("")
    return "".join(out)


def _quoted(value: str, name: str, context: str, nested: bool, line: str, where: str) -> str:
    if context in ("", "(", "`"):
        if shlex.quote(value) == value:
            return value
        if not nested:
            return shlex.quote(value)
        context = '"'
        wrap = True
    else:
        wrap = False
    bad = {"'": "'", '"': '"$`\\'}[context]
    if has_control(value) or any(c in bad for c in value):
        what = "a control character" if has_control(value) else "a quote, $, backquote or backslash"
        raise AxoplanError(f"{_option(name)} {value!r} cannot go into the line {line!r} of {where}: it holds {what}")
    return f'"{value}"' if wrap else value


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
    return lines + [f"export {k}={shlex.quote(v)}" for k, v in payload_env(plan, settings).items()]


def _staging_header(launcher: LauncherSpec, values: dict[str, str], machine: str) -> list[str]:
    if launcher.staging is None or not staged(launcher.staging, int(values["nodes"])):
        return []
    return [_directive(scheduler(launcher.scheduler), line, values, f"machine {machine!r} launcher.staging.header")
            for line in launcher.staging.header]


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
