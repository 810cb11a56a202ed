"""What to change when no layout of a world size is feasible: global batches that work well.

A global batch ``B`` needs a layout whose ``Gdata·Gz·micro-batch`` divides it. The next
integer that some layout divides is rarely a good answer: for 6,144 GPUs (3·2¹¹) and
``B = 2048``, ``B = 2049`` is divisible only by ``Gdata·Gz = 3``, which leaves 2,048-way
tensor parallelism and about 1 % of peak. So the candidates are the multiples of each
achievable ``Gdata·Gz`` just below and above ``B`` (within a factor of four); each is
ranked, and the suggestions are those whose best layout processes tokens within
:data:`GOOD_FRACTION` of the best throughput (sequences per second) found, nearest to ``B`` first.
For 320B on 6,144 Alps GPUs and ``B = 2048`` that gives 1536, 3072 and 6144 (200, 270 and 296
sequences/s); 2304 (154) and 1920 (139) need too much tensor parallelism.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from axoplan.ranking import Ranking

__all__ = ["suggest_global_batches", "GOOD_FRACTION"]

GOOD_FRACTION = 0.65
"""A suggested batch's best layout reaches at least this share of the best tokens/s per GPU found."""
_SPAN = 4.0  # candidates between B/_SPAN and B·_SPAN


def suggest_global_batches(r: Ranking, usable: np.ndarray, limit: int = 3) -> list[int]:
    """Up to `limit` global batches near the requested one whose best layout runs well.

    `usable`: the candidates that fail nothing but the batch (shape and memory allow them).
    """
    from axoplan.ranking import rank

    batch = r.options.global_batch
    c = r.candidates
    steps = sorted({int(v) for v in (c.gdata * c.gz * c.micro_batch)[usable]})
    tried = _candidate_batches(batch, steps)
    speed: dict[int, float] = {}
    for b in tried:
        opts = r.options.model_copy(update={"global_batch": b})
        got = rank(r.model, r.machine, opts, r.world_size)
        if got.num_feasible:
            best = float(got.column("t_step_s")[got.order[0]])
            speed[b] = b / best  # sequences per second
    if not speed:
        return []
    top = max(speed.values())
    good = [b for b, s in speed.items() if s >= GOOD_FRACTION * top]
    return sorted(sorted(good, key=lambda b: (abs(math.log(b / batch)), b))[:limit])


def _candidate_batches(batch: int, steps: list[int]) -> list[int]:
    """Multiples of each step just below and above `batch`, within a factor of _SPAN."""
    out: set[int] = set()
    for s in steps:
        below, above = (batch // s) * s, -(-batch // s) * s
        out.update(b for b in (below, above) if batch / _SPAN <= b <= batch * _SPAN and b > 0)
    return sorted(out)
