"""Join measured runs with the cost model's predictions for the plans they ran.

Repetitions of one plan (same ``plan_id``) are pooled first: the measured time of a plan
is the median over its runs, its spread the standard deviation over them (or the one
run's recorded spread). Metrics are over plans, so a layout timed five times counts once.

A *scenario* is a set of plans that answer the same question, "which layout for this
model, batch and GPU count?": same machine, model, global batch, sequence length and
world size, any layout, micro-batch, recompute and caching. Kendall's τ over all plans
mixes scenarios (a bigger model is slower on any layout), so the within-scenario τ and
"is the measured best in the predicted top-k" are reported per scenario as well.

A *scaling group* is a set of plans that answer "how does throughput change with the GPU
count?": same machine, model, sequence length and framework, two or more GPU counts. Within
each, Kendall's τ of predicted against measured tokens per second per GPU says whether the
model orders the GPU counts as the runs did. Every plan's memory verdict (fits, tight, does
not fit: ``axoplan.cost.memory``) is counted too: a run that ran and is called "does not fit"
is a wrong answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from axoplan.cost.model import CompiledPlan, compile_plan, price
from axoplan.cost.placement import topology
from axoplan.inputs.machine import Machine
from axoplan.records.plan import LaunchConfig
from axoplan.search.ranking import REASONS, rank_candidates
from axoplan.space.candidates import Candidates
from axoplan.validate import metrics
from axoplan.validate.records import Measured

__all__ = ["PlanRuns", "aggregate", "Predictor", "Summary", "Validation", "validate", "summarize",
           "PREDICTED_PARTS", "plan_table", "scenario_key", "scaling_key", "plan_candidates"]

PREDICTED_PARTS: dict[str, str] = {
    "gemm": "t_gemm_s", "non-GEMM": "t_nongemm_s", "optimizer": "t_optimizer_s",
    "comm x": "t_exposed_x_s", "comm y": "t_exposed_y_s", "comm z": "t_exposed_z_s",
    "comm data": "t_exposed_data_s", "comm world": "t_exposed_world_s", "interference": "t_interference_s",
    "slowest GPU": "t_straggler_s", "host idle": "t_host_idle_s",
}
"""Parts of the predicted step (they sum to ``t_step_s``), by the name plots use."""


@dataclass(frozen=True, slots=True)
class PlanRuns:
    """All runs of one plan, pooled."""

    plan: LaunchConfig
    measured_s: float
    spread_s: float
    repetitions: int
    phase_s: dict[str, float]
    where: str


def aggregate(runs: Sequence[Measured]) -> list[PlanRuns]:
    """Pool runs by plan id, in order of first appearance."""
    by_id: dict[str, list[Measured]] = {}
    for run in runs:
        by_id.setdefault(run.plan.plan_id, []).append(run)
    out = []
    for group in by_id.values():
        times = np.array([r.t_step_s for r in group])
        spread = float(times.std(ddof=1)) if len(group) > 1 else group[0].t_step_std_s
        keys = sorted({k for r in group for k in r.phase_s})
        phases = {k: float(np.median([r.phase_s[k] for r in group if k in r.phase_s])) for k in keys}
        out.append(PlanRuns(group[0].plan, float(np.median(times)), spread, len(group), phases, group[0].where))
    return out


def _prediction_key(plan: LaunchConfig) -> str:
    """Plans with equal keys share one vectorised prediction call (same model and step options)."""
    opts = plan.options.model_copy(update={"micro_batches": (1,), "recompute": "search", "cache_weights": "search"})
    return plan.model.model_dump_json() + opts.model_dump_json()


def scenario_key(plan: LaunchConfig) -> str:
    """Plans with equal keys are alternatives for one training job (see the module doc)."""
    return json.dumps([plan.machine, plan.model.model_dump(mode="json"), plan.options.global_batch,
                       plan.options.seq_len, plan.world_size], sort_keys=True)


class Predictor:
    """Predictions for a fixed list of plans on any machine (the calibration's inner loop)."""

    def __init__(self, plans: Sequence[LaunchConfig]) -> None:
        self.size = len(plans)
        groups: dict[str, list[int]] = {}
        for i, plan in enumerate(plans):
            groups.setdefault(_prediction_key(plan), []).append(i)
        self._groups = []
        for idx in groups.values():
            first = plans[idx[0]]
            cands = plan_candidates([plans[i] for i in idx])
            self._groups.append((first.model, first.options, first.world_size, cands, np.array(idx)))
        self._compiled: dict[tuple[object, ...], list[CompiledPlan]] = {}

    def __call__(self, machine: Machine) -> dict[str, np.ndarray]:
        """Every prediction column, plus ``feasible`` and ``reason``, aligned with the plans."""
        out: dict[str, np.ndarray] = {}
        for model, options, world, cands, idx in self._groups:
            # a group may mix world sizes; the ranking's world size only labels its messages
            ranking = rank_candidates(model, machine, options, world, cands, framework_code=False)  # they ran
            cols = dict(ranking.prediction.columns)
            cols["feasible"] = ranking.reason == 0
            cols["reason"] = np.array([REASONS[r] for r in ranking.reason], dtype=object)
            for name, values in cols.items():
                if name not in out:
                    out[name] = np.empty(self.size, dtype=values.dtype)
                out[name][idx] = values
        return out

    def step_s(self, machine: Machine) -> np.ndarray:
        """Predicted seconds per iteration only (no feasibility): the fast path for fitting. The plans are compiled
        once per machine topology (``axoplan.cost.model.compile_plan``) and priced again for every machine a fit
        or a sensitivity tries."""
        key = (topology(machine), machine.device.kind)
        if key not in self._compiled:
            self._compiled[key] = [compile_plan(model, machine, options, cands)
                                   for model, options, _, cands, _ in self._groups]
        out = np.empty(self.size)
        for plan, (_, _, _, _, idx) in zip(self._compiled[key], self._groups, strict=True):
            out[idx] = price(plan, machine).columns["t_step_s"]
        return out


def plan_candidates(plans: Sequence[LaunchConfig]) -> Candidates:
    """The plans' layouts, rank orders, micro-batches and options as candidates of one vectorised
    prediction (meaningful when the plans share a model and step options, as a scenario's do).

    Each plan keeps its own tensor-parallel order (``layout.tp_order``): the candidates list the
    distinct orders once and point each row at its plan's, so a ``/zxy`` plan is priced as
    ``explain --layout .../zxy`` prices it, not in AxoNN's default order (issue 29)."""
    layouts = [p.layout.to_layout() for p in plans]
    orders = tuple(dict.fromkeys(lay.order for lay in layouts))
    rows = [(*lay.sizes, p.micro_batch, p.recompute, p.cache_weights) for p, lay in zip(plans, layouts, strict=True)]
    columns = (np.array(v) for v in zip(*rows, strict=True))
    order_id = np.array([orders.index(lay.order) for lay in layouts], dtype=np.int64)
    return Candidates(*columns, order_id=order_id, orders=orders)


@dataclass(frozen=True, slots=True)
class Summary:
    """Headline figures of one validation (over plans; percentages signed where noted)."""

    plans: int
    runs: int
    mape_pct: float
    median_ape_pct: float
    worst_pct: float  # signed
    worst_where: str
    bias_pct: float  # mean signed error: > 0 means predictions are slow
    kendall_tau: float
    spearman_rho: float
    scenarios: int  # scenarios with at least two plans
    scenario_tau: float  # mean within-scenario Kendall τ
    top_k: int
    best_in_top_k: int  # scenarios whose measured best is in the predicted top-k
    best_predicted_first: int  # scenarios whose measured best is predicted fastest
    does_not_fit: int = 0  # plans (which all ran) called "does not fit"
    tight: int = 0  # plans whose memory interval holds the HBM limit
    scaling_groups: int = 0  # groups of plans at two or more GPU counts
    scaling_tau: float = math.nan  # mean within-group Kendall τ of throughput per GPU


@dataclass(frozen=True, slots=True)
class Validation:
    """Per-plan table (one row per plan) and its summary."""

    machine: Machine
    table: pd.DataFrame
    summary: Summary


def validate(runs: Sequence[Measured], machine: Machine, top_k: int = 3) -> Validation:
    """Predict every run's plan on `machine` and compare with the measured time."""
    pooled = aggregate(runs)
    cols = Predictor([p.plan for p in pooled])(machine)
    table = plan_table(pooled, cols)
    return Validation(machine, table, summarize(table, top_k))


def plan_table(pooled: Sequence[PlanRuns], cols: dict[str, np.ndarray]) -> pd.DataFrame:
    scenario_ids: dict[str, int] = {}
    scaling_ids: dict[str, int] = {}
    rows = []
    for i, pr in enumerate(pooled):
        plan, lay = pr.plan, pr.plan.layout
        row = {
            "where": pr.where, "plan_id": plan.plan_id, "machine": plan.machine,
            "scenario": scenario_ids.setdefault(scenario_key(plan), len(scenario_ids)),
            "model": plan.model.name, "layers": plan.model.num_layers, "hidden": plan.model.hidden,
            "global_batch": plan.options.global_batch, "seq_len": plan.options.seq_len,
            "layout": str(lay.to_layout()), "gx": lay.gx, "gy": lay.gy, "gz": lay.gz, "gdata": lay.gdata,
            "world_size": plan.world_size, "micro_batch": plan.micro_batch, "recompute": plan.recompute,
            "cache_weights": plan.cache_weights, "repetitions": pr.repetitions,
            "measured_s": pr.measured_s, "measured_std_s": pr.spread_s, "predicted_s": float(cols["t_step_s"][i]),
            "feasible": bool(cols["feasible"][i]), "reason": str(cols["reason"][i]),
            "memory": "does not fit" if cols["reason"][i] == "memory" else
                      ("tight" if cols["mem_tight"][i] else "fits"),
            "scaling_group": scaling_ids.setdefault(scaling_key(plan), len(scaling_ids)),
        }
        row.update({f"pred_{col}": float(cols[col][i]) for col in PREDICTED_PARTS.values()})
        row.update({f"phase_{k}_s": v for k, v in pr.phase_s.items()})
        rows.append(row)
    table = pd.DataFrame(rows)
    table.insert(table.columns.get_loc("predicted_s") + 1, "error_pct",
                 metrics.percent_errors(table["predicted_s"], table["measured_s"]))
    return table


def scaling_key(plan: LaunchConfig) -> str:
    """Plans with equal keys differ in GPU count (and batch and layout) only: a scaling group."""
    return json.dumps([plan.machine, plan.model.model_dump(mode="json"), plan.options.seq_len,
                       plan.options.framework, plan.options.attention], sort_keys=True)


def _scaling_tau(table: pd.DataFrame) -> tuple[int, float]:
    """Groups with two or more GPU counts, and their mean Kendall τ of tokens per second per GPU."""
    tokens = (table["global_batch"] * table["seq_len"] / table["world_size"]).to_numpy(dtype=np.float64)
    pred, meas = tokens / table["predicted_s"].to_numpy(), tokens / table["measured_s"].to_numpy()
    worlds = table["world_size"].to_numpy()
    taus = [metrics.kendall_tau(pred[idx], meas[idx]) for idx in metrics.grouped(table["scaling_group"].to_numpy())
            if np.unique(worlds[idx]).size >= 2]
    finite = [t for t in taus if not math.isnan(t)]
    return len(taus), float(np.mean(finite)) if finite else math.nan


def summarize(table: pd.DataFrame, top_k: int = 3) -> Summary:
    """Metrics of a per-plan table (all of it, or a held-out part)."""
    pred, meas = table["predicted_s"].to_numpy(), table["measured_s"].to_numpy()
    if not len(table):
        return Summary(0, 0, math.nan, math.nan, math.nan, "", math.nan, math.nan, math.nan, 0, math.nan, top_k, 0, 0)
    worst_i, worst = metrics.worst_error(pred, meas)
    err = metrics.percent_errors(pred, meas)
    taus, ranks = [], []
    for idx in metrics.grouped(table["scenario"].to_numpy()):
        if len(idx) < 2:
            continue
        taus.append(metrics.kendall_tau(pred[idx], meas[idx]))
        ranks.append(metrics.predicted_rank_of_best(pred[idx], meas[idx]))
    finite = [t for t in taus if not math.isnan(t)]
    groups, scaling = _scaling_tau(table)
    memory = table["memory"].to_numpy()
    return Summary(
        plans=len(table), runs=int(table["repetitions"].sum()), mape_pct=metrics.mape(pred, meas),
        median_ape_pct=float(np.median(np.abs(err))), worst_pct=worst, worst_where=str(table["where"].iloc[worst_i]),
        bias_pct=float(err.mean()), kendall_tau=metrics.kendall_tau(pred, meas),
        spearman_rho=metrics.spearman_rho(pred, meas), scenarios=len(ranks),
        scenario_tau=float(np.mean(finite)) if finite else math.nan, top_k=top_k,
        best_in_top_k=sum(r <= top_k for r in ranks), best_predicted_first=sum(r == 1 for r in ranks),
        does_not_fit=int((memory == "does not fit").sum()), tight=int((memory == "tight").sum()),
        scaling_groups=groups, scaling_tau=scaling,
    )
