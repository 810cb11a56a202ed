"""Render rankings and single-layout explanations as text tables, CSV and JSON."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from axoplan.axes import AXIS_DEFS, FIELDS, LABELS, order_name
from axoplan.cost.model import CollectiveTerm
from axoplan.layout import Layout
from axoplan.ranking import Ranking

__all__ = ["format_table", "format_csv", "format_json", "format_explain", "text_table", "selected_rows"]

_GB = 1e9


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    """Aligned plain-text table (numbers right-aligned)."""
    right = right or [True] * len(headers)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def _options_label(rec: dict[str, Any]) -> str:
    parts = ["recompute" if rec["recompute"] else "no-recompute"]
    if rec["cache_weights"] and rec["gz"] > 1:
        parts.append("cache")
    return ",".join(parts)


def selected_rows(r: Ranking, top: int, infeasible: bool) -> list[int]:
    """Indices of the top feasible candidates (or of the top infeasible ones)."""
    feasible = r.reason[r.order] == 0
    chosen = r.order[~feasible] if infeasible else r.order[feasible]
    return [int(i) for i in chosen[:top]]


def format_table(r: Ranking, top: int, infeasible: bool = False, tokens: int | None = None) -> str:
    """The top rows (or top infeasible rows with their reasons) as a readable table.

    With `tokens`, each row also shows days to train, node-hours and GPU-hours (axoplan.budget).
    """
    head = (f"{r.model.name} on {r.world_size} x {r.machine.device.name} ({r.machine.name}), "
            f"global batch {r.options.global_batch} x {r.options.seq_len} tokens: "
            f"{len(r.candidates)} candidates, {r.num_feasible} feasible")
    headers = ["rank", *LABELS, "order", "mbs", "options", "s/iter", "MFU %", "HFU %",
               "exposed comm s", "mem GB/GPU"]
    shows_interval = "p_best" in r.prediction.columns and not infeasible
    if shows_interval:
        headers[len(LABELS) + 5:len(LABELS) + 5] = ["interval s", "P(best)"]
    if tokens is not None:
        from axoplan.budget import format_tokens

        head += f"; cost of {format_tokens(tokens)} tokens"
        headers += ["days", "node-h", "GPU-h"]
    if infeasible:
        headers.append("why infeasible")
    rows = []
    for n, i in enumerate(selected_rows(r, top, infeasible), start=1):
        rec = r.row(i)
        timed = [f"{rec['t_step_s']:.3f}", f"{rec['mfu']:.1f}", f"{rec['pct_peak']:.1f}",
                 f"{rec['t_comm_exposed_s']:.3f}"] if r.has_time(i) else ["-"] * 4
        cells = [str(n), *(str(rec[k]) for k in (*FIELDS, "tp_order", "micro_batch")), _options_label(rec), *timed,
                 f"{rec['mem_need_bytes'] / _GB:.1f}" + ("*" if rec["mem_tight"] else "")]
        if shows_interval:
            at = len(FIELDS) + 5  # after rank, the axes, order, micro-batch, options and s/iter
            cells[at:at] = [_interval_text(rec), f"{rec['p_best']:.2f}" + ("=" if rec["tied"] else "")]
        if tokens is not None:
            cells += _cost_cells(r, rec["t_step_s"], tokens) if r.has_time(i) else ["-"] * 3
        if infeasible:
            cells.append(rec["reason"])
        rows.append(cells)
    if not rows:
        return head + "\n(no rows)"
    right = [True] * (len(LABELS) + 1) + [False, True, False] + [True] * (7 if shows_interval else 5) + \
        [True] * (3 if tokens is not None else 0) + ([False] if infeasible else [])
    foot = "\n" + (_INTERVAL_NOTE + "\n" if shows_interval else "") + _COLUMNS_NOTE
    return head + "\n\n" + text_table(headers, rows, right) + foot


def _interval_text(rec: dict[str, Any]) -> str:
    low, high = rec["t_low_s"], rec["t_high_s"]
    return "-" if low != low else f"{low:.3f}-{high:.3f}"


_COLUMNS_NOTE = ("MFU: model flops (6·params·tokens + non-causal attention, no recompute: Megatron's and "
                 "llm-foundry's count) over peak; HFU: the flops the kernels run; mem: per GPU with the reserve, "
                 "* tight: the HBM is inside its 80% interval (docs/algorithm.md)")

_INTERVAL_NOTE = ("interval: central prediction interval (--level, default 80%); P(best): probability of being "
                  "fastest, from the machine's parameter spread and model error; '=' after P(best) marks layouts "
                  "tied with the best (docs/uncertainty.md)")


def _cost_cells(r: Ranking, t_step_s: float, tokens: int) -> list[str]:
    from axoplan.budget import run_cost

    c = run_cost(tokens, r.options.global_batch, r.options.seq_len, t_step_s, r.world_size,
                 r.machine.devices_per_node)
    return [f"{c.days:.1f}", f"{c.node_hours:,.0f}", f"{c.gpu_hours:,.0f}"]


def _records(r: Ranking, rows: Sequence[int]) -> list[dict[str, Any]]:
    out = []
    for n, i in enumerate(rows, start=1):
        rec = {"rank": n, **r.row(i)}
        out.append(rec)
    return out


def format_csv(r: Ranking, rows: Sequence[int]) -> str:
    records = _records(r, rows)
    buf = io.StringIO()
    if records:
        writer = csv.DictWriter(buf, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    return buf.getvalue()


def format_json(r: Ranking, rows: Sequence[int]) -> str:
    doc = {
        "model": r.model.model_dump(), "machine": r.machine.name, "world_size": r.world_size,
        "options": r.options.model_dump(mode="json"), "candidates": len(r.candidates),
        "feasible": r.num_feasible, "rows": _records(r, rows),
    }
    return json.dumps(doc, indent=1) + "\n"


def _sizes_label(lay: Layout) -> str:
    """'Gx=4 Gy=8 Gz=512 Gdata=2, order xyz' (the tensor-parallel order, innermost first)."""
    return " ".join(f"{a.label}={lay.size(a.name)}" for a in AXIS_DEFS) + f", order {order_name(lay.order)}"


def format_explain(r: Ranking, i: int) -> str:
    """Every collective, the compute and the memory of candidate i."""
    rec = r.row(i)
    lay = r.candidates.layout(i)
    head = f"{r.model.name} on {r.world_size} x {r.machine.name}: layout {_sizes_label(lay)}, " \
           f"micro-batch {rec['micro_batch']}, {_options_label(rec)}"
    if not r.has_time(i):
        return "\n".join([head, f"INFEASIBLE: {rec['reason']}; no step time is predicted for it", "",
                          _memory_section(r, i)])
    lines = [
        f"{head}, {rec['grad_accum']:.0f} micro-batches per step",
        *([f"INFEASIBLE: {rec['reason']}"] if rec["reason"] else []),
        f"predicted {rec['t_step_s']:.4f} s/iter = compute {rec['t_compute_s']:.4f} s + exposed communication "
        f"{rec['t_comm_exposed_s']:.4f} s + compute lost to hidden communication {rec['t_interference_s']:.4f} s "
        f"+ waiting for the slowest of {r.world_size} GPUs {rec['t_straggler_s']:.4f} s + host idle "
        f"{rec['t_host_idle_s']:.4f} s; MFU {rec['mfu']:.1f}%, HFU {rec['pct_peak']:.1f}% "
        f"({rec['tflops_per_gpu']:.1f} TFLOP/s per GPU run)",
    ]
    lines += ["", "Compute per step", text_table(["part", "seconds"], [
        ["GEMMs (all linear layers, fwd + recompute + bwd)", f"{rec['t_gemm_s']:.4f}"],
        ["attention and element-wise (redundant over X)", f"{rec['t_nongemm_s']:.4f}"],
        ["optimizer step", f"{rec['t_optimizer_s']:.4f}"],
        ["lost to collectives hidden behind the compute (their SMs and HBM traffic)",
         f"{rec['t_interference_s']:.4f}"],
        [f"waiting for the slowest of {r.world_size} GPUs (device.speed_variation)", f"{rec['t_straggler_s']:.4f}"],
        ["host-bound idle (the host issues ops slower than the device runs them)", f"{rec['t_host_idle_s']:.4f}"],
    ], [False, True])]
    lines += ["", "Collectives per step (bytes per call; hidden = overlapped with compute)", _collectives_table(r, i)]
    lines += ["", _memory_section(r, i)]
    return "\n".join(lines)


def _memory_section(r: Ranking, i: int) -> str:
    from axoplan.cost.memory import VERDICTS

    mem, verdict = r.prediction.memory, r.feasibility.memory
    assert verdict is not None
    head = (f"Memory per GPU ({verdict.usable_bytes / _GB:.1f} GB of {verdict.hbm_bytes / _GB:.0f} GB usable after "
            f"the reserve; with the reserve it needs {verdict.need_bytes[i] / _GB:.1f} GB, "
            f"{verdict.low_bytes[i] / _GB:.1f}-{verdict.high_bytes[i] / _GB:.1f} GB: "
            f"{VERDICTS[int(verdict.verdict[i])]})")
    return head + "\n" + text_table(
        ["part", "GB"],
        [[k, f"{getattr(mem, k)[i] / _GB:.2f}"] for k in mem.__slots__] + [["total", f"{mem.total[i] / _GB:.2f}"]],
        [False, True])


def _collectives_table(r: Ranking, i: int) -> str:
    from axoplan.cost.placement import place

    rows = []
    for t in r.prediction.collectives:
        calls = float(t.calls_per_step[i])
        idle = t.exposed_per_call[i] == 0 if t.is_drain else t.seconds_per_call[i] == 0
        if calls == 0 or t.group_size[i] <= 1 or idle:
            continue  # no group, or skipped (a backward all-gather of cached weights, a drain already hidden)
        link = place(r.machine, int(t.stride[i]), int(t.group_size[i])).link
        rows.append(_collective_row(t, i, calls, link))
    totals = [float(r.column("t_comm_total_s")[i]), float(r.column("t_comm_exposed_s")[i])]
    rows.append(["total", "", "", "", "", "", "", "", "", "", f"{totals[0]:.4f}", f"{totals[0] - totals[1]:.4f}",
                 f"{totals[1]:.4f}"])
    headers = ["layer", "phase", "collective", "axis", "size", "stride", "placement", "MB/call", "calls", "GB/s",
               "total s", "hidden s", "exposed s"]
    note = ("\n(drain): the extra wait, once per micro-batch, for the first all-gather of the forward and the last "
            "reduce-scatter of the backward, which no compute hides (docs/algorithm.md §5c)")
    has_drain = any(row[2].endswith("(drain)") for row in rows)
    return text_table(headers, rows, [False] * 4 + [True, True, False] + [True] * 6) + (note if has_drain else "")


def _collective_row(t: CollectiveTerm, i: int, calls: float, link: str) -> list[str]:
    total, exposed = float(t.total_s[i]), float(t.exposed_s[i])
    if t.is_drain:  # its traffic is counted in its collective's row; here only the extra wait
        total = exposed
    bw = float(t.bandwidth_gbs[i])
    return [t.layer, t.phase, t.op, t.axis, str(int(t.group_size[i])), str(int(t.stride[i])), link,
            f"{t.nbytes[i] / 1e6:.2f}", f"{calls:g}", "inf" if not np.isfinite(bw) else f"{bw:.1f}",
            f"{total:.4f}", f"{total - exposed:.4f}", f"{exposed:.4f}"]
