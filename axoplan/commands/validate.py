"""`axoplan validate`: how far predictions are from measured runs, per run and overall.

    axoplan validate runs.jsonl
    axoplan validate data/measured/vtrain_a100_single_node_pp1.csv --machine dgx-a100 --plots figs/
    axoplan validate data/measured/llm-foundry/runs-a100.csv --summary-only     # two machines, two sections

Only typer, the standard library and the shared option types are imported here; the work is imported when the
command runs, so `axoplan --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from axoplan.commands.options import ProbeOpt

__all__ = ["validate", "resolve_machine", "machine_sections"]

RunsArg = Annotated[list[Path], typer.Argument(
    help="Measured runs: the executor's .jsonl records, an axoplan measured-run .csv, or the vTrain A100 .csv "
         "(docs/validate.md).", show_default=False)]


def validate(
    runs: RunsArg,
    machine: Annotated[str | None, typer.Option(
        "--machine", help="Machine to predict on (name or YAML, e.g. a calibrated one); runs recorded on other "
                          "machines are skipped with a note. Default: each machine the runs were recorded on, "
                          "a section per machine.", show_default=False)] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="Is the measured best in the predicted "
                                                                     "top K of its scenario?")] = 3,
    plots: Annotated[Path | None, typer.Option(
        "--plots", help="Folder for predicted_vs_measured and breakdown figures (.png and .svg).",
        show_default=False)] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the per-plan table to this .csv or "
                                             ".json file.", show_default=False)] = None,
    summary_only: Annotated[bool, typer.Option(
        "--summary-only", help="Print only the summary: a few lines per machine, no per-plan or per-scenario "
                               "rows.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing --out and figure files.")] = False,
    any_device: Annotated[bool, typer.Option(
        "--any-device", help="Compare runs measured on another kind of device too (a CPU rehearsal of a GPU "
                             "plan); refused by default.")] = False,
    probe: ProbeOpt = None,
) -> None:
    """Compare measured seconds per iteration with the prediction for each run's plan.

    Prints each plan's measured and predicted time and error, then the mean absolute
    percentage error, the worst case, Kendall tau and Spearman rho of the ordering, and
    per scenario (same model, batch and GPU count) whether the measured best layout is in
    the predicted top K. A file holding runs of several machines is reported a section per
    machine; --machine picks one.
    """
    from axoplan.errors import AxoplanError
    from axoplan.fileio import check_readable, check_writable
    from axoplan.validate.compare import aggregate
    from axoplan.validate.compare import validate as compare
    from axoplan.validate.coverage import coverage, format_coverage
    from axoplan.validate.records import load_runs
    from axoplan.validate.report import format_validation

    if out is not None and out.suffix not in {".csv", ".json"}:
        raise AxoplanError(f"--out {out} must end in .csv or .json")
    if out is not None:
        check_writable(out, force, "--out")
    if probe is not None:
        check_readable(probe, "--probe")
        typer.echo(f"predicting with the host, GEMM and op-class measurements of {probe} merged into each machine",
                   err=True)
    if plots is not None and plots.exists() and not plots.is_dir():
        raise AxoplanError(f"--plots {plots} is a file; give a folder")
    sections = machine_sections(load_runs(runs), machine, any_device, probe)
    results = [compare(measured, mach, top_k) for mach, measured in sections]
    if out is not None:
        _write_table([r.table for r in results], out, force)
    if plots is not None:
        _write_plots(results, plots, force)
    for i, ((mach, measured), result) in enumerate(zip(sections, results, strict=True)):
        if len(sections) > 1:
            typer.echo(("\n" if i else "") + f"== {mach.name} ({i + 1} of {len(sections)} machines) ==\n")
        typer.echo(format_validation(result, rows=not summary_only))
        typer.echo(format_coverage(coverage(aggregate(measured), mach, 0.8), per_scenario=not summary_only))


def machine_sections(measured: list[Any], machine: str | None, any_device: bool,
                     probe: Path | None = None) -> list[tuple[Any, list[Any]]]:
    """(machine, its runs) per machine to report: the one `--machine` names, the runs of other machines
    skipped with a one-line note; without it, every machine the runs were recorded on, in file order. With
    `probe`, each machine has that probe fragment merged in."""
    from axoplan.validate.records import by_machine, runs_of_machine, skipped_note

    if machine is not None:
        mach = resolve_machine(machine, probe)
        kept, skipped = runs_of_machine(measured, mach, machine, any_device)
        if skipped:
            typer.echo(skipped_note(skipped, mach), err=True)
        return [(mach, kept)]
    sections = []
    for name, group in by_machine(measured).items():
        mach = resolve_machine(group[0].plan.machine, probe)
        sections.append((mach, runs_of_machine(group, mach, name, any_device)[0]))
    return sections


def resolve_machine(ref: str, probe: Path | None = None) -> Any:
    """The machine named by `ref` (with the `probe` fragment merged in); a recorded YAML path that is gone falls
    back to its stem's shipped machine."""
    from axoplan.errors import AxoplanError
    from axoplan.inputs.machine import load_machine

    try:
        return load_machine(ref, probe)
    except AxoplanError as err:
        stem = Path(ref).stem
        if ref.endswith((".yaml", ".yml")) and not Path(ref).exists():
            try:
                return load_machine(stem, probe)
            except AxoplanError:
                pass
        raise AxoplanError(f"machine of the runs: {err}") from None


def _write_table(tables: list[Any], out: Path, force: bool) -> None:
    import pandas as pd

    from axoplan.fileio import write_text_atomic

    table = pd.concat(tables, ignore_index=True)
    text = table.to_json(orient="records", indent=1) + "\n" if out.suffix == ".json" else table.to_csv(index=False)
    write_text_atomic(out, text, force=force)
    typer.echo(f"wrote the per-plan table to {out}", err=True)


def _write_plots(results: list[Any], folder: Path, force: bool) -> None:
    """Each machine's figures; with several machines each name ends in ``-<machine>``."""
    from axoplan.errors import AxoplanError
    from axoplan.fileio import make_folder
    from axoplan.validate import plots

    if folder.exists() and not folder.is_dir():
        raise AxoplanError(f"--plots {folder} is a file; give a folder")
    make_folder(folder, "--plots")
    names: list[str] = []
    for result in results:
        tag = f"-{result.machine.name}" if len(results) > 1 else ""
        figures = {f"predicted_vs_measured{tag}": plots.predicted_vs_measured(
                       result.table, f"{result.machine.name}: predicted vs measured"),
                   f"breakdown{tag}": plots.breakdown(result.table)}
        for name in figures:
            for suffix in (".png", ".svg"):
                plots.check_figure_path(folder / f"{name}{suffix}", force)
        for name, fig in figures.items():
            for suffix in (".png", ".svg"):
                plots.save_figure(fig, folder / f"{name}{suffix}", force=force)
        names += figures
    typer.echo(f"wrote {', '.join(f'{n}.png/.svg' for n in names)} to {folder}", err=True)
