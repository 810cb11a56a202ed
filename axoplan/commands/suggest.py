"""`axoplan suggest`: the k layouts worth measuring first (issue 10).

    axoplan suggest --model 20B --gpus 256 --machine perlmutter -k 4 [--out-dir plans/]

Ranks like `axoplan rank`, then picks by probability of being fastest (one per 4D layout)
and, with --out-dir, exports them through the same path as `axoplan export`. After the
runs are measured, `axoplan calibrate` narrows the machine's spread and the next
`suggest` narrows with it. Only typer and the standard library are imported at the top.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from axoplan.commands.options import GpusOpt, MachineOpt, ModelFlags, shared_options
from axoplan.commands.rank import Format

if TYPE_CHECKING:
    from axoplan.inputs.options import RunOptions
    from axoplan.search.fit import FitPolicy

__all__ = ["suggest"]


@shared_options(fit=True)
def suggest(
    *,
    gpus: GpusOpt,
    machine: MachineOpt = "frontier",
    k: Annotated[int, typer.Option("-k", min=1, help="Layouts to suggest.")] = 4,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="Output format (csv and json carry every "
                                        "column).")] = Format.table,
    wide: Annotated[bool, typer.Option("--wide", help="Table: every column, wider than 120 characters.")] = False,
    out_dir: Annotated[Path | None, typer.Option("--out-dir", help="Export the suggested layouts here.",
                                                 show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing plan.json / job.sh files.")] = False,
    allow_partial_nodes: Annotated[bool, typer.Option(
        "--allow-partial-nodes", help="With --out-dir: allow a GPU count that does not fill whole nodes.")] = False,
    run_options: RunOptions,
    model_flags: ModelFlags,
    fit_policy: FitPolicy,
) -> None:
    """Suggest the k layouts whose measurement most likely finds the truly fastest one.

    Takes the same model, machine and run options as `axoplan rank`.
    """
    from axoplan import report
    from axoplan.errors import AxoplanError
    from axoplan.inputs.machine import load_machine
    from axoplan.search.advice import explain_infeasible
    from axoplan.search.ranking import rank
    from axoplan.uncertainty.intervals import suggest_indices, with_intervals

    ranked = rank(model_flags.load(), load_machine(machine), run_options, gpus, fit_policy)
    if ranked.num_feasible == 0:
        raise AxoplanError(explain_infeasible(ranked))
    source = with_intervals(ranked)
    chosen = suggest_indices(source, k)
    covered = float(source.prediction.columns["p_best"][chosen].sum())
    if fmt is Format.table:
        typer.echo(report.format_table(source, len(chosen), rows=chosen, wide=wide))
    elif fmt is Format.csv:
        typer.echo(report.format_csv(source, chosen), nl=False)
    else:
        typer.echo(report.format_json(source, chosen), nl=False)
    typer.echo(f"{'this layout holds' if len(chosen) == 1 else f'these {len(chosen)} layouts hold'} P(best) = "
               f"{covered:.2f} together", err=True)
    if out_dir is not None:
        from axoplan.export import JobSettings, prepare_exports, write_exports

        exports = prepare_exports(source, machine, len(chosen), JobSettings(allow_partial_nodes=allow_partial_nodes),
                                  indices=chosen)
        write_exports(exports, out_dir, force)
        typer.echo(f"exported {len(exports)} suggested layouts to {out_dir}", err=True)
