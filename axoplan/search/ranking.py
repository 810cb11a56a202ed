"""Rank every candidate of a world size: predict, check feasibility, sort.

Infeasible candidates stay in the table with the first reason that rules them out, so
"why is layout X not in my top 10?" is answered by the table itself. Feasible ones are ordered by
predicted time, except that a layout whose fit in memory is in doubt never comes above one that
fits within a margin of its time (:mod:`axoplan.search.fit`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from axoplan.cost.memory import memory_verdict
from axoplan.cost.model import Prediction, predict
from axoplan.errors import AxoplanError
from axoplan.inputs.axes import AXIS_DEFS, order_name, strides
from axoplan.inputs.machine import Machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.search.feasibility import REASONS, Feasibility, check, recompute_required
from axoplan.search.fit import TIGHT_LEVEL, FitPolicy, fit_order, fit_probability
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout

__all__ = ["Ranking", "rank", "rank_candidates", "REASONS", "check_machine_size", "check_moe_options", "MAX_WORLD"]

MAX_WORLD = 1 << 24


@dataclass(frozen=True, slots=True)
class Ranking:
    """Predictions for all candidates, with feasibility and the order by step time."""

    model: ModelSpec
    machine: Machine
    options: RunOptions
    world_size: int
    prediction: Prediction
    reason: npt.NDArray[np.uint8]  # index into REASONS; 0 = feasible
    order: npt.NDArray[np.int64]  # feasible first, each part by predicted step time (the fit rule applied)
    feasibility: Feasibility
    fit: FitPolicy = FitPolicy()

    @property
    def candidates(self) -> Candidates:
        return self.prediction.candidates

    @property
    def num_feasible(self) -> int:
        return int((self.reason == 0).sum())

    def column(self, name: str) -> np.ndarray:
        return self.prediction.columns[name]

    def top_feasible(self, k: int) -> list[int]:
        """Candidate indices of the k best feasible rows, best first."""
        return [int(i) for i in self.order[: self.num_feasible][:k]]

    def reason_text(self, i: int) -> str:
        """Why candidate i is infeasible, in words ('' if it is feasible)."""
        return self.feasibility.text(i)

    def has_time(self, i: int) -> bool:
        """Whether candidate i's predicted time means anything: it is feasible, or only memory rules it out.

        A layout that does not divide the model or the batch has no step to time (its
        micro-batch count is not an integer), so tables show its reason, not a time.
        """
        return int(self.reason[i]) in (0, REASONS.index("memory"))

    def row(self, i: int) -> dict[str, Any]:
        """Candidate i as a flat, JSON-friendly record."""
        c = self.candidates
        rec: dict[str, Any] = {a.field: int(getattr(c, a.field)[i]) for a in AXIS_DEFS}
        rec |= {
            "tp_order": order_name(c.order(i)),
            "micro_batch": int(c.micro_batch[i]), "recompute": bool(c.recompute[i]),
            "cache_weights": bool(c.cache_weights[i]), "feasible": bool(self.reason[i] == 0),
            "reason": self.reason_text(i),
        }
        rec.update({k: float(v[i]) for k, v in self.prediction.columns.items()})
        return rec

    def index_of(self, layout: Layout) -> int:
        """Best-ranked candidate with this layout (its micro-batch and options as searched).

        A rank order is matched by the placement it gives (the strides of the axes above one GPU),
        so ``1x1x8x8/zxy`` finds the one candidate that stands for every order of that layout."""
        c = self.candidates
        mask = np.logical_and.reduce([getattr(c, a.field) == layout.size(a.name) for a in AXIS_DEFS])
        rows = np.flatnonzero(mask)
        wanted = strides({a: np.array([layout.size(a)]) for a in layout.order}, layout.order)
        have = c.take(rows).strides()
        same = np.ones(rows.size, dtype=bool)
        for axis in ("x", "y", "z"):
            if layout.size(axis) > 1:
                same &= have[axis] == wanted[axis][0]
        mask[:] = False
        mask[rows[same]] = True
        hits = self.order[mask[self.order]]
        if hits.size == 0:
            raise AxoplanError(f"layout {layout} is not among the candidates of {self.world_size} GPUs; "
                               "check that its sizes multiply to --gpus")
        return int(hits[0])


def rank(model: ModelSpec, machine: Machine, options: RunOptions, world_size: int,
         fit: FitPolicy | None = None) -> Ranking:
    """Rank every layout of `world_size` GPUs (micro-batch and option axes included), under the fit
    policy `fit` (default: :class:`FitPolicy`'s)."""
    if world_size < 1:
        raise AxoplanError(f"--gpus must be a positive number of GPUs, got {world_size}")
    if world_size > MAX_WORLD:
        raise AxoplanError(f"--gpus {world_size} is larger than axoplan handles ({MAX_WORLD})")
    check_machine_size(machine, world_size)
    check_moe_options(model, options, world_size)
    check_recompute_option(options)
    return rank_candidates(model, machine, options, world_size, Candidates.enumerate(world_size, options), fit)


def check_recompute_option(options: RunOptions) -> None:
    """Refuse ``--recompute off`` under a framework whose code runs only with full recompute (feasibility's
    ``recompute`` rule, named before any layout is tried)."""
    if options.recompute == "off" and recompute_required(options):
        raise AxoplanError(f"--framework {options.framework} runs its blocks only with full activation recompute "
                           f"(its code raises otherwise; frameworks/{options.framework}.yaml): use --recompute on or "
                           "search, or a framework that runs without it")


def check_moe_options(model: ModelSpec, options: RunOptions, world_size: int | None = None) -> None:
    """Refuse MoE options a model or path cannot use, naming the flag."""
    if model.moe is None and (options.moe_impl != "auto" or options.expert_tp != 1):
        raise AxoplanError(f"--moe-impl and --expert-tp apply to mixture-of-experts models; {model.name} is dense "
                           "(drop them, or give an MoE model such as mixtral-8x7B or a Mixtral config.json)")
    if model.moe is not None and options.moe_module == "hf-mixtral" and not options.hf_path:
        raise AxoplanError("--moe-impl hf-mixtral is AxoNN's Hugging Face Mixtral patch: add --axonn-path hf, or use "
                           "--moe-impl native on the megatron path")
    check_expert_tp(model, options, world_size)


def check_expert_tp(model: ModelSpec, options: RunOptions, world_size: int | None) -> None:
    """Refuse an --expert-tp that divides not both the expert width and `world_size`: DroplessMoEMLP splits each
    expert's width over that many ranks inside Z (feasibility's `moe` rule, named before any layout is tried)."""
    tp = options.expert_tp
    if model.moe is None or options.moe_module != "native" or tp == 1:
        return
    width = model.moe.expert_ffn_hidden
    common = math.gcd(width, world_size or width)
    if common % tp:
        near = sorted((d for d in range(1, min(common, 4 * tp) + 1) if common % d == 0), key=lambda d: abs(d - tp))
        gpus = f" and --gpus {world_size}" if world_size else ""
        raise AxoplanError(f"--expert-tp {tp} must divide the expert width {width}{gpus} (DroplessMoEMLP splits each "
                           f"expert over that many ranks of Z); try --expert-tp {' or '.join(map(str, near[:2]))}")


def check_machine_size(machine: Machine, world_size: int) -> None:
    """Refuse more GPUs than the machine has (its YAML's ``nodes``), naming the most it can take."""
    total = machine.total_devices
    if total is not None and world_size > total:
        raise AxoplanError(
            f"--gpus {world_size} is more than {machine.name} has ({machine.nodes} nodes x {machine.devices_per_node} "
            f"= {total} GPUs); give at most {total}, or copy the machine YAML without 'nodes' for a larger machine")


def rank_candidates(
    model: ModelSpec, machine: Machine, options: RunOptions, world_size: int, c: Candidates,
    fit: FitPolicy | None = None, framework_code: bool = True,
) -> Ranking:
    """Predict, check and order the candidates `c` (columns ``mem_need_bytes``, ``mem_tight`` and ``p_fit`` added);
    `framework_code` False: runs that did run (``validate``), to which the framework's own code rules do not apply
    (feasibility's ``recompute``)."""
    fit = fit or FitPolicy()
    pred = predict(model, machine, options, c)
    verdict = memory_verdict(pred.columns["mem_total_bytes"], machine, options.code_profile(model),
                             level=TIGHT_LEVEL)
    pred = replace(pred, columns=pred.columns | {"mem_need_bytes": verdict.need_bytes,
                                                  "mem_tight": verdict.tight.astype(np.float64),
                                                  "p_fit": fit_probability(verdict, TIGHT_LEVEL)})
    feasibility = check(model, options, c, memory=verdict, framework_code=framework_code)
    reason = feasibility.reason
    order = fit_order(pred.columns["t_step_s"], pred.columns["p_fit"], reason == 0, fit)
    return Ranking(model, machine, options, world_size, pred, reason, order, feasibility, fit)
