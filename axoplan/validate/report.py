"""Text output of `validate` and `calibrate`, and the calibrated YAML's header."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from axoplan.report import plural, text_table, wrap
from axoplan.validate.calibrate import Calibration
from axoplan.validate.compare import Summary, Validation, summarize

__all__ = ["format_validation", "format_summary", "format_calibration", "calibration_verdict", "calibration_header",
           "table_rows"]


def _pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1f}%"


def _num(value: float, digits: int = 3) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def table_rows(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the per-plan table, ordered by scenario, then measured time."""
    headers = ["run", "scen", "layout", "mbs", "recomp", "GPUs", "reps", "measured s", "predicted s", "error"]
    rows = []
    for _, r in table.sort_values(["scenario", "measured_s"], kind="stable").iterrows():
        where = Path(str(r["where"]).rsplit(":", 1)[0]).name + ":" + str(r["where"]).rsplit(":", 1)[-1]
        flag = "" if r["feasible"] else f" ({r['reason']})"
        rows.append([where, str(r["scenario"]), r["layout"], str(r["micro_batch"]), "yes" if r["recompute"] else "no",
                     str(r["world_size"]), str(r["repetitions"]), f"{r['measured_s']:.4g}",
                     f"{r['predicted_s']:.4g}", f"{r['error_pct']:+.1f}%{flag}"])
    return headers, rows


def format_summary(s: Summary) -> str:
    """The headline lines of one validation."""
    if not s.plans:
        return "no plans"
    lines = [
        f"MAPE {_pct(s.mape_pct)} (median {_pct(s.median_ape_pct)}), worst {s.worst_pct:+.1f}% at {s.worst_where}, "
        f"mean signed error {s.bias_pct:+.1f}% over {plural(s.plans, 'plan')} ({plural(s.runs, 'run')})",
        f"ordering of all plans: Kendall tau {_num(s.kendall_tau)}, Spearman rho {_num(s.spearman_rho)}",
    ]
    if s.scenarios:
        lines.append(f"within {s.scenarios} scenarios (same model, batch and GPU count; >= 2 plans): mean Kendall "
                     f"tau {_num(s.scenario_tau)}; the measured best is predicted first in {s.best_predicted_first}"
                     f" and in the predicted top {s.top_k} in {s.best_in_top_k}")
    if s.scaling_groups:
        lines.append(f"across GPU counts ({plural(s.scaling_groups, 'group')} of one model and sequence length): "
                     f"mean Kendall tau of throughput per GPU {_num(s.scaling_tau)}")
    lines.append(f"memory: {s.does_not_fit} of {plural(s.plans, 'plan')} called 'does not fit' (all ran), "
                 f"{s.tight} tight")
    return "\n".join(wrap(line) for line in lines)


def format_validation(v: Validation, rows: bool = True) -> str:
    """Per-plan table (unless `rows` is False) and the summary."""
    m = v.machine
    head = (f"{plural(len(v.table), 'plan')} measured on {m.name} ({m.devices_per_node} x {m.device.name}), "
            "predicted by axoplan")
    parts = [head + _by_source(v.table)]
    if rows:
        headers, cells = table_rows(v.table)
        parts.append(text_table(headers, cells, [False, True, False, True, False, True, True, True, True, True]))
    parts.append(format_summary(v.summary))
    return "\n\n".join(parts)


def _by_source(table: pd.DataFrame) -> str:
    """One line per file when the plans come from several: its plans, MAPE and mean signed error."""
    files = table["where"].astype(str).str.rsplit(":", n=1).str[0]
    if files.nunique() < 2:
        return ""
    lines = []
    for name, part in table.groupby(files, sort=False):
        s = summarize(part)
        lines.append(f"\n  from {name}: {plural(s.plans, 'plan')}, MAPE {_pct(s.mape_pct)}, mean signed error "
                     f"{s.bias_pct:+.1f}%")
    return "".join(lines)


def _value(v: float) -> str:
    return f"{v:.4g}"


def format_calibration(c: Calibration) -> str:
    """What was fitted, and the error before and after on the training and held-out plans."""
    n_train, n_hold = c.train_before.plans, c.holdout_before.plans if c.holdout_before else 0
    held = f" ({n_hold} more held out, {c.holdout_fraction:.0%} by seed {c.seed})" if n_hold else " (none held out)"
    head = f"calibrated {c.original.name} on {plural(n_train, 'plan')}{held}"
    params = text_table(["parameter", "before", "after", "±1σ", "note"], [
        [f.path, _value(f.before), _value(f.after), "n/a" if math.isnan(f.rel_sigma) else f"{100 * f.rel_sigma:.0f}%",
         "at its bound" if f.at_bound else ""] for f in c.fitted], [False, True, True, True, False])
    rows = [_error_row("fitted on", c.train_before, c.train_after)]
    if c.holdout_before and c.holdout_after:
        rows.append(_error_row("held out", c.holdout_before, c.holdout_after))
    errors = text_table(["plans", "MAPE before", "MAPE after", "worst before", "worst after", "tau before",
                         "tau after", "scenario tau before", "scenario tau after"], rows, [False] + [True] * 8)
    unused = (f"\nnot constrained by these runs (left as they were): {', '.join(c.unused)}" if c.unused else "")
    return f"{head}\n\n{params}{unused}\n\n{errors}\n\n{wrap(calibration_verdict(c))}"


def calibration_verdict(c: Calibration) -> str:
    """Whether the calibrated machine is recommended, from its error on the plans the fit never saw."""
    if c.holdout_before is None or c.holdout_after is None:
        return ("nothing held out: the error on the fitted plans cannot tell whether the fit carries to other "
                "plans (--holdout 0.3 checks it on 30% of them)")
    n, before, after = c.holdout_before.plans, _pct(c.holdout_before.mape_pct), _pct(c.holdout_after.mape_pct)
    if c.worse_on_holdout:
        return (f"not recommended: the calibrated machine is worse on the {n} held-out plans than {c.original.name} "
                f"(MAPE {before} -> {after}); keep --machine {c.original.name}")
    return f"recommended: on the {n} held-out plans the calibrated machine is better (MAPE {before} -> {after})"


def _error_row(label: str, before: Summary, after: Summary) -> list[str]:
    return [f"{label} ({before.plans})", _pct(before.mape_pct), _pct(after.mape_pct), f"{before.worst_pct:+.1f}%",
            f"{after.worst_pct:+.1f}%", _num(before.kendall_tau, 2), _num(after.kendall_tau, 2),
            _num(before.scenario_tau, 2), _num(after.scenario_tau, 2)]


def calibration_header(c: Calibration, sources: Sequence[str], machine_ref: str, when: str) -> str:
    """Comment block for the top of a calibrated machine YAML."""
    n_hold = c.holdout_before.plans if c.holdout_before else 0
    lines = [
        f"Calibrated by `axoplan calibrate` on {when} from {', '.join(sources)}:",
        f"fitted on {plural(c.train_before.plans, 'plan')}"
        + (f", {n_hold} held out ({c.holdout_fraction:.0%}, seed {c.seed})." if n_hold else ", none held out."),
        "Fitted parameters (before -> after, one-sigma relative uncertainty):",
    ]
    for f in c.fitted:
        sigma = "uncertainty n/a" if math.isnan(f.rel_sigma) else f"±{100 * f.rel_sigma:.0f}%"
        lines.append(f"  {f.path}: {_value(f.before)} -> {_value(f.after)} ({sigma})"
                     + (" at its bound" if f.at_bound else ""))
    if c.unused:
        lines.append(f"Not constrained by these runs, kept: {', '.join(c.unused)}.")
    for label, before, after in (("training", c.train_before, c.train_after),
                                 ("held-out", c.holdout_before, c.holdout_after)):
        if before is None or after is None:
            continue
        lines.append(f"Error on the {label} plans: MAPE {_pct(before.mape_pct)} -> {_pct(after.mape_pct)}, worst "
                     f"{before.worst_pct:+.1f}% -> {after.worst_pct:+.1f}%, Kendall tau "
                     f"{_num(before.kendall_tau, 2)} -> {_num(after.kendall_tau, 2)}.")
    if c.worse_on_holdout:
        lines.append("NOT RECOMMENDED: worse than the original on the held-out plans (written on request, "
                     "--even-if-worse).")
    lines.append(f"The rest is {machine_ref} with the fitted lines replaced (their comments say 'calibrated').")
    return "\n".join(f"# {line}" for line in lines) + "\n"
