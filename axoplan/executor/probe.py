"""`axoplan probe` on each rank: the host, every op class the ledger prices, GEMMs and the three collectives.

Host: the cost per eager op, per kernel launch and per stream synchronize. Op classes: the kernel sweep
(``axoplan.executor.kernel_sweep``), every rank at once (ranks of a node share its memory, as in a run),
rank 0's records written.

GEMMs: every rank times every shape, in each configured operand layout, at once (ranks
that share a node share its memory and, on CPU, its cores, as in a run), 2 warm-up calls
then `repeats` timed ones; the per-rank median, then the median over ranks. Collectives: for one (stride, size) at a
time, every group of that shape runs together (a layout's groups of one axis do), so
groups that share links or NICs are measured sharing them; per call the slowest member
(max over ranks), median of the repeats.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from axoplan.executor.comm import ALL_GATHER, REDUCE_SCATTER
from axoplan.executor.fragment import (
    CollectivePoint,
    GemmTime,
    ProbeConfig,
    ProbeResult,
    grid_gemm_shapes,
    group_shapes,
    message_sizes,
)
from axoplan.executor.hardware import usable_cores
from axoplan.executor.kernel_sweep import kernel_sweep
from axoplan.executor.ranks import DistEnv
from axoplan.executor.spec import ExecSettings
from axoplan.executor.train import device_name, resolve_device, resolve_dtype
from axoplan.space.layout import Layout

__all__ = ["probe_rank", "probe_task", "probe_in_process"]



def probe_task(config_json: str) -> str | None:
    """LocalCluster task: rank 0 returns the ProbeResult as JSON."""
    result = probe_rank(ProbeConfig.model_validate_json(config_json), local_rank=dist.get_rank())
    return result.model_dump_json() if result is not None else None


def probe_in_process(config_json: str, env: DistEnv) -> str | None:
    """As one rank of a torchrun / srun job; rank 0 returns the ProbeResult as JSON."""
    from axoplan.executor.worker import init_group

    config = ProbeConfig.model_validate_json(config_json)
    init_group(env.rank, env.world_size, config.timeout_s, config.device, "env://", env.local_rank)
    result = probe_rank(config, env.local_rank)
    dist.destroy_process_group()
    return result.model_dump_json() if result is not None else None


def probe_rank(config: ProbeConfig, local_rank: int = 0) -> ProbeResult | None:
    """Measure on this rank of an initialised process group; rank 0 gets the result.

    Without shapes or sizes in `config`, a grid that suits the device is used: GEMM
    dimensions 64-1024 and messages 4 KiB-4 MiB on CPU, 512-8192 and 64 KiB-256 MiB on GPU.
    """
    settings = ExecSettings(device=config.device, dtype=config.dtype)
    device = resolve_device(settings, local_rank)
    dtype = resolve_dtype(settings, device)
    gpu = device.type == "cuda"
    say = _progress if dist.get_rank() == 0 else (lambda _line: None)
    shapes = config.gemm_shapes or tuple(grid_gemm_shapes(_default_dims(gpu, config.quick)))
    sizes = config.message_bytes or tuple(message_sizes(64 << 10, (64 if config.quick else 256) << 20) if gpu else
                                          message_sizes(4 << 10, 4 << 20))
    t0 = time.perf_counter()
    chains = [host_op_us_measured(torch.device("cpu"), torch.float32, config.repeats)]
    if device.type != "cpu":  # the same chain on the device: what it costs beyond the host op is the launch
        chains.append(host_op_us_measured(device, dtype, config.repeats))
        chains.append(host_sync_us_measured(device))
    host_op_us, *device_us = _median_over_ranks(chains, device)
    say(f"host: {host_op_us:.3g} us per op, {time.perf_counter() - t0:.1f} s")
    records, notes = kernel_sweep(device, dtype, config.quick, say) if config.kernels else ([], [])
    timed = [(shape, o) for shape in shapes for o in config.orientations]
    t0 = time.perf_counter()
    gemm_s = _median_over_ranks([_gemm_s(shape, o, device, dtype, config.repeats) for shape, o in timed], device)
    say(f"GEMMs: {len(timed)} shapes and layouts, {time.perf_counter() - t0:.1f} s")
    labels = dict(zip(shapes, config.gemm_labels, strict=False))
    world = dist.get_world_size()
    points = []
    t0 = time.perf_counter()
    for stride, size in group_shapes(world):
        group = _groups(Layout(stride, size, 1, world // (stride * size)), config.timeout_s)
        for nbytes in sizes:
            for op in ("all_reduce", "all_gather", "reduce_scatter"):
                seconds = _collective_s(op, nbytes, size, group, device, dtype, config.repeats)
                points.append(CollectivePoint(op=op, stride=stride, size=size, nbytes=_rounded(nbytes, size, dtype),
                                              seconds=seconds))
    if group_shapes(world):
        say(f"collectives: {len(points)} points over {len(group_shapes(world))} group shapes, "
            f"{time.perf_counter() - t0:.1f} s")
    if dist.get_rank() != 0:
        return None
    return ProbeResult(world_size=world, device_name=device_name(device), backend=dist.get_backend(),
                       dtype=str(dtype).removeprefix("torch."), torch_version=torch.__version__,
                       gemms=tuple(GemmTime(m=m, n=n, k=k, orientation=o, label=labels.get((m, n, k), ""), seconds=s)
                                   for ((m, n, k), o), s in zip(timed, gemm_s, strict=True)),
                       collectives=tuple(points), host_op_us=host_op_us,
                       host_launch_us=max(device_us[0] - host_op_us, 0.0) / CHAIN_KERNELS_PER_OP
                       if device_us else 0.0,
                       host_sync_us=device_us[1] if device_us else None,
                       cpu_cores=usable_cores() if device.type == "cpu" else None,
                       kernel_records=tuple(records), kernel_notes=tuple(notes))


def _default_dims(gpu: bool, quick: bool) -> list[int]:
    """GEMM dimensions of the default grid: 512-8192 on a GPU, 64-1024 on a CPU; the two ends with `quick`."""
    dims = [512, 2048, 8192] if gpu else [64, 256, 1024]
    return [dims[0], dims[-1]] if quick else dims


def _progress(line: str) -> None:
    sys.stderr.write(f"probe: {line}\n")
    sys.stderr.flush()


HOST_CHAIN = 50  # blocks of four ops: linear, view, transpose, GeLU
CHAIN_KERNELS_PER_OP = 6 / 8
"""Kernels the chain launches per op or backward node (counted): forward, the linear and the GeLU
launch and the view and transpose do not (2 of 4); backward, the GeLU's gradient, the linear's
two matmuls and the weight-gradient accumulation (4 of 4). The device chain's extra host time
per op over this is the launch per kernel, ``host.launch_us``."""


def host_op_us_measured(device: torch.device, dtype: torch.dtype, repeats: int) -> float:
    """Host microseconds per eager op: a chain of tiny ops (8x8, so the device work is
    negligible and the host's dispatch sets the pace, as in a host-bound micro-batch) run
    forward and backward with autograd; the time over forward ops plus backward nodes (the
    two counts of a framework profile, ``frameworks/*.yaml``). On host tensors this is the
    unit ``host.op_us``; on a GPU the difference from it is the launch, ``host.launch_us``."""
    x = torch.randn(8, 8, device=device, dtype=dtype, requires_grad=True)
    w = torch.randn(8, 8, device=device, dtype=dtype, requires_grad=True)

    def chain() -> None:
        y = x
        for _ in range(HOST_CHAIN):
            y = torch.nn.functional.gelu(torch.nn.functional.linear(y, w).view(8, 8).t())
        y.sum().backward()

    seconds = statistics.median(_timed(chain, device, max(repeats, 5), warmup=3))
    return seconds / (2 * 4 * HOST_CHAIN) * 1e6


SYNC_REPEATS = 200


def host_sync_us_measured(device: torch.device) -> float:
    """Host microseconds of a ``cudaStreamSynchronize`` round trip: one tiny kernel queued, then the stream
    synchronized, beyond the time queueing it alone takes; median of `SYNC_REPEATS` (what an ``.item()`` or a
    host-side check costs a step beyond its kernel)."""
    z = torch.zeros(16, device=device)
    stream = torch.cuda.current_stream(device)
    queued, waited = [], []
    for _ in range(SYNC_REPEATS):
        stream.synchronize()
        t0 = time.perf_counter()
        z.add_(1.0)
        t1 = time.perf_counter()
        stream.synchronize()
        t2 = time.perf_counter()
        queued.append(t1 - t0)
        waited.append(t2 - t0)
    return max(statistics.median(waited) - statistics.median(queued), 0.0) * 1e6


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def _gemm_s(shape: tuple[int, int, int], orientation: str, device: torch.device, dtype: torch.dtype,
            repeats: int) -> float:
    """Median seconds of ``[m×k]·[k×n]`` with each operand row-major (n) or a transposed view (t)."""
    m, n, k = shape
    a = _operand(m, k, orientation[0], device, dtype)
    b = _operand(k, n, orientation[1], device, dtype)
    return statistics.median(_timed(lambda: a @ b, device, repeats))


def _operand(rows: int, cols: int, layout: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if layout == "n":
        return torch.randn(rows, cols, device=device, dtype=dtype)
    return torch.randn(cols, rows, device=device, dtype=dtype).t()


def _median_over_ranks(values: list[float], device: torch.device) -> list[float]:
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return torch.stack(every).median(dim=0).values.cpu().tolist()


def _groups(layout: Layout, timeout_s: float) -> dist.ProcessGroup:
    """This rank's group along Y of `layout` (stride Gx, size Gy); every rank creates every group."""
    from datetime import timedelta

    rows = [[int(r) for r in row] for row in layout.groups("y")]
    mine, _ = dist.new_subgroups_by_enumeration(rows, timeout=timedelta(seconds=timeout_s))
    return mine


def _rounded(nbytes: int, size: int, dtype: torch.dtype) -> int:
    """Buffer bytes actually moved: whole elements, divisible among `size` members."""
    item = torch.empty((), dtype=dtype).element_size()
    elements = max(size, nbytes // item // size * size)
    return elements * item


def _collective_s(op: str, nbytes: int, size: int, group: dist.ProcessGroup, device: torch.device,
                  dtype: torch.dtype, repeats: int) -> float:
    """Seconds per call of `op` on a `nbytes` buffer: slowest member, median of the repeats."""
    elements = _rounded(nbytes, size, dtype) // torch.empty((), dtype=dtype).element_size()
    full = torch.ones(elements, device=device, dtype=dtype)
    part = torch.ones(elements // size, device=device, dtype=dtype)
    calls = {
        "all_reduce": lambda: dist.all_reduce(full, group=group),
        "all_gather": lambda: ALL_GATHER(full, part, group=group),
        "reduce_scatter": lambda: REDUCE_SCATTER(part, full, group=group),
    }
    dist.barrier(group=group)
    times = torch.tensor(_timed(calls[op], device, repeats, warmup=1), dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slowest member of the slowest group
    return float(times.median())
