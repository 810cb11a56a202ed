"""`axoplan validate`: how far predictions are from measured runs, per run and overall.

    axoplan validate runs.jsonl
    axoplan validate data/measured/vtrain_a100_single_node_pp1.csv --machine dgx-a100 --plots figs/

Only typer and the standard library are imported here; the work is imported when the
command runs, so `axoplan --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["validate", "resolve_machine"]

RunsArg = Annotated[list[Path], typer.Argument(
    help="Measured runs: the executor's .jsonl records, an axoplan measured-run .csv, or the vTrain A100 .csv "
         "(docs/validate.md).", show_default=False)]


def validate(
    runs: RunsArg,
    machine: Annotated[str | None, typer.Option(
        "--machine", help="Machine to predict on (name or YAML, e.g. a calibrated one); default: the machine "
                          "the runs were recorded on.", show_default=False)] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="Is the measured best in the predicted "
                                                                     "top K of its scenario?")] = 3,
    plots: Annotated[Path | None, typer.Option(
        "--plots", help="Folder for predicted_vs_measured and breakdown figures (.png and .svg).",
        show_default=False)] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the per-plan table to this .csv or "
                                             ".json file.", show_default=False)] = None,
    summary_only: Annotated[bool, typer.Option("--summary-only", help="Print only the summary.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing --out and figure files.")] = False,
    any_device: Annotated[bool, typer.Option(
        "--any-device", help="Compare runs measured on another kind of device too (a CPU rehearsal of a GPU "
                             "plan); refused by default.")] = False,
) -> None:
    """Compare measured seconds per iteration with the prediction for each run's plan.

    Prints each plan's measured and predicted time and error, then the mean absolute
    percentage error, the worst case, Kendall tau and Spearman rho of the ordering, and
    per scenario (same model, batch and GPU count) whether the measured best layout is in
    the predicted top K.
    """
    from axoplan.errors import AxoplanError
    from axoplan.fileio import check_writable
    from axoplan.validate.compare import validate as compare
    from axoplan.validate.records import check_machine, load_runs, recorded_machine
    from axoplan.validate.report import format_validation

    if out is not None and out.suffix not in {".csv", ".json"}:
        raise AxoplanError(f"--out {out} must end in .csv or .json")
    if out is not None:
        check_writable(out, force, "--out")
    if plots is not None and plots.exists() and not plots.is_dir():
        raise AxoplanError(f"--plots {plots} is a file; give a folder")
    measured = load_runs(runs)
    ref = machine or recorded_machine(measured)
    mach = resolve_machine(ref)
    check_machine(measured, mach, ref, any_device=any_device)
    result = compare(measured, mach, top_k)
    if out is not None:
        _write_table(result.table, out, force)
    if plots is not None:
        _write_plots(result, plots, force)
    typer.echo(format_validation(result, rows=not summary_only))
    from axoplan.validate.compare import aggregate
    from axoplan.validate.coverage import coverage, format_coverage

    typer.echo(format_coverage(coverage(aggregate(measured), mach, 0.8)))


def resolve_machine(ref: str) -> Any:
    """The machine named by `ref`; a recorded YAML path that is gone falls back to its stem's shipped machine."""
    from axoplan.errors import AxoplanError
    from axoplan.inputs.machine import load_machine

    try:
        return load_machine(ref)
    except AxoplanError as err:
        stem = Path(ref).stem
        if ref.endswith((".yaml", ".yml")) and not Path(ref).exists():
            try:
                return load_machine(stem)
            except AxoplanError:
                pass
        raise AxoplanError(f"machine of the runs: {err}") from None


def _write_table(table: Any, out: Path, force: bool) -> None:
    from axoplan.fileio import write_text_atomic

    text = table.to_json(orient="records", indent=1) + "\n" if out.suffix == ".json" else table.to_csv(index=False)
    write_text_atomic(out, text, force=force)
    typer.echo(f"wrote the per-plan table to {out}", err=True)


def _write_plots(result: Any, folder: Path, force: bool) -> None:
    from axoplan.errors import AxoplanError
    from axoplan.fileio import make_folder
    from axoplan.validate import plots

    if folder.exists() and not folder.is_dir():
        raise AxoplanError(f"--plots {folder} is a file; give a folder")
    make_folder(folder, "--plots")
    figures = {"predicted_vs_measured": plots.predicted_vs_measured(result.table, f"{result.machine.name}: "
                                                                    "predicted vs measured"),
               "breakdown": plots.breakdown(result.table)}
    for name, fig in figures.items():
        for suffix in (".png", ".svg"):
            plots.save_figure(fig, folder / f"{name}{suffix}", force=force)
    typer.echo(f"wrote {', '.join(f'{n}.png/.svg' for n in figures)} to {folder}", err=True)
