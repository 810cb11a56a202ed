"""A first pick that fits (issue 30): the probability that a layout fits in memory, the rank order that
respects it, and what rank, explain and export say about memory; and the head-count reason that names
the KV heads where they are the limit."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from axoplan.commands.options import FIT_FLAGS
from axoplan.cost.memory import MemoryVerdict, memory_verdict
from axoplan.inputs.framework import load_framework
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import ModelSpec, load_model
from axoplan.inputs.options import RunOptions
from axoplan.report import format_table
from axoplan.search.feasibility import check
from axoplan.search.fit import TIGHT_LEVEL, FitPolicy, doubt_level, fit_order, fit_probability, memory_fit
from axoplan.search.ranking import rank
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout, parse_layout
from tests.conftest import run_cli, run_cli_here

Z80 = 1.2815515655446004
"""Φ⁻¹(0.9): the 80 % central interval's half-width in standard deviations."""

NINE = ("frontier", "alps", "dgx-h100", "perlmutter-80gb", "el-capitan", "lumi-g", "dgx-h200", "dgx-b200", "jupiter")
"""Issue 30's nine shipped machines for Llama 3.1 70B on 1,024 GPUs."""


def _verdict(need: float, hbm: float, up: float, down: float) -> MemoryVerdict:
    """One candidate needing `need` bytes, its 80 % interval ``need·exp(-Z80·down) .. need·exp(Z80·up)``."""
    arr = np.array([need])
    return MemoryVerdict(arr, arr * math.exp(-Z80 * down), arr * math.exp(Z80 * up), hbm, hbm - 1.0,
                         np.zeros(1, dtype=np.uint8))


# ----------------------------------------------------------------------------- the probability


@pytest.mark.parametrize(("hbm_over_need", "up", "down", "expected"), [
    (1.0, 0.1, 0.1, 0.5),  # the point estimate at the HBM: as likely to fit as not
    (math.exp(0.1), 0.1, 0.1, 0.8413447460685429),  # one sigma of headroom: Φ(1)
    (math.exp(Z80 * 0.1), 0.1, 0.1, 0.9),  # the interval's high end at the HBM: Φ(z) = 0.9
    (math.exp(-0.2), 0.1, 0.1, 0.022750131948179195),  # two sigma short: Φ(-2)
    (math.exp(-0.2), 0.1, 0.2, 0.15865525393145707),  # below the need the low side's sigma counts: Φ(-1)
    (math.exp(0.3), 0.2, 0.05, 0.9331927987311419),  # above it the high side's: Φ(1.5)
    (1.25, 0.0, 0.0, 1.0),  # no spread: it fits or it does not
    (0.8, 0.0, 0.0, 0.0),
])
def test_fit_probability_is_the_normal_cdf_of_the_headroom_in_sigmas(hbm_over_need, up, down, expected):
    need = 50e9
    p = fit_probability(_verdict(need, need * hbm_over_need, up, down), level=0.8)
    assert p[0] == pytest.approx(expected, abs=1e-12)


def test_fit_probability_agrees_with_the_cost_models_verdict():
    """Whatever the need and its spread: 'fits' is P(fit) >= Φ(z) (0.9 at the 80 % level), 'does not fit' is
    P(fit) < Φ(-z) (0.1), and a point estimate above the HBM is P(fit) < 1/2."""
    machine = load_machine("frontier")
    profile = load_framework("axonn")
    live = np.linspace(1e9, 120e9, 4001)
    v = memory_verdict(live, machine, profile, level=TIGHT_LEVEL)
    p = fit_probability(v, TIGHT_LEVEL)
    z = Z80 if TIGHT_LEVEL == 0.8 else None
    assert z is not None, "the tight band's level changed: update Z80"
    eps = 1e-9
    assert (v.verdict == 0).any() and (v.verdict == 1).any() and (v.verdict == 2).any()
    assert (p[v.verdict == 0] >= 0.9 - eps).all() and (p[v.verdict != 0] < 0.9 + eps).all()
    assert (p[v.verdict == 2] < 0.1 + eps).all() and (p[v.verdict != 2] >= 0.1 - eps).all()
    assert ((p < 0.5) == (v.need_bytes > v.hbm_bytes)).all()
    assert (np.diff(p) <= 0).all()  # more memory never fits better


def test_memory_fit_states_need_usable_memory_and_verdict():
    """Frontier's GCD: 64 GB of HBM; the reserve and the usable memory come from the machine."""
    machine = load_machine("frontier")
    usable = machine.hbm_usable_bytes(load_framework("axonn").memory.communicators)
    live = usable  # the tensors exactly fill the usable memory: the point estimate sits at the HBM
    fit = memory_fit(live, machine, load_model("20B"), RunOptions(framework="axonn"))
    assert fit.need_bytes == pytest.approx(64e9) and fit.p_fit == pytest.approx(0.5)
    assert fit.verdict == "tight"
    text = fit.describe()
    assert f"needs {live / 1e9:.1f} GB of tensors, of {usable / 1e9:.1f} GB usable (64 GB HBM less a " \
           f"{64 - usable / 1e9:.1f} GB reserve)" in text
    assert text.endswith("tight (P(fit) 0.50)")


# ----------------------------------------------------------------------------- the order


@st.composite
def _rows(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, FitPolicy]:
    n = draw(st.integers(1, 40))
    t = np.array(draw(st.lists(st.floats(0.01, 100.0), min_size=n, max_size=n)))
    # few distinct times too, so that ties and exact margins occur
    if draw(st.booleans()):
        t = np.round(t, 0) + 1.0
    p = np.array(draw(st.lists(st.sampled_from([0.0, 0.05, 0.3, 0.5, 0.7, 0.89, 0.9, 0.95, 1.0])
                               | st.floats(0.0, 1.0), min_size=n, max_size=n)))
    feasible = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    policy = FitPolicy(margin=draw(st.sampled_from([0.0, 0.05, 0.25]) | st.floats(0.0, 1.0)),
                       risk=draw(st.sampled_from([0.1, 0.5, 0.7]) | st.floats(0.01, 0.99)))
    return t, p, feasible, policy


@given(_rows())
def test_no_doubtful_row_precedes_a_row_that_fits_within_the_margin(rows):
    t, p, feasible, policy = rows
    order = fit_order(t, p, feasible, policy)
    assert sorted(order.tolist()) == list(range(t.size))
    k = int(feasible.sum())
    assert feasible[order[:k]].all() and not feasible[order[k:]].any()
    top = order[:k]
    doubt = doubt_level(p[top], policy)
    fits, likely_not = p[top] >= 1 - policy.risk, p[top] < min(0.5, 1 - policy.risk)
    for a in range(k):
        for b in range(a + 1, k):
            ta, tb = t[top[a]], t[top[b]]
            if not fits[a] and fits[b]:  # a doubtful row above one that fits: only beyond the margin
                assert tb > ta * (1 + policy.margin)
            if likely_not[a] and not likely_not[b]:  # more likely not to fit, above one less so: likewise
                assert tb > ta * (1 + policy.margin)
            if doubt[a] == doubt[b]:  # equally doubtful: by time
                assert ta <= tb
    if policy.margin == 0.0:
        assert (np.diff(t[top]) >= 0).all()  # no margin: the order by time


def test_fit_flags_default_to_the_policys_defaults():
    defaults = {f.name: f.default for f in FIT_FLAGS}
    assert defaults == {"fit_margin": FitPolicy().margin, "fit_risk": FitPolicy().risk} == \
        {"fit_margin": 0.05, "fit_risk": 0.1}


# ----------------------------------------------------------------------------- the nine machines


def _first_pick_holds(machine_name: str) -> tuple[bool, str]:
    """Check issue 30's rule on one machine; returns whether the fastest feasible layout was in doubt and
    the first pick's description."""
    machine = load_machine(machine_name)
    r = rank(load_model("llama3.1-70B"), machine, RunOptions(), 1024)
    assert r.fit == FitPolicy()
    t, p, need = r.column("t_step_s"), r.column("p_fit"), r.column("mem_need_bytes")
    feasible = r.order[: r.num_feasible]
    first = int(r.order[0])
    hbm = machine.device.hbm_gb * 1e9
    fits = feasible[p[feasible] >= 0.9]
    within = fits[t[fits] <= 1.05 * t[first]]
    note = format_table(r, 5)
    if p[first] < 0.9:  # in doubt: only because nothing that fits is within 5 % of its time, and it says so
        assert within.size == 0, machine_name
        assert "rank 1 fits in memory only with probability" in note, machine_name
        if fits.size:
            best = int(fits[np.argmin(t[fits])])
            assert t[best] > 1.05 * t[first]
            assert f"is {t[best] / t[first] - 1:.1%} slower, more than the 5 % margin" in " ".join(note.split())
    else:
        assert "rank 1 fits in memory only" not in note
    if need[first] > hbm:  # a point estimate above the HBM: nothing that fits, or even may fit, lies within 5 %
        maybe = feasible[p[feasible] >= 0.5]
        assert not (t[maybe] <= 1.05 * t[first]).any(), machine_name
    fastest = int(feasible[np.argmin(t[feasible])])
    return bool(p[fastest] < 0.9), f"{machine_name}: {r.candidates.layout(first)} {t[first]:.3f} s"


def test_nine_machines_first_pick_fits_or_says_why():
    """Llama 3.1 70B on 1,024 GPUs of each of the nine machines: no first pick whose fit is in doubt while a
    layout that fits lies within 5 % of its time, none whose point estimate is above the HBM while one that
    may fit does, and the table's note where no layout that fits is within the margin."""
    doubtful_fastest = [_first_pick_holds(m)[0] for m in NINE]
    assert any(doubtful_fastest)  # the rule is tested where it has work to do (7 of 9 in issue 30)


def _rank_rows(stdout: str) -> list[list[str]]:
    return [ln.split() for ln in stdout.splitlines() if ln.strip() and ln.split()[0].isdigit()]


def test_frontier_first_pick_through_the_cli_fits():
    """The real entry point: issue 30's Frontier case (the fastest layout needs more than a 64 GB GCD while
    one that fits is within 5 %, on 2026-11-26 69.3 against 34.7 GB, 1.8 % slower): rank 1 fits."""
    done = run_cli("rank", "--model", "llama3.1-70B", "--gpus", "1024", "--machine", "frontier", "--top", "5")
    assert done.returncode == 0, done.stderr
    header = next(ln for ln in done.stdout.splitlines() if ln.startswith("rank"))
    assert header.split()[-2:] == ["GB", "P(fit)"]
    rows = _rank_rows(done.stdout)
    assert len(rows) == 5 and max(map(len, done.stdout.splitlines())) <= 120
    first = rows[0]
    assert float(first[-2].rstrip("*")) <= 64.0 and float(first[-1]) >= 0.9
    assert "rank 1 fits in memory only" not in done.stdout
    by_time = run_cli_here("rank", "--model", "llama3.1-70B", "--gpus", "1024", "--machine", "frontier", "--top",
                           "1", "--fit-margin", "0")
    fastest = _rank_rows(by_time.stdout)[0]
    assert float(fastest[4]) <= float(first[4])  # margin 0: the fastest, whatever its memory
    if float(fastest[-1]) < 0.9 and float(first[4]) <= 1.05 * float(fastest[4]):
        assert fastest[1] != first[1] or fastest[2:4] != first[2:4]


@pytest.mark.parametrize("args", [("--fit-risk", "0"), ("--fit-risk", "1"), ("--fit-margin", "nan"),
                                  ("--fit-margin", "-0.1"), ("--fit-margin", "2"), ("--fit-risk", "inf")])
@pytest.mark.parametrize("command", ["rank", "explain", "suggest"])
def test_bad_fit_options_are_one_line_naming_the_flag(command, args):
    done = run_cli_here(command, "--model", "5B", "--gpus", "64", "--machine", "perlmutter", *args)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"axoplan: error: {args[0]} ") and "Traceback" not in done.stderr


def test_help_states_the_fit_defaults():
    text = " ".join(run_cli_here("rank", "--help", env={"COLUMNS": "200"}).stdout.split())
    assert "--fit-margin" in text and "0.05: 5 %" in text and "[default: 0.05]" in text
    assert "--fit-risk" in text and "0.1: it fits with probability 0.9 or more" in text and "[default: 0.1]" in text


# ----------------------------------------------------------------------------- explain and export


def test_explain_states_need_usable_memory_and_verdict():
    machine = load_machine("frontier")
    usable = machine.hbm_usable_bytes(load_framework("axonn").memory.communicators) / 1e9
    done = run_cli_here("explain", "--model", "llama3.1-70B", "--gpus", "1024", "--machine", "frontier")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    m = re.search(r"Memory per GPU: needs ([\d.]+) GB of tensors, of ([\d.]+) GB usable \(64 GB HBM less a [\d.]+ GB "
                  r"reserve\); with the reserve ([\d.]+) GB, 80% interval [\d.]+-[\d.]+ GB: (fits|tight) "
                  r"\(P\(fit\) ([\d.]+)\)", text)
    assert m is not None, text[-800:]
    assert float(m.group(2)) == pytest.approx(usable, abs=0.05)
    memory_part = done.stdout[done.stdout.index("Memory per GPU"):]
    total = float(re.search(r"\ntotal\s+([\d.]+)", memory_part).group(1))  # the breakdown's own total
    assert float(m.group(1)) == pytest.approx(total, abs=0.06)
    assert float(m.group(3)) == pytest.approx(total + 64 - usable, abs=0.1)
    assert float(m.group(5)) >= 0.9 and m.group(4) == "fits"  # rank 1 is the first pick that fits


def test_export_table_and_job_script_state_need_usable_memory_and_verdict(tmp_path: Path):
    out = tmp_path / "plans"
    done = run_cli_here("export", "--model", "llama3.1-70B", "--gpus", "1024", "--machine", "dgx-h200", "--top",
                        "3", "--out-dir", str(out))
    assert done.returncode == 0, done.stderr
    header = next(ln for ln in done.stdout.splitlines() if ln.startswith("rank"))
    assert header.split()[4:6] == ["mem", "GB"] and "fit" in header.split()
    machine = load_machine("dgx-h200")
    usable = machine.hbm_usable_bytes(load_framework("axonn").memory.communicators) / 1e9
    assert f"({usable:.1f} GB of it usable by tensors)" in done.stdout
    ranked = rank(load_model("llama3.1-70B"), machine, RunOptions(), 1024)
    for n, line in enumerate(_rank_rows(done.stdout)):
        i = ranked.top_feasible(3)[n]
        need, p = ranked.column("mem_need_bytes")[i] / 1e9, ranked.column("p_fit")[i]
        verdict = "tight" if ranked.column("mem_tight")[i] else "fits"
        assert line[1] == str(ranked.candidates.layout(i))
        assert line[4] == f"{need:.1f}/141" and line[5:7] == [verdict, f"{p:.2f}"]
        script = next(out.glob(f"{n + 1:02d}-*")) / "job.sh"
        [mem_line] = [ln for ln in script.read_text().splitlines() if ln.startswith("# memory per GPU:")]
        assert f"of {usable:.1f} GB usable" in mem_line and f"with the reserve {need:.1f} GB" in mem_line
        assert mem_line.endswith(f": {verdict} (P(fit) {p:.2f})")
    if ranked.column("p_fit")[ranked.top_feasible(1)[0]] < 0.9:
        assert "warning: rank 1 fits in memory only with probability" in done.stderr


# ----------------------------------------------------------------------------- the head-count reason


def _heads_reason(model: ModelSpec, gy: int) -> str:
    c = Candidates.single(Layout(1, gy, 1, 1), micro_batch=1, recompute=False, cache_weights=False)
    f = check(model, RunOptions(), c)
    return f.text(0, "heads")


@pytest.mark.parametrize(("gy", "expected"), [
    (16, "Gy=16 does not divide the 8 KV heads (grouped-query attention: it divides the 64 query heads, but the KV "
         "heads are split over Y too)"),
    (128, "Gy=128 divides neither the 64 query heads nor the 8 KV heads"),
])
def test_heads_reason_names_the_kv_heads_where_they_are_the_limit(gy, expected):
    assert _heads_reason(load_model("llama3.1-70B"), gy) == expected


def test_heads_reason_of_multi_head_attention_names_the_heads():
    assert _heads_reason(load_model("20B"), 16) == "Gy=16 does not divide the 56 heads"


def test_heads_reason_through_explain():
    """Llama 3.1 70B at Gy=16: 16 divides the 64 query heads; the 8 KV heads are what rule it out."""
    done = run_cli_here("explain", "--model", "llama3.1-70B", "--gpus", "1024", "--machine", "frontier",
                        "--layout", "1x16x8x8")
    assert done.returncode == 0, done.stderr
    assert "INFEASIBLE: Gy=16 does not divide the 8 KV heads" in done.stdout
    assert "the 64 heads" not in done.stdout
    assert parse_layout("1x16x8x8").world_size == 1024


def test_node_hour_cap_keeps_every_row_within_it_in_rank_order():
    """With the fit rule the rows within --max-node-hours are not a prefix of the order: Frontier's Llama 3.1 70B on
    256 GCDs, rank 1 fits and is slower (so dearer) than the doubtful fastest layout ranked below it; a cap between
    the two keeps the doubtful one and drops rank 1. (The case was 1,024 GCDs until the default framework's Llama
    op list was traced and its recompute required: there its fastest layout now fits.)"""
    from axoplan.cost.budget import run_cost

    machine = load_machine("frontier")
    r = rank(load_model("llama3.1-70B"), machine, RunOptions(), 256)
    t, p = r.column("t_step_s"), r.column("p_fit")
    first = int(r.order[0])
    feasible = r.order[: r.num_feasible]
    fastest = int(feasible[np.argmin(t[feasible])])
    assert p[first] >= 0.9 > p[fastest] and t[fastest] < t[first]  # issue 30's case on this machine

    def hours(i: int) -> float:
        return run_cost(10**12, 2048, 2048, float(t[i]), 256, 8).node_hours

    cap = (hours(fastest) + hours(first)) / 2
    done = run_cli_here("rank", "--model", "llama3.1-70B", "--gpus", "256", "--machine", "frontier", "--tokens",
                        "1T", "--max-node-hours", f"{cap:.3f}", "--top", "50")
    assert done.returncode == 0, done.stderr
    rows = _rank_rows(done.stdout)
    assert rows and all(float(row[-1].replace(",", "")) <= cap for row in rows)
    assert all(float(row[4]) < t[first] - 0.0005 for row in rows)  # rank 1 (dearer than the cap) is left out
    assert any(float(row[4]) == pytest.approx(t[fastest], abs=5e-4) for row in rows)  # the cheaper one kept
    keyed = [float(row[4]) * 1.05 ** ((float(row[-3]) < 0.9) + (float(row[-3]) < 0.5)) for row in rows]
    assert keyed == sorted(keyed)  # still the fit rule's order


def test_a_saved_ranking_keeps_its_order_and_refuses_fit_flags(tmp_path: Path):
    """`export --ranking FILE.json` exports in the order the ranking was saved in; the fit flags, which would
    change that order, are refused in one line like every other ranking flag."""
    saved = tmp_path / "r.json"
    assert run_cli_here("rank", "--model", "llama3.1-70B", "--gpus", "1024", "--machine", "frontier", "--out",
                        str(saved)).returncode == 0
    done = run_cli_here("export", "--ranking", str(saved), "--fit-margin", "0", "--out-dir", str(tmp_path / "p"))
    assert done.returncode == 2 and "leave out --fit-margin" in done.stderr
    assert len(done.stderr.splitlines()) == 1 and not (tmp_path / "p").exists()
    done = run_cli_here("export", "--ranking", str(saved), "--top", "1", "--out-dir", str(tmp_path / "p"))
    assert done.returncode == 0, done.stderr
    import json

    first = next(r for r in json.loads(saved.read_text())["rows"] if r["feasible"])
    row = _rank_rows(done.stdout)[0]
    from axoplan.inputs.axes import parse_tp_order

    saved_first = Layout(first["gx"], first["gy"], first["gz"], first["gdata"], order=parse_tp_order(first["tp_order"]))
    assert row[1] == str(saved_first)  # the saved order's first
    assert row[5:7] == [("fits" if first["p_fit"] >= 0.9 else "tight"), f"{first['p_fit']:.2f}"]
