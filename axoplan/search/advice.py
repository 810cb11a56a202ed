"""What to change when no layout of a world size is feasible: the binding constraint in one line
(`explain_infeasible`), the smallest GPU count that works, and global batches that work well.

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

import numpy as np

from axoplan.inputs.machine import Machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.search.ranking import MAX_WORLD, Ranking, rank
from axoplan.space.layout import sequences_per_micro_step

__all__ = ["suggest_global_batches", "GOOD_FRACTION", "explain_infeasible", "smallest_feasible_world"]

GOOD_FRACTION = 0.65
"""A suggested batch's best layout reaches at least this share of the best tokens/s per GPU found."""
_SPAN = 4.0  # candidates between B/_SPAN and B·_SPAN


def suggest_global_batches(r: Ranking, usable: np.ndarray, limit: int = 3) -> list[int]:
    """Up to `limit` global batches near the requested one whose best layout runs well.

    `usable`: the candidates that fail nothing but the batch (shape and memory allow them).
    """
    batch = r.options.global_batch
    c = r.candidates
    per_step = sequences_per_micro_step(c.gx, c.gy, c.gz, c.gdata, c.micro_batch, r.options.hf_path)
    steps = sorted({int(v) for v in per_step[usable]})
    tried = _candidate_batches(batch, steps)
    speed: dict[int, float] = {}
    for b in tried:
        opts = r.options.model_copy(update={"global_batch": b})
        got = rank(r.model, r.machine, opts, r.world_size, r.fit)
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


def smallest_feasible_world(model: ModelSpec, machine: Machine, options: RunOptions, start: int) -> int | None:
    """Smallest GPU count above `start` (whole nodes or a power of two) with a feasible layout."""
    n = machine.devices_per_node
    counts = sorted({k * n for k in range(1, 65)} | {1 << k for k in range(25)})
    counts += [n * 64 * 2**k for k in range(1, 16)]
    tried = 0
    for g in sorted(set(counts)):
        if g <= start or g > min(MAX_WORLD, machine.total_devices or MAX_WORLD):
            continue
        if rank(model, machine, options, g).num_feasible:
            return g
        tried += 1
        if tried > 60:
            break
    return None


def _whole_machine(machine: Machine) -> str:
    total = machine.total_devices
    return f"; no GPU count up to all {total} of {machine.name} fits it" if total else ""


def explain_infeasible(r: Ranking) -> str:
    """One line saying why no candidate of this world size works, and what would."""
    c = r.candidates
    fails = r.feasibility.fails
    if fails["positions"].any():
        return (f"{r.feasibility.text(0, 'positions')} of {r.model.name}; use --seq-len {r.model.max_positions} or "
                "less, or a model with more positions (max_positions in a model YAML)")
    divides = ~(fails["dims-x"] | fails["dims-y"] | fails["heads"] | fails["zblock"])
    shape_ok = divides & ~fails["moe"] & ~fails["recompute"]  # a layout its framework's code runs
    fits = shape_ok & ~fails["memory"]
    where = f"{r.world_size} GPUs of {r.machine.name}"
    moe = _moe_refusal(r)
    if divides.any() and not shape_ok.any():  # every layout that divides the model shards experts it cannot
        return f"no layout of {where} runs {r.model.name}'s experts: {moe}"
    if shape_ok.any() and not fits.any():  # memory binds whatever the batch
        best = r.column("mem_need_bytes")[shape_ok].min() / 1e9
        if moe and np.all((c.gx * c.gy * c.gz)[shape_ok] == 1):  # every GPU holds the whole model, however many
            fix = "; more GPUs would not help: each would hold the whole model"
        else:
            more = smallest_feasible_world(r.model, r.machine, r.options, r.world_size)
            fix = f"; the smallest GPU count that fits is {more}" if more else _whole_machine(r.machine)
        why = f"; the layouts that would shard it are refused: {moe}" if moe else ""
        return (f"no layout of {where} fits {r.model.name} in memory (best needs {best:.1f} GB per GPU with the "
                f"reserve, of {r.machine.device.hbm_gb:g} GB){fix}{why}")
    if fits.any():
        sizes = sorted({int(v) for v in (c.gdata * c.gz)[fits]})[:6]
        good = suggest_global_batches(r, fits)
        fix = f"try --global-batch {' or '.join(map(str, good))}" if good else "no global batch near it fits"
        if r.options.hf_path:
            return (f"global batch {r.options.global_batch} is not divisible by GPUs*micro-batch = "
                    f"{r.world_size}*{min(r.options.micro_batches)} or more: on the hf path every GPU holds its own "
                    f"sequences; {fix}")
        return (f"global batch {r.options.global_batch} is not divisible by Gdata*Gz*micro-batch for any layout "
                f"of {where} that fits (Gdata*Gz can be {', '.join(map(str, sizes))}; micro-batches "
                f"{', '.join(map(str, r.options.micro_batches))}); {fix}")
    more = smallest_feasible_world(r.model, r.machine, r.options, r.world_size)
    fix = f"; the smallest GPU count with a feasible layout is {more}" if more else ""
    return (f"no layout of {where} divides {r.model.name}'s dimensions (hidden {r.model.hidden}, "
            f"FFN {r.model.ffn}, {_heads_text(r.model)}){fix}")


def _moe_refusal(r: Ranking) -> str:
    """Why the expert layouts were refused (the first such candidate's reason), or '' where none was."""
    refused = np.flatnonzero(r.feasibility.fails["moe"])
    return r.feasibility.text(int(refused[0]), "moe") if refused.size else ""


def _heads_text(model: ModelSpec) -> str:
    """'56 heads', or '64 query heads and 8 KV heads' where attention is grouped-query."""
    if model.kv_heads == model.num_heads:
        return f"{model.num_heads} heads"
    return f"{model.num_heads} query heads and {model.kv_heads} KV heads"
