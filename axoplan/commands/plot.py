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
from typing import Annotated, Any

import typer

__all__ = ["register", "scaling", "breakdown", "intervals"]

OutOpt = Annotated[Path, typer.Option("--output", "-o", help="Figure to write: .png, .svg or .pdf.",
                                      show_default=False)]
MachineOpt = Annotated[str, typer.Option("--machine", help="Shipped machine or path to a machine YAML.")]
BatchOpt = Annotated[int, typer.Option("--global-batch", help="Sequences per optimizer step.", min=1)]
SeqOpt = Annotated[int, typer.Option("--seq-len", help="Tokens per sequence.", min=1)]
MbsOpt = Annotated[str, typer.Option("--micro-batch", help="Per-GPU micro-batch sizes to search, e.g. 1,2,4.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite the figure if it exists.")]


def register(app: typer.Typer, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Add the ``plot`` command group to `app`, each command wrapped by `wrap` (the CLI's error handler)."""
    group = typer.Typer(no_args_is_help=True, help="Draw predicted scaling and layout breakdowns (PNG/SVG/PDF).")
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


def _options(global_batch: int, seq_len: int, micro_batch: str) -> Any:
    from pydantic import ValidationError

    from axoplan.errors import AxoplanError
    from axoplan.options import RunOptions
    from axoplan.schema import describe_validation_error

    try:
        return RunOptions(global_batch=global_batch, seq_len=seq_len,
                          micro_batches=tuple(_ints(micro_batch, "--micro-batch")))
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, "run options", RunOptions)) from None


def scaling(
    output: OutOpt,
    machine: MachineOpt = "frontier",
    models: Annotated[str, typer.Option("--models", help="Comma-separated presets or model YAMLs.")] = "5B,20B,80B",
    gpus: Annotated[str | None, typer.Option(
        "--gpus", help="Comma-separated GPU counts (default: one node, then doubling up to 512 nodes).",
        show_default=False)] = None,
    global_batch: BatchOpt = 2048,
    seq_len: SeqOpt = 2048,
    micro_batch: MbsOpt = "1,2,4,8",
    force: ForceOpt = False,
) -> None:
    """Predicted TFLOP/s per GPU and seconds per iteration against GPU count, for several
    model sizes, using the best feasible layout at each count."""
    from axoplan.machine import load_machine
    from axoplan.model import load_model
    from axoplan.report import text_table
    from axoplan.validate import plots

    mach = load_machine(machine)
    specs = [load_model(name.strip()) for name in models.split(",") if name.strip()]
    counts = _ints(gpus, "--gpus") if gpus else [mach.devices_per_node * 2**k for k in range(10)]
    opts = _options(global_batch, seq_len, micro_batch)
    points = plots.scaling_points(mach, specs, counts, opts)
    plots.save_figure(plots.scaling(points, mach, opts), output, force=force)
    rows = [[r.model, str(r.gpus), r.layout or "none fits", f"{r.t_step_s:.4g}", f"{r.tflops_per_gpu:.1f}"]
            for r in points.itertuples()]
    typer.echo(text_table(["model", "GPUs", "best layout", "s/iter", "TFLOP/s/GPU"], rows,
                          [False, True, False, True, True]))
    typer.echo(f"\nwrote {output}")


def breakdown(
    output: OutOpt,
    model: Annotated[str, typer.Option("--model", "-m", help="Preset or path to a model YAML.", show_default=False)],
    gpus: Annotated[int, typer.Option("--gpus", "-g", help="Number of GPUs.", min=1, show_default=False)],
    machine: MachineOpt = "frontier",
    top: Annotated[int, typer.Option("--top", "-n", min=1, help="How many of the best layouts to draw.")] = 8,
    global_batch: BatchOpt = 2048,
    seq_len: SeqOpt = 2048,
    micro_batch: MbsOpt = "1,2,4,8",
    force: ForceOpt = False,
) -> None:
    """Stacked predicted breakdown (GEMM, non-GEMM, optimizer, exposed communication per
    axis) of the best layouts of --gpus GPUs."""
    from axoplan.machine import load_machine
    from axoplan.model import load_model
    from axoplan.ranking import rank
    from axoplan.validate import plots

    result = rank(load_model(model), load_machine(machine), _options(global_batch, seq_len, micro_batch), gpus)
    plots.save_figure(plots.top_layouts(result, top), output, force=force)
    typer.echo(f"wrote {output}")


def intervals(
    output: OutOpt,
    model: Annotated[str, typer.Option("--model", "-m", help="Preset or path to a model YAML.", show_default=False)],
    gpus: Annotated[int, typer.Option("--gpus", "-g", help="Number of GPUs.", min=1, show_default=False)],
    machine: MachineOpt = "frontier",
    top: Annotated[int, typer.Option("--top", "-n", min=1, help="How many of the best layouts to draw.")] = 10,
    global_batch: BatchOpt = 2048,
    seq_len: SeqOpt = 2048,
    micro_batch: MbsOpt = "1,2,4,8",
    force: ForceOpt = False,
) -> None:
    """The best layouts with their 80% prediction intervals and probability of being fastest."""
    from axoplan.machine import load_machine
    from axoplan.model import load_model
    from axoplan.ranking import rank
    from axoplan.uncertainty import with_intervals
    from axoplan.uncertainty_plot import intervals_figure
    from axoplan.validate import plots

    result = with_intervals(rank(load_model(model), load_machine(machine),
                                 _options(global_batch, seq_len, micro_batch), gpus))
    plots.save_figure(intervals_figure(result, top), output, force=force)
    typer.echo(f"wrote {output}")
