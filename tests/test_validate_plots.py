"""Figures: what they draw, and how they are written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

from axoplan.errors import AxoplanError
from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import load_model
from axoplan.inputs.options import RunOptions
from axoplan.search.ranking import rank
from axoplan.validate import plots
from axoplan.validate.compare import validate
from tests.validate_helpers import small_plans, synthetic_runs, theory_machine


@pytest.fixture(scope="module")
def table() -> object:
    machine = theory_machine()
    plans = small_plans(worlds=(4, 8), micro_batches=(1, 2), recompute=(False,))
    return validate(synthetic_runs(plans, machine, [1.1] * len(plans)), machine).table


def test_measured_phases_map_onto_the_predicted_parts() -> None:
    phases = {"gemm": 1.0, "attention": 0.5, "all_reduce_y": 0.2, "stats_all_reduce_x": 0.1, "all_gather_z": 0.3,
              "reduce_scatter_z": 0.05, "optimizer": 0.05, "wait": 0.1}
    parts = plots.measured_parts(phases, total_s=3.0)
    assert parts["gemm"] == 1.0 and parts["non-GEMM"] == 0.5 and parts["optimizer"] == 0.05
    assert parts["comm y"] == 0.2 and parts["comm x"] == 0.1 and parts["comm z"] == pytest.approx(0.35)
    # 'wait' (0.1) plus what the phases leave of the total: 3.0 - 2.3 = 0.7
    assert parts["other"] == pytest.approx(0.8)
    assert sum(parts.values()) == pytest.approx(3.0)


def test_predicted_vs_measured_draws_every_plan_and_the_diagonal(table: object) -> None:
    fig = plots.predicted_vs_measured(table)
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    points = np.concatenate([c.get_offsets() for c in ax.collections if len(c.get_offsets()) > 0
                             and c.get_label().endswith("GPUs")])
    assert len(points) == len(table)
    diagonal = next(line for line in ax.lines if line.get_label() == "y = x")
    assert np.array_equal(diagonal.get_xdata(), diagonal.get_ydata())


def test_breakdown_bars_sum_to_the_predicted_and_measured_times(table: object) -> None:
    fig = plots.breakdown(table, max_plans=5)
    ax = fig.axes[0]
    left: dict[int, float] = {}  # plan index -> top of its predicted (left) stack
    right: dict[int, float] = {}  # ... of its measured (right) stack
    for rect in (r for c in ax.containers for r in c):
        centre = rect.get_x() + rect.get_width() / 2
        side = left if centre < round(centre) else right
        side[round(centre)] = max(side.get(round(centre), 0.0), rect.get_y() + rect.get_height())
    biggest = table["scenario"].value_counts().idxmax()
    shown = table[table["scenario"] == biggest].sort_values("measured_s").head(5)
    assert [left[i] for i in range(5)] == pytest.approx(shown["predicted_s"].to_list())
    assert [right[i] for i in range(5)] == pytest.approx(shown["measured_s"].to_list())


def test_top_layouts_and_scaling() -> None:
    machine, model, options = load_machine("frontier"), load_model("5B"), RunOptions()
    fig = plots.top_layouts(rank(model, machine, options, 64), top=4)
    assert len(fig.axes[0].get_xticklabels()) == 4
    points = plots.scaling_points(machine, [model], [64, 128], options)
    best = rank(model, machine, options, 128)
    assert points["t_step_s"].iloc[1] == pytest.approx(best.column("t_step_s")[best.order[0]])
    fig = plots.scaling(points, machine, options)
    assert len(fig.axes) == 2
    assert list(fig.axes[1].lines[0].get_xdata()) == [64, 128]


def test_nothing_feasible_gives_a_gap_not_an_error() -> None:
    points = plots.scaling_points(load_machine("frontier"), [load_model("640B")], [8], RunOptions())
    assert np.isnan(points["t_step_s"].iloc[0]) and points["layout"].iloc[0] == ""


def test_figures_are_written_by_extension(tmp_path: Path) -> None:
    fig = Figure()
    fig.add_subplot().plot([1, 2], [1, 2])
    plots.save_figure(fig, tmp_path / "a.png")
    plots.save_figure(fig, tmp_path / "a.svg")
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (tmp_path / "a.svg").read_text()
    with pytest.raises(AxoplanError, match="already exists"):
        plots.save_figure(fig, tmp_path / "a.png")
    with pytest.raises(AxoplanError, match=r"must end in .png, .svg, .pdf"):
        plots.save_figure(fig, tmp_path / "a.jpg")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "a.svg"]  # no temporary files left


def _overlapping_tick_labels(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of neighbouring x tick labels whose drawn text would intersect (after a real Agg draw).

    Level labels overlap when their boxes do. Labels slanted by the same angle θ (anchored at their
    ticks, a horizontal distance d apart) are parallel strips of the text's height h: they are apart
    when d·sin θ ≥ h. h comes from the drawn box (W = w·cos θ + h·sin θ, H = w·sin θ + h·cos θ)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    labels = [t for t in fig.axes[0].get_xticklabels() if t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in labels]
    pairs = []
    for a, b, p, q in zip(labels, labels[1:], boxes, boxes[1:], strict=False):
        theta = np.radians(a.get_rotation())
        if theta == 0:
            apart = not p.overlaps(q)
        else:
            height = (p.height * np.cos(theta) - p.width * np.sin(theta)) / np.cos(2 * theta)
            apart = abs(q.x1 - p.x1) * np.sin(theta) >= height
        if not apart:
            pairs.append((a.get_text(), b.get_text()))
    return pairs


def test_layout_labels_of_the_interval_and_breakdown_figures_do_not_overlap(table: object) -> None:
    """Issue 30 item 7: the labels of 320B's top layouts on 32,768 Frontier GCDs (``2x8x128x16/zxy``) ran
    into each other in `plot intervals` and `plot breakdown`; every pair of neighbours is now apart."""
    from axoplan.uncertainty.intervals import with_intervals
    from axoplan.uncertainty.plot import intervals_figure

    ranking = with_intervals(rank(load_model("320B"), load_machine("frontier"), RunOptions(), 32768))
    for fig in (intervals_figure(ranking, 10), plots.top_layouts(ranking, 10), plots.breakdown(table)):
        assert len(fig.axes[0].get_xticklabels()) >= 8
        assert _overlapping_tick_labels(fig) == []
