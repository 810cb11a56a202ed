"""One linear layer of one micro-batch, priced for every candidate at once: its local GEMM shapes
and times (forward, dX, dW), the non-GEMM work attached to it (element-wise, attention, logits),
the bytes its collectives move, and its tensor-parallel and data all-reduce times; and each
axis's group (size, stride, bandwidth, latency) as `axoplan.cost.placement` places it.

Shapes (``docs/algorithm.md`` §1): a plain layer's input features are split over X and its
output features over Y (a transposed layer swaps them); ``m_l = micro_batch · S`` tokens per
GPU; a Z-gathered weight block is ``k·n/(Gx·Gy)`` elements.

On the Hugging Face path (``RunOptions.axonn_path``, ``docs/algorithm.md`` §4b) every GPU holds its own
``m_l`` tokens at full width; each linear gathers the tokens of its X·Y group first, so its GEMMs
see ``Gx·Gy·m_l`` rows, while the work between linears (norms, attention, element-wise) runs once
on the GPU's own tokens, all heads, repeated nowhere. An expert linear of a mixture of experts sees
``top_k/E`` of those rows (``axoplan.cost.moe``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from axoplan.cost import collectives as coll
from axoplan.cost.attention import fused_attention_s, unfused_attention_s
from axoplan.cost.compute import BYTES_BF16, gemm_s, memory_bound_s
from axoplan.cost.ledger import LedgerCost
from axoplan.cost.memory import mlp_width, vocab_rows
from axoplan.cost.moe import expert_plan
from axoplan.cost.orientation import Phase, phase_gemm_s
from axoplan.cost.placement import place_groups
from axoplan.inputs.framework import FrameworkProfile
from axoplan.inputs.machine import Machine
from axoplan.inputs.model import LinearLayer, ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates

__all__ = ["Groups", "Layer", "axis_groups", "linear_layers"]

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


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
    count: int  # calls of this linear per micro-batch (layers, times experts where each is its own linear)
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
    own_rows: Floats  # tokens one call takes from this GPU (before the hf path's gathers)
    n_full: Floats  # output features of the whole layer (the padded vocabulary for the LM head)
    native_moe: bool = False  # a DroplessMoEMLP projection (its Z traffic is axoplan.cost.moe's)

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
    profile: FrameworkProfile, dilation: Floats | None = None, ledger: LedgerCost | None = None,
) -> list[Layer]:
    """Block layers in execution order, then the LM head (its rows: the padded vocabulary).

    A block's elementwise work is shared equally by its linears; the attention is attached
    to the layer that reads its output; the logits' softmax work to the head. With a priced op
    ledger (`ledger`), that work is the ledger's: a block's non-GEMM ops, its attention, and the rest
    of the step's (embeddings, final norm, loss) on the head."""
    block = model.block_linears()
    if ledger is not None:
        extra_fwd, extra_bwd = _ledger_nongemm_s(ledger)
    else:
        extra_fwd, extra_bwd = _nongemm_s(model, machine, options, c, tokens, profile)
    router_fwd = _router_s(model, machine, tokens)
    vocab = vocab_rows(model, c)
    shapes = _GemmShapes.of(c)
    rows = tokens * (c.gx * c.gy).astype(np.float64) if options.hf_path else tokens
    out = []
    for spec in (*block, model.head_linear(0)):
        head = spec.role == "head"
        part = "logits" if head else "elementwise"
        share = 1.0 if head else 1.0 / len(block)
        fwd = extra_fwd[part] * share + (extra_fwd["attention"] if spec.input == "attention" else 0.0)
        bwd = extra_bwd[part] * share + (extra_bwd["attention"] if spec.input == "attention" else 0.0)
        if spec.name == "expert_up":  # the router and its top-k run before the experts, on the GPU's own tokens
            fwd, bwd = fwd + router_fwd, bwd + 2.0 * router_fwd
        plan = expert_plan(spec, model, options, c, rows, tokens)
        if plan.calls > 1:  # the block's own work is shared by the copies that each run as a linear
            fwd, bwd = fwd / plan.calls, bwd / plan.calls
        n = vocab if head else np.float64(plan.spec.n_out)
        lay = _layer(plan.spec, n, (1 if head else model.num_layers) * plan.calls, machine, options, g, plan.rows,
                     fwd, bwd, shapes, dilation, plan.gemm_factor, plan.shard_elems)
        out.append(replace(lay, own_rows=tokens * spec.token_share, native_moe=plan.native))
    return out


def _full_width(c: Candidates) -> Candidates:
    """The candidates as the hf path's attention sees them: every head (no split over Y)."""
    return replace(c, gy=np.ones_like(c.gy))


def _router_s(model: ModelSpec, machine: Machine, tokens: Floats) -> Floats:
    """Forward seconds of an MoE block's replicated router ``[m × H]·[H × E]`` (0 for a dense model)."""
    if model.moe is None:
        return 0.0 * tokens
    return gemm_s(machine, tokens, np.full_like(tokens, model.moe.num_experts), np.full_like(tokens, model.hidden))


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
    dilation: Floats | None = None, gemm_factor: Floats | float = 1.0, shard_elems: Floats | None = None,
) -> Layer:
    """One call of a linear: `tokens` rows into its GEMMs (times `gemm_factor`: the wait for the most loaded
    shard of an expert), its ``k·n/(Gx·Gy)`` block (all experts' where one grouped linear holds them), and the
    shard a GPU keeps (`shard_elems`, or the block's Z-chunk)."""
    in_axis, out_axis = spec.in_axis, spec.out_axis
    k_loc, n_loc = spec.k_in / g.size[in_axis], n / g.size[out_axis] + 0.0 * tokens
    tuned = options.tuned_gemm
    time = shapes.time  # every row count here is the micro-batch's tokens times a function of Gx, Gy and options
    if options.overlap_forward_all_reduce:
        t_fwd = 2.0 * time(machine, tokens / 2.0, n_loc, k_loc, "forward", tuned)
    else:
        t_fwd = time(machine, tokens, n_loc, k_loc, "forward", tuned)
    t_dx = time(machine, tokens, k_loc, n_loc, "dx", tuned)
    t_dw = time(machine, n_loc, k_loc, tokens, "dw", tuned)
    t_fwd, t_dx, t_dw = (t * gemm_factor for t in (t_fwd, t_dx, t_dw))
    extra_fwd, extra_bwd = np.broadcast_to(extra_fwd, tokens.shape), np.broadcast_to(extra_bwd, tokens.shape)
    if dilation is not None:
        t_fwd, t_dx, t_dw, extra_fwd, extra_bwd = (t * dilation for t in (t_fwd, t_dx, t_dw, extra_fwd, extra_bwd))
    block = spec.k_in * n * spec.experts / (g.size["x"] * g.size["y"])
    shard = np.ceil(block / g.size["z"]) if shard_elems is None else shard_elems
    bytes_block = block * BYTES_BF16
    bytes_out, bytes_in = tokens * n_loc * BYTES_BF16, tokens * k_loc * BYTES_BF16
    bytes_shard = shard * options.grad_reduce_bytes
    return Layer(
        spec=spec, count=count, in_axis=in_axis, out_axis=out_axis,
        t_fwd=t_fwd, t_dx=t_dx, t_dw=t_dw, extra_fwd=extra_fwd, extra_bwd=extra_bwd,
        ar_fwd=coll.all_reduce_s(bytes_out, g.size[in_axis], g.bw[in_axis], g.lat[in_axis]),
        ar_bwd=coll.all_reduce_s(bytes_in, g.size[out_axis], g.bw[out_axis], g.lat[out_axis]),
        ar_data=coll.all_reduce_s(bytes_shard, g.size["data"], g.bw["data"], g.lat["data"]),
        bytes_block=bytes_block, bytes_out=bytes_out, bytes_in=bytes_in, bytes_shard=bytes_shard,
        own_rows=tokens, n_full=n + 0.0 * tokens,
    )


def _ledger_nongemm_s(cost: LedgerCost) -> tuple[dict[str, Floats], dict[str, Floats]]:
    """Forward and backward seconds of a block's non-GEMM ops, its attention, and the rest of the step (the
    ledger's, ``axoplan.cost.ledger``)."""
    def phase(name: str) -> dict[str, Floats]:
        return {"elementwise": cost.scope_s(f"block_{name}", exclude=("attention",)),
                "attention": cost.class_s("attention", f"block_{name}"), "logits": cost.scope_s(f"rest_{name}")}

    return phase("forward"), phase("backward")


def _nongemm_s(
    model: ModelSpec, machine: Machine, options: RunOptions, c: Candidates, tokens: Floats, profile: FrameworkProfile,
) -> tuple[dict[str, Floats], dict[str, Floats]]:
    """Forward and backward seconds of the work that is not a sharded GEMM, for a profile without a ledger: the
    forward's element-wise and logits work (:func:`_nongemm_fwd_s`), twice that backward (a backward reads and
    writes about twice the forward), and the attention core (``axoplan.cost.attention``)."""
    extra_fwd = _nongemm_fwd_s(model, machine, options, c, tokens, profile)
    extra_bwd = {k: 2.0 * v for k, v in extra_fwd.items()}
    attention = unfused_attention_s if options.attention == "unfused" else fused_attention_s
    heads_of = _full_width(c) if options.hf_path else c  # hf: every head on the GPU's own sequences
    extra_fwd["attention"], extra_bwd["attention"] = attention(model, machine, options, heads_of)
    return extra_fwd, extra_bwd


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
    if options.hf_path:  # the GPU's own tokens at full width (docs/algorithm.md §4b)
        gx, gy = np.ones_like(gx), np.ones_like(gy)
    act = 3.0 if model.ffn_kind == "swiglu" else 2.0
    ew_bytes = tokens * (10.0 * model.hidden / gx + act * mlp_width(model) / gy) * BYTES_BF16
    logits_bytes = tokens * vocab_rows(model, c) / gy * profile.loss_traffic_bytes / 3.0  # forward's third
    return {
        "elementwise": memory_bound_s(machine, ew_bytes),
        "logits": memory_bound_s(machine, logits_bytes),
    }
