"""Z all-gathers and reduce-scatters: what each moves, what hides them, and what nothing can hide.

A *unit* is what one Z all-gather moves: one linear layer's ``k·n/(Gx·Gy)`` weight block
(AxoNN gathers each Linear on its own) or a whole transformer block's flat parameter (FSDP
wraps each block), per the framework's ``z_gather_unit``. Per micro-batch, in forward order:

* **forward** all-gather of every unit, prefetched behind the previous unit's forward compute
  under OAG (``max(ag − compute_prev, 0)`` exposed), again under recompute unless the
  weights are cached or the unit is FSDP's (a block: the checkpoint runs inside the FSDP unit, so its recompute
  runs in the unit's backward on the parameters FSDP's pre-backward hook gathered: ``torch/distributed/fsdp``'s
  ``_pre_backward_hook`` for FSDP1, ``FSDPState._pre_backward`` for FSDP2; torchtitan applies activation
  checkpointing before ``fully_shard``, ``torchtitan/distributed/fsdp.py``);
* **backward** all-gather (unless cached, or the unit stays gathered from the forward, as FSDP's
  root unit does) and **reduce-scatter** of its gradient, both behind the neighbouring unit's
  backward compute (:func:`backward_exposed`).

Two waits no compute can hide, once per micro-batch (the *drains*): the first unit's
all-gather, issued when the forward starts with nothing before it, and the last reduce-scatter
of the backward, which the framework waits for before the micro-batch ends. AxoNN's
``optimize_communication`` exits with ``clear_handles()`` and a device synchronise after every
micro-batch's backward (``axonn/intra_layer/overlap_communication.py``; Megatron-AxoNN enters it
per micro-batch, ``../reference``: axonn.md §8.3); FSDP's post-backward callback waits for its
reduce-scatter stream (``torch/distributed/fsdp/_runtime_utils.py``, ``_post_backward_final_callback``).
Where the framework keeps its root unit (the embeddings, tied to the LM head) gathered from
forward to backward, the root's gather opens the forward and its reduce-scatter closes the
backward.

The drain is AxoNN's code: ``optimize_communication`` exits with ``clear_handles()``, a
``torch.cuda.synchronize()`` (``intra_layer/overlap_communication.py`` L27-30, L154-157 @4973c51), and the
deferred reduce-scatter gradients are added only then (``accumulate``); an overlapped reduce-scatter can
hide behind the rest of its micro-batch's backward, never behind the next micro-batch.

**Backward gathers** (``RunOptions.backward_gather``): ``AsyncLinear.backward`` calls
``_gather(original_weight, cache=False)`` (``intra_layer/fully_connected.py`` L127-129), which takes the weight
from ``weights_cache`` only if the forward cached it; the OAG iterator prefetches in forward module order and a
recompute's ``_gather`` deletes what it retrieves (``intra_layer/communication.py`` L38-68 @fd24d01), so the
backward's gather is a blocking ``dist.all_gather`` plus ``torch.cat`` (L60). ``prefetched`` (the default) keeps
the model's earlier assumption, the gather hidden behind the neighbouring unit's backward; ``blocking`` follows
the code: the gather is exposed, and the reduce-scatter launched before it on the same Z communicator can hide
only behind the non-GEMM backward that runs before that gather (the unit's ``attached_bwd_s``), unless the
weights are cached or a second Z communicator (``concurrent_z``) carries the gathers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from axoplan.cost.groups import Group
from axoplan.cost.terms import CollectiveTerm, collective_term
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates

__all__ = ["ZUnit", "ZGroup", "z_terms", "backward_exposed"]

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ZUnit:
    """One unit's Z collectives and the compute beside them, per candidate."""

    name: str
    count: int  # units of this kind per micro-batch
    recomputed: bool  # a block's unit: recompute runs its forward again
    ag_s: Floats  # one all-gather
    rs_s: Floats  # one reduce-scatter
    ag_bytes: Floats
    rs_bytes: Floats
    compute_fwd_s: Floats  # one unit's forward compute
    compute_bwd_s: Floats
    stays_gathered: bool = False  # kept from the forward to the backward (FSDP's root unit)
    regathered: bool = True  # a recompute gathers it again (AxoNN); FSDP's recompute runs on the backward's gather
    attached_bwd_s: Floats | None = None  # its non-GEMM backward, run before the next unit's gather


@dataclass(frozen=True, slots=True)
class ZGroup:
    """The Z communicator of every candidate, and a ring's latency alone over it."""

    group: Group
    latency_s: Floats  # the all-gather of nothing: the ring's latency


def z_terms(units: Sequence[ZUnit], z: ZGroup, options: RunOptions, c: Candidates,
            n_micro: Floats) -> list[CollectiveTerm]:
    """Every Z collective of a micro-batch's units (forward order; the first is the first block's),
    times the micro-batches of a step, with their exposed parts and the two drains."""
    blocks = [u for u in units if u.recomputed]
    terms: list[CollectiveTerm] = []
    exposed: dict[str, tuple[Floats, Floats]] = {}
    for i, unit in enumerate(units):
        prev = units[i - 1] if i > 0 else blocks[-1]  # the unit before in forward order (the last block for the first)
        ag_fwd = np.maximum(unit.ag_s - prev.compute_fwd_s, 0.0) if options.overlap_all_gather else unit.ag_s
        again = 0.0 * unit.ag_s if unit.stays_gathered else np.where(c.cache_weights, 0.0, unit.ag_s)
        ag_bwd, rs = backward_exposed(unit.rs_s, again, prev.compute_bwd_s, options, z.latency_s)
        if options.backward_gather == "blocking":
            ag_bwd, rs = _blocking_backward(unit, again, prev.compute_bwd_s, options)
        exposed[unit.name] = (ag_fwd, rs)
        calls = n_micro * unit.count
        rec = c.recompute.astype(np.float64) * (unit.recomputed and unit.regathered)
        terms += [
            _term(unit.name, "forward", "all-gather", z, unit.ag_bytes, calls, unit.ag_s, ag_fwd),
            _term(unit.name, "recompute", "all-gather", z, unit.ag_bytes, calls * rec, again,
                  np.minimum(ag_fwd, again)),
            _term(unit.name, "backward", "all-gather", z, unit.ag_bytes, calls, again, ag_bwd),
            _term(unit.name, "backward", "reduce-scatter", z, unit.rs_bytes, calls, unit.rs_s, rs),
        ]
    for unit in [blocks[0]] + [u for u in units if u.stays_gathered]:
        ag_fwd, rs = exposed[unit.name]
        terms.append(_term(unit.name, "forward", "all-gather (drain)", z, unit.ag_bytes, n_micro, 0.0 * unit.ag_s,
                           unit.ag_s - ag_fwd))
        terms.append(_term(unit.name, "backward", "reduce-scatter (drain)", z, unit.rs_bytes, n_micro,
                           0.0 * unit.rs_s, unit.rs_s - rs))
    return terms


def _blocking_backward(unit: ZUnit, again: Floats, neighbour_bwd_s: Floats,
                       options: RunOptions) -> tuple[Floats, Floats]:
    """Exposed backward all-gather and reduce-scatter when the gather blocks (module docstring): the gather
    wholly; the reduce-scatter behind the neighbour's backward where no blocking gather follows it on the same
    communicator (cached weights, or ``concurrent_z``), else behind the unit's own attached backward only."""
    rs = unit.rs_s
    if not options.overlap_reduce_scatter:
        return again, rs
    attached = unit.attached_bwd_s if unit.attached_bwd_s is not None else 0.0 * rs
    free = (again == 0) | options.concurrent_z
    behind = np.where(free, neighbour_bwd_s, attached)
    return again, np.maximum(rs - behind, 0.0)


def _term(layer: str, phase: str, op: str, z: ZGroup, nbytes: Floats, calls: Floats, seconds: Floats,
          exposed: Floats) -> CollectiveTerm:
    return collective_term(layer, phase, op, "z", z.group, nbytes, calls, seconds, exposed)


def backward_exposed(rs: Floats, ag: Floats, neighbour_bwd_s: Floats, options: RunOptions,
                     z_latency_s: Floats) -> tuple[Floats, Floats]:
    """Exposed backward all-gather and reduce-scatter: both ride the Z links behind one
    neighbouring unit's backward compute; what is not overlapped is fully exposed.

    On one Z communicator the two run one after the other, ``ag + rs``. With a second one
    (``concurrent_z``, AxoNN's Gordon Bell branch) they run at once but still share the Z
    links, so their bandwidth terms still add; only their latency terms overlap:
    ``ag + rs − min(latency_ag, latency_rs)``. So concurrency never exposes more than the
    serial case and never hides more than the shorter of the two."""
    ov_ag = ag if options.overlap_all_gather else 0.0 * ag
    ov_rs = rs if options.overlap_reduce_scatter else 0.0 * rs
    overlapped = ov_ag + ov_rs
    if options.concurrent_z:
        both = (ov_ag > 0) & (ov_rs > 0)
        overlapped = overlapped - np.where(both, z_latency_s, 0.0)
    left = np.maximum(overlapped - neighbour_bwd_s, 0.0)
    total = ov_ag + ov_rs
    share = np.divide(left, total, out=np.zeros_like(left), where=total > 0)
    return ag - ov_ag + ov_ag * share, rs - ov_rs + ov_rs * share
