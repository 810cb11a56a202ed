"""`axoplan explain`: one layout's collectives, compute and memory.

    axoplan explain --model 320B --gpus 32768 --machine frontier --layout 8x2x512x4

Only typer and the standard library are imported here; the work is imported when the
command runs, so `axoplan --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from axoplan.commands.options import GpusOpt, MachineOpt, ModelFlags, ProbeOpt, TokensOpt, shared_options

if TYPE_CHECKING:
    from axoplan.inputs.options import RunOptions
    from axoplan.search.fit import FitPolicy

__all__ = ["explain"]


@shared_options(fit=True)
def explain(
    *,
    gpus: GpusOpt,
    machine: MachineOpt = "frontier",
    probe: ProbeOpt = None,
    layout: Annotated[str | None, typer.Option("--layout", "-l", help="Gx x Gy x Gz x Gdata, e.g. 8x2x512x4.")] = None,
    rank_: Annotated[int | None, typer.Option("--rank", "-r", min=1, help="Explain the layout ranked N.")] = None,
    tokens: TokensOpt = None,
    wide: Annotated[bool, typer.Option("--wide", help="Every column (group strides, hidden seconds), lines "
                                       "unwrapped: wider than 120 characters.")] = False,
    trace: Annotated[Path | None, typer.Option(
        "--trace", help="A torch.profiler trace (.json or .json.gz) of one GPU's step of this layout: the op "
                        "ledger's seconds per class beside the trace's.", show_default=False)] = None,
    run_options: RunOptions,
    model_flags: ModelFlags,
    fit_policy: FitPolicy,
) -> None:
    """Explain one layout: each collective (group, size, bytes, bandwidth, time, hidden part),
    the compute breakdown and the memory per GPU.

    Give --layout (the best micro-batch and options for it are chosen unless fixed) or
    --rank N (default 1, the best layout; ranked as `axoplan rank` ranks, --fit-margin and --fit-risk included).
    With --trace, the op ledger's split by class beside a profiled step's (fix --micro-batch and --recompute
    to the traced step's).
    """
    from axoplan import report
    from axoplan.errors import AxoplanError
    from axoplan.inputs.machine import load_machine
    from axoplan.search.ranking import rank as do_rank
    from axoplan.space.layout import parse_layout

    spec, mach = model_flags.load(), load_machine(machine, probe)
    if layout is not None and rank_ is not None:
        raise AxoplanError("give --layout or --rank, not both")
    lay = parse_layout(layout) if layout is not None else None
    if lay is not None and lay.world_size != gpus:
        raise AxoplanError(f"layout {lay} uses {lay.world_size} GPUs but --gpus is {gpus}")
    result = do_rank(spec, mach, run_options, gpus, fit_policy)
    if lay is not None:
        index = result.index_of(lay)
    else:
        n = rank_ or 1
        if n > result.num_feasible:
            raise AxoplanError(f"--rank {n} but only {report.plural(result.num_feasible, 'layout')} "
                               f"{'is' if result.num_feasible == 1 else 'are'} feasible")
        index = int(result.order[n - 1])
    typer.echo(report.format_explain(result, index, wide))
    if tokens is not None and result.has_time(index):
        from axoplan.cost.budget import cost_line, parse_tokens

        typer.echo("\n" + cost_line(result, index, parse_tokens(tokens)))
    if trace is not None:
        from axoplan.records.trace import read_trace
        from axoplan.validate.trace_fit import explain_trace

        typer.echo("\n" + explain_trace(read_trace(trace), result, index))
