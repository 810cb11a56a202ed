"""One linear layer of one micro-batch, priced for every candidate at once: its local GEMM shapes
and times (forward, dX, dW), the non-GEMM work attached to it (element-wise, attention, logits),
the bytes its collectives move, and its tensor-parallel and data all-reduce times. In two passes (issue 32):
:func:`layer_shapes` finds what does not depend on the machine's numbers (each linear's local shape, rows,
calls and bytes, and the distinct GEMM shapes), once per model, options and candidates; :func:`price_layers`
applies a machine's numbers (GEMM, non-GEMM and all-reduce seconds).

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

from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from axoplan.arrays import distinct
from axoplan.cost.attention import fused_attention_s, unfused_attention_s
from axoplan.cost.compute import BYTES_BF16, gemm_numbers, gemm_s, memory_bound_s
from axoplan.cost.groups import Groups
from axoplan.cost.ledger import LedgerCost
from axoplan.cost.memory import mlp_width, vocab_rows
from axoplan.cost.moe import expert_plan, native_routing_s, native_sync_s
from axoplan.cost.orientation import Phase, phase_gemm_s
from axoplan.inputs.framework import FrameworkProfile
from axoplan.inputs.machine import Machine
from axoplan.inputs.model import LinearLayer, ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import activation_split, tokens_gathered

__all__ = ["Layer", "LayerShape", "Layers", "layer_shapes", "price_layers"]

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


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
    t_rec: Floats  # what a recompute reruns of its GEMM (none for a linear outside the blocks: the LM head)
    extra_rec: Floats  # and of the non-GEMM work attached to it
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


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One linear as the machine's numbers do not change it: its call's shape (`spec`), calls per micro-batch,
    GEMM rows and local ``k``, ``n``, the factor of an expert's most loaded shard, the bytes its collectives move,
    and which of the block's non-GEMM work it carries (`part` times `share`, the attention where it reads it, the
    router where it is the first expert linear, divided over `calls` copies)."""

    spec: LinearLayer
    count: int
    rows: Floats
    k_loc: Floats
    n_loc: Floats
    gemm_factor: Floats | float
    bytes_block: Floats
    bytes_out: Floats
    bytes_in: Floats
    bytes_shard: Floats
    own_rows: Floats
    n_full: Floats
    native_moe: bool
    part: str
    share: float
    attention: bool
    router: bool
    calls: int


@dataclass(frozen=True, slots=True)
class Layers:
    """Every linear's :class:`LayerShape` (block linears in execution order, then the LM head), the distinct
    local GEMM shapes among the candidates, and the non-GEMM bytes a profile without a ledger prices."""

    shapes: tuple[LayerShape, ...]
    gemms: _GemmShapes
    nongemm_bytes: dict[str, Floats]
    gemm_times: dict[tuple[object, ...], list[tuple[Floats, Floats, Floats]]] = field(default_factory=dict)
    """Each linear's forward, dX and dW GEMM seconds by the machine numbers they read
    (:func:`axoplan.cost.compute.gemm_numbers`): found once for each set of them, whatever else a repricing moves."""


def layer_shapes(model: ModelSpec, options: RunOptions, c: Candidates, sizes: dict[str, Floats], tokens: Floats,
                 profile: FrameworkProfile) -> Layers:
    """The pass of :func:`price_layers` that depends on no machine number (module docstring). A block's
    elementwise work is shared equally by its linears; the attention is attached to the layer that reads its
    output; the logits' softmax work to the head (with a ledger: the rest of the step's ops)."""
    block = model.block_linears()
    rows = tokens * np.asarray(tokens_gathered(c.gx, c.gy, options.hf_path), dtype=np.float64)
    vocab = vocab_rows(model, c)
    xy = sizes["x"] * sizes["y"]
    out = []
    for spec in (*block, model.head_linear(0)):
        head = spec.role == "head"
        plan = expert_plan(spec, model, options, c, rows, tokens)
        n = vocab if head else np.float64(plan.spec.n_out)
        one, zero = plan.spec, 0.0 * plan.rows
        k_loc, n_loc = one.k_in / sizes[one.in_axis], n / sizes[one.out_axis] + zero
        block_elems = one.k_in * n * one.experts / xy
        shard = np.ceil(block_elems / sizes["z"]) if plan.shard_elems is None else plan.shard_elems
        out.append(LayerShape(
            spec=one, count=(1 if head else model.num_layers) * plan.calls, rows=plan.rows, k_loc=k_loc, n_loc=n_loc,
            gemm_factor=plan.gemm_factor, bytes_block=block_elems * profile.z_gather_bytes,
            bytes_out=plan.rows * n_loc * BYTES_BF16, bytes_in=plan.rows * k_loc * BYTES_BF16,
            bytes_shard=shard * options.grad_reduce_bytes, own_rows=tokens * spec.token_share,
            n_full=n + zero, native_moe=plan.native, part="logits" if head else "elementwise",
            share=1.0 if head else 1.0 / len(block), attention=spec.input == "attention",
            router=spec.name == "expert_up", calls=plan.calls))
    return Layers(tuple(out), _GemmShapes.of(c), _nongemm_fwd_bytes(model, options, c, tokens, profile))


def price_layers(
    layers: Layers, model: ModelSpec, machine: Machine, options: RunOptions, c: Candidates, g: Groups,
    tokens: Floats, dilation: Floats | None = None, ledger: LedgerCost | None = None,
) -> list[Layer]:
    """Every linear of `layers` with `machine`'s numbers: its GEMMs, the non-GEMM work it carries (the ledger's,
    where the framework has one: a block's non-GEMM ops, its attention, and the rest of the step's on the head)
    and its all-reduces."""
    gemm_share = 1.0
    if ledger is not None:
        extra_fwd, extra_bwd, extra_rec = _ledger_nongemm_s(ledger)
        gemm_share = ledger.recompute_gemm_share
    else:
        extra_fwd, extra_bwd = _nongemm_s(model, machine, options, c, layers.nongemm_bytes)
        extra_rec = extra_fwd  # full recompute: the forward again
    router_fwd, routing_fwd, syncs = _router_s(model, machine, tokens), 0.0 * tokens, 0.0
    if model.moe is not None and options.moe_module == "native":
        routing_fwd, syncs = native_routing_s(model, machine, options, tokens), native_sync_s(model, machine)
    key = gemm_numbers(machine)
    if key not in layers.gemm_times:
        layers.gemm_times[key] = [_gemm_times(shape, machine, options, layers.gemms) for shape in layers.shapes]
    out = []
    for shape, gemms in zip(layers.shapes, layers.gemm_times[key], strict=True):
        fwd, bwd, rec = (extra[shape.part] * shape.share + (extra["attention"] if shape.attention else 0.0)
                         for extra in (extra_fwd, extra_bwd, extra_rec))
        if shape.router:  # the router and its top-k run before the experts, on the GPU's own tokens
            fwd, bwd, rec = fwd + router_fwd, bwd + 2.0 * router_fwd, rec + router_fwd
            # the native module's permutations, forward and mirrored backward, and its routing's host syncs
            fwd, bwd, rec = fwd + routing_fwd + syncs, bwd + routing_fwd, rec + routing_fwd + syncs
        if shape.calls > 1:  # the block's own work is shared by the copies that each run as a linear
            fwd, bwd, rec = fwd / shape.calls, bwd / shape.calls, rec / shape.calls
        out.append(_layer(shape, gemms, g, (fwd, bwd, rec), gemm_share, dilation))
    return out


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
        keys = distinct(key)
        back = np.searchsorted(keys, key)  # faster than return_inverse on tens of thousands of rows
        first = np.empty(len(keys), dtype=np.int64)
        first[back] = np.arange(len(key))  # any row of a key will do: its shape is the key's
        return cls(first, back)

    def time(self, machine: Machine, m: Floats, n: Floats, k: Floats, phase: Phase, tuned: bool) -> Floats:
        f = self.first
        return phase_gemm_s(machine, m[f], n[f], k[f], phase, tuned)[self.back]


def _gemm_times(shape: LayerShape, machine: Machine, options: RunOptions,
                shapes: _GemmShapes) -> tuple[Floats, Floats, Floats]:
    """Seconds of one call's forward, dX and dW GEMMs on its rows (the forward in two halves where its
    all-reduce is overlapped in two chunks)."""
    tokens, k_loc, n_loc, tuned = shape.rows, shape.k_loc, shape.n_loc, options.tuned_gemm
    time = shapes.time  # every row count here is the micro-batch's tokens times a function of Gx, Gy and options
    if options.overlap_forward_all_reduce:
        t_fwd = 2.0 * time(machine, tokens / 2.0, n_loc, k_loc, "forward", tuned)
    else:
        t_fwd = time(machine, tokens, n_loc, k_loc, "forward", tuned)
    return t_fwd, time(machine, tokens, k_loc, n_loc, "dx", tuned), time(machine, n_loc, k_loc, tokens, "dw", tuned)


def _layer(shape: LayerShape, gemms: tuple[Floats, Floats, Floats], g: Groups,
           extra: tuple[Floats, Floats, Floats], gemm_share: float, dilation: Floats | None = None) -> Layer:
    """One call of a linear: its GEMMs (times `gemm_factor`: the wait for the most loaded shard of an expert), the
    work attached to it (`extra`: forward, backward, and what a recompute reruns of it), what a recompute reruns
    (a block linear's forward GEMM times `gemm_share`, the share of the block's GEMM flops its framework's
    checkpointing reruns: 1 under full recompute; nothing for a linear outside the blocks), and its all-reduces
    over its in-axis, out-axis and data groups."""
    spec, tokens = shape.spec, shape.rows
    in_axis, out_axis = spec.in_axis, spec.out_axis
    t_fwd, t_dx, t_dw = (t * shape.gemm_factor for t in gemms)
    again = float(spec.recomputed)
    extra_fwd, extra_bwd, extra_rec = (np.broadcast_to(e, tokens.shape) for e in extra)
    t_rec, extra_rec = t_fwd * (gemm_share * again), extra_rec * again
    if dilation is not None:
        t_fwd, t_dx, t_dw, t_rec, extra_fwd, extra_bwd, extra_rec = (
            t * dilation for t in (t_fwd, t_dx, t_dw, t_rec, extra_fwd, extra_bwd, extra_rec))
    return Layer(
        spec=spec, count=shape.count, in_axis=in_axis, out_axis=out_axis,
        t_fwd=t_fwd, t_dx=t_dx, t_dw=t_dw, extra_fwd=extra_fwd, extra_bwd=extra_bwd, t_rec=t_rec, extra_rec=extra_rec,
        ar_fwd=g.rates[in_axis].all_reduce_s(shape.bytes_out),
        ar_bwd=g.rates[out_axis].all_reduce_s(shape.bytes_in),
        ar_data=g.rates["data"].all_reduce_s(shape.bytes_shard),
        bytes_block=shape.bytes_block, bytes_out=shape.bytes_out, bytes_in=shape.bytes_in,
        bytes_shard=shape.bytes_shard, own_rows=shape.own_rows, n_full=shape.n_full, native_moe=shape.native_moe,
    )


def _ledger_nongemm_s(cost: LedgerCost) -> tuple[dict[str, Floats], dict[str, Floats], dict[str, Floats]]:
    """Forward and backward seconds of a block's non-GEMM ops, its attention, and the rest of the step (the
    ledger's, ``axoplan.cost.ledger``), and what a recompute reruns of the block's (``LedgerCost.recompute_scope``;
    the rest is not recomputed)."""
    def phase(block: str, rest: str | None) -> dict[str, Floats]:
        return {"elementwise": cost.scope_s(block, exclude=("attention",)),
                "attention": cost.class_s("attention", block),
                "logits": cost.scope_s(rest) if rest else 0.0 * cost.scope_s(block)}

    return (phase("block_forward", "rest_forward"), phase("block_backward", "rest_backward"),
            phase(cost.recompute_scope, None))


def _nongemm_s(model: ModelSpec, machine: Machine, options: RunOptions, c: Candidates,
               nongemm_bytes: dict[str, Floats]) -> tuple[dict[str, Floats], dict[str, Floats]]:
    """Forward and backward seconds of the work that is not a sharded GEMM, for a profile without a ledger: the
    forward's element-wise and logits bytes (:func:`_nongemm_fwd_bytes`) through HBM, twice that backward (a
    backward reads and writes about twice the forward), and the attention core (``axoplan.cost.attention``) on
    the heads a GPU holds (:func:`axoplan.space.layout.activation_split`)."""
    extra_fwd = {part: memory_bound_s(machine, nbytes) for part, nbytes in nongemm_bytes.items()}
    extra_bwd = {k: 2.0 * v for k, v in extra_fwd.items()}
    attention = unfused_attention_s if options.attention == "unfused" else fused_attention_s
    _, heads_y = activation_split(c.gx, c.gy, options.hf_path)
    extra_fwd["attention"], extra_bwd["attention"] = attention(model, machine, options, replace(c, gy=heads_y))
    return extra_fwd, extra_bwd


def _nongemm_fwd_bytes(model: ModelSpec, options: RunOptions, c: Candidates, tokens: Floats,
                       profile: FrameworkProfile) -> dict[str, Floats]:
    """Bytes the forward moves per block in work that is not a sharded GEMM (and for the logits).

    Tokens are split over Gdata·Gz. Heads are split over Y, so attention is repeated by the
    Gx members of an X group (``docs/algorithm.md`` §1). The residual stream between blocks is the
    transposed layers' output ``[m_l, H/Gx]``: norms and residual adds (``10·H`` elements
    per token) are split over X and repeated over Y; the activation function (``2·F`` GeLU,
    ``3·F`` SwiGLU) works on ``[m_l, F/Gy]``. 2 bytes per element. On the hf path the GPU's own tokens
    at full width (:func:`axoplan.space.layout.activation_split`). The logits' forward moves a third of the
    profile's loss traffic over the vocabulary a GPU holds of them.
    """
    split_x, split_y = activation_split(c.gx, c.gy, options.hf_path)
    gx, gy = split_x.astype(np.float64), split_y.astype(np.float64)
    act = 3.0 if model.ffn_kind == "swiglu" else 2.0
    ew_bytes = tokens * (10.0 * model.hidden / gx + act * mlp_width(model) / gy) * BYTES_BF16
    logits_bytes = tokens * vocab_rows(model, c) / gy * profile.loss_traffic_bytes / 3.0  # forward's third
    return {"elementwise": ew_bytes, "logits": logits_bytes}
