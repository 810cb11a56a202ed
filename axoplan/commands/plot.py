"""`axoplan plot scaling|breakdown`: pictures of the predictions (PNG, SVG or PDF by extension).

    axoplan plot scaling --machine frontier --models 5B,20B,80B -o scaling.png
    axoplan plot breakdown --model 20B --gpus 1024 --machine frontier --top 8 -o top.svg

Only typer and the standard library are imported here; the work is imported when the
command runs, so `axoplan --help` stays fast. :func:`register` adds the ``plot`` group
to the main app (called from axoplan/cli.py with its error wrapper).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from axoplan.commands.options import ModelFlags, TokensOpt, shared_options

if TYPE_CHECKING:
    from axoplan.inputs.options import RunOptions

__all__ = ["register", "scaling", "breakdown", "intervals"]

OutOpt = Annotated[Path, typer.Option("--output", "-o", help="Figure to write: .png, .svg or .pdf.",
                                      show_default=False)]
MachineOpt = Annotated[str, typer.Option("--machine", help="Shipped machine or path to a machine YAML.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite the figure if it exists.")]


def register(app: typer.Typer, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Add the ``plot`` command group to `app`, each command wrapped by `wrap` (the CLI's error handler)."""
    group = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Draw predicted scaling and layout breakdowns (PNG/SVG/PDF).")
    group.command("scaling")(wrap(scaling))
    group.command("breakdown")(wrap(breakdown))
    group.command("intervals")(wrap(intervals))
    app.add_typer(group, name="plot")


def _ints(text: str, flag: str) -> list[int]:
    from axoplan.errors import AxoplanError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise AxoplanError(f"{flag} {text!r} must be comma-separated whole numbers, e.g. 64,128,256") from None
    if not values or min(values) < 1:
        raise AxoplanError(f"{flag} {text!r} must list positive whole numbers")
    return values


@shared_options(model=False)
def scaling(
    output: OutOpt,
    machine: MachineOpt = "frontier",
    models: Annotated[str, typer.Option("--models", help="Comma-separated presets or model YAMLs.")] = "5B,20B,80B",
    gpus: Annotated[str | None, typer.Option(
        "--gpus", help="Comma-separated GPU counts (default: one node, then doubling up to 512 nodes).",
        show_default=False)] = None,
    force: ForceOpt = False,
    tokens: TokensOpt = None,
    *,
    run_options: RunOptions,
) -> None:
    """Predicted model TFLOP/s per GPU (MFU) and seconds per iteration against GPU count, for several
    model sizes, using the best feasible layout at each count. With --tokens, a second row
    of panels shows days to train and node-hours, so you see where adding GPUs stops paying."""
    from axoplan.cost.budget import parse_tokens
    from axoplan.errors import AxoplanError
    from axoplan.inputs.machine import load_machine
    from axoplan.inputs.model import load_model
    from axoplan.validate import plots

    n_tokens = parse_tokens(tokens) if tokens is not None else None
    plots.check_figure_path(output, force)
    mach = load_machine(machine)
    specs = [load_model(name.strip()) for name in models.split(",") if name.strip()]
    if not specs:
        raise AxoplanError(f"--models {models!r} names no model; give presets or model YAMLs, e.g. 5B,20B,80B")
    counts = _ints(gpus, "--gpus") if gpus else [mach.devices_per_node * 2**k for k in range(10)
                                                  if mach.nodes is None or 2**k <= mach.nodes]
    opts = run_options
    points = plots.scaling_points(mach, specs, counts, opts)
    if n_tokens is not None:
        points = plots.scaling_costs(points, n_tokens, opts, mach.devices_per_node)
    plots.save_figure(plots.scaling(points, mach, opts, n_tokens), output, force=force)
    typer.echo(_scaling_table(points, n_tokens is not None))
    if n_tokens is not None:
        typer.echo("\n" + "\n".join(plots.cost_summary(points)))
    typer.echo(f"\nwrote {output}")


def _scaling_table(points: Any, costs: bool) -> str:
    from axoplan.report import text_table

    head = ["model", "GPUs", "best layout", "s/iter", "MFU %"] + (["days", "node-hours"] if costs else [])
    rows = []
    for r in points.itertuples():
        row = [r.model, str(r.gpus), r.layout or "none fits", f"{r.t_step_s:.4g}", f"{r.mfu:.1f}"]
        if costs:
            row += [f"{r.days:.1f}", f"{r.node_hours:,.0f}"]
        rows.append(row)
    return text_table(head, rows, [False, True, False, True, True] + [True, True] * costs)


@shared_options()
def breakdown(
    output: OutOpt,
    gpus: Annotated[int, typer.Option("--gpus", "-g", help="Number of GPUs.", min=1, show_default=False)],
    machine: MachineOpt = "frontier",
    top: Annotated[int, typer.Option("--top", "-n", min=1, help="How many of the best layouts to draw.")] = 8,
    force: ForceOpt = False,
    *,
    run_options: RunOptions,
    model_flags: ModelFlags,
) -> None:
    """Stacked predicted breakdown (GEMM, non-GEMM, optimizer, exposed communication per
    axis) of the best layouts of --gpus GPUs, each total with its 80% prediction interval."""
    from axoplan.inputs.machine import load_machine
    from axoplan.report import text_table
    from axoplan.search.ranking import rank
    from axoplan.uncertainty.intervals import with_intervals
    from axoplan.validate import plots

    plots.check_figure_path(output, force)
    result = with_intervals(rank(model_flags.load(), load_machine(machine), run_options, gpus))
    plots.save_figure(plots.top_layouts(result, top), output, force=force)
    cols, c = result.prediction.columns, result.candidates
    rows = [[str(c.layout(i)), str(c.micro_batch[i]), f"{cols['t_step_s'][i]:.6g}", f"{cols['t_low_s'][i]:.6g}",
             f"{cols['t_high_s'][i]:.6g}"] for i in result.top_feasible(top)]
    typer.echo(text_table(["layout", "mbs", "s/iter", "80% low", "80% high"], rows, [False, True, True, True, True]))
    typer.echo(f"\nwrote {output}")


@shared_options()
def intervals(
    output: OutOpt,
    gpus: Annotated[int, typer.Option("--gpus", "-g", help="Number of GPUs.", min=1, show_default=False)],
    machine: MachineOpt = "frontier",
    top: Annotated[int, typer.Option("--top", "-n", min=1, help="How many of the best layouts to draw.")] = 10,
    force: ForceOpt = False,
    *,
    run_options: RunOptions,
    model_flags: ModelFlags,
) -> None:
    """The best layouts with their 80% prediction intervals and probability of being fastest."""
    from axoplan.inputs.machine import load_machine
    from axoplan.search.ranking import rank
    from axoplan.uncertainty.intervals import with_intervals
    from axoplan.uncertainty.plot import intervals_figure
    from axoplan.validate import plots

    plots.check_figure_path(output, force)
    result = with_intervals(rank(model_flags.load(), load_machine(machine), run_options, gpus))
    plots.save_figure(intervals_figure(result, top), output, force=force)
    typer.echo(f"wrote {output}")
