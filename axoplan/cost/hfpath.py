"""The Hugging Face / Lightning path's own collectives (``docs/algorithm.md`` §4b, ``axonn.md`` §8.1, §8.2).

AxoNN's default ("non-expert") ``Linear`` takes data-parallel inputs: every GPU holds its own tokens at
full width (Lightning's ``AxonnStrategy`` samples over the whole world: ``lightning/axonn_strategy.py``
L119-123 @4973c51). When ``Gx·Gy > 1`` each linear moves them into the 4D layout and back
(``intra_layer/fully_connected.py``, ``Linear.forward`` L311-343, the version with PR #102's guard;
``intra_layer/asym_communication.py``): with ``m`` own rows, ``k`` in and ``n`` out features, ``p_in`` and
``p_out`` its in-axis and out-axis group sizes (X and Y for a plain layer, swapped for a transposed one),
per call:

========  =========================================  =======  ===========================================
phase     collective                                 group    bytes per call
========  =========================================  =======  ===========================================
forward   all-gather of one int (gather_batch_sizes)  in       ``8·p_in`` (then ``.cpu()``: latency-bound)
forward   all-to-all (GatherBatchScatterChannels)     in       ``m·k·2``: ``[m, k] → [p_in·m, k/p_in]``
forward   all-gather of one int                        out      ``8·p_out``
forward   all-gather-v (Gatherv, on all_to_all)       out      ``p_out·m·k·2`` gathered
forward   all-to-all (GatherChannelsScatterBatch)     out      ``p_in·m·n·2``: ``[M, n/p_out] → [p_in·m, n]``
backward  all-gather-v (Dropv's backward)             in       ``p_in·m·n·2`` gathered
backward  all-to-all (GatherChannelsScatterBatch)     out      ``p_in·m·n·2``
backward  all-to-all (GatherBatchScatterChannels)     in       ``m·k·2``
========  =========================================  =======  ===========================================

``M = p_in·p_out·m`` rows reach the GEMMs. Dropv's forward and Gatherv's backward are slices (no traffic).
Each is a blocking ``all_to_all`` or ``all_gather_into_tensor`` (``asym_communication.py`` L24, L44, L146,
L171): exposed. A group of one skips its transitions; with ``Gx·Gy = 1`` none run (PR #102). All-to-all is
priced as a ring all-gather of its buffer: ``(p−1)/p`` of it crosses the group, ``p − 1`` messages [assumed].

The token table (``axonn.md`` §8.2): with ``Gx = 1`` AxoNN's ``Embedding`` gathers its ``V·H/Gy`` shard over
Z every forward, all-gathers its ``[m, H/Gy]`` output over Y and reduce-scatters its gradient over Z, all
blocking (``ForwardGather_BackwardReduceScatter`` without overlap; ``intra_layer/embedding.py``); otherwise the
table stays whole on every GPU and its gradient is all-reduced over the world once per step.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from axoplan.cost.compute import BYTES_BF16
from axoplan.cost.groups import Groups
from axoplan.cost.layers import Layer
from axoplan.cost.memory import hf_embedding_sharded
from axoplan.cost.terms import CollectiveTerm, collective_term
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates

__all__ = ["redistribution_terms", "embedding_terms", "INT_BYTES"]

Floats = npt.NDArray[np.float64]
INT_BYTES = 8.0  # gather_batch_sizes all-gathers one int64 per rank


def redistribution_terms(layers: list[Layer], g: Groups, c: Candidates, n_micro: Floats) -> list[CollectiveTerm]:
    """Every linear's transitions (module docstring), for the candidates whose X·Y group has more than one GPU."""
    active = (c.gx * c.gy > 1).astype(np.float64)
    rec = c.recompute.astype(np.float64)
    out: list[CollectiveTerm] = []
    for lay in layers:
        if lay.native_moe:
            continue
        calls = n_micro * lay.count * active
        again = calls * rec * lay.spec.recomputed
        out += _forward(lay, g, calls, "forward") + _forward(lay, g, again, "recompute") + _backward(lay, g, calls)
    return out


def _sizes(lay: Layer, g: Groups) -> tuple[Floats, Floats, Floats, Floats]:
    p_in, p_out = g.size[lay.in_axis], g.size[lay.out_axis]
    k = float(lay.spec.k_in)
    return p_in, p_out, lay.own_rows * k * BYTES_BF16, p_in * lay.own_rows * lay.n_full * BYTES_BF16


def _forward(lay: Layer, g: Groups, calls: Floats, phase: str) -> list[CollectiveTerm]:
    p_in, p_out, in_bytes, out_bytes = _sizes(lay, g)
    return [
        _term(lay, g, phase, "all-gather (int)", lay.in_axis, INT_BYTES * p_in, calls),
        _term(lay, g, phase, "all-to-all", lay.in_axis, in_bytes, calls),
        _term(lay, g, phase, "all-gather (int)", lay.out_axis, INT_BYTES * p_out, calls),
        _term(lay, g, phase, "all-gather-v", lay.out_axis, p_out * in_bytes, calls),
        _term(lay, g, phase, "all-to-all", lay.out_axis, out_bytes, calls),
    ]


def _backward(lay: Layer, g: Groups, calls: Floats) -> list[CollectiveTerm]:
    _, _, in_bytes, out_bytes = _sizes(lay, g)
    return [
        _term(lay, g, "backward", "all-gather-v", lay.in_axis, out_bytes, calls),
        _term(lay, g, "backward", "all-to-all", lay.out_axis, out_bytes, calls),
        _term(lay, g, "backward", "all-to-all", lay.in_axis, in_bytes, calls),
    ]


def _term(lay: Layer, g: Groups, phase: str, op: str, axis: str, nbytes: Floats, calls: Floats) -> CollectiveTerm:
    t = g.rates[axis].all_gather_s(nbytes)
    return collective_term(lay.spec.name, phase, op, axis, g.of(axis), nbytes, calls, t)


def embedding_terms(model: ModelSpec, options: RunOptions, g: Groups, c: Candidates, n_micro: Floats,
                    tokens: Floats, weight_bytes: float) -> list[CollectiveTerm]:
    """The token table's collectives on the hf path (module docstring), exposed. `weight_bytes`: an element of the
    table as stored (``FrameworkProfile.z_gather_bytes``): AxoNN's ``Embedding.forward`` gathers it with
    ``ForwardGather_BackwardReduceScatter`` as stored, and ``F.embedding`` is not autocast, so its gradient is
    reduce-scattered in the same dtype (``intra_layer/embedding.py`` @4973c51)."""
    h = float(model.hidden)
    sharded = hf_embedding_sharded(model, c).astype(np.float64)
    table = model.vocab * h / g.size["y"] * weight_bytes
    gather = g.rates["z"].all_gather_s(table)
    out_y = g.rates["y"].all_gather_s(tokens * h * BYTES_BF16)
    whole = np.full_like(tokens, model.vocab * h * options.grad_reduce_bytes)
    world = g.rates["world"].all_reduce_s(whole)
    rows = (("forward", "all-gather", "z", table, n_micro * sharded, gather),
            ("forward", "all-gather", "y", tokens * h * BYTES_BF16, n_micro * sharded, out_y),
            ("backward", "reduce-scatter", "z", table, n_micro * sharded, gather),
            ("step", "all-reduce", "world", whole, 1.0 - sharded, world))
    return [collective_term("embedding", phase, op, axis, g.of(axis), nbytes, calls, t)
            for phase, op, axis, nbytes, calls, t in rows]
