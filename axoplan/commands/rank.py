"""`axoplan rank`: every layout of --gpus GPUs by predicted seconds per iteration.

    axoplan rank --model 320B --gpus 32768 --machine frontier

Only typer and the standard library are imported here; the work is imported when the
command runs, so `axoplan --help` stays fast.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from axoplan.commands.options import GpusOpt, MachineOpt, ModelFlags, ProbeOpt, TokensOpt, shared_options

if TYPE_CHECKING:
    from axoplan.inputs.options import RunOptions
    from axoplan.search.fit import FitPolicy

__all__ = ["rank", "Format"]


class Format(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


@shared_options(fit=True)
def rank(
    *,
    gpus: GpusOpt,
    machine: MachineOpt = "frontier",
    probe: ProbeOpt = None,
    top: Annotated[int, typer.Option("--top", "-n", min=1, help="Rows to show.")] = 10,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write ALL candidates (feasible or not, "
                                             "with reasons) to this .csv or .json file.")] = None,
    infeasible: Annotated[bool, typer.Option("--infeasible", help="Show infeasible rows and why.")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="Table: every column (the axes apart, HFU, exposed "
                                       "communication), wider than 120 characters.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --out if it exists.")] = False,
    level: Annotated[float, typer.Option("--level", min=0.01, max=0.99, help="Central probability of the "
                                         "prediction interval (0.8: 10th-90th percentile).")] = 0.8,
    tokens: TokensOpt = None,
    max_nodes: Annotated[int | None, typer.Option("--max-nodes", min=1, help="Refuse runs on more nodes.",
                                                  show_default=False)] = None,
    max_node_hours: Annotated[float | None, typer.Option(
        "--max-node-hours", min=0, help="Keep layouts whose --tokens run fits this many node-hours.",
        show_default=False)] = None,
    run_options: RunOptions,
    model_flags: ModelFlags,
    fit_policy: FitPolicy,
) -> None:
    """Rank every Gx x Gy x Gz x Gdata layout of --gpus GPUs by predicted seconds per iteration.

    Micro-batch sizes, activation recompute and weight caching are searched too. Infeasible
    candidates (dimensions not divisible, batch not divisible, out of memory) stay in the
    --out table with their reason; --infeasible prints them. A layout whose fit in memory is in
    doubt never ranks above one that fits and is at most --fit-margin slower (P(fit): the
    probability that it fits).
    """
    from axoplan import report
    from axoplan.errors import AxoplanError
    from axoplan.fileio import check_writable, write_text_atomic
    from axoplan.inputs.machine import load_machine
    from axoplan.search.advice import explain_infeasible
    from axoplan.search.ranking import rank as do_rank

    spec, mach = model_flags.load(), load_machine(machine, probe)
    if gpus < 1:
        raise AxoplanError(f"--gpus must be a positive number of GPUs, got {gpus}")
    if out is not None and out.suffix not in {".csv", ".json"}:
        raise AxoplanError(f"--out {out} must end in .csv or .json")
    if out is not None:
        check_writable(out, force, "--out")
    from axoplan.cost.budget import budget_checks
    from axoplan.uncertainty.intervals import with_intervals

    n_tokens = budget_checks(tokens, gpus, mach.devices_per_node, max_nodes, max_node_hours)
    result = with_intervals(do_rank(spec, mach, run_options, gpus, fit_policy), level=level)
    if out is not None:
        full = [int(i) for i in result.order]
        text = (report.format_json(result, full, n_tokens) if out.suffix == ".json"
                else report.format_csv(result, full, n_tokens))
        write_text_atomic(out, text, force=force)
    if result.num_feasible == 0 and not infeasible:
        raise AxoplanError(explain_infeasible(result))
    rows = report.selected_rows(result, top, infeasible)
    if max_node_hours is not None and n_tokens is not None and not infeasible:
        rows = _within_node_hours(result, n_tokens, max_node_hours)[:top]
    if fmt is Format.table:
        typer.echo(report.format_table(result, top, infeasible, tokens=n_tokens, rows=rows, wide=wide))
    elif fmt is Format.csv:
        typer.echo(report.format_csv(result, rows, n_tokens), nl=False)
    else:
        typer.echo(report.format_json(result, rows, n_tokens), nl=False)
    if out is not None:
        typer.echo(f"wrote all {len(result.candidates)} candidates to {out}", err=True)


def _within_node_hours(result: Any, tokens: int, max_node_hours: float) -> list[int]:
    """The feasible rows, in rank order, whose run of `tokens` fits `max_node_hours` (an error naming the cheapest
    when none does). Not a prefix: the fit rule can rank a slower, dearer layout above a cheaper one in doubt."""
    from axoplan.cost.budget import rows_within_node_hours, run_cost

    rows_within_node_hours(result, tokens, max_node_hours)  # refuses when no row fits
    t_step_s = result.column("t_step_s")
    o = result.options
    return [int(i) for i in result.order[: result.num_feasible]
            if run_cost(tokens, o.global_batch, o.seq_len, float(t_step_s[i]), result.world_size,
                        result.machine.devices_per_node).node_hours <= max_node_hours]
