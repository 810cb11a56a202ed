"""`axoplan run PLAN`: run a launch config's layout with torch.distributed and record it.

    axoplan run plans/01-2x2x1x1/plan.json --local 4                 # 4 ranks here (gloo on CPU)
    axoplan run plan.json --local 8 --layers 2 --hidden 256           # scaled down for a laptop
    torchrun --nproc-per-node 8 -m axoplan run plan.json              # or srun, one task per GPU

Everything that can be refused is refused before any rank starts: an unreadable or
corrupt plan, a layout that does not divide the (scaled) model, a world size that is not
the layout's, an unwritable record file. One measured-run record is appended to
``runs.jsonl`` beside the plan when every rank finished (kept in a file of its own, named
in the error, when that append fails). SIGINT or SIGTERM stops every rank and exits
128 + the signal with one line. Only typer and the standard
library are imported here; torch is imported by the ranks.
"""

from __future__ import annotations

import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from axoplan.commands.choices import Device as _Device
from axoplan.commands.choices import Dtype as _Dtype

__all__ = ["run", "SCALED_GRAD_ACCUM"]

SCALED_GRAD_ACCUM = 2
"""Micro-batches per iteration of a scaled-down rehearsal unless --grad-accum says otherwise: enough to
exercise accumulation (and the overlapped reduce-scatters between micro-batches), short enough to finish
in seconds, where the plan's own count (often 64 or more) kept a laptop busy for minutes with no output."""


class _Init(StrEnum):
    local = "local"
    full = "full"


class _Engine(StrEnum):
    native = "native"
    axonn = "axonn"


def run(
    plan: Annotated[Path, typer.Argument(help="Launch config (plan.json) written by `axoplan export`.")],
    local: Annotated[int | None, typer.Option(
        "--local", min=1, help="Start N ranks on this machine (gloo on CPU, NCCL on GPUs). Without it, this "
                               "process is one rank of a torchrun or srun job.", show_default=False)] = None,
    iterations: Annotated[int, typer.Option(
        "--iterations", min=1, envvar="AXOPLAN_ITERATIONS",
        help="Timed iterations (an exported job script sets AXOPLAN_ITERATIONS).")] = 10,
    warmup: Annotated[int, typer.Option(
        "--warmup", min=0, envvar="AXOPLAN_WARMUP",
        help="Untimed iterations first (they train too; a chained job script sets AXOPLAN_WARMUP=0).")] = 2,
    layers: Annotated[int | None, typer.Option(
        "--layers", min=1, help="Scale down: number of layers.", show_default=False)] = None,
    hidden: Annotated[int | None, typer.Option(
        "--hidden", min=1, help="Scale down: hidden size (heads kept; an explicit FFN width scales with it).",
        show_default=False)] = None,
    seq_len: Annotated[int | None, typer.Option(
        "--seq-len", min=1, help="Scale down: tokens per sequence.", show_default=False)] = None,
    vocab: Annotated[int | None, typer.Option(
        "--vocab", min=1, help="Scale down: vocabulary size.", show_default=False)] = None,
    grad_accum: Annotated[int | None, typer.Option(
        "--grad-accum", min=1, help="Gradient-accumulation steps (sets the global batch; layout and micro-batch "
                                    "stay). Default: the plan's, or 2 when the model is scaled down.",
        show_default=False)] = None,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1, help="Seconds any collective (and start-up) may wait before the run fails.")] = 120.0,
    runs: Annotated[Path | None, typer.Option(
        "--runs", help="JSON-lines file to append the record to (default: runs.jsonl beside the plan).",
        show_default=False)] = None,
    device: Annotated[_Device, typer.Option("--device", help="auto: cuda when available.")] = _Device.auto,
    dtype: Annotated[_Dtype, typer.Option(
        "--dtype", help="auto: bfloat16 on GPU (the plan's precision), float32 on CPU.")] = _Dtype.auto,
    init: Annotated[_Init, typer.Option(
        "--init", help="local: each rank draws its shards; full: cut one full model (small models only).")
    ] = _Init.local,
    engine: Annotated[_Engine, typer.Option(
        "--engine", help="native: axoplan's 4D layers; axonn: AxoNN 0.2.0's expert-mode linears (GPU, "
                         "`pip install 'axoplan[axonn]'`).")] = _Engine.native,
    save_checkpoint: Annotated[bool, typer.Option(
        "--save-checkpoint", envvar="AXOPLAN_SAVE_CHECKPOINT",
        help="At the end, write each rank's parameters, optimizer state and step count to --checkpoint-dir "
             "(a chained job script sets AXOPLAN_SAVE_CHECKPOINT=1).")] = False,
    resume: Annotated[bool, typer.Option(
        "--resume", envvar="AXOPLAN_RESUME", help="Start from the checkpoint in --checkpoint-dir (a chained job "
                                                  "script sets AXOPLAN_RESUME=1 in every job but the first).")
    ] = False,
    checkpoint_dir: Annotated[Path | None, typer.Option(
        "--checkpoint-dir", envvar="AXOPLAN_CHECKPOINT_DIR", help="Checkpoint folder (default: checkpoint/ beside "
                                                                  "the plan).", show_default=False)] = None,
    fault: Annotated[str, typer.Option(
        "--fault", hidden=True, help="Fault drill RANK:raise|exit|kill|hang@ITERATION (docs/executor.md).")] = "",
) -> None:
    """Run a launch config's 4D layout, time it, and append a measured-run record beside it.

    Synthetic tokens; warm-up, then timed iterations with per-phase times (GEMM, each
    collective kind, waiting on overlapped collectives). Exit status 2 for a bad plan or
    option (nothing started), 1 when a rank fails (every rank is stopped; no record), 130 / 143 on
    SIGINT / SIGTERM (every rank is stopped; no record).
    """
    from axoplan.executor import checkpoint
    from axoplan.executor.record import runs_path
    from axoplan.executor.spec import Scale, check_runnable, check_world, make_settings, scale_plan
    from axoplan.records.plan import LaunchConfig

    original = LaunchConfig.load(plan)
    scaled_down = any(v is not None for v in (layers, hidden, seq_len, vocab))
    if scaled_down and grad_accum is None and original.grad_accum_steps > SCALED_GRAD_ACCUM:
        grad_accum = SCALED_GRAD_ACCUM
        typer.echo(f"scaled-down run: {grad_accum} micro-batches per iteration instead of the plan's "
                   f"{original.grad_accum_steps} (--grad-accum N to choose)", err=True)
    config = scale_plan(original, Scale(layers=layers, hidden=hidden, seq_len=seq_len, vocab=vocab,
                                        grad_accum=grad_accum))
    check_runnable(config, engine.value)
    if engine is _Engine.axonn:
        _require_axonn()
    folder = checkpoint_dir if checkpoint_dir is not None else checkpoint.checkpoint_dir(plan)
    if resume:
        checkpoint.check_resumable(folder, config.plan_id, config.world_size)
    if save_checkpoint:
        checkpoint.check_savable(folder)
    settings = make_settings(iterations=iterations, warmup=warmup, timeout_s=timeout, device=device.value,
                             dtype=dtype.value, init=init.value, engine=engine.value, fault=fault, progress=True,
                             checkpoint_dir=str(folder.resolve()), save_checkpoint=save_checkpoint, resume=resume)
    out = runs if runs is not None else runs_path(plan)
    _check_record_path(out)
    record: str | None
    if local is not None:
        check_world(config, local, "--local")
        record = _run_local(config, settings, local)
    else:
        record = _run_in_launcher(config, settings, check_world)
        if record is None:
            return
    _finish(out, record)
    if save_checkpoint:
        typer.echo(f"wrote the checkpoint to {folder}", err=True)


def _require_axonn() -> None:
    import importlib.util

    from axoplan.errors import AxoplanError

    if importlib.util.find_spec("axonn") is None:
        raise AxoplanError("--engine axonn needs AxoNN 0.2.0: pip install 'axoplan[axonn]'")


def _check_record_path(path: Path) -> None:
    from axoplan.errors import AxoplanError

    if path.is_dir():
        raise AxoplanError(f"--runs {path} is a folder; give a file such as {path / 'runs.jsonl'}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir() or not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise AxoplanError(f"cannot write the run record to {path}; pass --runs PATH in a writable folder")


def _run_local(config: Any, settings: Any, ranks: int) -> str:
    from axoplan.executor.launch import Interrupted, LocalCluster, RankFailure

    typer.echo(f"starting {ranks} local ranks for plan {config.plan_id} (layout {config.layout.to_layout()})",
               err=True)
    try:
        with LocalCluster(ranks, timeout_s=settings.timeout_s, device=settings.device,
                          stop_on_signals=True) as cluster:
            results = cluster.run("axoplan.executor.worker:run_plan_task", config.to_json(),
                                  settings.model_dump_json())
    except RankFailure as failure:
        typer.echo(f"axoplan: error: run failed: {failure}; no record written", err=True)
        raise typer.Exit(1) from None
    except Interrupted as stop:  # SIGINT / SIGTERM: every rank is gone; exit as a shell reports the signal
        typer.echo(f"axoplan: error: run {stop}; no record written", err=True)
        raise typer.Exit(128 + stop.signum) from None
    return str(results[0])


def _run_in_launcher(config: Any, settings: Any, check_world: Any) -> str | None:
    """This process is one rank; rank 0 returns the record, the others None."""
    from axoplan.errors import AxoplanError
    from axoplan.executor.launch import exit_on_signals
    from axoplan.executor.ranks import describe_exception, dist_env

    env = dist_env()
    if env is None:
        raise AxoplanError("not started by torchrun or srun (no RANK/WORLD_SIZE or SLURM_PROCID); pass --local N "
                           "to start N ranks on this machine")
    check_world(config, env.world_size, env.launcher)
    rank = env.rank
    # SIGINT / SIGTERM (torchrun forwards its own to every rank; scancel sends SIGTERM): one line and exit now,
    # even from inside a collective or the rendezvous
    exit_on_signals(lambda name: f"axoplan: error: rank {rank} interrupted by {name}; no record written")
    try:
        from axoplan.executor.worker import run_in_process

        return run_in_process(config.to_json(), settings.model_dump_json(), env)
    except Exception as exc:  # noqa: BLE001 - one line naming the rank, then a hard exit (no PG teardown hang)
        sys.stderr.write(f"axoplan: error: rank {env.rank} failed: {describe_exception(exc)}; no record written\n")
        sys.stderr.flush()
        os._exit(1)


def _finish(path: Path, record_json: str) -> None:
    """Show the measurement, then append its record; a failed append keeps the record elsewhere and says where
    (axoplan.records.runs.append_run), so a finished run is never lost."""
    from axoplan.records.runs import MeasuredRun, append_run

    record = MeasuredRun.model_validate_json(record_json)
    typer.echo(_summary(record))
    append_run(path, record)
    typer.echo(f"appended the record to {path}", err=True)


def _summary(record: Any) -> str:
    from axoplan.report import text_table

    plan = record.plan
    head = (f"plan {record.plan_id}: {plan.model.name}, layout {plan.layout.to_layout()}, {record.world_size} "
            f"ranks on {record.nodes} node(s), {record.backend} on {record.device_name}, {record.dtype}\n"
            f"{record.t_step_s:.4f} s/iteration (std {record.t_step_std_s:.4f}) over {record.iterations} "
            f"iterations after {record.warmup} warm-up")
    total = sum(record.phase_s.values()) or 1.0
    rows = [[k, f"{v:.4f}", f"{100 * v / total:.1f}%"]
            for k, v in sorted(record.phase_s.items(), key=lambda kv: -kv[1])]
    return head + "\n\n" + text_table(["phase", "s/iter", "share"], rows, [False, True, True])
