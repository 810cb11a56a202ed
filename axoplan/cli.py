"""The `axoplan` command line: declarations only; the work lives in the library.

    axoplan rank --model 320B --gpus 32768 --machine frontier
    axoplan explain --model 320B --gpus 32768 --machine frontier --layout 8x2x512x4
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from axoplan.errors import AxoplanError

app = typer.Typer(
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Rank AxoNN 4D layouts (Gx x Gy x Gz x Gdata) by predicted iteration time, and explain why.",
)

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Report an AxoplanError as one line on stderr and exit 2, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AxoplanError as err:
            typer.echo(f"axoplan: error: {err}", err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


class Format(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


class Choice(StrEnum):
    on = "on"
    off = "off"
    search = "search"


ModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", help="Preset (see `axoplan models`) or path to a model YAML.", show_default=False)]
GpusOpt = Annotated[int, typer.Option("--gpus", "-g", help="Number of GPUs (GCDs on Frontier).")]
MachineOpt = Annotated[str, typer.Option(
    "--machine", help="Shipped machine (see `axoplan machines`) or path to a machine YAML.")]
BatchOpt = Annotated[int, typer.Option("--global-batch", help="Sequences per optimizer step.")]
SeqOpt = Annotated[int, typer.Option("--seq-len", help="Tokens per sequence.")]
MbsOpt = Annotated[str, typer.Option("--micro-batch", help="Per-GPU micro-batch sizes to search, e.g. 1,2,4.")]
RecomputeOpt = Annotated[Choice, typer.Option("--recompute", help="Full activation recompute.")]
CacheOpt = Annotated[Choice, typer.Option("--cache-weights", help="Keep Z-gathered weights for the backward.")]
OarOpt = Annotated[bool, typer.Option("--oar/--no-oar", help="Overlap the backward all-reduce (OAR).")]
OrsOpt = Annotated[bool, typer.Option("--ors/--no-ors", help="Overlap Z reduce-scatters (ORS).")]
OagOpt = Annotated[bool, typer.Option("--oag/--no-oag", help="Prefetch Z all-gathers (OAG).")]
FwdArOpt = Annotated[bool, typer.Option(
    "--overlap-forward-all-reduce/--no-overlap-forward-all-reduce", help="2-chunk forward all-reduce overlap.")]
LayersOpt = Annotated[int | None, typer.Option("--layers", help="Custom model: number of layers.", min=1)]
HiddenOpt = Annotated[int | None, typer.Option("--hidden", help="Custom model: hidden size.", min=1)]
HeadsOpt = Annotated[int | None, typer.Option("--heads", help="Custom model: attention heads.", min=1)]
KvOpt = Annotated[int | None, typer.Option("--kv-heads", help="Custom model: KV heads (GQA).", min=1)]
FfnOpt = Annotated[int | None, typer.Option("--ffn-hidden", help="Custom model: FFN width.", min=1)]
TokensOpt = Annotated[str | None, typer.Option(
    "--tokens", help="Tokens to train (e.g. 300B, 1.5T, 2e12): adds days, node-hours and GPU-hours.")]
VocabOpt = Annotated[int | None, typer.Option("--vocab", help="Custom model: vocabulary size.", min=1)]


def _setup(model: str | None, machine: str, global_batch: int, seq_len: int, micro_batch: str,
           recompute: Choice, cache_weights: Choice, oar: bool, ors: bool, oag: bool, fwd_ar: bool,
           **custom: int | None) -> tuple[Any, Any, Any]:
    """Load the model, machine and run options named on the command line."""
    from pydantic import ValidationError

    from axoplan.machine import load_machine
    from axoplan.model import load_model
    from axoplan.options import RunOptions
    from axoplan.schema import describe_validation_error

    spec = _model(model, custom, load_model)
    mach = load_machine(machine)
    try:
        mbs = tuple(int(v) for v in micro_batch.split(",") if v.strip())
    except ValueError:
        raise AxoplanError(f"--micro-batch {micro_batch!r} must be comma-separated integers, e.g. 1,2,4") from None
    try:
        opts = RunOptions(global_batch=global_batch, seq_len=seq_len, micro_batches=mbs,
                          recompute=recompute.value, cache_weights=cache_weights.value, overlap_all_reduce=oar,
                          overlap_reduce_scatter=ors, overlap_all_gather=oag, overlap_forward_all_reduce=fwd_ar)
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, "run options", RunOptions)) from None
    return spec, mach, opts


def _model(model: str | None, custom: dict[str, int | None], load: Callable[..., Any]) -> Any:
    fields = {"layers": "num_layers", "hidden": "hidden", "heads": "num_heads", "kv_heads": "num_kv_heads",
              "ffn_hidden": "ffn_hidden", "vocab": "vocab"}
    overrides = {fields[k]: v for k, v in custom.items() if v is not None}
    if model is not None:
        return load(model, **overrides)
    missing = [f"--{k}" for k in ("layers", "hidden", "heads") if custom.get(k) is None]
    if missing:
        raise AxoplanError(f"give --model NAME|PATH, or a custom model with {', '.join(missing)}")
    from pydantic import ValidationError

    from axoplan.model import ModelSpec
    from axoplan.schema import describe_validation_error

    try:
        return ModelSpec(**overrides)
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, "custom model", ModelSpec)) from None


def _write_new(path: Path, text: str, force: bool) -> None:
    from axoplan.fileio import write_text_atomic

    write_text_atomic(path, text, force=force)


@app.command()
@user_errors
def rank(
    *,
    model: ModelOpt = None,
    gpus: GpusOpt,
    machine: MachineOpt = "frontier",
    global_batch: BatchOpt = 2048,
    seq_len: SeqOpt = 2048,
    micro_batch: MbsOpt = "1,2,4,8",
    recompute: RecomputeOpt = Choice.search,
    cache_weights: CacheOpt = Choice.search,
    oar: OarOpt = True,
    ors: OrsOpt = True,
    oag: OagOpt = True,
    overlap_forward_all_reduce: FwdArOpt = False,
    top: Annotated[int, typer.Option("--top", "-n", min=1, help="Rows to show.")] = 10,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write ALL candidates (feasible or not, "
                                             "with reasons) to this .csv or .json file.")] = None,
    infeasible: Annotated[bool, typer.Option("--infeasible", help="Show infeasible rows and why.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --out if it exists.")] = False,
    layers: LayersOpt = None, hidden: HiddenOpt = None, heads: HeadsOpt = None, kv_heads: KvOpt = None,
    ffn_hidden: FfnOpt = None, vocab: VocabOpt = None,
    tokens: TokensOpt = None,
    max_nodes: Annotated[int | None, typer.Option("--max-nodes", min=1, help="Refuse runs on more nodes.")] = None,
    max_node_hours: Annotated[float | None, typer.Option(
        "--max-node-hours", min=0, help="Keep layouts whose --tokens run fits this many node-hours.")] = None,
) -> None:
    """Rank every Gx x Gy x Gz x Gdata layout of --gpus GPUs by predicted seconds per iteration.

    Micro-batch sizes, activation recompute and weight caching are searched too. Infeasible
    candidates (dimensions not divisible, batch not divisible, out of memory) stay in the
    --out table with their reason; --infeasible prints them.
    """
    from axoplan import report
    from axoplan.ranking import explain_infeasible
    from axoplan.ranking import rank as do_rank

    spec, mach, opts = _setup(model, machine, global_batch, seq_len, micro_batch, recompute, cache_weights,
                              oar, ors, oag, overlap_forward_all_reduce, layers=layers, hidden=hidden,
                              heads=heads, kv_heads=kv_heads, ffn_hidden=ffn_hidden, vocab=vocab)
    if gpus < 1:
        raise AxoplanError(f"--gpus must be a positive number of GPUs, got {gpus}")
    if out is not None and out.suffix not in {".csv", ".json"}:
        raise AxoplanError(f"--out {out} must end in .csv or .json")
    n_tokens = _budget_checks(tokens, gpus, mach.devices_per_node, max_nodes, max_node_hours)
    result = do_rank(spec, mach, opts, gpus)
    if out is not None:
        full = [int(i) for i in result.order]
        text = report.format_json(result, full) if out.suffix == ".json" else report.format_csv(result, full)
        _write_new(out, text, force)
    if result.num_feasible == 0 and not infeasible:
        raise AxoplanError(explain_infeasible(result))
    if max_node_hours is not None and n_tokens is not None and not infeasible:
        top = min(top, _fits_budget(result, n_tokens, max_node_hours))
    rows = report.selected_rows(result, top, infeasible)
    if fmt is Format.table:
        typer.echo(report.format_table(result, top, infeasible, tokens=n_tokens))
    elif fmt is Format.csv:
        typer.echo(report.format_csv(result, rows), nl=False)
    else:
        typer.echo(report.format_json(result, rows), nl=False)
    if out is not None:
        typer.echo(f"wrote all {len(result.candidates)} candidates to {out}", err=True)


def _budget_checks(tokens: str | None, gpus: int, devices_per_node: int, max_nodes: int | None,
                   max_node_hours: float | None) -> int | None:
    """Parse --tokens and apply --max-nodes; --max-node-hours needs --tokens."""
    from axoplan.budget import check_max_nodes, parse_tokens

    if max_node_hours is not None and tokens is None:
        raise AxoplanError("--max-node-hours needs --tokens (the run whose node-hours are counted), e.g. --tokens 300B")
    if max_nodes is not None:
        check_max_nodes(gpus, devices_per_node, max_nodes)
    return None if tokens is None else parse_tokens(tokens)


def _cost_line(result: Any, index: int, tokens: str) -> str:
    """One line: what training --tokens tokens with candidate `index` costs."""
    from axoplan.budget import format_tokens, parse_tokens, run_cost

    c = run_cost(parse_tokens(tokens), result.options.global_batch, result.options.seq_len,
                 float(result.column("t_step_s")[index]), result.world_size, result.machine.devices_per_node)
    return (f"\ntime to train {format_tokens(c.tokens)} tokens: {c.steps:,} steps, {c.days:.1f} days on {c.nodes} "
            f"nodes = {c.node_hours:,.0f} node-hours ({c.gpu_hours:,.0f} GPU-hours)")


def _fits_budget(result: Any, tokens: int, max_node_hours: float) -> int:
    """How many of the fastest feasible rows fit --max-node-hours (error naming the cheapest if none)."""
    from axoplan.budget import run_cost, within_node_hours
    from axoplan.report import selected_rows

    t_step_s = result.column("t_step_s")
    costs = [run_cost(tokens, result.options.global_batch, result.options.seq_len, float(t_step_s[i]),
                      result.world_size, result.machine.devices_per_node)
             for i in selected_rows(result, result.num_feasible, False)]
    return within_node_hours(costs, max_node_hours)


@app.command()
@user_errors
def explain(
    *,
    model: ModelOpt = None,
    gpus: GpusOpt,
    machine: MachineOpt = "frontier",
    layout: Annotated[str | None, typer.Option("--layout", "-l", help="Gx x Gy x Gz x Gdata, e.g. 8x2x512x4.")] = None,
    rank_: Annotated[int | None, typer.Option("--rank", "-r", min=1, help="Explain the layout ranked N.")] = None,
    global_batch: BatchOpt = 2048,
    seq_len: SeqOpt = 2048,
    micro_batch: MbsOpt = "1,2,4,8",
    recompute: RecomputeOpt = Choice.search,
    cache_weights: CacheOpt = Choice.search,
    oar: OarOpt = True,
    ors: OrsOpt = True,
    oag: OagOpt = True,
    overlap_forward_all_reduce: FwdArOpt = False,
    layers: LayersOpt = None, hidden: HiddenOpt = None, heads: HeadsOpt = None, kv_heads: KvOpt = None,
    ffn_hidden: FfnOpt = None, vocab: VocabOpt = None,
    tokens: TokensOpt = None,
) -> None:
    """Explain one layout: each collective (group, size, bytes, bandwidth, time, hidden part),
    the compute breakdown and the memory per GPU.

    Give --layout (the best micro-batch and options for it are chosen unless fixed) or
    --rank N (default 1, the best layout).
    """
    from axoplan import report
    from axoplan.layout import parse_layout
    from axoplan.ranking import rank as do_rank

    spec, mach, opts = _setup(model, machine, global_batch, seq_len, micro_batch, recompute, cache_weights,
                              oar, ors, oag, overlap_forward_all_reduce, layers=layers, hidden=hidden,
                              heads=heads, kv_heads=kv_heads, ffn_hidden=ffn_hidden, vocab=vocab)
    if layout is not None and rank_ is not None:
        raise AxoplanError("give --layout or --rank, not both")
    lay = parse_layout(layout) if layout is not None else None
    if lay is not None and lay.world_size != gpus:
        raise AxoplanError(f"layout {lay} uses {lay.world_size} GPUs but --gpus is {gpus}")
    result = do_rank(spec, mach, opts, gpus)
    if lay is not None:
        index = result.index_of(lay)
    else:
        n = rank_ or 1
        if n > result.num_feasible:
            raise AxoplanError(f"--rank {n} but only {result.num_feasible} layouts are feasible")
        index = int(result.order[n - 1])
    typer.echo(report.format_explain(result, index))
    if tokens is not None:
        typer.echo(_cost_line(result, index, tokens))


@app.command()
@user_errors
def machines() -> None:
    """List the machines that ship with axoplan."""
    from axoplan.machine import load_machine, machines_dir, shipped_machines
    from axoplan.report import text_table

    rows = []
    for name in shipped_machines():
        m = load_machine(name)
        rows.append([name, str(m.devices_per_node), m.device.name, f"{m.device.peak_bf16_tflops:g}",
                     f"{m.device.hbm_gb:g}", f"{m.inter_node.injection_gbs:g}",
                     "yes" if m.measured_bandwidth else "no"])
    typer.echo(text_table(["machine", "devices/node", "device", "bf16 TFLOP/s", "HBM GB", "injection GB/s",
                           "measured bw"], rows, [False, True, False, True, True, True, False]))
    typer.echo(f"\nfrom {machines_dir()}; any other machine: --machine path/to/machine.yaml")


@app.command()
@user_errors
def models() -> None:
    """List the model presets with their shapes and parameter counts."""
    from axoplan.model import PRESETS
    from axoplan.report import text_table

    rows = [[name, str(m.num_layers), str(m.hidden), str(m.num_heads), str(m.kv_heads), str(m.ffn), m.ffn_kind,
             str(m.vocab), f"{m.num_params() / 1e9:.1f}B"] for name, m in PRESETS.items()]
    typer.echo(text_table(["model", "layers", "hidden", "heads", "kv heads", "ffn", "ffn kind", "vocab", "params"],
                          rows, [False] + [True] * 5 + [False, True, True]))
    typer.echo("\nany other model: --model path/to/model.yaml, or --layers/--hidden/--heads [--ffn-hidden ...]")


# --- commands defined in other modules are registered below, one line each ---
# (each module imports only typer and the standard library at its top; the work is imported lazily)
from axoplan.commands.export import export as _export  # noqa: E402

app.command("export")(user_errors(_export))
from axoplan.commands.run import run as _run  # noqa: E402

app.command("run")(user_errors(_run))
from axoplan.commands.probe import probe as _probe  # noqa: E402

app.command("probe")(user_errors(_probe))
from axoplan.commands.validate import validate as _validate  # noqa: E402

app.command("validate")(user_errors(_validate))
from axoplan.commands.calibrate import calibrate as _calibrate  # noqa: E402

app.command("calibrate")(user_errors(_calibrate))
from axoplan.commands.plot import register as _register_plot  # noqa: E402

_register_plot(app, user_errors)


def main() -> None:
    """Console-script entry point."""
    sys.exit(app())
