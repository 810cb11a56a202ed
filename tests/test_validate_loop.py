"""The suggest-measure-calibrate loop replayed on the vTrain single-node data (issue 10).

Figures from `benchmarks/suggest_loop.py` (README, docs/uncertainty.md, "The loop").
"""

from __future__ import annotations

import pytest

from axoplan.errors import AxoplanError
from axoplan.inputs.machine import load_machine
from axoplan.validate.compare import aggregate
from axoplan.validate.loop import next_plans, run_loop, scenarios
from axoplan.validate.records import load_runs
from tests.conftest import REPO

VTRAIN = REPO / "data" / "measured" / "vtrain_a100_single_node_pp1.csv"
SCENARIOS = 12  # the first 12 scenarios of the file, 80 plans; about 6 s per rule
K = 2  # the k at which suggest beat point prediction over 48 scenarios (108 against 114 plans)


@pytest.fixture(scope="module")
def groups() -> list:
    return scenarios(aggregate(load_runs([VTRAIN])))[:SCENARIOS]


def test_scenarios_are_the_files_questions(groups: list) -> None:
    every = scenarios(aggregate(load_runs([VTRAIN])))
    assert len(every) == 120 and sum(len(g) for g in every) == 696  # 24 single-plan scenarios dropped
    assert sum(len(g) for g in groups) == 80
    for g in groups:
        first = g[0].plan
        assert {(p.plan.model, p.plan.world_size, p.plan.options.global_batch) for p in g} == \
            {(first.model, first.world_size, first.options.global_batch)}


def test_the_loop_finds_every_fastest_plan_timing_a_third_and_suggest_is_no_worse(groups: list) -> None:
    machine = load_machine("dgx-a100")
    suggested = run_loop(groups, machine, K, "suggest")
    point = run_loop(groups, machine, K, "point")
    plans = sum(len(g) for g in groups)
    # measured (README): 26 of the 80 plans timed by either rule; the fastest in the first round in 11 of 12
    assert suggested.total <= 28 < plans
    assert suggested.total <= point.total
    assert suggested.first_round >= 10
    assert all(1 <= m <= n for m, n in zip(suggested.measured, suggested.sizes, strict=True))
    assert suggested.fits == sum(-(-m // K) for m in suggested.measured)  # one refit per round
    fitted = suggested.machine
    assert fitted.uncertainty is not None and fitted.uncertainty.log_cov  # the loop did calibrate
    # the scanned floor moved up, as the full fit moves it (5.95 µs shipped for the DGX A100's CPU,
    # 6.59 µs after this loop, 6.87 µs fitted on 504 plans; with the counted ops of the first
    # kernel model it had to reach 26 µs)
    assert 1.03 * machine.host.op_us < fitted.host.op_us < 1.5 * machine.host.op_us


def test_next_plans_never_repeats_a_timed_plan(groups: list) -> None:
    g = max(groups, key=len)
    machine = load_machine("dgx-a100")
    timed: list[int] = []
    while len(timed) < len(g):
        new = next_plans(g, machine, timed, 2, "suggest")
        assert new and not set(new) & set(timed) and len(new) == min(2, len(g) - len(timed))
        timed += new
    assert sorted(timed) == list(range(len(g)))


def test_bad_loop_arguments_are_refused(groups: list) -> None:
    with pytest.raises(AxoplanError, match="k >= 1"):
        run_loop(groups, load_machine("dgx-a100"), 0, "suggest")
