"""Mixture-of-experts blocks on AxoNN's two MoE paths, for every candidate (``docs/algorithm.md`` §4c).

Neither path has expert parallelism: every GPU holds a shard of every expert.

* **hf-mixtral** (AxoNN's Hugging Face Mixtral patch, ``axonn/models/transformers/modify_mixtral.py``):
  each expert's ``w1``, ``w3`` (plain) and ``w2`` (transposed) is its own AxoNN linear on the hf path, so a
  block runs ``3·E`` linears, each with its own Z all-gather, reduce-scatter and X/Y collectives, on the
  ``top_k/E`` of the X·Y group's tokens routed to that expert: small GEMMs, priced by the tile and wave
  model (``axoplan.cost.compute``). The ranks of a Z group meet in every expert's collectives, so each
  expert waits for the Z shard with the most tokens routed to it (:func:`imbalance_factor`).
* **native** (AxoNN's ``DroplessMoEMLP``, ``axonn/intra_layer/moe/layer.py``, ``linear.py``, ``routing.py``,
  ``communication.py``): inside Z (``Gx = Gy = 1``) a tensor-parallel group of ``expert_tp`` ranks gathers
  its tokens and routing map, permutes them by expert, runs one grouped GEMM per projection on the expert
  FFN width split ``expert_tp`` ways, and reduce-scatters the output; the expert weights are sharded over the
  other ``Gz/expert_tp`` ranks (FSDP), gathered before the forward and again before the backward
  (``_gather(..., cache=False)``), their gradients reduce-scattered, all blocking (:func:`native_terms`).

* **transformers** (transformers 5's own ``MixtralExperts``: every expert's weights in one 3-D parameter, one
  grouped GEMM per projection over the tokens sorted by expert, ``transformers/integrations/moe.py``): not an
  ``nn.Linear``, so neither ``auto_parallelize`` nor AxoNN's Mixtral patch (written for per-expert ``nn.Linear``
  modules) shards it; it runs whole on every GPU, only with data parallelism (``Gx = Gy = Gz = 1``), its GEMMs in
  the weights' dtype (``_grouped_mm`` is not autocast-enabled: fp32 under ``Trainer(bf16=True)``), priced with
  the rest of its op list by the framework's ledger (``axoplan.cost.ledger``).

The router (``nn.Linear(H, E)``) is replicated on both paths: every GPU runs it on its own tokens and its
gradient is all-reduced with the other replicated parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from axoplan.cost.compute import BYTES_BF16, memory_bound_s
from axoplan.cost.groups import Groups
from axoplan.cost.ledger import sync_stall_s
from axoplan.cost.scale import expected_max_normal
from axoplan.cost.terms import CollectiveTerm, collective_term
from axoplan.inputs.machine import Machine
from axoplan.inputs.model import LinearLayer, ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates

__all__ = ["ExpertPlan", "RoutingCounts", "expert_plan", "imbalance_factor", "native_routing_counts",
           "native_routing_s", "native_sync_s", "native_terms"]

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ExpertPlan:
    """How the cost model runs one of a block's linears: its shape as one call, calls per block, GEMM rows per
    call, the factor of the most loaded shard, the shard a GPU keeps, and whether it is native MoE."""

    spec: LinearLayer
    calls: int
    rows: Floats
    gemm_factor: Floats | float
    shard_elems: Floats | None
    native: bool


def expert_plan(spec: LinearLayer, model: ModelSpec, options: RunOptions, c: Candidates, rows: Floats,
                tokens: Floats) -> ExpertPlan:
    """A dense linear as it is; an expert linear as its MoE path runs it (module docstring).

    `rows` are the tokens a dense linear's GEMMs see (the hf path's gathered rows), `tokens` the GPU's own."""
    if not spec.is_expert or model.moe is None:
        return ExpertPlan(spec, 1, rows, 1.0, None, False)
    if options.moe_module == "transformers":  # the framework's ledger prices its grouped fp32 GEMMs
        return ExpertPlan(spec, 1, rows * spec.token_share, 0.0, None, False)
    if options.moe_module == "hf-mixtral":
        one = spec.with_shape(spec.k_in, spec.n_out, spec.out_chunks, 1, spec.token_share)
        routed = rows * spec.token_share
        return ExpertPlan(one, spec.experts, routed, imbalance_factor(model, c, routed), None, False)
    tp = options.expert_tp
    k, n = (spec.k_in, spec.n_out // tp) if not spec.transposed else (spec.k_in // tp, spec.n_out)
    grouped = spec.with_shape(k, n, spec.out_chunks, spec.experts, spec.token_share)
    shard = np.ceil(spec.num_params / c.gz.astype(np.float64))
    return ExpertPlan(grouped, 1, tokens * tp * model.moe.top_k, 1.0, shard, True)


@dataclass(frozen=True, slots=True)
class RoutingCounts:
    """Host ops and kernels the native module's layer runs beyond the dense MLP a profile counts (Megatron-AxoNN's
    MLP-up, bias-GeLU and MLP-down, which it replaces), per layer and micro-batch, and its host syncs per forward
    (:func:`native_routing_counts`)."""

    forward_ops: float
    backward_ops: float
    forward_kernels: float
    backward_kernels: float
    syncs: float


def native_routing_counts(model: ModelSpec) -> RoutingCounts:
    """What AxoNN's ``DroplessMoEMLP`` runs beyond a dense MLP, traced from a rebuild of its code (``layer.py``,
    ``linear.py``, ``communication.py`` @0e02dbf, ``routing.py`` @13f402d) on one rank with the ledger tracer's
    recorder, less Megatron-AxoNN's MLP traced the same way: ``python -m benchmarks.tracing.axonn_moe`` (torch 2.13.0,
    2026-11-27), each count linear in the experts ``E`` and the experts per token ``k`` (collectives left out: the
    cost model counts them):

    * forward: ``23 + 4k + 3E`` host ops and ``15 + k + E`` kernels: the router's ``addmm``, softmax, ``topk``, the
      probabilities' sum, ``+ 1e-8`` and division, the routing map's ``zeros`` and per chosen expert an ``arange``, a
      select, the ``True`` and an ``index_put_``; the map's transpose copied, then per expert a select, a ``nonzero``
      (``torch.where``) and its ``unbind``; ``cat``, ``sum``, the permuting ``index``, the counts' copy to the host;
      two grouped GEMMs on reshaped weights, the strided halves, ``silu`` and ``mul``; the unpermutation's ``zeros``,
      ``unsqueeze``, ``expand``, ``scatter_add_`` and ``empty``; less the MLP's two GEMMs, bias-GeLU and views;
    * backward: ``2`` host ops and ``6`` kernels more than the MLP's (four grouped GEMMs, ``mul``'s two products,
      ``silu``'s backward, two ``slice_backward``, their sum, the mirror permutations);
    * ``E + 1`` host syncs per forward: each ``nonzero`` waits for its count on the device to size its output, and
      ``per_expert_token_counts.cpu()`` copies the counts to the host (``grouped_gemm`` reads them there).

    Host ops here are dispatched aten ops, the ledgers' unit: they leave out the modules' and autograd functions'
    Python, which a replay measures (docs/decisions.md: Megatron-AxoNN's replayed block was 5-9 times its ops)."""
    assert model.moe is not None
    e, k = float(model.moe.num_experts), float(model.moe.top_k)
    return RoutingCounts(forward_ops=23.0 + 4.0 * k + 3.0 * e, backward_ops=2.0, forward_kernels=15.0 + k + e,
                         backward_kernels=6.0, syncs=e + 1.0)


def native_routing_s(model: ModelSpec, machine: Machine, options: RunOptions, tokens: Floats) -> Floats:
    """Device seconds of the native module's token permutation in one forward (its backward runs the mirror
    permutations: the same): ``R = tp·m`` gathered rows, ``k`` experts each, bf16 features. The permuting index reads
    and writes ``R·k·H·2`` bytes; the unpermutation fills ``R·H·2`` and its ``scatter_add_`` reads the ``R·k`` rows
    and reads and writes their targets (``3·R·k·H·2``); the two int64 index tensors ``R·k·8`` each
    (``communication.py`` @0e02dbf)."""
    assert model.moe is not None
    rows, k, h = float(options.expert_tp) * tokens, float(model.moe.top_k), float(model.hidden)
    nbytes = rows * h * BYTES_BF16 * (5.0 * k + 1.0) + 2.0 * rows * k * 8.0
    return memory_bound_s(machine, nbytes)


def native_sync_s(model: ModelSpec, machine: Machine) -> float:
    """Device seconds the native module's routing loses to its host syncs in one forward
    (:func:`native_routing_counts`)."""
    return native_routing_counts(model).syncs * sync_stall_s(machine)


def imbalance_factor(model: ModelSpec, c: Candidates, routed: Floats) -> Floats:
    """How much longer an expert's GEMMs take on the most loaded of the ``Gz`` shards that meet in its
    collectives than on an average one: ``skew · (1 + cv · E[max of Gz standard normals])``.

    Each of ``n`` rows picks this expert with probability ``p = top_k/E`` (the balance that the load-balancing
    loss aims for: Fedus et al., Switch Transformer, JMLR 2022, §2.2), so its count is binomial with mean
    ``n·p`` and ``cv = sqrt((1 − p)/(n·p))``; the Gz shards meet in every expert's Z collectives and wait for
    the largest count (the expected maximum of Gz normals, as for the slowest GPU: ``axoplan.cost.scale``).
    ``routing_skew`` is the systematic part beyond sampling (``ModelSpec.moe``)."""
    assert model.moe is not None
    p = model.moe.top_k / model.moe.num_experts
    cv = np.sqrt((1.0 - p) / np.maximum(routed, 1e-9))
    return model.moe.routing_skew * (1.0 + cv * expected_max_normal(c.gz))


def native_terms(model: ModelSpec, options: RunOptions, c: Candidates, g: Groups, n_micro: Floats,
                 tokens: Floats) -> list[CollectiveTerm]:
    """The collectives of the native MoE layers, all blocking (module docstring), per micro-batch and layer:

    ======== ======================================== ===== =================================
    phase    collective                               group bytes per call
    ======== ======================================== ===== =================================
    forward  all-gather of the routing map (bool)     tp    ``tp·E·m``
    forward  all-gather of the tokens                 tp    ``tp·m·H·2``
    forward  all-gather of fc's and proj's experts    fsdp  ``E·2I·H/tp·2``, ``E·I·H/tp·2``
    forward  reduce-scatter of the output             tp    ``tp·m·H·2``
    backward all-gather of the output gradient        tp    ``tp·m·H·2``
    backward all-gather of fc's and proj's experts    fsdp  as forward
    backward reduce-scatter of their gradients        fsdp  as forward
    backward reduce-scatter of the input gradient     tp    ``tp·m·H·2``
    ======== ======================================== ===== =================================

    ``m = micro_batch·S`` tokens per GPU; under full recompute the forward's rows run again. The tp and fsdp groups
    are ``experts_tp`` and ``experts_fsdp`` of :class:`axoplan.cost.groups.Groups`, placed with every other group;
    their time counts under Z, inside which they sit."""
    moe = model.moe
    assert moe is not None
    tp = float(options.expert_tp)
    e, i, h = float(moe.num_experts), float(moe.expert_ffn_hidden), float(model.hidden)
    calls = n_micro * model.num_layers
    rec = calls * c.recompute.astype(np.float64)
    tokens_b = tp * tokens * h * BYTES_BF16
    fc_b = np.full_like(tokens, e * 2 * i * h / tp * BYTES_BF16)
    proj_b = np.full_like(tokens, e * i * h / tp * BYTES_BF16)
    rows = []
    for phase, k in (("forward", calls), ("recompute", rec)):
        rows += [(phase, "all-gather (routing map)", "tp", tp * e * tokens, k),
                 (phase, "all-gather (tokens)", "tp", tokens_b, k),
                 (phase, "all-gather (fc experts)", "fsdp", fc_b, k),
                 (phase, "all-gather (proj experts)", "fsdp", proj_b, k),
                 (phase, "reduce-scatter (output)", "tp", tokens_b, k)]
    rows += [("backward", "all-gather (output grad)", "tp", tokens_b, calls),
             ("backward", "all-gather (proj experts)", "fsdp", proj_b, calls),
             ("backward", "reduce-scatter (proj grads)", "fsdp", proj_b, calls),
             ("backward", "all-gather (fc experts)", "fsdp", fc_b, calls),
             ("backward", "reduce-scatter (fc grads)", "fsdp", fc_b, calls),
             ("backward", "reduce-scatter (input grad)", "tp", tokens_b, calls)]
    groups = {"tp": g.of("experts_tp"), "fsdp": g.of("experts_fsdp")}
    out = []
    for phase, op, name, nbytes, k in rows:
        group = groups[name]
        t = group.rates.all_gather_s(nbytes)  # ring all-gather and reduce-scatter cost the same
        out.append(collective_term("experts (native)", phase, op, "z", group, nbytes, k, t))
    return out
