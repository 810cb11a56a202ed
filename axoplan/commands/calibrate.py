"""`axoplan calibrate`: fit a machine's efficiencies and latencies to measured runs.

    axoplan calibrate runs.jsonl --machine local-cpu -o local-cpu-calibrated.yaml
    axoplan calibrate data/measured/vtrain_a100_single_node_pp1.csv --machine dgx-a100 \\
        -o dgx-a100-calibrated.yaml --holdout 0.3 --seed 0
    axoplan calibrate --trace trace.json.gz --machine dgx-h100 -o h100-mine.yaml --model config.json \\
        --framework hf-transformers --global-batch 4 --micro-batch 4 --recompute off

Only typer and the standard library are imported here; the work is imported when the
command runs, so `axoplan --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from axoplan.commands.options import ModelFlags, shared_options
from axoplan.commands.validate import RunsArg

if TYPE_CHECKING:
    from axoplan.inputs.options import RunOptions

__all__ = ["calibrate"]

OptionalRunsArg = Annotated[list[Path] | None, typer.Argument(
    help=RunsArg.__metadata__[0].help + " Not with --trace.", show_default=False)]


def _holdout_by(text: str) -> Literal["plan", "model"]:
    from axoplan.errors import AxoplanError

    if text == "plan":
        return "plan"
    if text == "model":
        return "model"
    raise AxoplanError(f"--holdout-by {text!r}: give 'plan' or 'model'")


@shared_options()
def calibrate(
    runs: OptionalRunsArg = None,
    *,
    machine: Annotated[str, typer.Option("--machine", help="Machine to calibrate (name or YAML); every run must "
                                         "have been recorded on it.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Calibrated machine YAML to write.",
                                         show_default=False)],
    holdout: Annotated[float, typer.Option("--holdout", help="Fraction of the plans kept out of the fit to "
                                           "measure how it generalises (0 fits on all).")] = 0.3,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random training/held-out split.")] = 0,
    holdout_by: Annotated[str, typer.Option(
        "--holdout-by", help="What is held out: 'plan' (random plans) or 'model' (every plan of randomly chosen "
                             "model sizes, so the check is on sizes the fit never saw).")] = "plan",
    params: Annotated[str | None, typer.Option(
        "--params", help="Comma-separated parameters to fit (default: every one the runs constrain), e.g. "
                         "gemm.max_efficiency,intra_node.latency_us.", show_default=False)] = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, help="Top-k used in the reported metrics.")] = 3,
    prior: Annotated[bool, typer.Option(
        "--prior/--no-prior", help="Keep each parameter near its sourced value unless the runs outweigh its "
                                   "prior spread (maximum a posteriori); --no-prior: plain least squares.")] = True,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --output if it exists.")] = False,
    even_if_worse: Annotated[bool, typer.Option(
        "--even-if-worse", help="Write --output even when the calibrated machine is worse than the original on "
                                "the held-out plans (refused by default; its header then says so).")] = False,
    trace: Annotated[Path | None, typer.Option(
        "--trace", help="Fit the op classes' constants to a torch.profiler trace (.json or .json.gz) of one "
                        "GPU's training step instead of runs; give the step as to explain (--model, --framework, "
                        "--global-batch: its sequences, one --micro-batch, --recompute on|off).",
        show_default=False)] = None,
    run_options: RunOptions,
    model_flags: ModelFlags,
) -> None:
    """Fit a machine's efficiencies and latencies to measured runs; write a calibrated YAML.

    Least squares over GEMM, attention and memory efficiency, collective bandwidth
    efficiency and latency and the host's cost per op (those the runs constrain), with each
    parameter's prior (its sourced range or how it is sourced) as extra residuals unless
    --no-prior. The plans are split by --seed into a fitted part and a held-out part
    (--holdout); the error before and after the fit is printed for both. Where the calibrated
    machine is worse on the held-out plans it is not recommended and not written (exit 2)
    unless --even-if-worse. A file holding runs of several machines is fitted on the runs of
    --machine; the others are skipped with a note. The YAML keeps the original's comments,
    marks the fitted lines and records the fit in a header.

    With --trace: each op class's constant (a memory-bound class's share of HBM bandwidth, the
    attention curve, gemm.max_efficiency; host.op_us where the device waited) fitted so the op
    ledger's seconds per class match the trace's, each near its sourced prior
    (docs/validate.md, "Calibrating from a trace").
    """
    if trace is not None:
        _no_run_flags(runs, params)
        _calibrate_trace(trace, machine, output, force, prior, run_options, model_flags)
        return
    _no_step_flags(runs, model_flags)
    import sys
    import time
    from datetime import UTC, datetime

    from axoplan.errors import AxoplanError
    from axoplan.fileio import check_writable, write_text_atomic
    from axoplan.inputs.machine import load_machine, machines_dir
    from axoplan.validate.calibrate import calibrate as fit
    from axoplan.validate.records import load_runs, runs_of_machine, skipped_note
    from axoplan.validate.report import calibration_header, calibration_verdict, format_calibration
    from axoplan.validate.yamledit import machine_yaml

    if output.suffix not in {".yaml", ".yml"}:
        raise AxoplanError(f"-o {output} must end in .yaml or .yml")
    check_writable(output, force)
    mach = load_machine(machine)
    measured, skipped = runs_of_machine(load_runs(runs or []), mach, machine)
    if skipped:
        typer.echo(skipped_note(skipped, mach), err=True)
    names = [p.strip() for p in params.split(",") if p.strip()] if params else None
    interactive = sys.stderr.isatty()  # progress for a person at a terminal; logs keep one-line errors
    if interactive:
        how = "maximum a posteriori" if prior else "least squares"
        typer.echo(f"fitting {mach.name} to {len(measured)} runs by {how} (a few seconds per hundred plans)...",
                   err=True)
    started = time.perf_counter()
    result = fit(measured, mach, names, holdout, seed, top_k, holdout_by=_holdout_by(holdout_by), prior=prior)
    if interactive:
        typer.echo(f"fitted in {time.perf_counter() - started:.1f} s", err=True)
    if result.worse_on_holdout and not even_if_worse:
        typer.echo(format_calibration(result))
        raise AxoplanError(f"{calibration_verdict(result)}; {output} not written (--even-if-worse writes it)")
    source = _yaml_path(machine)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    shipped = source.resolve().parent == machines_dir().resolve()
    header = calibration_header(result, [str(p) for p in runs or []],
                                f"machines/{source.name}" if shipped else str(source), when)
    values = {f.path: f.after for f in result.fitted}
    text = machine_yaml(source.read_text(), result.calibrated, values, header, f"calibrated {when[:10]}")
    write_text_atomic(output, text, force=force)
    if load_machine(output) != result.calibrated:
        raise AxoplanError(f"{output} does not read back as the calibrated machine; please report this")
    typer.echo(format_calibration(result))
    typer.echo(f"\nwrote {output}; use it with --machine {output}")


def _no_run_flags(runs: list[Path] | None, params: str | None) -> None:
    """Refuse, with --trace, what only a fit to runs takes."""
    from axoplan.errors import AxoplanError

    if runs:
        raise AxoplanError("give measured runs or --trace FILE, not both")
    if params is not None:
        raise AxoplanError("--params chooses what runs fit; with --trace each class the trace and the ledger both "
                           "time sets its own constant")


def _no_step_flags(runs: list[Path] | None, model_flags: ModelFlags) -> None:
    """Refuse a call with neither runs nor --trace, and a model given without --trace (it describes a trace)."""
    from axoplan.errors import AxoplanError

    if not runs:
        raise AxoplanError("give measured runs (a .jsonl or .csv file), or --trace FILE with the traced step's "
                           "--model")
    if model_flags.name is not None or any(v is not None for v in model_flags.custom.values()):
        raise AxoplanError("--model and the custom model flags describe a traced step: give them with --trace; "
                           "measured runs name their own models")


def _calibrate_trace(trace: Path, machine: str, output: Path, force: bool, prior: bool, run_options: RunOptions,
                     model_flags: ModelFlags) -> None:
    """`calibrate --trace`: fit the op classes to the trace; write the calibrated YAML (axoplan.validate.trace_fit)."""
    import sys
    from datetime import UTC, datetime

    from axoplan.errors import AxoplanError
    from axoplan.fileio import check_writable, write_text_atomic
    from axoplan.inputs.machine import load_machine, machines_dir
    from axoplan.records.trace import read_trace
    from axoplan.validate.trace_fit import TracedStep, fit_trace, format_trace_fit, trace_header, trace_machine_yaml

    if output.suffix not in {".yaml", ".yml"}:
        raise AxoplanError(f"-o {output} must end in .yaml or .yml")
    check_writable(output, force)
    step = TracedStep.of(model_flags.load(), run_options)
    mach = load_machine(machine)
    summary = read_trace(trace)
    if sys.stderr.isatty():  # progress for a person at a terminal; logs keep one-line errors
        typer.echo(f"fitting {mach.name}'s op classes to {trace} (a few seconds)...", err=True)
    fit = fit_trace(summary, step, mach, prior=prior)
    source = _yaml_path(machine)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    shipped = source.resolve().parent == machines_dir().resolve()
    header = trace_header(fit, str(trace), f"machines/{source.name}" if shipped else str(source), when)
    text = trace_machine_yaml(fit, source.read_text(), header, f"calibrated {when[:10]} from a trace")
    write_text_atomic(output, text, force=force)
    if load_machine(output) != fit.calibrated:
        raise AxoplanError(f"{output} does not read back as the calibrated machine; please report this")
    typer.echo(format_trace_fit(fit))
    typer.echo(f"\nwrote {output}; use it with --machine {output}")


def _yaml_path(machine: str) -> Path:
    from axoplan.inputs.machine import machines_dir

    path = Path(machine)
    if path.suffix in {".yaml", ".yml"} or path.exists():
        return path
    return machines_dir() / f"{machine}.yaml"
