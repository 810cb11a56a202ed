"""The collectives of one step, with their exposed parts (the table in ``axoplan.cost.model``):
each linear layer's tensor-parallel all-reduces and data all-reduce, its Z all-gathers and
reduce-scatters by unit (``axoplan.cost.zsharding``), the small statistics all-reduces of norms
and the loss, and the world all-reduce of replicated parameters (one call, or one per tensor as AxoNN's
``sync_gradients`` issues them: ``RunOptions.grad_sync``). On the Hugging Face path the linears'
redistributions and the token table's collectives are ``axoplan.cost.hfpath``'s, and the norms and the
loss need no statistics (they run at full width); the native MoE module's are ``axoplan.cost.moe``'s."""

from __future__ import annotations

from typing import cast

import numpy as np
import numpy.typing as npt

from axoplan.cost.compute import BYTES_BF16
from axoplan.cost.groups import Groups
from axoplan.cost.hfpath import embedding_terms, redistribution_terms
from axoplan.cost.layers import Layer
from axoplan.cost.memory import replicated_params
from axoplan.cost.moe import native_terms
from axoplan.cost.terms import CollectiveTerm, collective_term
from axoplan.cost.zsharding import ZGroup, ZUnit, z_terms
from axoplan.inputs.framework import FrameworkProfile
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates

__all__ = ["collective_terms"]

Floats = npt.NDArray[np.float64]


def collective_terms(
    layers: list[Layer], g: Groups, options: RunOptions, c: Candidates, model: ModelSpec, n_micro: Floats,
    tokens: Floats, profile: FrameworkProfile,
) -> list[CollectiveTerm]:
    """Every collective of a step (module docstring), priced on the groups `g`."""
    terms: list[CollectiveTerm] = []
    last_in_block = [lay for lay in layers if lay.spec.role != "head"][-1]
    for i, lay in enumerate(layers):
        prev = layers[i - 1] if i > 0 else last_in_block  # the previous linear in execution order
        terms += _linear_terms(lay, prev, g=g, options=options, c=c, n_micro=n_micro,
                               overlap_data=profile.grad_reduce_overlaps_backward)
    z = ZGroup(g.of("z"), g.rates["z"].all_gather_s(0.0 * n_micro))
    terms += z_terms(_z_units(layers, g, options, profile), z, options, c, n_micro)
    if options.hf_path:
        terms += redistribution_terms(layers, g, c, n_micro) + embedding_terms(model, options, g, c, n_micro, tokens,
                                                                                    profile.z_gather_bytes)
    else:
        terms += _statistics_terms(model, g, c, tokens, n_micro)
    if any(lay.native_moe for lay in layers):
        terms += native_terms(model, options, c, g, n_micro, tokens)
    terms.append(_world_term(model, options, g, n_micro))
    return terms


def _z_units(layers: list[Layer], g: Groups, options: RunOptions, profile: FrameworkProfile) -> list[ZUnit]:
    """What each Z all-gather moves (``axoplan.cost.zsharding``): each linear layer, or (FSDP) each
    block's four together; the LM head on its own, kept gathered where the framework keeps its root."""
    head = [lay for lay in layers if lay.spec.role == "head"]
    block = [lay for lay in layers if lay.spec.role != "head" and not lay.native_moe]
    keep_root = profile.memory.embedding_gathered
    units = [_unit(lay.spec.name, [lay], g, options, profile) for lay in block]
    if profile.z_gather_unit == "block":
        units = [_unit("block", block, g, options, profile)]
    return units + [_unit(lay.spec.name, [lay], g, options, profile, stays_gathered=keep_root) for lay in head]


def _unit(name: str, parts: list[Layer], g: Groups, options: RunOptions, profile: FrameworkProfile,
          stays_gathered: bool = False) -> ZUnit:
    z = g.rates["z"]
    gathered = cast(Floats, sum(lay.bytes_block for lay in parts))
    grads = gathered / profile.z_gather_bytes * _rs_bytes(profile, options)
    return ZUnit(name=name, count=parts[0].count, recomputed=parts[0].spec.recomputed,
                 regathered=profile.z_gather_unit != "block",  # FSDP: recompute runs on the backward's gather
                 ag_s=z.all_gather_s(gathered), rs_s=z.reduce_scatter_s(grads), ag_bytes=gathered,
                 rs_bytes=grads, compute_fwd_s=cast(Floats, sum(lay.compute_fwd for lay in parts)),
                 compute_bwd_s=cast(Floats, sum(lay.compute_bwd for lay in parts)), stays_gathered=stays_gathered,
                 attached_bwd_s=cast(Floats, sum(lay.extra_bwd for lay in parts)))


def _rs_bytes(profile: FrameworkProfile, options: RunOptions) -> float:
    """Bytes per gradient element in the Z reduce-scatter: the run's gradient-reduction dtype where the
    framework reduces in it (FSDP's reduce_dtype), else bf16 (AxoNN's REDUCE_SCATTER_DTYPE)."""
    return float(options.grad_reduce_bytes) if profile.z_reduce_scatter_in_grad_dtype else BYTES_BF16


def _linear_terms(
    lay: Layer, prev: Layer, *, g: Groups, options: RunOptions, c: Candidates,
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
    return [collective_term(lay.spec.name, phase, op, axis, g.of(axis), nbytes, k, t, e)
            for phase, op, axis, nbytes, k, t, e in rows]


def _world_term(model: ModelSpec, options: RunOptions, g: Groups, n_micro: Floats) -> CollectiveTerm:
    """The replicated parameters' gradients all-reduced over the whole world once per step: in one call, or
    one call per tensor as AxoNN's ``sync_gradients`` issues them (``vectorize=False``, its default and
    Megatron-AxoNN's and the Lightning strategy's call: ``intra_layer/__init__.py``; ``axonn.md`` §8.3), each
    paying the all-reduce's latency."""
    calls = float(model.replicated_tensors()) if options.per_tensor_sync else 1.0
    nbytes = np.full_like(n_micro, replicated_params(model) * options.grad_reduce_bytes / calls)
    t = g.rates["world"].all_reduce_s(nbytes)
    return collective_term("norms+biases", "step", "all-reduce", "world", g.of("world"), nbytes,
                           np.full_like(n_micro, calls), t)


def _statistics_terms(
    model: ModelSpec, g: Groups, c: Candidates, tokens: Floats, n_micro: Floats
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
        t = g.rates[axis].all_reduce_s(nbytes)
        out.append(collective_term(layer, phase, "all-reduce", axis, g.of(axis), nbytes, calls, t))
    return out
