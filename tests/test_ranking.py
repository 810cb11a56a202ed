"""Ranking: order, feasibility reasons, and the search for a GPU count that fits."""

from __future__ import annotations

import numpy as np

from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import load_model
from axoplan.inputs.options import RunOptions
from axoplan.records.plan import LaunchConfig, plan_from_ranking
from axoplan.search.advice import smallest_feasible_world
from axoplan.search.fit import FitPolicy, doubt_level
from axoplan.search.ranking import REASONS, rank

BY_TIME = FitPolicy(margin=0.0)
"""No margin: the fit rule orders only layouts of equal time (axoplan.search.fit)."""


def test_feasible_rows_first_then_by_time():
    r = rank(load_model("20B"), load_machine("perlmutter"), RunOptions(), 256, BY_TIME)
    feasible = r.reason[r.order] == 0
    assert feasible[: r.num_feasible].all() and not feasible[r.num_feasible:].any()
    t = r.column("t_step_s")[r.order[: r.num_feasible]]
    assert (np.diff(t) >= 0).all()


def test_default_order_is_by_time_with_doubtful_layouts_counted_a_margin_slower():
    """The default rule (5 % margin, 10 % risk): a layout in doubt ranks as if 1.05x its time, one whose point
    estimate is above the HBM as if 1.05²x; the same 20B case as above, where the rule moves rows."""
    r = rank(load_model("20B"), load_machine("perlmutter"), RunOptions(), 256)
    feasible = r.reason[r.order] == 0
    assert feasible[: r.num_feasible].all() and not feasible[r.num_feasible:].any()
    top = r.order[: r.num_feasible]
    p = r.column("p_fit")[top]
    doubt = doubt_level(p, r.fit)
    assert ((doubt == 0) == (p >= 0.9)).all() and ((doubt == 2) == (p < 0.5)).all()
    keyed = r.column("t_step_s")[top] * 1.05 ** doubt
    assert (np.diff(keyed) >= 0).all()
    assert (np.diff(r.column("t_step_s")[top]) < 0).any()  # the rule did reorder something here


def test_top_feasible_is_the_fastest_feasible_rows_in_order():
    r = rank(load_model("320B"), load_machine("frontier"), RunOptions(), 512, BY_TIME)
    feasible = np.flatnonzero(r.reason == 0)
    fastest = feasible[np.argsort(r.column("t_step_s")[feasible], kind="stable")]
    assert 0 < r.num_feasible < len(r.reason)  # both kinds of row present, so the cut matters
    assert r.top_feasible(5) == [int(i) for i in fastest[:5]]
    assert r.top_feasible(len(r.reason)) == [int(i) for i in fastest]


def test_every_reason_is_explained():
    r = rank(load_model("320B"), load_machine("frontier"), RunOptions(), 512)
    seen = set()
    for i in range(len(r.candidates)):
        code = REASONS[r.reason[i]]
        text = r.reason_text(i)
        assert bool(code) == bool(text)
        seen.add(code)
    assert {"memory", "batch", "heads"} <= seen


def test_memory_reason_matches_the_numbers():
    """The reason, rebuilt from the breakdown's own columns: need = live tensors + the reserve (Megatron-AxoNN's
    5 communicators), its 80 % interval ``need·exp(±1.2816·σ)`` (σ = 0.10, docs/algorithm.md §6) against the HBM."""
    import math

    machine = load_machine("frontier")
    r = rank(load_model("320B"), machine, RunOptions(), 512)
    need = r.column("mem_total_bytes") + machine.reserved_gb(5) * 1e9
    low, high = need * math.exp(-1.2816 * 0.10), need * math.exp(1.2816 * 0.10)
    hbm = machine.device.hbm_gb * 1e9
    oom = r.reason == REASONS.index("memory")
    assert oom.any() and (low[oom] > hbm * (1 + 1e-6)).all()
    feasible = r.reason == 0
    assert feasible.any() and (low[feasible] <= hbm * (1 + 1e-6)).all()
    # a tight layout is ranked and marked: its interval straddles the HBM; the others' lies below it
    tight = feasible & (r.column("mem_tight") == 1)
    assert tight.any() and (high[tight] > hbm * (1 - 1e-6)).all()
    assert (high[feasible & ~tight] <= hbm * (1 + 1e-6)).all()


def test_smallest_feasible_world_is_feasible_and_minimal_among_tried():
    model, machine, opts = load_model("80B"), load_machine("perlmutter"), RunOptions()
    g = smallest_feasible_world(model, machine, opts, 4)
    assert g is not None and rank(model, machine, opts, g).num_feasible > 0
    assert rank(model, machine, opts, g // 2).num_feasible == 0


def test_plan_from_ranking_round_trips():
    r = rank(load_model("5B"), load_machine("alps"), RunOptions(), 64)
    best = int(r.order[0])
    plan = plan_from_ranking(r, best)
    again = LaunchConfig.from_json(plan.to_json())
    assert again == plan and again.prediction.t_step_s == r.column("t_step_s")[best]
    lay = r.candidates.layout(best)
    assert plan.axonn_init == lay.to_axonn_init() and plan.nodes == 16
    assert plan.grad_accum_steps * lay.gdata * lay.gz * plan.micro_batch == 2048
