"""What `axoplan probe` measures, and the machine-YAML fragment it writes (no torch).

The fragment holds the two blocks the cost model reads from measurements:

* ``measured_bandwidth``: one row per (stride, size) group shape that layouts of the
  probed world size contain, with the bus bandwidth its collectives reached (nccl-tests
  convention, the same ring volumes as ``axoplan.cost.collectives``: all-reduce
  ``2(p-1)/p·bytes/t``, all-gather and reduce-scatter ``(p-1)/p·bytes/t`` of the full
  buffer), taken as the median of the three kinds at the largest message;
* ``gemm``: a measured ``table`` (efficiency = achieved flop/s ÷ the machine's peak),
  plus ``max_efficiency`` and ``half_efficiency_dim`` fitted to its ``nn`` rows, so the
  block is complete when it replaces a machine's ``gemm:``. Shapes timed in other operand
  layouts too (``--plan``: each phase's shape in all four) get rows with their
  ``orientation`` (the phase in a comment) and ``orientation_efficiency``, the median over
  shapes of each layout's speed relative to ``nn``.

With the host's measurements it also holds ``host`` (``op_us``, ``launch_us``; the sync round trip as a
comment) and, from the kernel sweep's records, a ``kernels`` section (``axoplan.executor.kernel_constants``,
the derivation ``benchmarks/kernel_constants.py`` uses too).

Merge it into a machine YAML with `merge_fragment` (``axoplan.inputs.machine``: mappings merge, lists are replaced),
or give it to ``axoplan validate --probe``.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field, PositiveInt

from axoplan.cost.collectives import Shares
from axoplan.executor.kernel_constants import kernels_yaml
from axoplan.inputs.axes import AXES, strides
from axoplan.inputs.machine import Orientation, merge_fragment
from axoplan.inputs.schema import Frozen
from axoplan.records.plan import LaunchConfig
from axoplan.space.layout import ordered_factorizations

__all__ = ["ProbeConfig", "ProbeResult", "group_shapes", "plan_gemm_shapes", "grid_gemm_shapes", "message_sizes",
           "fit_gemm_curve", "render_fragment", "plan_gemm_phases", "orientation_speedups", "merge_fragment",
           "bus_bandwidth_gbs"]


class ProbeConfig(Frozen):
    """What to measure."""

    gemm_shapes: tuple[tuple[int, int, int], ...] = Field((), description="(m, n, k) of [m×k]·[k×n] GEMMs; "
                                                          "empty: a grid that suits the device.")
    message_bytes: tuple[PositiveInt, ...] = Field((), description="Collective buffer sizes, bytes; empty: a "
                                                                    "range that suits the device.")
    repeats: PositiveInt = 5
    timeout_s: float = Field(60.0, gt=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    orientations: tuple[Orientation, ...] = Field(("nn",), min_length=1,
                                                  description="Operand layouts each shape is timed in.")
    gemm_labels: tuple[str, ...] = Field((), description="What each shape is (e.g. 'qkv forward'), for comments.")
    kernels: bool = Field(True, description="Also time every op class the ledger prices "
                          "(axoplan.executor.kernel_sweep), for a kernels: section.")
    quick: bool = Field(False, description="Fewer shapes: the kernel sweep's quick sizes.")


class CollectivePoint(Frozen):
    op: Literal["all_reduce", "all_gather", "reduce_scatter"]
    stride: PositiveInt
    size: PositiveInt
    nbytes: PositiveInt
    seconds: float = Field(gt=0, description="Per call, the slowest member, median of the repeats.")


class GemmTime(Frozen):
    m: PositiveInt
    n: PositiveInt
    k: PositiveInt
    orientation: Orientation = "nn"
    label: str = ""
    seconds: float = Field(gt=0, description="Per GEMM, median over ranks of each rank's median.")


class ProbeResult(Frozen):
    """Raw measurements, as rank 0 returns them."""

    world_size: PositiveInt
    device_name: str
    backend: str
    dtype: str
    torch_version: str
    gemms: tuple[GemmTime, ...]
    collectives: tuple[CollectivePoint, ...]
    host_op_us: float | None = Field(None, gt=0, description="Host time per eager op (forward op or backward "
                                     "node) of a chain of tiny ops with autograd on host tensors, median over ranks.")
    host_launch_us: float | None = Field(None, ge=0, description="What the same chain on the device costs the host "
                                         "beyond host_op_us, per kernel it launches: the launch (0 on a CPU).")
    cpu_cores: int | None = Field(None, gt=0, description="CPU probes: the cores the ranks of a node may run on.")
    host_sync_us: float | None = Field(None, ge=0, description="Host microseconds a stream synchronize waits for one "
                                       "tiny kernel just queued, beyond queueing it (None on a CPU).")
    kernel_records: tuple[dict[str, str | int | float | bool], ...] = Field(
        (), description="Rank 0's kernel sweep, in the fields of data/measured/gpu-h100-h200/micro*.jsonl.")
    kernel_notes: tuple[str, ...] = Field((), description="Op classes or attention backends not measured, and why.")


def group_shapes(world_size: int) -> list[tuple[int, int]]:
    """Every (stride, size ≥ 2) that a group of some layout of `world_size` ranks has.

    Strides follow the default rank order (``axoplan.inputs.axes``): X 1, Y Gx, Z Gx·Gy, data Gx·Gy·Gz.
    """
    sizes = dict(zip(AXES, ordered_factorizations(world_size), strict=True))
    shapes = set()
    for axis, stride in strides(sizes).items():
        shapes |= {(int(s), int(p)) for s, p in zip(stride, sizes[axis], strict=True) if p > 1}
    return sorted(shapes)


def plan_gemm_shapes(plan: LaunchConfig) -> list[tuple[int, int, int]]:
    """The local (m, n, k) of every GEMM the plan runs: forward, dX and dW of each layer.

    Same conventions as ``axoplan.cost.model``: forward ``(m_l, n_loc, k_loc)``, dX
    ``(m_l, k_loc, n_loc)``, dW ``(n_loc, k_loc, m_l)`` with ``m_l = micro_batch·seq_len``.
    """
    return list(plan_gemm_phases(plan))


def plan_gemm_phases(plan: LaunchConfig) -> dict[tuple[int, int, int], str]:
    """Each local GEMM shape of the plan, in order, with the layers and phases that run it."""
    from axoplan.inputs.model import padded_vocab

    lay, model = plan.layout, plan.model
    size = {"x": lay.gx, "y": lay.gy}
    m = plan.micro_batch * plan.options.seq_len
    layers = [*model.block_linears(), model.head_linear(padded_vocab(model.vocab, lay.gx, lay.gy))]
    labels: dict[tuple[int, int, int], list[str]] = {}
    for lin in layers:
        k_loc, n_loc = lin.k_in // size[lin.in_axis], lin.n_out // size[lin.out_axis]
        for phase, shape in (("forward", (m, n_loc, k_loc)), ("dx", (m, k_loc, n_loc)), ("dw", (n_loc, k_loc, m))):
            labels.setdefault(shape, []).append(f"{lin.name} {phase}")
    return {shape: ", ".join(names) for shape, names in labels.items()}


def grid_gemm_shapes(sizes: list[int]) -> list[tuple[int, int, int]]:
    """Every (m, n, k) with each dimension from `sizes`."""
    return [(m, n, k) for m in sizes for n in sizes for k in sizes]


def message_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of four from `min_bytes` up to `max_bytes` (both included), multiples of 64 bytes."""
    sizes, size = [], max(64, min_bytes)
    while size < max_bytes:
        sizes.append(size)
        size *= 4
    sizes.append(max(64, max_bytes - max_bytes % 64))
    return sorted(set(sizes))


def bus_bandwidth_gbs(op: str, nbytes: int, size: int, seconds: float) -> float:
    """Bus bandwidth of one collective call, GB/s."""
    factor = 2.0 * (size - 1) / size if op == "all_reduce" else (size - 1) / size
    return factor * nbytes / seconds / 1e9


def fit_gemm_curve(points: list[tuple[int, int, int, float]]) -> tuple[float, float]:
    """(max_efficiency, half_efficiency_dim) of ``eff = max · Π d/(d + half)``, least squares in log space.

    The half dimension is searched on a log grid (1 to 65536); for each, the best scale
    is the geometric mean ratio, capped at 1.
    """
    dims = np.array([[m, n, k] for m, n, k, _ in points], dtype=np.float64)
    log_eff = np.log(np.array([e for *_, e in points], dtype=np.float64))
    best = (math.inf, 1.0, 1.0)
    for half in np.geomspace(1.0, 65536.0, 241):
        log_shape = np.log(dims / (dims + half)).sum(axis=1)
        scale = min(0.0, float(np.mean(log_eff - log_shape)))
        err = float(np.sum((log_eff - log_shape - scale) ** 2))
        if err < best[0]:
            best = (err, math.exp(scale), float(half))
    return best[1], best[2]


def render_fragment(result: ProbeResult, peak_tflops: float, machine: str, when: str,
                    hbm_gbs: float | None = None) -> str:
    """The YAML fragment, with where and how it was measured in comments; a ``kernels:`` section from the
    kernel sweep's records as shares of `hbm_gbs` (``axoplan.executor.kernel_constants``)."""
    eff = [(g.m, g.n, g.k, 2.0 * g.m * g.n * g.k / g.seconds / (peak_tflops * 1e12)) for g in result.gemms]
    capped = [(m, n, k, min(1.0, e)) for m, n, k, e in eff]
    nn = [p for p, g in zip(capped, result.gemms, strict=True) if g.orientation == "nn"]
    max_eff, half = fit_gemm_curve(nn or capped)
    lines = [
        f"# axoplan probe, {when}: {result.world_size} rank(s) on {result.device_name}, {result.backend}, "
        f"torch {result.torch_version}, {result.dtype}",
        f"# GEMM efficiency = achieved flop/s / {peak_tflops:g} TFLOP/s (peak of machine {machine!r}); every "
        "rank measured at once, median over ranks",
        "# collectives: all groups of one (stride, size) at once; per call the slowest member, median of the "
        "repeats; bandwidth_gbs = median over all-reduce, all-gather, reduce-scatter of the bus bandwidth at "
        "the largest message",
        *_bandwidth_block(result),
        *_host_lines(result),
        *_device_lines(result),
        *_kernel_lines(result, hbm_gbs, peak_tflops, machine),
        "gemm:",
        f"  max_efficiency: {_num(max_eff)}         # fitted to the table's nn rows below",
        f"  half_efficiency_dim: {_num(half)}",
        *_orientation_lines(result),
        "  table:",
    ]
    for (m, n, k, e), (_, _, _, raw), g in zip(capped, eff, result.gemms, strict=True):
        note = f"  # {raw * peak_tflops:.4g} TFLOP/s" + (" (above the assumed peak: capped at 1)" if raw > 1 else "")
        note += f"; {g.label}" if g.label else ""
        layout = f", orientation: {g.orientation}" if g.orientation != "nn" else ""
        lines.append(f"    - {{m: {m}, n: {n}, k: {k}, efficiency: {_num(max(e, 1e-6))}{layout}}}{note}")
    return "\n".join(lines) + "\n"


def _host_lines(result: ProbeResult) -> list[str]:
    if result.host_op_us is None:
        return []
    lines = ["host:",
             f"  op_us: {_num(result.host_op_us)}  # measured: a chain of 200 tiny ops (linear, view, transpose, "
             "GeLU) forward and backward with autograd on host tensors, time per op or backward node"]
    if result.host_launch_us is not None:
        lines.append(f"  launch_us: {_num(result.host_launch_us)}  # measured: the same chain on the device, "
                     "minus op_us, per kernel launched")
    if result.host_sync_us is not None:
        lines.append(f"  # sync: {_num(result.host_sync_us)} us per cudaStreamSynchronize round trip (one tiny "
                     "kernel queued, then synchronize, beyond queueing it; no machine field reads it yet)")
    return lines


def _kernel_lines(result: ProbeResult, hbm_gbs: float | None, peak_tflops: float, machine: str) -> list[str]:
    if not result.kernel_records or hbm_gbs is None:
        return [f"# {note}" for note in result.kernel_notes]
    records = [dict(r) for r in result.kernel_records]
    return kernels_yaml(records, list(result.kernel_notes), hbm_gbs, peak_tflops, machine)


def _device_lines(result: ProbeResult) -> list[str]:
    if result.cpu_cores is None:
        return []
    return ["device:",
            f"  cores_per_node: {result.cpu_cores}  # measured: the cores the probe's ranks could run on "
            "(ranks beyond them time-share)"]


def orientation_speedups(result: ProbeResult) -> dict[str, float]:
    """Per layout other than nn: median over shapes timed in both of ``t_nn / t_layout``."""
    nn = {(g.m, g.n, g.k): g.seconds for g in result.gemms if g.orientation == "nn"}
    ratios: dict[str, list[float]] = {}
    for g in result.gemms:
        if g.orientation != "nn" and (g.m, g.n, g.k) in nn:
            ratios.setdefault(g.orientation, []).append(nn[g.m, g.n, g.k] / g.seconds)
    return {o: float(np.median(r)) for o, r in sorted(ratios.items())}


def _orientation_lines(result: ProbeResult) -> list[str]:
    speed = orientation_speedups(result)
    if not speed:
        return []
    values = ", ".join(f"{o}: {_num(v)}" for o, v in speed.items())
    return [f"  orientation_efficiency: {{{values}}}  # median over shapes of t_nn / t_layout; the table's rows "
            "of a layout take precedence"]


def _bandwidth_block(result: ProbeResult) -> list[str]:
    """The ``measured_bandwidth`` rows; none on one rank, and then no key (a merge keeps the machine's)."""
    if not result.collectives:
        return [f"# no measured_bandwidth: {result.world_size} rank(s) form no group of two or more; "
                "probe with more ranks to measure collectives"]
    return ["measured_bandwidth:", *_bandwidth_lines(result)]


def _bandwidth_lines(result: ProbeResult) -> list[str]:
    lines = []
    shapes = sorted({(c.stride, c.size) for c in result.collectives})
    for stride, size in shapes:
        points = [c for c in result.collectives if (c.stride, c.size) == (stride, size)]
        largest, smallest = max(c.nbytes for c in points), min(c.nbytes for c in points)
        bw = {c.op: bus_bandwidth_gbs(c.op, c.nbytes, size, c.seconds) for c in points if c.nbytes == largest}
        lat = {c.op: c.seconds / _steps(c.op, size, result.backend) * 1e6 for c in points if c.nbytes == smallest}
        detail = ", ".join(f"{op} {bw[op]:.3g}" for op in sorted(bw))
        latency = ", ".join(f"{op} {lat[op]:.0f}" for op in sorted(lat))
        value = _num(float(np.median(list(bw.values()))))
        lines.append(f"  - {{stride: {stride}, size: {size}, bandwidth_gbs: {value}}}"
                     f"  # GB/s at {largest} B: {detail}; us per step at {smallest} B: {latency}")
    return lines


def _num(value: float) -> str:
    """4 significant digits that YAML reads back as a float (PyYAML wants '1.0e-05', not '1e-05')."""
    text = f"{value:.4g}"
    mantissa, _, exponent = text.partition("e")
    if exponent and "." not in mantissa:
        text = f"{mantissa}.0e{exponent}"
    return text


def _steps(op: str, size: int, backend: str) -> float:
    """Latency steps of one call, as the cost model counts them (``axoplan.cost.collectives.Shares``): an
    all-reduce's tree depth (NCCL, RCCL) or ring (gloo); all-gather and reduce-scatter as half of it."""
    shares = Shares.of(np.array([float(size)]), ring_all_reduce=backend == "gloo")
    steps = float(shares.all_reduce_steps[0])
    return steps if op == "all_reduce" else steps / 2.0
