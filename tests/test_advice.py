"""Advice when no layout is feasible: the binding constraint first, batches that run well."""

from __future__ import annotations

from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import load_model
from axoplan.inputs.options import RunOptions
from axoplan.search.advice import _candidate_batches, explain_infeasible, suggest_global_batches
from axoplan.search.ranking import rank


def test_candidate_batches_are_the_multiples_just_around_the_request() -> None:
    # 2048 // 3 = 682 -> 2046, 2049; by 6: 2046, 2052; by 96: 21 x 96 = 2016, 22 x 96 = 2112;
    # by 6144: 0 (dropped) and 6144 (within 4 x 2048); by 16384: beyond 4 x 2048 (dropped)
    assert _candidate_batches(2048, [3, 6, 96, 6144, 16384]) == [2016, 2046, 2049, 2052, 2112, 6144]


def test_alps_6144_gets_batches_whose_best_layout_runs_well_not_the_next_integer() -> None:
    r = rank(load_model("320B"), load_machine("alps"), RunOptions(), 6144)
    assert r.num_feasible == 0
    fails = r.feasibility.fails
    usable = ~(fails["dims-x"] | fails["dims-y"] | fails["heads"] | fails["memory"])
    good = suggest_global_batches(r, usable)
    assert 2049 not in good and good == sorted(good) and len(good) <= 3
    def seconds_per_sequence(batch: int) -> float:
        got = rank(r.model, r.machine, RunOptions(global_batch=batch), 6144)
        assert got.num_feasible > 0
        return float(got.column("t_step_s")[got.order[0]]) / batch

    # each suggestion runs at least twice as fast per sequence as 2049, the next integer some layout divides
    assert max(map(seconds_per_sequence, good)) < seconds_per_sequence(2049) / 2


def test_memory_is_named_before_the_batch_when_it_would_block_anyway() -> None:
    r = rank(load_model("320B"), load_machine("alps"), RunOptions(global_batch=7), 12)
    assert "in memory" in explain_infeasible(r) and "--global-batch" not in explain_infeasible(r)
