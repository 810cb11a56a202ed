"""Picture of the top layouts with their prediction intervals and probability of being fastest."""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from axoplan.errors import AxoplanError
from axoplan.search.ranking import Ranking

__all__ = ["intervals_figure", "layout_ticks"]


def layout_ticks(ax: Axes, labels: list[str]) -> None:
    """One x tick per bar at 0, 1, ...: each label on one line, slanted so that neighbours never overlap
    (issue 30: two-line labels such as ``2x8x128x16/zxy`` ran into each other)."""
    ax.set_xticks(range(len(labels)), labels, fontsize="small", rotation=30, ha="right", rotation_mode="anchor")
    ax.set_xlim(-0.6, len(labels) - 0.4)


def intervals_figure(r: Ranking, top: int = 10) -> Figure:
    """Point prediction with its interval (left axis) and P(best) bars (right axis) of the
    `top` best feasible layouts; `r` carries :func:`axoplan.uncertainty.intervals.with_intervals` columns."""
    rows = r.top_feasible(top)
    if not rows:
        raise AxoplanError(f"no feasible layout of {r.world_size} GPUs to draw")
    cols = r.prediction.columns
    t, low, high = cols["t_step_s"][rows], cols["t_low_s"][rows], cols["t_high_s"][rows]
    fig = Figure(figsize=(max(6.0, 0.8 * len(rows) + 2.5), 4.8), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(rows))
    tied = cols["tied"][rows] > 0
    ax.errorbar(x, t, yerr=[t - low, high - t], fmt="none", ecolor="0.4", capsize=4, label="prediction interval")
    for mask, color, label in ((tied, "tab:red", "tied with the best"), (~tied, "tab:blue", "point prediction")):
        if mask.any():  # no legend entry for a kind the figure does not show
            ax.scatter(x[mask], t[mask], color=color, zorder=3, label=label)
    ax.set_ylabel("predicted s / iteration")
    twin = ax.twinx()
    twin.bar(x, cols["p_best"][rows], 0.5, color="tab:green", alpha=0.3, label="P(best)")
    twin.set(ylabel="probability of being fastest", ylim=(0.0, 1.0))
    ax.set_zorder(twin.get_zorder() + 1)  # intervals over the bars
    ax.patch.set_visible(False)
    c = r.candidates
    layout_ticks(ax, [f"{c.layout(i)} mbs {c.micro_batch[i]}" for i in rows])
    ax.set_title(f"top {len(rows)} layouts: {r.model.name} on {r.world_size} GPUs of {r.machine.name}")
    handles = ax.get_legend_handles_labels()
    extra = twin.get_legend_handles_labels()
    ax.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize="small", loc="upper left",
              bbox_to_anchor=(1.08, 1.0))
    return fig
