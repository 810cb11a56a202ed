"""One linear layer of one micro-batch, priced for every candidate at once: its local GEMM shapes
and times (forward, dX, dW), the non-GEMM work attached to it (element-wise, attention, logits),
the bytes its collectives move, and its tensor-parallel and data all-reduce times; and each
axis's group (size, stride, bandwidth, latency) as `axoplan.cost.placement` places it.

Shapes (``docs/algorithm.md`` §1): a plain layer's input features are split over X and its
output features over Y (a transposed layer swaps them); ``m_l = micro_batch · S`` tokens per
GPU; a Z-gathered weight block is ``k·n/(Gx·Gy)`` elements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from axoplan.cost import collectives as coll
from axoplan.cost.attention import fused_attention_s, unfused_attention_s
from axoplan.cost.compute import memory_bound_s
from axoplan.cost.memory import vocab_rows
from axoplan.cost.orientation import Phase, phase_gemm_s
from axoplan.cost.placement import place_groups
from axoplan.inputs.framework import FrameworkProfile
from axoplan.inputs.machine import Machine
from axoplan.inputs.model import LinearLayer, ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates

__all__ = ["BYTES", "Groups", "Layer", "axis_groups", "linear_layers"]

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
BYTES = 2.0  # bf16 weights and activations


@dataclass(frozen=True, slots=True)
class Groups:
    """Size, stride, bandwidth, latency (per all-reduce step, and a ring's) and node crossing of each
    axis's group, per candidate."""

    size: dict[str, Floats]
    stride: dict[str, Ints]
    bw: dict[str, Floats]
    lat: dict[str, Floats]
    ring: dict[str, Floats]
    crosses: dict[str, npt.NDArray[np.bool_]]


@dataclass(frozen=True, slots=True)
class Layer:
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


def axis_groups(machine: Machine, c: Candidates) -> Groups:
    sizes = c.sizes() | {"world": c.world_size}
    strides = c.strides() | {"world": np.ones_like(c.gx)}
    axes = list(sizes)
    all_strides, all_sizes = (np.concatenate([d[a] for a in axes]) for d in (strides, sizes))
    placed = place_groups(machine, all_strides, all_sizes)
    n = len(c)

    def by_axis(values: np.ndarray) -> dict[str, np.ndarray]:
        return {a: values[i * n:(i + 1) * n] for i, a in enumerate(axes)}

    return Groups({a: s.astype(np.float64) for a, s in sizes.items()}, strides, by_axis(placed.bandwidth_gbs),
                   by_axis(placed.latency_us), by_axis(placed.ring_latency_us), by_axis(placed.crosses_nodes))


def linear_layers(
    model: ModelSpec, machine: Machine, options: RunOptions, c: Candidates, g: Groups, tokens: Floats,
    profile: FrameworkProfile, dilation: Floats | None = None,
) -> list[Layer]:
    """Block layers in execution order, then the LM head (its rows: the padded vocabulary).

    A block's elementwise work is shared equally by its linears; the attention is attached
    to the layer that reads its output; the logits' softmax work to the head."""
    block = model.block_linears()
    extra_fwd = _nongemm_fwd_s(model, machine, options, c, tokens, profile)
    extra_bwd = {k: 2.0 * v for k, v in extra_fwd.items()}  # a backward reads and writes about twice the forward
    attention = unfused_attention_s if options.attention == "unfused" else fused_attention_s
    extra_fwd["attention"], extra_bwd["attention"] = attention(model, machine, options, c)
    vocab = vocab_rows(model, c)
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
    g: Groups, tokens: Floats, extra_fwd: Floats, extra_bwd: Floats, shapes: _GemmShapes,
    dilation: Floats | None = None,
) -> Layer:
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
    return Layer(
        spec=spec, count=count, in_axis=in_axis, out_axis=out_axis,
        t_fwd=t_fwd, t_dx=t_dx, t_dw=t_dw, extra_fwd=extra_fwd, extra_bwd=extra_bwd,
        ar_fwd=coll.all_reduce_s(bytes_out, g.size[in_axis], g.bw[in_axis], g.lat[in_axis]),
        ar_bwd=coll.all_reduce_s(bytes_in, g.size[out_axis], g.bw[out_axis], g.lat[out_axis]),
        ar_data=coll.all_reduce_s(bytes_shard, g.size["data"], g.bw["data"], g.lat["data"]),
        bytes_block=bytes_block, bytes_out=bytes_out, bytes_in=bytes_in, bytes_shard=bytes_shard,
    )


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
    logits_bytes = tokens * vocab_rows(model, c) / gy * profile.loss_traffic_bytes / 3.0  # forward's third
    return {
        "elementwise": memory_bound_s(machine, ew_bytes),
        "logits": memory_bound_s(machine, logits_bytes),
    }
