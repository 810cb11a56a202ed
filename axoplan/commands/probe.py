"""`axoplan probe`: measure the host, every op class, GEMMs and collectives here; write a machine-YAML fragment.

    axoplan probe --local 4 --machine local-cpu -o local-cpu-probe.yaml
    torchrun --nproc-per-node 8 -m axoplan probe --plan plan.json -o node-probe.yaml

The fragment holds ``measured_bandwidth`` rows (one per group stride and size that the
probed world size's layouts contain) and a ``gemm`` block with a measured ``table`` (with
``--plan``, each phase's shape in every operand layout, and ``orientation_efficiency``),
a ``host`` block (per op, per launch; the sync round trip in a comment) and a ``kernels``
section (every op class the ledger prices: ``axoplan.executor.kernel_sweep``, derived as
``benchmarks/kernel_constants.py`` derives dgx-h100's); merge it into a machine YAML
(docs/executor.md). Its header names the CPU of the node that
wrote it (``axoplan.executor.hardware``), the core ``host.op_us`` was measured on. Only typer
and the standard library are imported here.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from axoplan.commands.choices import Device as _Device
from axoplan.commands.choices import Dtype as _Dtype

__all__ = ["probe"]


def probe(
    out: Annotated[Path, typer.Option("--out", "-o", help="YAML fragment to write.")],
    local: Annotated[int | None, typer.Option(
        "--local", min=1, help="Start N ranks on this machine. Without it, this process is one rank of a torchrun "
                               "or srun job.", show_default=False)] = None,
    plan: Annotated[Path | None, typer.Option(
        "--plan", help="Time the GEMM shapes this launch config runs (default: a grid of shapes).",
        show_default=False)] = None,
    machine: Annotated[str | None, typer.Option(
        "--machine", help="Machine whose peak the GEMM efficiencies are relative to (default: the plan's).",
        show_default=False)] = None,
    gemm_sizes: Annotated[str | None, typer.Option(
        "--gemm-sizes", help="Comma-separated GEMM dimensions; every (m, n, k) combination is timed "
                             "(default: 64,256,1024 on CPU, 512,2048,8192 on GPU).", show_default=False)] = None,
    min_kib: Annotated[float | None, typer.Option(
        "--min-kib", min=0.0625, help="Smallest collective message, KiB (default 4 on CPU, 64 on GPU).",
        show_default=False)] = None,
    max_mib: Annotated[float | None, typer.Option(
        "--max-mib", min=0.0001, help="Largest collective message, MiB (default 4 on CPU, 256 on GPU).",
        show_default=False)] = None,
    orientations: Annotated[str | None, typer.Option(
        "--orientations", help="Operand layouts to time each GEMM shape in, e.g. nn,nt,tn,tt (default: all four "
                               "with --plan, where each phase has its own; else nn).", show_default=False)] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Timed calls per measurement.")] = 5,
    kernels: Annotated[bool, typer.Option(
        "--kernels/--no-kernels", help="Time every op class the ledger prices (element-wise, norms, activation, "
                                       "cast, row sums, fills, loss, AdamW, attention per SDPA backend).")] = True,
    quick: Annotated[bool, typer.Option(
        "--quick", help="Fewer shapes, meant for under a minute on one GPU: the GEMM grid's ends, one size per op "
                        "class, three attention lengths at 32 heads, GPU messages up to 64 MiB.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds any collective may wait.")] = 60.0,
    device: Annotated[_Device, typer.Option("--device", help="auto: cuda when available.")] = _Device.auto,
    dtype: Annotated[_Dtype, typer.Option("--dtype", help="auto: bfloat16 on GPU, float32 on CPU.")] = _Dtype.auto,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --out if it exists.")] = False,
) -> None:
    """Measure the host, every op class, GEMM throughput and all-reduce / all-gather / reduce-scatter bandwidth.

    Collectives run for every group stride and size that layouts of this world size
    have, all groups of one shape at once. Works on CPU with gloo too.
    """
    from axoplan.errors import AxoplanError
    from axoplan.fileio import check_writable

    check_writable(out, force)
    started = time.perf_counter()
    config_plan, peak, machine_name, base = _peak(plan, machine)
    config = _config(config_plan, gemm_sizes, min_kib, max_mib, repeats, timeout, device.value, dtype.value)
    config = config.model_copy(update={"orientations": _orientations(orientations, config_plan is not None),
                                       "kernels": kernels, "quick": quick})
    if local is not None:
        result = _probe_local(config, local)
    else:
        from axoplan.executor.ranks import dist_env

        env = dist_env()
        if env is None:
            raise AxoplanError("not started by torchrun or srun; pass --local N to probe with N ranks here")
        result = _probe_in_launcher(config, env)
        if result is None:
            return
    _write(out, result, peak, machine_name, base, force, time.perf_counter() - started)


def _peak(plan: Path | None, machine: str | None) -> tuple[Any, float, str, dict[str, Any]]:
    from axoplan.errors import AxoplanError
    from axoplan.inputs.machine import load_machine
    from axoplan.records.plan import LaunchConfig

    config_plan = LaunchConfig.load(plan) if plan is not None else None
    name = machine or (config_plan.machine if config_plan is not None else None)
    if name is None:
        raise AxoplanError("give --machine NAME|PATH (the GEMM efficiencies are fractions of its peak) or --plan")
    mach = load_machine(name)
    return config_plan, mach.device.peak_bf16_tflops, mach.name, mach.model_dump(mode="json", exclude_none=True)


def _config(plan: Any, gemm_sizes: str | None, min_kib: float | None, max_mib: float | None, repeats: int,
            timeout: float, device: Any, dtype: Any) -> Any:
    from axoplan.errors import AxoplanError
    from axoplan.executor.fragment import ProbeConfig, grid_gemm_shapes, message_sizes, plan_gemm_phases

    shapes: list[tuple[int, int, int]] = []
    if gemm_sizes is not None:
        try:
            dims = [int(v) for v in gemm_sizes.split(",") if v.strip()]
        except ValueError:
            dims = []
        if not dims or min(dims) < 1:
            raise AxoplanError(f"--gemm-sizes {gemm_sizes!r} must be positive integers, e.g. 64,256,1024")
        shapes = grid_gemm_shapes(dims)
    labels: list[str] = [""] * len(shapes)
    if plan is not None:
        phases = plan_gemm_phases(plan)
        labels = [phases.get(s, "") for s in shapes]
        for shape, label in phases.items():
            if shape not in shapes:
                shapes.append(shape)
                labels.append(label)
    sizes: list[int] = []
    if min_kib is not None or max_mib is not None:
        low, high = int((min_kib or 4) * 1024), int((max_mib or 4) * (1 << 20))
        if high < low:
            raise AxoplanError(f"--max-mib {max_mib} is below --min-kib {min_kib}")
        sizes = message_sizes(low, high)
    return ProbeConfig(gemm_shapes=tuple(shapes), message_bytes=tuple(sizes), repeats=repeats, timeout_s=timeout,
                       device=device, dtype=dtype, gemm_labels=tuple(labels))


def _orientations(text: str | None, plan: bool) -> tuple[str, ...]:
    """The operand layouts asked for; an unknown one is an AxoplanError."""
    from axoplan.errors import AxoplanError
    from axoplan.inputs.machine import ORIENTATIONS

    if text is None:
        return ORIENTATIONS if plan else ("nn",)
    asked = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    bad = [v for v in asked if v not in ORIENTATIONS]
    if bad or not asked:
        raise AxoplanError(f"--orientations {text!r}: each must be one of {', '.join(ORIENTATIONS)}")
    return asked


def _probe_local(config: Any, ranks: int) -> Any:
    from axoplan.executor.fragment import ProbeResult
    from axoplan.executor.launch import Interrupted, LocalCluster, RankFailure

    typer.echo(f"probing with {ranks} local ranks", err=True)
    try:
        with LocalCluster(ranks, timeout_s=config.timeout_s, device=config.device, stop_on_signals=True) as cluster:
            results = cluster.run("axoplan.executor.probe:probe_task", config.model_dump_json())
    except RankFailure as failure:
        typer.echo(f"axoplan: error: probe failed: {failure}; nothing written", err=True)
        raise typer.Exit(1) from None
    except Interrupted as stop:  # SIGINT / SIGTERM: every rank is gone, as for `axoplan run`
        typer.echo(f"axoplan: error: probe {stop}; nothing written", err=True)
        raise typer.Exit(128 + stop.signum) from None
    return ProbeResult.model_validate_json(results[0])


def _probe_in_launcher(config: Any, env: Any) -> Any:
    from axoplan.executor.fragment import ProbeResult
    from axoplan.executor.ranks import describe_exception

    try:
        from axoplan.executor.probe import probe_in_process

        text = probe_in_process(config.model_dump_json(), env)
    except Exception as exc:  # noqa: BLE001 - one line naming the rank, then a hard exit
        sys.stderr.write(f"axoplan: error: rank {env.rank} failed: {describe_exception(exc)}; nothing written\n")
        sys.stderr.flush()
        os._exit(1)
    return ProbeResult.model_validate_json(text) if text is not None else None


def _write(out: Path, result: Any, peak: float, machine: str, base: dict[str, Any], force: bool,
           seconds: float) -> None:
    import yaml

    from axoplan.executor.fragment import merge_fragment, render_fragment
    from axoplan.fileio import write_text_atomic
    from axoplan.inputs.machine import Machine

    when = datetime.now(UTC).isoformat(timespec="seconds")
    hbm_gbs = float(base["device"]["hbm_bandwidth_gbs"])
    text = _with_host_identity(render_fragment(result, peak, machine, when, hbm_gbs), result)
    Machine.model_validate(merge_fragment(base, yaml.safe_load(text)))  # what we write must load
    write_text_atomic(out, text, force=force)
    typer.echo(text, nl=False)
    typer.echo(f"wrote {out} after {seconds:.0f} s: {len({(c.stride, c.size) for c in result.collectives})} "
               "bandwidth rows, "
               f"{len(result.gemms)} GEMM points, {len(result.kernel_records)} kernel records; merge it into a "
               "machine YAML (docs/executor.md)", err=True)


def _with_host_identity(text: str, result: Any) -> str:
    """`text` with the CPU this process runs on named after its first line: rank 0's node (or,
    with --local, the node of every rank), whose cores the host figures were measured on. The
    GPU, where there is one, is the device the first line names (the ranks' own
    ``torch.cuda.get_device_name``); this process loads no torch."""
    from axoplan.executor.hardware import cpu_identity

    cpu = cpu_identity()
    first, _, rest = text.partition("\n")
    lines = [first, f"# host CPU (rank 0's node; host.op_us is per op on its cores): {cpu.describe()}"]
    if result.backend == "nccl":
        lines.append(f"# GPU: {result.device_name}")
    return "\n".join(lines) + "\n" + rest
