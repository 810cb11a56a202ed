"""`axoplan suggest`: the k layouts worth measuring first (issue 10).

    axoplan suggest --model 20B --gpus 256 --machine perlmutter -k 4 [--out-dir plans/]

Ranks like `axoplan rank`, then picks by probability of being fastest (one per 4D layout)
and, with --out-dir, exports them through the same path as `axoplan export`. After the
runs are measured, `axoplan calibrate` narrows the machine's spread and the next
`suggest` narrows with it. Only typer and the standard library are imported at the top.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["suggest"]


def suggest(
    model: Annotated[str | None, typer.Option("--model", "-m", help="Preset or model YAML.")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", "-g", min=1, help="Number of GPUs.")] = None,
    machine: Annotated[str, typer.Option("--machine", help="Shipped machine or YAML path.")] = "frontier",
    global_batch: Annotated[int, typer.Option("--global-batch", min=1, help="Sequences per step.")] = 2048,
    seq_len: Annotated[int, typer.Option("--seq-len", min=1, help="Tokens per sequence.")] = 2048,
    k: Annotated[int, typer.Option("-k", min=1, help="Layouts to suggest.")] = 4,
    out_dir: Annotated[Path | None, typer.Option("--out-dir", help="Export the suggested layouts here.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing plan.json / job.sh files.")] = False,
) -> None:
    """Suggest the k layouts whose measurement most likely finds the truly fastest one."""
    from axoplan import report
    from axoplan.cli import Choice
    from axoplan.commands.export import _fresh, _settings
    from axoplan.uncertainty import suggest_indices, with_intervals

    options = (global_batch, seq_len, "1,2,4,8", Choice.search, Choice.search, True, True, True, False)
    source = with_intervals(_fresh(model, gpus, machine, options, {}))
    chosen = suggest_indices(source, k)
    covered = float(source.prediction.columns["p_best"][chosen].sum())
    typer.echo(report.format_csv(source, chosen), nl=False)
    typer.echo(f"these {len(chosen)} layouts hold P(best) = {covered:.2f} together", err=True)
    if out_dir is not None:
        from axoplan.export import prepare_exports, write_exports

        exports = prepare_exports(source, machine, len(chosen), _settings(), indices=chosen)
        write_exports(exports, out_dir, force)
        typer.echo(f"exported {len(exports)} suggested layouts to {out_dir}", err=True)
