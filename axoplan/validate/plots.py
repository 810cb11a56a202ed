"""Figures: predicted against measured, per-layout breakdowns, and predicted scaling.

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot (no
global state, no window); :func:`save_figure` writes PNG, SVG or PDF by the file's
extension. Measured phases (the executor's ``phase_s``: ``gemm``, ``attention``,
``optimizer``, ``all_reduce_y``, ``all_gather_z``, ...) are mapped onto the predicted
parts (:data:`PARTS`); time the phases do not cover is drawn as "other".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from axoplan.errors import AxoplanError
from axoplan.fileio import check_writable, write_with
from axoplan.inputs.axes import AXES
from axoplan.inputs.machine import Machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.search.ranking import Ranking, rank
from axoplan.uncertainty.plot import layout_ticks
from axoplan.validate.compare import PREDICTED_PARTS

__all__ = ["PARTS", "predicted_vs_measured", "breakdown", "top_layouts", "scaling_points", "scaling",
           "scaling_costs", "cost_summary", "measured_parts", "save_figure", "check_figure_path", "FIGURE_SUFFIXES"]

PARTS: tuple[str, ...] = (*PREDICTED_PARTS, "other")
FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
_COLORS = dict(zip(PARTS, ("#4c72b0", "#8172b3", "#937860", "#dd8452", "#55a868", "#c44e52", "#da8bc3",
                           "#8c8c8c", "#64b5cd", "#a1887f", "#ccb974", "#cccccc"), strict=True))
_NONGEMM = {"attention", "elementwise", "nongemm", "non_gemm", "softmax", "norm", "logits", "loss"}
_AXES = (*AXES, "world")


def measured_parts(phase_s: dict[str, float], total_s: float) -> dict[str, float]:
    """Measured phases summed into the predicted parts; what they leave of the total is 'other'."""
    parts = dict.fromkeys(PARTS, 0.0)
    for key, seconds in phase_s.items():
        axis = key.rsplit("_", 1)[-1]
        if key == "gemm":
            parts["gemm"] += seconds
        elif key in _NONGEMM:
            parts["non-GEMM"] += seconds
        elif key == "optimizer":
            parts["optimizer"] += seconds
        elif axis in _AXES and any(op in key for op in ("all_reduce", "all_gather", "reduce_scatter")):
            parts[f"comm {axis}"] += seconds
        else:
            parts["other"] += seconds
    parts["other"] += max(total_s - sum(parts.values()), 0.0)
    return parts


def _phases(row: pd.Series) -> dict[str, float]:
    return {str(k)[len("phase_"):-2]: float(v) for k, v in row.items()
            if str(k).startswith("phase_") and isinstance(v, int | float) and not math.isnan(v)}


def predicted_vs_measured(table: pd.DataFrame, title: str = "") -> Figure:
    """Log-log scatter of predicted against measured seconds per iteration, with y = x and ±20 %."""
    fig = Figure(figsize=(6.0, 5.5), layout="constrained")
    ax = fig.add_subplot()
    meas, pred = table["measured_s"].to_numpy(), table["predicted_s"].to_numpy()
    lo, hi = min(meas.min(), pred.min()) / 1.3, max(meas.max(), pred.max()) * 1.3
    line = np.array([lo, hi])
    ax.fill_between(line, line / 1.2, line * 1.2, color="#dddddd", label="±20 %", zorder=0)
    ax.plot(line, line, color="black", lw=1, label="y = x")
    worlds = sorted(table["world_size"].unique())
    for i, world in enumerate(worlds):
        sel = table["world_size"] == world
        color = colormaps["viridis"](0.1 + 0.8 * i / max(len(worlds) - 1, 1))
        ax.scatter(table.loc[sel, "measured_s"], table.loc[sel, "predicted_s"], s=18, alpha=0.8, color=color,
                   label=f"{world} GPUs", edgecolors="none")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured s / iteration",
           ylabel="predicted s / iteration", title=title or "predicted vs measured")
    err = np.abs(pred - meas) / meas * 100
    ax.text(0.03, 0.97, f"MAPE {err.mean():.1f}%  ({len(table)} plans)", transform=ax.transAxes, va="top")
    ax.legend(loc="lower right", fontsize="small")
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    return fig


def breakdown(table: pd.DataFrame, max_plans: int = 12, title: str = "") -> Figure:
    """Per plan, a predicted and a measured stacked bar of the step's parts.

    The plans drawn are the `max_plans` fastest measured of the scenario with the most plans.
    """
    biggest = table["scenario"].value_counts().idxmax()
    rows = table[table["scenario"] == biggest].sort_values("measured_s").head(max_plans)
    fig = Figure(figsize=(max(6.0, 0.9 * len(rows) + 2.5), 5.0), layout="constrained")
    ax = fig.add_subplot()
    width = 0.38
    x = np.arange(len(rows))
    pred_base, meas_base = np.zeros(len(rows)), np.zeros(len(rows))
    meas_parts = [measured_parts(_phases(r), float(r["measured_s"])) for _, r in rows.iterrows()]
    for part in PARTS:
        pred = rows[f"pred_{PREDICTED_PARTS[part]}"].to_numpy() if part in PREDICTED_PARTS else np.zeros(len(rows))
        meas = np.array([m[part] for m in meas_parts])
        if not (pred.any() or meas.any()):
            continue
        ax.bar(x - width / 2, pred, width, bottom=pred_base, color=_COLORS[part], label=part)
        ax.bar(x + width / 2, meas, width, bottom=meas_base, color=_COLORS[part], hatch="//", edgecolor="white")
        pred_base += pred
        meas_base += meas
    layout_ticks(ax, [f"{r['layout']} mbs {r['micro_batch']}" for _, r in rows.iterrows()])
    first = rows.iloc[0]
    ax.set(ylabel="s / iteration", title=title or f"predicted (left) vs measured (right, hatched): {first['model']}, "
           f"{first['world_size']} GPUs, batch {first['global_batch']}")
    ax.legend(fontsize="small", ncols=3)
    return fig


def top_layouts(ranking: Ranking, top: int = 8) -> Figure:
    """Predicted breakdown of the `top` best feasible layouts of a ranking; a whisker on each
    total marks its prediction interval when the ranking carries the interval columns of
    :func:`axoplan.uncertainty.intervals.with_intervals` (docs/uncertainty.md)."""
    feasible = ranking.top_feasible(top)
    if not feasible:
        raise AxoplanError(f"no feasible layout of {ranking.world_size} GPUs to draw")
    fig = Figure(figsize=(max(6.0, 0.8 * len(feasible) + 2.5), 4.8), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(feasible))
    base = np.zeros(len(feasible))
    for part, column in PREDICTED_PARTS.items():
        values = ranking.column(column)[feasible]
        if values.any():
            ax.bar(x, values, 0.6, bottom=base, color=_COLORS[part], label=part)
            base += values
    if "t_low_s" in ranking.prediction.columns:
        _interval_whiskers(ax, x, ranking, feasible)
    c = ranking.candidates
    layout_ticks(ax, [f"{c.layout(i)} mbs {c.micro_batch[i]}" for i in feasible])
    ax.set(ylabel="predicted s / iteration",
           title=f"top {len(feasible)} layouts: {ranking.model.name} on {ranking.world_size} GPUs of "
                 f"{ranking.machine.name}")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _interval_whiskers(ax: Axes, x: np.ndarray, ranking: Ranking, rows: list[int]) -> None:
    """Whiskers from each total's interval low to high (``t_low_s``, ``t_high_s``)."""
    t = ranking.column("t_step_s")[rows]
    low, high = ranking.column("t_low_s")[rows], ranking.column("t_high_s")[rows]
    ax.errorbar(x, t, yerr=[t - low, high - t], fmt="none", ecolor="black", capsize=4,
                label="prediction interval")


def scaling_points(machine: Machine, models: Sequence[ModelSpec], gpu_counts: Sequence[int],
                   options: RunOptions) -> pd.DataFrame:
    """Best feasible prediction per (model, GPU count); NaN where nothing fits.

    Throughput is in model flops (``mfu``, and ``model_tflops_per_gpu`` = MFU x peak: recompute not
    counted, so a faster layout always shows more); ``tflops_per_gpu`` is the hardware flops the
    kernels run (HFU's count)."""
    rows = []
    peak = machine.device.peak_bf16_tflops
    for model in models:
        for gpus in gpu_counts:
            r = rank(model, machine, options, gpus)
            best = int(r.order[0]) if r.num_feasible else None
            at = {k: float(r.column(k)[best]) if best is not None else math.nan
                  for k in ("t_step_s", "mfu", "tflops_per_gpu")}
            rows.append({"model": model.name, "gpus": gpus, **at, "model_tflops_per_gpu": at["mfu"] * peak / 100,
                         "layout": str(r.candidates.layout(best)) if best is not None else ""})
    return pd.DataFrame(rows)


def scaling_costs(points: pd.DataFrame, tokens: int, options: RunOptions, devices_per_node: int) -> pd.DataFrame:
    """`points` with the days, node-hours and GPU-hours of training `tokens` tokens
    (axoplan.cost.budget.run_cost); NaN where nothing fits."""
    from axoplan.cost.budget import run_cost

    def cost(row: pd.Series) -> pd.Series:
        if math.isnan(row["t_step_s"]):
            return pd.Series({"days": math.nan, "node_hours": math.nan, "gpu_hours": math.nan})
        c = run_cost(tokens, options.global_batch, options.seq_len, float(row["t_step_s"]), int(row["gpus"]),
                     devices_per_node)
        return pd.Series({"days": c.days, "node_hours": c.node_hours, "gpu_hours": c.gpu_hours})

    return pd.concat([points, points.apply(cost, axis=1)], axis=1)


def cost_summary(points: pd.DataFrame, threshold: float = 0.75) -> list[str]:
    """Per model, the fastest and the cheapest GPU count, and where adding GPUs stops paying.

    A step from g1 to g2 GPUs (consecutive feasible counts) pays while its marginal efficiency,
    speed-up / GPU ratio = (days1 / days2) / (g2 / g1), is at least `threshold` (0.75: at most a
    quarter of the added GPU-hours buy nothing); the line names the first step below it.
    """
    lines = []
    for model, sub in points.dropna(subset=["days"]).groupby("model", sort=False):
        fast, cheap = sub.loc[sub["days"].idxmin()], sub.loc[sub["node_hours"].idxmin()]
        text = (f"{model}: fewest days {fast['days']:.1f} at {int(fast['gpus'])} GPUs "
                f"({fast['node_hours']:,.0f} node-hours); fewest node-hours {cheap['node_hours']:,.0f} at "
                f"{int(cheap['gpus'])} GPUs ({cheap['days']:.1f} days)")
        steps = sub.sort_values("gpus")
        for (_, a), (_, b) in zip(steps.iterrows(), steps.iloc[1:].iterrows(), strict=False):
            speedup, more = a["days"] / b["days"], b["gpus"] / a["gpus"]
            if speedup / more < threshold:
                text += (f"; from {int(a['gpus'])} to {int(b['gpus'])} GPUs the days fall only {speedup:.2f}x for "
                         f"{more:g}x the GPUs ({100 * speedup / more:.0f}% of ideal)")
                break
        lines.append(text)
    return lines


def scaling(points: pd.DataFrame, machine: Machine, options: RunOptions, tokens: int | None = None) -> Figure:
    """Model TFLOP/s per GPU (MFU's count) and seconds per iteration against GPU count, one line per model;
    with `tokens` (and `points` from :func:`scaling_costs`), a second row: days to train and node-hours."""
    rows = 1 if tokens is None else 2
    fig = Figure(figsize=(11.0, 4.5 * rows), layout="constrained")
    grid = fig.subplots(rows, 2, squeeze=False)
    left, right = grid[0]
    for model, sub in points.groupby("model", sort=False):
        left.plot(sub["gpus"], sub["model_tflops_per_gpu"], marker="o", label=str(model))
        right.plot(sub["gpus"], sub["t_step_s"], marker="o", label=str(model))
    peak = machine.device.peak_bf16_tflops
    left.axhline(peak, color="grey", lw=0.8, ls="--", label=f"peak {peak:g}")
    left.set(xscale="log", xlabel="GPUs", ylabel="model TFLOP/s per GPU (MFU x peak; no recompute)",
             ylim=(0, peak * 1.05))
    right.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="s / iteration (best layout)")
    if tokens is not None:
        _cost_panels(points, grid[1][0], grid[1][1], tokens, machine)
    for ax in grid.flat:
        ax.set_xticks(sorted(points["gpus"].unique()), [str(g) for g in sorted(points["gpus"].unique())],
                      fontsize="small", rotation=45)
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        ax.legend(fontsize="small")
    fig.suptitle(f"predicted scaling on {machine.name}: global batch {options.global_batch} x "
                 f"{options.seq_len} tokens")
    return fig


def _cost_panels(points: pd.DataFrame, days_ax: Axes, hours_ax: Axes, tokens: int, machine: Machine) -> None:
    """Days to train (falls while adding GPUs pays) and node-hours (flat under perfect scaling, rising after)."""
    from axoplan.cost.budget import format_tokens

    for model, sub in points.groupby("model", sort=False):
        days_ax.plot(sub["gpus"], sub["days"], marker="o", label=str(model))
        hours_ax.plot(sub["gpus"], sub["node_hours"], marker="o", label=str(model))
    label = format_tokens(tokens)
    days_ax.set(xscale="log", yscale="log", xlabel="GPUs",
                ylabel=f"days to train {label} tokens")
    hours_ax.set(xscale="log", yscale="log", xlabel="GPUs",
                 ylabel=f"node-hours for {label} tokens ({machine.devices_per_node} GPUs per node)")


def check_figure_path(path: Path, force: bool = False) -> None:
    """Refuse, before any work, a figure path with an unknown suffix or that cannot be written."""
    if Path(path).suffix.lower() not in FIGURE_SUFFIXES:
        raise AxoplanError(f"{path}: a figure must end in {', '.join(FIGURE_SUFFIXES)}")
    check_writable(Path(path), force, "figure")


def save_figure(fig: Figure, path: Path, force: bool = False) -> None:
    """Write `fig` as PNG, SVG or PDF (by extension), atomically; refuse to overwrite without `force`."""
    path = Path(path)
    check_figure_path(path, force)
    metadata = {"Date": None} if path.suffix.lower() == ".svg" else None
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=120, metadata=metadata), force=force, suffix=path.suffix)
