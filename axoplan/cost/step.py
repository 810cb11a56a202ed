"""The step of every candidate from its parts: GEMM, non-GEMM and optimizer compute, the host's
ops and the device's kernel gaps, each axis's total and exposed communication, what hidden
collectives take from the compute beside them and the wait for the slowest GPU
(``axoplan.cost.scale``), then the step time, throughput, MFU and HFU (``axoplan.cost.flops``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import numpy as np
import numpy.typing as npt

from axoplan.cost.compute import memory_bound_s
from axoplan.cost.flops import hardware_flops, model_flops
from axoplan.cost.groups import Groups
from axoplan.cost.layers import Layer
from axoplan.cost.ledger import Ledger, LedgerCost, per_step_s
from axoplan.cost.memory import replicated_params, sharded_params
from axoplan.cost.moe import native_routing_counts
from axoplan.cost.scale import interference_s, straggler_factor
from axoplan.cost.terms import CollectiveTerm
from axoplan.inputs.axes import AXES
from axoplan.inputs.framework import FrameworkProfile
from axoplan.inputs.machine import Machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates

__all__ = ["compute_columns", "step_columns", "optimizer_params", "collective_calls", "step_flops"]

Floats = npt.NDArray[np.float64]


def compute_columns(
    layers: list[Layer], model: ModelSpec, machine: Machine, c: Candidates, n_micro: Floats,
    dilation: Floats | None = None, options: RunOptions | None = None, ledger: LedgerCost | None = None,
    params: Floats | None = None, profile: FrameworkProfile | None = None,
) -> dict[str, Floats]:
    """GEMM, non-GEMM and optimizer seconds per step (an expert linear's calls share its block's non-GEMM work:
    ``axoplan.cost.layers``). The optimizer is the ledger's where the framework has one, else 30 bytes per
    parameter at ``memory_efficiency`` (read and write the fp32 master, both moments and the gradient, write
    the bf16 weight). The ledger's own GEMMs (fp32 ones, which no 4D linear holds) came in with the block's
    other ops and are counted as GEMMs. `params`: the parameters a GPU updates (:func:`optimizer_params`), where
    the caller has them; `profile`: the framework, whose counted optimizer may step a data shard only."""
    rec = c.recompute.astype(np.float64)
    gemm = sum(lay.count * (lay.t_fwd + rec * lay.t_rec + lay.t_dx + lay.t_dw) for lay in layers)
    other = sum(lay.count * (lay.extra_fwd + rec * lay.extra_rec + lay.extra_bwd) for lay in layers)
    params = optimizer_params(model, c, options) if params is None else params
    if ledger is not None:
        optimizer = ledger.optimizer_s(machine, params, _optimizer_shards(c, profile))
        moved = per_step_s(ledger, "gemm", model.num_layers, c.recompute, np.ones_like(n_micro))  # its fp32 GEMMs
        if dilation is not None:  # as the layers' work they came in with (axoplan.cost.layers)
            moved = moved * dilation
        gemm, other = gemm + moved, other - moved
    else:
        optimizer = memory_bound_s(machine, params * 30.0) / _optimizer_shards(c, profile)
    if dilation is not None:
        optimizer = optimizer * dilation
    return {"t_gemm_s": n_micro * gemm, "t_nongemm_s": n_micro * other, "t_optimizer_s": optimizer}


def _optimizer_shards(c: Candidates, profile: FrameworkProfile | None) -> Floats | float:
    """Over how many GPUs a profile's optimizer step is split: ``Gdata`` where its optimizer states are
    sharded over data (ZeRO stage 1, Megatron's distributed optimizer: each data-parallel rank updates its ``1/d``
    of the fp32 master weights and moments, then the weights are all-gathered; Rajbhandari et al., ZeRO, SC'20,
    §5.1), else 1 (the memory rule's ``optimizer.sharded_over_data``, one fact for memory and time). A ledger profile
    splits only what its trace ran on the shard (``LedgerCost.optimizer_s``)."""
    if profile is None or not profile.memory.optimizer.sharded_over_data:
        return 1.0
    return c.gdata.astype(np.float64)


def optimizer_params(model: ModelSpec, c: Candidates, options: RunOptions | None = None) -> Floats:
    """The parameters one GPU's optimizer updates: its shard of the 4D-sharded weights and every replicated one."""
    return sharded_params(model, c, options) + replicated_params(model)


def _extra_linears(model: ModelSpec, options: RunOptions | None) -> float:
    """Linears a block runs beyond the profile's two MLP linears: the Mixtral patch's ``3·E`` expert linears
    (``modify_mixtral.py``: w1, w3 and w2 of every expert), each launching its own GEMMs."""
    if model.moe is None or options is None or options.moe_module != "hf-mixtral":
        return 0.0
    return 3.0 * model.moe.num_experts - 2.0


def _per_micro_counts(profile: FrameworkProfile, model: ModelSpec, c: Candidates,
                      options: RunOptions | None = None, ledger: LedgerCost | None = None) -> tuple[Floats, Floats]:
    """Host ops and device kernels of one micro-batch, collectives excluded (``axoplan/inputs/framework.py``):
    every block's forward, what its checkpointing reruns when recomputed (with the checkpoint's bookkeeping), its
    backward, then the head's forward and backward (the ledger's ops, where the framework has one; the blocks' host work
    as replayed where its profile measured it, ``FrameworkProfile.host_replay``); AxoNN's native MoE module adds its
    routing's (:func:`axoplan.cost.moe.native_routing_counts`)."""
    rec = c.recompute.astype(np.float64)
    if ledger is not None:
        def count(per_scope: dict[str, float]) -> Floats:
            return (model.num_layers * (per_scope["block_forward"] + rec * per_scope[ledger.recompute_scope]
                                        + per_scope["block_backward"])
                    + per_scope["rest_forward"] + per_scope["rest_backward"])
        host = count(ledger.host_ops)
        if profile.host_replay is not None:  # the blocks' host work as replayed, the head's as the ledger counts it
            r = profile.host_replay
            host = (model.num_layers * (r.forward * (1.0 + rec) + r.backward + r.recompute_extra * rec)
                    + ledger.host_ops["rest_forward"] + ledger.host_ops["rest_backward"])
        return host, count(ledger.kernels)
    blk, head = profile.block, profile.head
    assert blk is not None and head is not None
    fwd_k, bwd_k = profile.kernels_per_block
    ops = model.num_layers * (blk.forward.host_ops * (1.0 + rec) + blk.backward.host_ops
                              + blk.recompute_extra_host_ops * rec)
    kernels = model.num_layers * (fwd_k * (1.0 + rec) + bwd_k)
    ops = ops + head.forward.host_ops + head.backward.host_ops
    kernels = kernels + sum(p.kernels + p.gemm_kernels for p in (head.forward, head.backward))
    extra = model.num_layers * _extra_linears(model, options) * ((1.0 + rec) + 2.0)  # a GEMM forward, two backward
    ops, kernels = ops + extra, kernels + extra  # [assumed] one host op per launched GEMM
    if model.moe is not None and options is not None and options.moe_module == "native":
        routing = native_routing_counts(model)
        ops = ops + model.num_layers * (routing.forward_ops * (1.0 + rec) + routing.backward_ops)
        kernels = kernels + model.num_layers * (routing.forward_kernels * (1.0 + rec) + routing.backward_kernels)
    return ops, kernels


def step_flops(model: ModelSpec, options: RunOptions, c: Candidates,
               ledger: Ledger | None = None) -> tuple[Floats, float]:
    """The flops the kernels execute in a step, per candidate, and the model's (``axoplan.cost.flops``); a
    recompute reruns what the framework's ledger says its checkpointing reruns, where it has one."""
    share = (1.0, 1.0) if ledger is None else (ledger.recompute_share("gemm", model, options.seq_len),
                                               ledger.recompute_share("attention", model, options.seq_len))
    return hardware_flops(model, options, c.recompute, share), model_flops(model, options)


def collective_calls(terms: list[CollectiveTerm], n_micro: Floats) -> Floats:
    """Collective calls of one micro-batch on groups of more than one rank (the step's own and the drains, which
    make no call, left out): no machine number changes them."""
    return _added(t.calls_per_step * (t.group_size > 1) for t in terms
                  if t.phase != "step" and not t.is_drain) / n_micro


def _added(arrays: Iterable[Floats]) -> Floats:
    """``sum(arrays)``, the same additions in the same order (so the same bits, a negative zero first made
    positive as ``0 + x`` makes it), into one array where the shapes allow it."""
    total: Floats | int = 0
    for a in arrays:
        if isinstance(total, np.ndarray) and total.shape == np.shape(a):
            total += a
        else:
            total = total + a
    return cast(Floats, total)


def _host_s(
    profile: FrameworkProfile, model: ModelSpec, machine: Machine, c: Candidates, terms: list[CollectiveTerm],
    n_micro: Floats, options: RunOptions | None = None, ledger: LedgerCost | None = None,
    calls: Floats | None = None,
) -> tuple[Floats, Floats]:
    """Host seconds and device kernel-gap seconds per step.

    Each host op costs ``host.op_us`` and each kernel launched on the device another
    ``host.launch_us`` (the driver's launch call: about 3 µs for an empty kernel, Boyer,
    "CUDA kernel overhead", U. Virginia; 5–20 µs CPU-side in PyTorch traces, Meta's
    HolisticTraceAnalysis docs); each collective call on a group of more than one rank is one
    more op and one more kernel (frameworks skip a group of one, as Megatron's mappings do);
    each kernel costs the device ``device.kernel_gap_us`` besides its work. `calls`: :func:`collective_calls`,
    where the caller has them."""
    ops, kernels = _per_micro_counts(profile, model, c, options, ledger)
    calls = collective_calls(terms, n_micro) if calls is None else calls
    host = n_micro * ((ops + calls) * machine.host.op_us + (kernels + calls) * machine.host.launch_us) * 1e-6
    gaps = n_micro * (kernels + calls) * machine.device.kernel_gap_us * 1e-6
    return host, gaps


def _host_idle_s(machine: Machine, host_s: Floats, device_s: Floats) -> Floats:
    """Time the device waits for the host. A GPU runs kernels while the host issues the next
    ones, so per micro-batch the slower of the two sets the pace: idle = max(host − device, 0)
    (the host-bound regime of eager frameworks). A CPU 'device' is the host: the overhead adds."""
    if machine.host.overlaps_device:
        return np.maximum(host_s - device_s, 0.0)
    return host_s


def step_columns(
    model: ModelSpec, machine: Machine, options: RunOptions, c: Candidates, g: Groups,
    terms: list[CollectiveTerm], compute: dict[str, Floats], n_micro: Floats, profile: FrameworkProfile,
    dilation: Floats | None = None, ledger: LedgerCost | None = None, calls: Floats | None = None,
    flops: tuple[Floats, float] | None = None,
) -> dict[str, Floats]:
    """The step: compute, exposed collectives, what hidden collectives take from the compute beside
    them, the wait for the slowest GPU, and the time the device waits for the host (`calls`:
    :func:`collective_calls`, and `flops`: :func:`step_flops`, where the caller has them)."""
    cols = dict(compute)
    totals = [(t.axis, t.total_s, t.exposed_s) for t in terms]
    comm_axes = (*AXES, "world")
    for axis in comm_axes:
        cols[f"t_comm_{axis}_s"] = _added(total for a, total, _ in totals if a == axis)
        cols[f"t_exposed_{axis}_s"] = _added(exposed for a, _, exposed in totals if a == axis)
    cols["t_comm_total_s"] = _added(cols[f"t_comm_{a}_s"] for a in comm_axes)
    cols["t_comm_exposed_s"] = _added(cols[f"t_exposed_{a}_s"] for a in comm_axes)
    host_s, gaps_s = _host_s(profile, model, machine, c, terms, n_micro, options, ledger, calls)
    if dilation is not None:  # the host shares the cores too
        host_s = host_s * dilation
    cols["t_nongemm_s"] = compute["t_nongemm_s"] + gaps_s
    cols["t_compute_s"] = compute["t_gemm_s"] + cols["t_nongemm_s"] + compute["t_optimizer_s"]
    cols["t_interference_s"] = cast(Floats, sum(
        interference_s(np.maximum(cols[f"t_comm_{a}_s"] - cols[f"t_exposed_{a}_s"], 0.0), g.crosses[a],
                       machine.intra_node.processor_usage, machine.inter_node.processor_usage) for a in comm_axes))
    busy = compute["t_gemm_s"] + cols["t_nongemm_s"] + cols["t_interference_s"]
    cols["t_straggler_s"] = busy * straggler_factor(machine.device.speed_variation, c.world_size)
    device_s = busy + cols["t_straggler_s"] + _added(t.exposed_s for t in terms if t.phase != "step")
    cols["t_host_idle_s"] = _host_idle_s(machine, host_s, device_s)
    step = (cols["t_compute_s"] + cols["t_comm_exposed_s"] + cols["t_interference_s"] + cols["t_straggler_s"]
            + cols["t_host_idle_s"])
    cols["t_step_s"] = step
    world = c.world_size.astype(np.float64)
    hw, useful = step_flops(model, options, c) if flops is None else flops
    cols["tflops_per_gpu"] = hw / step / world / 1e12
    cols["pct_peak"] = 100.0 * hw / step / world / machine.peak_flops
    cols["mfu"] = 100.0 * useful / step / world / machine.peak_flops
    cols["grad_accum"] = n_micro
    return cols
