"""Time to train, node-hours and budget constraints (axoplan.cost.budget and rank --tokens)."""

from __future__ import annotations

import pytest

from axoplan.cost.budget import check_max_nodes, format_tokens, parse_tokens, run_cost, within_node_hours
from axoplan.errors import AxoplanError
from tests.conftest import run_cli


@pytest.mark.parametrize(("text", "tokens"), [("300B", 300 * 10**9), ("1.5T", 1_500 * 10**9),
                                              ("2e12", 2 * 10**12), ("4096", 4096), ("10k", 10_000)])
def test_parse_tokens(text: str, tokens: int) -> None:
    assert parse_tokens(text) == tokens


@pytest.mark.parametrize("text", ["abc", "", "-3B", "0", "1.5X"])
def test_parse_tokens_refuses(text: str) -> None:
    with pytest.raises(AxoplanError, match="--tokens"):
        parse_tokens(text)


def test_format_tokens() -> None:
    assert format_tokens(300 * 10**9) == "300B"
    assert format_tokens(1_500 * 10**9) == "1.5T"


def test_row_frontier_300b_by_hand() -> None:
    # 300e9 / (2048 x 2048 = 4,194,304) = 71,525.57 -> 71,526 steps; x 20 s = 1,430,520 s
    # = 16.557 days; 64 GCDs / 8 per node = 8 nodes -> 8 x 1,430,520 / 3,600 = 3,178.93 node-hours,
    # 64 x 1,430,520 / 3,600 = 25,431.47 GPU-hours.
    c = run_cost(300 * 10**9, 2048, 2048, 20.0, 64, 8)
    assert c.steps == 71_526
    assert c.days == pytest.approx(16.5569, abs=1e-4)
    assert c.node_hours == pytest.approx(3178.93, abs=0.01)
    assert c.gpu_hours == pytest.approx(25431.47, abs=0.01)


def test_row_perlmutter_partial_node_by_hand() -> None:
    # 1e12 / (1024 x 4096 = 4,194,304) = 238,418.58 -> 238,419 steps; x 2.5 s = 596,047.5 s = 6.8987 days;
    # 6 GPUs on 4-GPU nodes occupy 2 whole nodes -> 2 x 596,047.5 / 3,600 = 331.14 node-hours,
    # 6 x 596,047.5 / 3,600 = 993.41 GPU-hours.
    c = run_cost(10**12, 1024, 4096, 2.5, 6, 4)
    assert c.steps == 238_419
    assert c.nodes == 2
    assert c.days == pytest.approx(6.8987, abs=1e-4)
    assert c.node_hours == pytest.approx(331.14, abs=0.01)
    assert c.gpu_hours == pytest.approx(993.41, abs=0.01)


def test_budget_prefix_and_cheapest() -> None:
    costs = [run_cost(10**12, 1024, 4096, t, 8, 4) for t in (2.0, 2.5, 3.0)]
    assert within_node_hours(costs, costs[1].node_hours) == 2
    with pytest.raises(AxoplanError, match=f"cheapest feasible choice needs {costs[0].node_hours:,.0f} node-hours"):
        within_node_hours(costs, costs[0].node_hours / 2)


def test_max_nodes() -> None:
    check_max_nodes(32, 4, 8)
    with pytest.raises(AxoplanError, match="largest GPU count that fits is --gpus 28"):
        check_max_nodes(64, 4, 7)


def test_rank_tokens_columns_match_budget() -> None:
    res = run_cli("rank", "--model", "5B", "--gpus", "64", "--machine", "frontier", "--tokens", "300B", "-n", "2")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    at = next(k for k, line in enumerate(lines) if line.startswith("rank"))
    assert lines[at].split()[-2:] == ["days", "node-h"]  # GPU-hours only with --wide, to stay within 120 columns
    cells = lines[at + 2].split()
    c = run_cost(300 * 10**9, 2048, 2048, float(cells[4]), 64, 8)  # rank, layout, mbs, options, s/iter
    # the table's days and node-hours are the budget arithmetic on the row's own s/iter (rounded)
    assert float(cells[-2]) == pytest.approx(c.days, abs=0.06)
    assert float(cells[-1].replace(",", "")) == pytest.approx(c.node_hours, rel=1e-3)
    wide = run_cli("rank", "--model", "5B", "--gpus", "64", "--machine", "frontier", "--tokens", "300B", "-n", "2",
                   "--wide").stdout.splitlines()
    at = next(k for k, line in enumerate(wide) if line.startswith("rank"))
    assert wide[at].split()[-3:] == ["days", "node-h", "GPU-h"]
    assert float(wide[at + 2].split()[-1].replace(",", "")) == pytest.approx(c.gpu_hours, rel=1e-3)


@pytest.mark.parametrize(("args", "message"), [
    (["--max-node-hours", "10"], "--max-node-hours needs --tokens"),
    (["--tokens", "300B", "--max-node-hours", "10"], "cheapest feasible choice needs"),
    (["--tokens", "300B", "--max-nodes", "4"], "largest GPU count that fits is --gpus 32"),
])
def test_rank_budget_errors(args: list[str], message: str) -> None:
    res = run_cli("rank", "--model", "5B", "--gpus", "64", "--machine", "frontier", *args)
    assert res.returncode == 2
    assert res.stderr.startswith("axoplan: error:") and message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_rank_budget_keeps_rows_that_fit() -> None:
    """A cap between two rows' node-hours keeps exactly the rows at or below it."""
    def rows(*extra: str) -> list[list[str]]:
        res = run_cli("rank", "--model", "5B", "--gpus", "64", "--machine", "frontier", "--tokens", "300B",
                      "-n", "10", *extra)
        assert res.returncode == 0, res.stderr
        return [ln.split() for ln in res.stdout.splitlines()[4:] if ln.strip() and ln.split()[0].isdigit()]

    hours = sorted(float(r[-1].replace(",", "")) for r in rows())  # node-h, the last column
    cut = next(i for i in range(4, len(hours)) if hours[i] > hours[i - 1])  # a gap after at least 4 rows
    cap = (hours[cut - 1] + hours[cut]) / 2
    kept = rows("--max-node-hours", f"{cap:.3f}")
    assert kept and all(float(r[-1].replace(",", "")) <= cap for r in kept)
    assert len(kept) < 10


def test_explain_tokens_line() -> None:
    res = run_cli("explain", "--model", "5B", "--gpus", "64", "--machine", "frontier", "--tokens", "300B")
    assert res.returncode == 0, res.stderr
    # 300e9 / 4,194,304 tokens per step = 71,525.6 -> 71,526 steps; 64 GCDs / 8 = 8 nodes
    assert "time to train 300B tokens: 71,526 steps" in res.stdout and "on 8 nodes" in res.stdout
