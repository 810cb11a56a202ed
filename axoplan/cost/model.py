"""Assemble the per-step time of every candidate from its collectives, compute and overlap.

Per micro-batch and linear layer (``docs/algorithm.md`` §4; ``X`` is the input-feature group of
a plain layer, ``Y`` of a transposed one):

=========  =====================  =========  ================================  ==============
phase      collective             group      bytes per call                    hidden behind
=========  =====================  =========  ================================  ==============
forward    all-gather weight      Z          ``k·n/(Gx·Gy)·2``                 previous unit (OAG)
forward    all-reduce output      in-group   ``m_l·n/g_out·2``                 half, 2-chunk option
recompute  the two above again    (unless weights are cached: no all-gather)
backward   all-gather weight      Z          as forward, unless cached         next unit (OAG)
backward   all-reduce input grad  out-group  ``m_l·k/g_in·2``                  dW GEMM (OAR)
backward   reduce-scatter grad    Z          ``k·n/(Gx·Gy)`` in its dtype      next unit (ORS)
step       all-reduce grad shard  data       ``k·n/(Gx·Gy·Gz)·4`` (fp32)       nothing
step       all-reduce norms       world      replicated params · 4             nothing
=========  =====================  =========  ================================  ==============

``m_l = micro_batch · S`` tokens per GPU. The step repeats the micro-batch
``B / (Gdata·Gz·micro_batch)`` times (gradient accumulation), then reduces over data
and the world and runs the optimizer. The exposed part of each collective is what is
left after overlapping with the compute named in the last column. The Z rows are
``axoplan.cost.zsharding``'s (a unit is a linear layer, or a whole block where the framework
gathers blocks, and two waits per micro-batch nothing hides); the attention core is
``axoplan.cost.attention``'s; the slowest of N GPUs and the compute hidden collectives take
are ``axoplan.cost.scale``'s; the framework profile (``frameworks/<name>.yaml``) sets the
host work, memory rules and Z units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from axoplan.axes import AXES
from axoplan.candidates import Candidates
from axoplan.cost import collectives as coll
from axoplan.cost.attention import fused_attention_s, unfused_attention_s
from axoplan.cost.compute import memory_bound_s
from axoplan.cost.flops import hardware_flops, model_flops
from axoplan.cost.memory import MemoryBreakdown, memory_per_gpu, padded_vocab, replicated_params, sharded_params
from axoplan.cost.orientation import Phase, phase_gemm_s
from axoplan.cost.placement import place_groups
from axoplan.cost.scale import interference_s, straggler_factor
from axoplan.cost.terms import CollectiveTerm
from axoplan.cost.zsharding import ZGroup, ZUnit, z_terms
from axoplan.framework import FrameworkProfile, load_framework
from axoplan.machine import Machine
from axoplan.model import LinearLayer, ModelSpec
from axoplan.options import RunOptions

__all__ = ["CollectiveTerm", "Prediction", "predict"]

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
BYTES = 2.0  # bf16 weights and activations


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted step time, its breakdown, memory and flops for every candidate."""

    candidates: Candidates
    columns: dict[str, Floats]
    collectives: tuple[CollectiveTerm, ...]
    memory: MemoryBreakdown


@dataclass(frozen=True, slots=True)
class _Groups:
    """Size, stride, bandwidth, latency (per all-reduce step, and a ring's) and node crossing of each
    axis's group, per candidate."""

    size: dict[str, Floats]
    stride: dict[str, Ints]
    bw: dict[str, Floats]
    lat: dict[str, Floats]
    ring: dict[str, Floats]
    crosses: dict[str, npt.NDArray[np.bool_]]


@dataclass(frozen=True, slots=True)
class _Layer:
    """Shapes and raw times of one linear layer for one micro-batch."""

    spec: LinearLayer
    count: int
    in_axis: str
    out_axis: str
    t_fwd: Floats
    t_dx: Floats
    t_dw: Floats
    extra_fwd: Floats  # non-GEMM work attached to this layer
    extra_bwd: Floats
    ar_fwd: Floats
    ar_bwd: Floats
    ar_data: Floats
    bytes_block: Floats
    bytes_out: Floats
    bytes_in: Floats
    bytes_shard: Floats

    @property
    def compute_fwd(self) -> Floats:
        return self.t_fwd + self.extra_fwd

    @property
    def compute_bwd(self) -> Floats:
        return self.t_dx + self.t_dw + self.extra_bwd


def predict(model: ModelSpec, machine: Machine, options: RunOptions, c: Candidates) -> Prediction:
    """Evaluate the cost model for all candidates at once."""
    profile = load_framework(options.framework)
    groups = _groups(machine, c)
    tokens = (c.micro_batch * options.seq_len).astype(np.float64)
    dilation = _core_sharing(machine, c)
    layers = _layers(model, machine, options, c, groups, tokens, profile, dilation)
    n_micro = options.global_batch / (c.gdata * c.gz * c.micro_batch).astype(np.float64)
    terms = _collective_terms(layers, groups, options, c, model, n_micro, tokens, profile)
    compute = _compute_columns(layers, model, machine, c, n_micro, dilation)
    memory = memory_per_gpu(model, options, c, profile)
    columns = _step_columns(model, machine, options, c, groups, terms, compute, n_micro, profile, dilation)
    return Prediction(c, columns | memory.as_columns(), tuple(terms), memory)


def _core_sharing(machine: Machine, c: Candidates) -> Floats | None:
    """How much slower a CPU rank computes when its node runs more ranks than it has cores:
    ``max(ranks on the node / cores, 1)`` (the ranks time-share the cores; a node holds
    ``min(world, devices_per_node)`` ranks). None for a GPU or a CPU machine without
    ``device.cores_per_node``. Collectives are left as they are: gloo's time on loopback is
    mostly waiting, and its bandwidth was measured with the cores shared (``local-cpu.yaml``)."""
    cores = machine.device.cores_per_node
    if cores is None or machine.device.kind != "cpu":
        return None
    ranks = np.minimum(c.world_size, machine.devices_per_node).astype(np.float64)
    return np.maximum(ranks / cores, 1.0)


def _groups(machine: Machine, c: Candidates) -> _Groups:
    sizes = c.sizes() | {"world": c.world_size}
    strides = c.strides() | {"world": np.ones_like(c.gx)}
    axes = list(sizes)
    all_strides, all_sizes = (np.concatenate([d[a] for a in axes]) for d in (strides, sizes))
    placed = place_groups(machine, all_strides, all_sizes)
    n = len(c)

    def by_axis(values: np.ndarray) -> dict[str, np.ndarray]:
        return {a: values[i * n:(i + 1) * n] for i, a in enumerate(axes)}

    return _Groups({a: s.astype(np.float64) for a, s in sizes.items()}, strides, by_axis(placed.bandwidth_gbs),
                   by_axis(placed.latency_us), by_axis(placed.ring_latency_us), by_axis(placed.crosses_nodes))


def _layers(
    model: ModelSpec, machine: Machine, options: RunOptions, c: Candidates, g: _Groups, tokens: Floats,
    profile: FrameworkProfile, dilation: Floats | None = None,
) -> list[_Layer]:
    """Block layers in execution order, then the LM head (its rows: the padded vocabulary).

    A block's elementwise work is shared equally by its linears; the attention is attached
    to the layer that reads its output; the logits' softmax work to the head."""
    block = model.block_linears()
    extra_fwd = _nongemm_fwd_s(model, machine, options, c, tokens, profile)
    extra_bwd = {k: 2.0 * v for k, v in extra_fwd.items()}  # a backward reads and writes about twice the forward
    attention = unfused_attention_s if options.attention == "unfused" else fused_attention_s
    extra_fwd["attention"], extra_bwd["attention"] = attention(model, machine, options, c)
    vocab = padded_vocab(model, c)
    shapes = _GemmShapes.of(c)
    out = []
    for spec in (*block, model.head_linear(0)):
        head = spec.role == "head"
        n = vocab if head else np.float64(spec.n_out)
        count = 1 if head else model.num_layers
        part = "logits" if head else "elementwise"
        share = 1.0 if head else 1.0 / len(block)
        fwd = extra_fwd[part] * share + (extra_fwd["attention"] if spec.input == "attention" else 0.0)
        bwd = extra_bwd[part] * share + (extra_bwd["attention"] if spec.input == "attention" else 0.0)
        out.append(_layer(spec, n, count, machine, options, g, tokens, fwd, bwd, shapes, dilation))
    return out


@dataclass(frozen=True, slots=True)
class _GemmShapes:
    """Rows with distinct local GEMM shapes: a GEMM's m, n, k depend only on Gx, Gy and the
    micro-batch, so its time is computed once per distinct (Gx, Gy, micro-batch), at the rows
    `first`, and spread back with `back` (a few hundred shapes for tens of thousands of rows)."""

    first: Ints
    back: Ints

    @classmethod
    def of(cls, c: Candidates) -> _GemmShapes:
        key = (c.gx * (int(c.gy.max()) + 1) + c.gy) * (int(c.micro_batch.max()) + 1) + c.micro_batch
        keys = np.unique(key)
        back = np.searchsorted(keys, key)  # faster than return_inverse on tens of thousands of rows
        first = np.empty(len(keys), dtype=np.int64)
        first[back] = np.arange(len(key))  # any row of a key will do: its shape is the key's
        return cls(first, back)

    def time(self, machine: Machine, m: Floats, n: Floats, k: Floats, phase: Phase, tuned: bool) -> Floats:
        f = self.first
        return phase_gemm_s(machine, m[f], n[f], k[f], phase, tuned)[self.back]


def _layer(
    spec: LinearLayer, n: Floats | np.float64, count: int, machine: Machine, options: RunOptions,
    g: _Groups, tokens: Floats, extra_fwd: Floats, extra_bwd: Floats, shapes: _GemmShapes,
    dilation: Floats | None = None,
) -> _Layer:
    in_axis, out_axis = spec.in_axis, spec.out_axis
    k_loc, n_loc = spec.k_in / g.size[in_axis], n / g.size[out_axis] + 0.0 * tokens
    tuned = options.tuned_gemm
    if options.overlap_forward_all_reduce:
        t_fwd = 2.0 * shapes.time(machine, tokens / 2.0, n_loc, k_loc, "forward", tuned)
    else:
        t_fwd = shapes.time(machine, tokens, n_loc, k_loc, "forward", tuned)
    t_dx = shapes.time(machine, tokens, k_loc, n_loc, "dx", tuned)
    t_dw = shapes.time(machine, n_loc, k_loc, tokens, "dw", tuned)
    extra_fwd, extra_bwd = np.broadcast_to(extra_fwd, tokens.shape), np.broadcast_to(extra_bwd, tokens.shape)
    if dilation is not None:
        t_fwd, t_dx, t_dw, extra_fwd, extra_bwd = (t * dilation for t in (t_fwd, t_dx, t_dw, extra_fwd, extra_bwd))
    block = spec.k_in * n / (g.size["x"] * g.size["y"])
    shard = np.ceil(block / g.size["z"])
    bytes_block, bytes_out, bytes_in = block * BYTES, tokens * n_loc * BYTES, tokens * k_loc * BYTES
    bytes_shard = shard * options.grad_reduce_bytes
    return _Layer(
        spec=spec, count=count, in_axis=in_axis, out_axis=out_axis,
        t_fwd=t_fwd, t_dx=t_dx, t_dw=t_dw, extra_fwd=extra_fwd, extra_bwd=extra_bwd,
        ar_fwd=coll.all_reduce_s(bytes_out, g.size[in_axis], g.bw[in_axis], g.lat[in_axis]),
        ar_bwd=coll.all_reduce_s(bytes_in, g.size[out_axis], g.bw[out_axis], g.lat[out_axis]),
        ar_data=coll.all_reduce_s(bytes_shard, g.size["data"], g.bw["data"], g.lat["data"]),
        bytes_block=bytes_block, bytes_out=bytes_out, bytes_in=bytes_in, bytes_shard=bytes_shard,
    )


def _rs_bytes(profile: FrameworkProfile, options: RunOptions) -> float:
    """Bytes per gradient element in the Z reduce-scatter: the run's gradient-reduction dtype where the
    framework reduces in it (FSDP's reduce_dtype), else bf16 (AxoNN's REDUCE_SCATTER_DTYPE)."""
    return float(options.grad_reduce_bytes) if profile.z_reduce_scatter_in_grad_dtype else BYTES


def _nongemm_fwd_s(
    model: ModelSpec, machine: Machine, options: RunOptions, c: Candidates, tokens: Floats, profile: FrameworkProfile,
) -> dict[str, Floats]:
    """Forward time of work that is not a sharded GEMM, per block (and for the logits).

    Tokens are split over Gdata·Gz. Heads are split over Y, so attention is repeated by the
    Gx members of an X group (``docs/algorithm.md`` §1). The residual stream between blocks is the
    transposed layers' output ``[m_l, H/Gx]``: norms and residual adds (``10·H`` elements
    per token) are split over X and repeated over Y; the activation function (``2·F`` GeLU,
    ``3·F`` SwiGLU) works on ``[m_l, F/Gy]``. 2 bytes per element. The attention core is
    ``axoplan.cost.attention``'s.
    """
    gx, gy = c.gx.astype(np.float64), c.gy.astype(np.float64)
    act = 3.0 if model.ffn_kind == "swiglu" else 2.0
    ew_bytes = tokens * (10.0 * model.hidden / gx + act * model.ffn / gy) * BYTES
    logits_bytes = tokens * padded_vocab(model, c) / gy * profile.loss_traffic_bytes / 3.0  # forward's third
    return {
        "elementwise": memory_bound_s(machine, ew_bytes),
        "logits": memory_bound_s(machine, logits_bytes),
    }


def _collective_terms(
    layers: list[_Layer], g: _Groups, options: RunOptions, c: Candidates, model: ModelSpec, n_micro: Floats,
    tokens: Floats, profile: FrameworkProfile,
) -> list[CollectiveTerm]:
    terms: list[CollectiveTerm] = []
    last_in_block = [lay for lay in layers if lay.spec.role != "head"][-1]
    for i, lay in enumerate(layers):
        prev = layers[i - 1] if i > 0 else last_in_block  # the previous linear in execution order
        terms += _linear_terms(lay, prev, g=g, options=options, c=c, n_micro=n_micro,
                               overlap_data=profile.grad_reduce_overlaps_backward)
    z = ZGroup(g.size["z"], g.stride["z"], g.bw["z"], coll.all_gather_s(0.0 * n_micro, g.size["z"], g.bw["z"],
                                                                         g.ring["z"]))
    terms += z_terms(_z_units(layers, g, options, profile), z, options, c, n_micro)
    terms += _statistics_terms(model, g, c, tokens, n_micro)
    terms.append(_world_term(model, options, g, n_micro))
    return terms


def _z_units(layers: list[_Layer], g: _Groups, options: RunOptions, profile: FrameworkProfile) -> list[ZUnit]:
    """What each Z all-gather moves (``axoplan.cost.zsharding``): each linear layer, or (FSDP) each
    block's four together; the LM head on its own, kept gathered where the framework keeps its root."""
    head = [lay for lay in layers if lay.spec.role == "head"]
    block = [lay for lay in layers if lay.spec.role != "head"]
    keep_root = profile.memory.embedding_gathered
    units = [_unit(lay.spec.name, [lay], g, options, profile) for lay in block]
    if profile.z_gather_unit == "block":
        units = [_unit("block", block, g, options, profile)]
    return units + [_unit(lay.spec.name, [lay], g, options, profile, stays_gathered=keep_root) for lay in head]


def _unit(name: str, parts: list[_Layer], g: _Groups, options: RunOptions, profile: FrameworkProfile,
          stays_gathered: bool = False) -> ZUnit:
    z = (g.size["z"], g.bw["z"], g.ring["z"])
    gathered = cast(Floats, sum(lay.bytes_block for lay in parts))
    grads = gathered / BYTES * _rs_bytes(profile, options)
    return ZUnit(name=name, count=parts[0].count, recomputed=parts[0].spec.recomputed,
                 ag_s=coll.all_gather_s(gathered, *z), rs_s=coll.reduce_scatter_s(grads, *z), ag_bytes=gathered,
                 rs_bytes=grads, compute_fwd_s=cast(Floats, sum(lay.compute_fwd for lay in parts)),
                 compute_bwd_s=cast(Floats, sum(lay.compute_bwd for lay in parts)), stays_gathered=stays_gathered)


def _linear_terms(
    lay: _Layer, prev: _Layer, *, g: _Groups, options: RunOptions, c: Candidates,
    n_micro: Floats, overlap_data: bool = False,
) -> list[CollectiveTerm]:
    """The tensor-parallel and data collectives of one linear layer (table in the module docstring;
    its Z collectives are ``axoplan.cost.zsharding``'s), with their exposed parts. Layers that are
    not ``recomputed`` (the LM head) have no recompute calls. With ``overlap_data`` (a framework
    whose gradient buckets are reduced during the backward) the data all-reduce of a layer hides
    behind the backward compute of the layer before it in the forward order (``prev``), which
    runs next in the last micro-batch's backward."""
    calls = n_micro * lay.count
    rec = c.recompute.astype(np.float64) * lay.spec.recomputed
    if options.overlap_forward_all_reduce:
        ar_fwd_exposed = lay.ar_fwd / 2 + np.maximum(lay.ar_fwd / 2 - lay.t_fwd / 2, 0.0)
    else:
        ar_fwd_exposed = lay.ar_fwd
    ar_bwd_exposed = np.maximum(lay.ar_bwd - lay.t_dw, 0.0) if options.overlap_all_reduce else lay.ar_bwd
    ar_data_exposed = np.maximum(lay.ar_data - prev.compute_bwd, 0.0) if overlap_data else lay.ar_data
    rows = (
        ("forward", "all-reduce", lay.in_axis, lay.bytes_out, calls, lay.ar_fwd, ar_fwd_exposed),
        ("recompute", "all-reduce", lay.in_axis, lay.bytes_out, calls * rec, lay.ar_fwd, ar_fwd_exposed),
        ("backward", "all-reduce", lay.out_axis, lay.bytes_in, calls, lay.ar_bwd, ar_bwd_exposed),
        ("step", "all-reduce", "data", lay.bytes_shard, np.full_like(n_micro, lay.count), lay.ar_data,
         ar_data_exposed),
    )
    return [CollectiveTerm(lay.spec.name, phase, op, axis, g.size[axis].astype(np.int64), g.stride[axis], nbytes,
                           k, g.bw[axis], t, e) for phase, op, axis, nbytes, k, t, e in rows]


def _world_term(model: ModelSpec, options: RunOptions, g: _Groups, n_micro: Floats) -> CollectiveTerm:
    """One all-reduce of the replicated parameters' gradients over the whole world per step."""
    nbytes = np.full_like(n_micro, replicated_params(model) * options.grad_reduce_bytes)
    t = coll.all_reduce_s(nbytes, g.size["world"], g.bw["world"], g.lat["world"])
    return CollectiveTerm("norms+biases", "step", "all-reduce", "world", g.size["world"].astype(np.int64),
                          g.stride["world"], nbytes, np.ones_like(n_micro), g.bw["world"], t, t)


def _statistics_terms(
    model: ModelSpec, g: _Groups, c: Candidates, tokens: Floats, n_micro: Floats
) -> list[CollectiveTerm]:
    """Small, latency-bound all-reduces of statistics, all exposed.

    Norms see ``[m_l, H/Gx]``: each of the ``2L + 1`` norms all-reduces two fp32 sums per token
    over X in the forward (again when recomputed) and two in the backward. The
    vocabulary-parallel loss all-reduces the max, the sum of exponentials and the target
    logit (fp32 per token) over Y.
    """
    norms = 2.0 * model.num_layers + 1.0
    rec = c.recompute.astype(np.float64)
    out = []
    for layer, phase, axis, nbytes, calls in (
        ("norms", "forward", "x", tokens * 8.0, n_micro * norms),
        ("norms", "recompute", "x", tokens * 8.0, n_micro * 2.0 * model.num_layers * rec),
        ("norms", "backward", "x", tokens * 8.0, n_micro * norms),
        ("loss", "forward", "y", tokens * 4.0, n_micro * 3.0),
    ):
        t = coll.all_reduce_s(nbytes, g.size[axis], g.bw[axis], g.lat[axis])
        out.append(CollectiveTerm(layer, phase, "all-reduce", axis, g.size[axis].astype(np.int64), g.stride[axis],
                                  nbytes, calls, g.bw[axis], t, t))
    return out


def _compute_columns(
    layers: list[_Layer], model: ModelSpec, machine: Machine, c: Candidates, n_micro: Floats,
    dilation: Floats | None = None,
) -> dict[str, Floats]:
    rec = c.recompute.astype(np.float64)
    gemm = sum(lay.count * (lay.t_fwd * (1 + rec * lay.spec.recomputed) + lay.t_dx + lay.t_dw) for lay in layers)
    other = sum(lay.count * (lay.extra_fwd * (1 + rec * lay.spec.recomputed) + lay.extra_bwd) for lay in layers)
    params = sharded_params(model, c) + replicated_params(model)
    optimizer = memory_bound_s(machine, params * 30.0)  # read/write master, m, v, grad; write bf16 weight
    if dilation is not None:
        optimizer = optimizer * dilation
    return {"t_gemm_s": n_micro * gemm, "t_nongemm_s": n_micro * other, "t_optimizer_s": optimizer}


def _per_micro_counts(profile: FrameworkProfile, model: ModelSpec, c: Candidates) -> tuple[Floats, Floats]:
    """Host ops and device kernels of one micro-batch, collectives excluded (``axoplan/framework.py``):
    every block's forward, again when recomputed with the checkpoint's bookkeeping, its backward,
    then the head's forward and backward."""
    rec = c.recompute.astype(np.float64)
    blk, head = profile.block, profile.head
    fwd_k, bwd_k = profile.kernels_per_block
    ops = model.num_layers * (blk.forward.host_ops * (1.0 + rec) + blk.backward.host_ops
                              + blk.recompute_extra_host_ops * rec)
    kernels = model.num_layers * (fwd_k * (1.0 + rec) + bwd_k)
    ops = ops + head.forward.host_ops + head.backward.host_ops
    kernels = kernels + sum(p.kernels + p.gemm_kernels for p in (head.forward, head.backward))
    return ops, kernels


def _host_s(
    profile: FrameworkProfile, model: ModelSpec, machine: Machine, c: Candidates, terms: list[CollectiveTerm],
    n_micro: Floats,
) -> tuple[Floats, Floats]:
    """Host seconds and device kernel-gap seconds per step.

    Each host op costs ``host.op_us`` and each kernel launched on the device another
    ``host.launch_us`` (the driver's launch call: about 3 µs for an empty kernel, Boyer,
    "CUDA kernel overhead", U. Virginia; 5–20 µs CPU-side in PyTorch traces, Meta's
    HolisticTraceAnalysis docs); each collective call on a group of more than one rank is one
    more op and one more kernel (frameworks skip a group of one, as Megatron's mappings do);
    each kernel costs the device ``device.kernel_gap_us`` besides its work."""
    ops, kernels = _per_micro_counts(profile, model, c)
    calls = sum(t.calls_per_step * (t.group_size > 1) for t in terms
                if t.phase != "step" and not t.is_drain) / n_micro
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


def _step_columns(
    model: ModelSpec, machine: Machine, options: RunOptions, c: Candidates, g: _Groups,
    terms: list[CollectiveTerm], compute: dict[str, Floats], n_micro: Floats, profile: FrameworkProfile,
    dilation: Floats | None = None,
) -> dict[str, Floats]:
    """The step: compute, exposed collectives, what hidden collectives take from the compute beside
    them, the wait for the slowest GPU, and the time the device waits for the host."""
    cols = dict(compute)
    totals = [(t.axis, t.total_s, t.exposed_s) for t in terms]
    comm_axes = (*AXES, "world")
    for axis in comm_axes:
        cols[f"t_comm_{axis}_s"] = cast(Floats, sum(total for a, total, _ in totals if a == axis))
        cols[f"t_exposed_{axis}_s"] = cast(Floats, sum(exposed for a, _, exposed in totals if a == axis))
    cols["t_comm_total_s"] = cast(Floats, sum(cols[f"t_comm_{a}_s"] for a in comm_axes))
    cols["t_comm_exposed_s"] = cast(Floats, sum(cols[f"t_exposed_{a}_s"] for a in comm_axes))
    host_s, gaps_s = _host_s(profile, model, machine, c, terms, n_micro)
    if dilation is not None:  # the host shares the cores too
        host_s = host_s * dilation
    cols["t_nongemm_s"] = compute["t_nongemm_s"] + gaps_s
    cols["t_compute_s"] = compute["t_gemm_s"] + cols["t_nongemm_s"] + compute["t_optimizer_s"]
    cols["t_interference_s"] = cast(Floats, sum(
        interference_s(np.maximum(cols[f"t_comm_{a}_s"] - cols[f"t_exposed_{a}_s"], 0.0), g.crosses[a],
                       machine.intra_node.processor_usage, machine.inter_node.processor_usage) for a in comm_axes))
    busy = compute["t_gemm_s"] + cols["t_nongemm_s"] + cols["t_interference_s"]
    cols["t_straggler_s"] = busy * straggler_factor(machine.device.speed_variation, c.world_size)
    device_s = busy + cols["t_straggler_s"] + cast(Floats, sum(t.exposed_s for t in terms if t.phase != "step"))
    cols["t_host_idle_s"] = _host_idle_s(machine, host_s, device_s)
    step = (cols["t_compute_s"] + cols["t_comm_exposed_s"] + cols["t_interference_s"] + cols["t_straggler_s"]
            + cols["t_host_idle_s"])
    cols["t_step_s"] = step
    world = c.world_size.astype(np.float64)
    hw = hardware_flops(model, options, c.recompute)
    cols["tflops_per_gpu"] = hw / step / world / 1e12
    cols["pct_peak"] = 100.0 * hw / step / world / machine.peak_flops
    cols["mfu"] = 100.0 * model_flops(model, options) / step / world / machine.peak_flops
    cols["grad_accum"] = n_micro
    return cols
