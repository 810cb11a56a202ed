"""`axoplan export`: write the top layouts as launch configs and ready-to-submit job scripts.

    axoplan export --model 320B --gpus 32768 --machine frontier --top 5 --out-dir plans/
    axoplan export --ranking ranking.json --top 3 --account ABC123

Only typer and the standard library are imported here; the work is imported when the
command runs, so `axoplan --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from axoplan.commands.options import FIT_FLAGS, MODEL_FLAGS, RUN_FLAGS, ModelFlags, TokensOpt, shared_options

if TYPE_CHECKING:
    from axoplan.inputs.options import RunOptions
    from axoplan.search.fit import FitPolicy

__all__ = ["export"]

# options that define a fresh ranking; a saved ranking (--ranking) already fixes them
_RANKING_FLAGS = {"gpus": "--gpus"} | {f.name: f.text for f in (*MODEL_FLAGS, *RUN_FLAGS, *FIT_FLAGS)}
_SITE_HELP = "Written into the job scripts; otherwise the machine's default or a visible placeholder like <{}>."


@shared_options(fit=True)
def export(
    ctx: typer.Context,
    ranking: Annotated[Path | None, typer.Option(
        "--ranking", help="A ranking saved by `axoplan rank --out FILE.json`: export from it instead of ranking "
                          "again (model, GPUs and options come from the file).")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", "-g", help="Number of GPUs (GCDs on Frontier).",
                                             show_default=False)] = None,
    machine: Annotated[str | None, typer.Option(
        "--machine", help="Shipped machine or path to a machine YAML (default: frontier, or the machine named "
                          "in --ranking).", show_default=False)] = None,
    top: Annotated[int, typer.Option("--top", "-n", min=1, help="How many of the best layouts to export.")] = 5,
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="Folder to write one sub-folder per layout into.")
                       ] = Path("plans"),
    account: Annotated[str | None, typer.Option(
        "--account", envvar="AXOPLAN_ACCOUNT", help=_SITE_HELP.format("ACCOUNT"), show_default=False)] = None,
    partition: Annotated[str | None, typer.Option(
        "--partition", envvar="AXOPLAN_PARTITION", help=_SITE_HELP.format("PARTITION"), show_default=False)] = None,
    qos: Annotated[str | None, typer.Option(
        "--qos", envvar="AXOPLAN_QOS", help=_SITE_HELP.format("QOS"), show_default=False)] = None,
    queue: Annotated[str | None, typer.Option(
        "--queue", envvar="AXOPLAN_QUEUE", help="PBS or Flux queue (-q). " + _SITE_HELP.format("QUEUE"),
        show_default=False)] = None,
    python_env: Annotated[str | None, typer.Option(
        "--python-env", envvar="AXOPLAN_PYTHON_ENV", help="Python environment (venv or conda) with PyTorch and "
        "axoplan, activated by the script. " + _SITE_HELP.format("PYTHON_ENV"), show_default=False)] = None,
    container: Annotated[str | None, typer.Option(
        "--container", envvar="AXOPLAN_CONTAINER", help="Container image or environment (Alps: EDF TOML). "
        + _SITE_HELP.format("CONTAINER"), show_default=False)] = None,
    net_plugin: Annotated[str | None, typer.Option(
        "--net-plugin", envvar="AXOPLAN_NET_PLUGIN", help="Folder of the collective library's network plugin where "
        "the centre does not load it (El Capitan, Tuolumne: the aws-ofi-rccl build for your PyTorch's ROCm; "
        "docs/export.md). " + _SITE_HELP.format("NET_PLUGIN"), show_default=False)] = None,
    iterations: Annotated[int | None, typer.Option(
        "--iterations", min=1, help="Iterations the job runs; wall time = predicted s/iter x iterations + margin. "
                                    "Default: the steps --tokens needs, else 100.", show_default=False)] = None,
    tokens: TokensOpt = None,
    time: Annotated[str | None, typer.Option(
        "--time", help="Wall time of each job (HH:MM:SS, minutes or D-HH:MM:SS), instead of the predicted one; "
                       "the queue is still chosen from the prediction.", show_default=False)] = None,
    margin_minutes: Annotated[float, typer.Option("--margin-minutes", min=0, help="Minutes added to the predicted "
                                                  "run time for start-up and safety.")] = 10.0,
    command: Annotated[str | None, typer.Option(
        "--command", help="Launch your own training command instead of `python -m axoplan run plan.json`; it gets "
                          "the layout as AXOPLAN_* variables (docs/export.md).", show_default=False)] = None,
    benchmark: Annotated[bool, typer.Option(
        "--benchmark", help="With --tokens or a chain of jobs and no --command: run axoplan's synthetic benchmark "
                            "knowingly (otherwise refused; the scripts and the screen say what it spends).")] = False,
    allow_partial_nodes: Annotated[bool, typer.Option(
        "--allow-partial-nodes", help="Allow a GPU count that does not fill whole nodes.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing plan.json / job.sh files.")] = False,
    *,
    run_options: RunOptions,
    model_flags: ModelFlags,
    fit_policy: FitPolicy,
) -> None:
    """Export the top --top layouts as launch configs (plan.json) and job scripts (job.sh), one folder each.

    Ranks --model on --gpus GPUs of --machine (same options as `axoplan rank`), or reads a
    ranking saved with `axoplan rank --out FILE.json` (--ranking). Job scripts follow the
    machine YAML's launcher block (Slurm, Flux, PBS or torchrun). Existing files are never replaced
    without --force, and a failed export writes nothing.
    """
    from axoplan.cost.budget import parse_tokens
    from axoplan.export import prepare_exports, summary, write_exports
    from axoplan.export.exporter import benchmark_note
    from axoplan.export.job import parse_walltime
    from axoplan.report import fit_note

    site = {"account": account, "partition": partition, "qos": qos, "queue": queue, "python_env": python_env,
            "container": container, "net_plugin": net_plugin}
    n_tokens = parse_tokens(tokens) if tokens is not None else None
    settings = _settings(iterations=iterations or 100, margin_minutes=margin_minutes, command=command,
                         benchmark=benchmark,
                         allow_partial_nodes=allow_partial_nodes, site=site, tokens=n_tokens,
                         walltime_override_s=parse_walltime(time) if time is not None else None)
    if ranking is not None:
        _refuse_ranking_flags(ctx, ranking)
        source, ref = _saved(ranking, machine)
    else:
        ref = machine or "frontier"
        source = _fresh(model_flags, gpus, ref, run_options, fit_policy)
    if n_tokens is not None and iterations is None:
        settings = settings.model_copy(update={"iterations": _token_steps(n_tokens, source.options)})
    exports = prepare_exports(source, ref, top, settings)
    write_exports(exports, out_dir, force)
    launcher = source.machine.launcher
    assert launcher is not None  # prepare_exports refused a machine without one
    typer.echo(f"exported {len(exports)} layout{'s' if len(exports) > 1 else ''} of {source.model.name} on "
               f"{source.world_size} GPUs of {source.machine.name} to {out_dir}\n")
    typer.echo(summary(exports, out_dir, launcher, source.machine))
    if (doubt := fit_note(source)) is not None:
        typer.echo(f"warning: {doubt}", err=True)
    if exports[0].plan.training is not None:
        from axoplan.cost.budget import describe_cost

        typer.echo(f"rank 1: {describe_cost(exports[0].plan.training)}; each plan.json records its own")
    for note in _notes(launcher, settings, site, len(exports), top):
        typer.echo(f"note: {note}", err=True)
    if (spent := benchmark_note(exports, settings)) is not None:
        typer.echo(f"warning: {spent}", err=True)
    _warnings(exports, source.machine, settings)


def _token_steps(tokens: int, options: Any) -> int:
    """Iterations of an export with --tokens and no --iterations: the steps the tokens need."""
    from axoplan.cost.budget import steps_for

    return steps_for(tokens, options.global_batch, options.seq_len)


def _warnings(exports: list[Any], machine: Any, settings: Any) -> None:
    """A job no queue holds (uncapped wall time); a --time over the chosen queue's limit (each plan's own job)."""
    for e in exports:
        for warning in e.warnings(machine, settings):
            typer.echo(f"warning: {warning}", err=True)


def _settings(**fields: Any) -> Any:
    from pydantic import ValidationError

    from axoplan.errors import AxoplanError
    from axoplan.export import JobSettings
    from axoplan.inputs.schema import describe_validation_error

    try:
        return JobSettings.model_validate(fields)
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, "export options", JobSettings)) from None


def _refuse_ranking_flags(ctx: typer.Context, ranking: Path) -> None:
    from axoplan.errors import AxoplanError

    for name, flag in _RANKING_FLAGS.items():
        source = ctx.get_parameter_source(name)
        if source is not None and source.name in {"COMMANDLINE", "ENVIRONMENT"}:
            raise AxoplanError(f"--ranking {ranking} already fixes the model, GPUs and options; leave out {flag} "
                               f"(or rank afresh without --ranking)")


def _saved(ranking: Path, machine: str | None) -> tuple[Any, str]:
    from axoplan.errors import AxoplanError
    from axoplan.export import load_saved_ranking
    from axoplan.inputs.machine import load_machine

    def machine_for(name: str) -> Any:
        if machine is None:
            try:
                return load_machine(name)
            except AxoplanError:
                raise AxoplanError(f"{ranking} was ranked on machine {name!r}, which does not ship with axoplan; "
                                   f"pass --machine path/to/{name}.yaml") from None
        loaded = load_machine(machine)
        if loaded.name != name:
            raise AxoplanError(f"{ranking} was ranked on machine {name!r}, but --machine {machine} is "
                               f"{loaded.name!r}; leave out --machine or give the one it was ranked on")
        return loaded

    source = load_saved_ranking(ranking, machine_for)
    return source, machine or source.machine.name


def _fresh(model_flags: ModelFlags, gpus: int | None, machine: str, options: RunOptions, fit: FitPolicy) -> Any:
    from axoplan.errors import AxoplanError
    from axoplan.inputs.machine import load_machine
    from axoplan.search.advice import explain_infeasible
    from axoplan.search.ranking import rank

    if gpus is None:
        raise AxoplanError("give --gpus N (and --model), or --ranking FILE.json saved by `axoplan rank --out`")
    spec, mach = model_flags.load(), load_machine(machine)
    result = rank(spec, mach, options, gpus, fit)
    if result.num_feasible == 0:
        raise AxoplanError(explain_infeasible(result))
    return result


def _notes(launcher: Any, settings: Any, site: dict[str, str | None], exported: int, top: int) -> list[str]:
    """Placeholders left in the scripts, site values this machine does not use, fewer layouts than asked."""
    from axoplan.export.job import site_values
    from axoplan.inputs.launcher import placeholder_text

    used = launcher.placeholders()
    values = site_values(launcher, settings.site)
    notes = []
    left = [placeholder_text(n) for n, v in values.items() if n in used and v == placeholder_text(n)]
    if left:
        flags = ", ".join(f"--{n.strip('<>').lower().replace('_', '-')}" for n in left)
        notes.append(f"the scripts still hold {', '.join(left)}: give {flags} (or AXOPLAN_* variables), or edit them")
    unused = [n for n, v in site.items() if v is not None and n not in used]
    if unused:
        notes.append(f"this machine's job scripts use no {', '.join(unused)}; ignored")
    if exported < top:
        notes.append(f"only {exported} feasible layout{'s' if exported > 1 else ''} to export (asked for {top})")
    return notes
