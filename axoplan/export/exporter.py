"""Export the top k layouts of a ranking: one folder each with ``plan.json`` and ``job.sh``.

    plans/01-x4-y8-z1024-d1/plan.json   the launch config (axoplan.records.plan.LaunchConfig)
    plans/01-x4-y8-z1024-d1/job.sh      the job script, from the machine's launcher block

Everything is built and checked in memory first (launch configs round-trip, scripts pass
``bash -n``); only then are the files written, all or nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from axoplan.cost.budget import run_cost
from axoplan.errors import AxoplanError
from axoplan.export.files import NewFile, write_all_or_nothing
from axoplan.export.job import JobSettings, check_site
from axoplan.export.saved import SavedRanking
from axoplan.export.script import (
    PLAN_NAME,
    SCRIPT_NAME,
    Job,
    benchmark_spend,
    plan_job,
    render_job_script,
    submit_command,
    time_warning,
)
from axoplan.inputs.launcher import LauncherSpec
from axoplan.inputs.schedulers import scheduler
from axoplan.inputs.shell import quote_for
from axoplan.records.plan import LaunchConfig, plan_from_ranking
from axoplan.search.ranking import Ranking

__all__ = ["ExportedPlan", "folder_label", "prepare_exports", "with_training", "write_exports", "top_indices",
           "summary", "benchmark_note"]


@dataclass(frozen=True, slots=True)
class ExportedPlan:
    """One exported layout: its folder name, launch config, job (queue chosen once) and job script."""

    rank: int
    folder: str
    plan: LaunchConfig
    script: str
    nodes: int
    walltime: str
    job: Job

    def warnings(self, machine: Any, settings: JobSettings) -> list[str]:
        """A job no queue holds (its wall time uncapped); a --time over the chosen queue's limit or under the need."""
        out = []
        if machine.launcher.queues and self.job.choice is None:
            nodes = f"{self.nodes} node{'s' if self.nodes != 1 else ''}"
            out.append(f"no queue of {machine.name} holds {nodes} ({self.folder}); its wall time {self.walltime} is "
                       f"not capped; check the centre's limits")
        if (warning := time_warning(self.job, settings)) is not None:
            out.append(f"{warning} ({self.folder})")
        return out


def top_indices(source: Ranking | SavedRanking, k: int) -> list[int]:
    """Candidate indices of the k best feasible rows, best first."""
    if isinstance(source, SavedRanking):
        return source.top(k)
    return source.top_feasible(k)


def prepare_exports(source: Ranking | SavedRanking, machine_ref: str, k: int,
                    settings: JobSettings, indices: list[int] | None = None) -> list[ExportedPlan]:
    """Launch configs and job scripts of the k best feasible layouts (or of `indices`), in memory."""
    _refuse_an_undrivable_payload(source.machine, settings)
    if source.machine.launcher is not None:
        check_site(source.machine.launcher, settings.site, source.machine.name)
    indices = top_indices(source, k) if indices is None else indices
    if not indices:
        raise AxoplanError(f"no feasible layout to export among the {source.world_size}-GPU candidates; "
                           f"run `axoplan rank --infeasible` to see why")
    width = max(2, len(str(len(indices))))
    out = []
    for n, i in enumerate(indices, start=1):
        plan = _checked_plan(source, i, machine_ref, settings.tokens)
        folder = f"{n:0{width}d}-{folder_label(plan)}"
        job = plan_job(plan, source.machine, settings, folder)
        _refuse_unmeant_benchmark(job, settings)
        script = render_job_script(plan, source.machine, settings, folder, n, job)
        out.append(ExportedPlan(n, folder, plan, script, job.nodes, job.values["walltime"], job))
    return out


def _refuse_an_undrivable_payload(machine: Any, settings: JobSettings) -> None:
    """Without --command the scripts run `axoplan run`: refused where the executor cannot drive the devices."""
    from axoplan.inputs.launcher import EXECUTOR_DEVICES, executor_drives

    launcher = machine.launcher
    if settings.command is not None or launcher is None or executor_drives(launcher.torch_device):
        return
    raise AxoplanError(f"machine {machine.name!r} runs PyTorch on its {machine.device.name} as "
                       f"'{launcher.torch_device}' devices, which `axoplan run` cannot drive (it runs on "
                       f"{' and '.join(repr(d) for d in EXECUTOR_DEVICES)} devices only), so its job scripts need "
                       f"your training command: axoplan export ... --command 'python train.py ...'")


def _refuse_unmeant_benchmark(job: Job, settings: JobSettings) -> None:
    """A long export without --command would spend an allocation on the benchmark: only with --benchmark."""
    spend = benchmark_spend(job, settings)
    if spend is not None and not settings.benchmark:
        raise AxoplanError(f"without --command, layout {job.plan.layout.to_layout()} would run {spend}; give --command "
                           "'python train.py ...' to train, or --benchmark to run the benchmark knowingly")


def benchmark_note(exports: list[ExportedPlan], settings: JobSettings) -> str | None:
    """The screen line of an export --benchmark: what rank 1's jobs run and spend."""
    spend = benchmark_spend(exports[0].job, settings) if exports else None
    return None if spend is None else f"these job scripts run the benchmark (--benchmark); rank 1: {spend}"


def folder_label(plan: LaunchConfig) -> str:
    """``x4-y8-z512-d2``: the layout with its axis names, safe in a file name; ``-zxy`` is added
    when the tensor-parallel order is not AxoNN's default."""
    from axoplan.inputs.axes import AXIS_DEFS

    lay = plan.layout.to_layout()
    label = "-".join(f"{a.name[0]}{lay.size(a.name)}" for a in AXIS_DEFS)
    return label if plan.layout.tp_order == "xyz" else f"{label}-{plan.layout.tp_order}"


def _checked_plan(source: Any, i: int, machine_ref: str, tokens: int | None) -> LaunchConfig:
    """The launch config of row i (with the cost of `tokens` tokens), refused unless it reads back unchanged."""
    plan = plan_from_ranking(source, i, machine_ref)
    if tokens is not None:
        plan = with_training(plan, tokens)
    if LaunchConfig.from_json(plan.to_json(), "exported plan") != plan:
        raise AxoplanError(f"launch config {plan.plan_id} does not read back unchanged (a non-finite prediction?); "
                           f"not exporting it")
    return plan


def with_training(plan: LaunchConfig, tokens: int) -> LaunchConfig:
    """`plan` recording what training `tokens` tokens costs at its predicted step time (axoplan.cost.budget)."""
    if plan.prediction is None:
        return plan
    cost = run_cost(tokens, plan.options.global_batch, plan.options.seq_len, plan.prediction.t_step_s,
                    plan.world_size, plan.devices_per_node)
    return plan.model_copy(update={"training": cost.record()})


def write_exports(exports: list[ExportedPlan], out_dir: Path, force: bool) -> list[Path]:
    """Write every plan.json and job.sh under `out_dir`, all or nothing."""
    files = []
    for e in exports:
        files.append(NewFile(f"{e.folder}/{PLAN_NAME}", e.plan.to_json()))
        files.append(NewFile(f"{e.folder}/{SCRIPT_NAME}", e.script, mode=0o777))
    return write_all_or_nothing(out_dir, files, force=force)


def summary(exports: list[ExportedPlan], out_dir: Path, launcher: LauncherSpec, machine: Any) -> str:
    """What was written, as a table (the memory need with the reserve against the HBM, its verdict and P(fit)),
    and how to submit it."""
    from axoplan.report import text_table
    from axoplan.search.fit import memory_fit

    rows = []
    for e in exports:
        pred = e.plan.prediction
        fit = memory_fit(pred.mem_total_bytes, machine, e.plan.model, e.plan.options) if pred else None
        rows.append([str(e.rank), str(e.plan.layout.to_layout()), str(e.plan.micro_batch),
                     f"{pred.t_step_s:.3f}" if pred else "-",
                     f"{fit.need_bytes / 1e9:.1f}/{fit.hbm_bytes / 1e9:.0f}" if fit else "-",
                     f"{fit.verdict} {fit.p_fit:.2f}" if fit else "-", str(e.nodes), e.walltime, e.plan.plan_id,
                     str(out_dir / e.folder)])
    table = text_table(["rank", "layout", "mbs", "s/iter", "mem GB", "fit", "nodes", "wall time", "plan", "folder"],
                       rows, [True, False, True, True, True, False, True, True, False, False])
    first = quote_for(str(out_dir / exports[0].folder))  # a command to paste: an odd --out-dir stays one word
    how = f"cd {first} && {submit_command(launcher)}"
    if scheduler(launcher.scheduler).directive is None:
        how += "   (on every node)"
    usable = f"{fit.usable_bytes / 1e9:.1f}" if fit else "-"
    mem = (f"mem: GB per GPU with the reserve / the HBM ({usable} GB of it usable by tensors); fit: the memory verdict "
           "and the probability of fitting (each job script's header says more)")
    return f"{table}\n{mem}\n\nsubmit each from its folder, e.g.: {how}"
