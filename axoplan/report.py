"""Render rankings and single-layout explanations as text tables, CSV and JSON."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from axoplan.cost.model import CollectiveTerm
from axoplan.inputs.axes import AXIS_DEFS, order_name
from axoplan.records.numbers import json_numbers
from axoplan.search.ranking import Ranking
from axoplan.space.layout import Layout

__all__ = ["format_table", "format_csv", "format_json", "format_explain", "text_table", "selected_rows", "plural",
           "wrap", "TABLE_WIDTH", "fit_note"]

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


TABLE_WIDTH = 120
"""Characters a table and its notes fit by default (``--wide`` shows every column, unwrapped)."""


def format_table(r: Ranking, top: int, infeasible: bool = False, tokens: int | None = None,
                 rows: Sequence[int] | None = None, wide: bool = False) -> str:
    """The top rows (or top infeasible rows with their reasons, or the given `rows`) as a readable table.

    By default it fits :data:`TABLE_WIDTH` columns: the layout in ``--layout`` spelling, the
    micro-batch, the options, seconds per step with its interval and P(best), MFU, the memory need
    and the probability that it fits. `wide` adds the axes one by one, HFU and the exposed
    communication. With `tokens`, each row also shows days to train and node-hours (and, `wide`,
    GPU-hours; axoplan.cost.budget). Where the first row's fit is in doubt, a note says why it is first.
    """
    head = (f"{r.model.name} on {r.world_size} x {r.machine.device.name} ({r.machine.name}), "
            f"global batch {r.options.global_batch} x {r.options.seq_len} tokens: "
            f"{plural(len(r.candidates), 'candidate')}, {r.num_feasible} feasible")
    if tokens is not None:
        from axoplan.cost.budget import format_tokens

        head += f"; cost of {format_tokens(tokens)} tokens"
    chosen = list(rows) if rows is not None else selected_rows(r, top, infeasible)
    columns = _table_columns(r, infeasible, tokens, wide)
    body = [[cell(r, i, n) for _, _, cell in columns] for n, i in enumerate(chosen, start=1)]
    if not body:
        return wrap(head, wide) + "\n(no rows)"
    notes = [fit_note(r) if chosen[0] == r.order[0] and not infeasible else None,
             _routing_note(r) if isinstance(r, Ranking) else None,
             _attention_note(r) if isinstance(r, Ranking) else None,
             _LAYOUT_NOTE if not wide else "", _INTERVAL_NOTE if _has_interval(r, infeasible) else "",
             _reach_note(r, chosen[0]) if wide and _has_interval(r, infeasible) else None,
             _columns_note(wide, r), "" if wide or tokens is None else _GPU_HOURS_NOTE]
    table = text_table([h for h, _, _ in columns], body, [right for _, right, _ in columns])
    return "\n".join([wrap(head, wide), "", table, *(wrap(n, wide) for n in notes if n)])


Cell = Callable[[Ranking, int, int], str]


def _table_columns(r: Ranking, infeasible: bool, tokens: int | None, wide: bool) -> list[tuple[str, bool, Cell]]:
    """(header, right-aligned, cell of (ranking, candidate, rank)) for each column shown."""
    cols: list[tuple[str, bool, Cell]] = [("rank", True, lambda r, i, n: str(n))]
    if wide:
        cols += [(a.label, True, _axis_cell(a.field)) for a in AXIS_DEFS]
        cols.append(("order", False, lambda r, i, n: order_name(r.candidates.order(i))))
    else:
        cols.append(("layout", False, lambda r, i, n: _layout_spelling(r.candidates.layout(i))))
    cols += [("mbs", True, lambda r, i, n: str(int(r.candidates.micro_batch[i]))),
             ("options", False, lambda r, i, n: _options_label(r.row(i))),
             ("s/iter", True, _timed(lambda rec: f"{rec['t_step_s']:.3f}"))]
    if _has_interval(r, infeasible):
        cols += [("interval s", True, lambda r, i, n: _interval_text(r.row(i))),
                 ("P(best)", True, lambda r, i, n: f"{r.row(i)['p_best']:.2f}" + ("=" if r.row(i)["tied"] else ""))]
    cols.append(("MFU %", True, _timed(lambda rec: f"{rec['mfu']:.1f}")))
    if wide:
        cols += [("HFU %", True, _timed(lambda rec: f"{rec['pct_peak']:.1f}")),
                 ("exposed comm s", True, _timed(lambda rec: f"{rec['t_comm_exposed_s']:.3f}"))]
    cols.append(("mem GB" if not wide else "mem GB/GPU", True, _memory_cell))
    if "p_fit" in r.prediction.columns:
        cols.append(("P(fit)", True, lambda r, i, n: f"{r.row(i)['p_fit']:.2f}"))
    if tokens is not None:
        for k, header in enumerate(("days", "node-h", "GPU-h")[: 3 if wide else 2]):  # GPU-h: node-h x GPUs/node
            cols.append((header, True, _cost_cell(tokens, k)))
    if infeasible:
        cols.append(("why infeasible", False, lambda r, i, n: str(r.row(i)["reason"])))
    return cols


def _axis_cell(field: str) -> Cell:
    return lambda r, i, n: str(int(getattr(r.candidates, field)[i]))


def _timed(fmt: Callable[[dict[str, Any]], str]) -> Cell:
    return lambda r, i, n: fmt(r.row(i)) if r.has_time(i) else "-"


def _memory_cell(r: Ranking, i: int, n: int) -> str:
    rec = r.row(i)
    return f"{rec['mem_need_bytes'] / _GB:.1f}" + ("*" if rec["mem_tight"] else "")


def _cost_cell(tokens: int, k: int) -> Cell:
    def cell(r: Ranking, i: int, n: int) -> str:
        if not r.has_time(i):
            return "-"
        c = _run_cost(r, float(r.column("t_step_s")[i]), tokens)
        return (f"{c.days:.1f}", f"{c.node_hours:,.0f}", f"{c.gpu_hours:,.0f}")[k]
    return cell


def _reach_note(r: Ranking, i: int) -> str | None:
    """What widened the first row's interval beyond the model's error (axoplan.uncertainty.reach)."""
    from axoplan.uncertainty.intervals import ranking_note

    return ranking_note(r, i)


def _has_interval(r: Ranking, infeasible: bool) -> bool:
    return "p_best" in r.prediction.columns and not infeasible


def _layout_spelling(lay: Layout) -> str:
    """Gx x Gy x Gz x Gdata with its rank order, always named: what --layout takes."""
    return "x".join(str(v) for v in lay.sizes) + "/" + order_name(lay.order)


def wrap(text: str, wide: bool = False) -> str:
    """`text` folded to :data:`TABLE_WIDTH` columns (unless `wide`)."""
    import textwrap

    return text if wide else textwrap.fill(text, TABLE_WIDTH, break_on_hyphens=False)


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """'1 node', '2 nodes' (and a given irregular plural)."""
    return f"{count} {noun if count == 1 else (plural_noun or noun + 's')}"


def _interval_text(rec: dict[str, Any]) -> str:
    low, high = rec["t_low_s"], rec["t_high_s"]
    return "-" if low != low else f"{low:.3f}-{high:.3f}"


_LAYOUT_NOTE = ("layout: Gx x Gy x Gz x Gdata/tensor-parallel order (innermost first), as --layout takes it; "
                "--wide shows the axes apart, HFU and the exposed communication")


def _columns_note(wide: bool, r: Ranking) -> str:
    from axoplan.search.fit import TIGHT_LEVEL

    hfu = "; HFU: the flops the kernels run, recompute included" if wide else ""
    return ("MFU: model flops (6·params·tokens + non-causal attention, no recompute: Megatron's and llm-foundry's "
            f"count) over peak{hfu}; mem: GB per GPU with the reserve, * tight: the HBM is inside its "
            f"{TIGHT_LEVEL:.0%} interval (docs/algorithm.md); P(fit): the probability that it fits the HBM; a layout "
            f"with P(fit) under {r.fit.min_p_fit:.2f} (--fit-risk) never ranks above one that fits and is at most "
            f"{r.fit.margin * 100:g} % slower (--fit-margin)")


_GPU_HOURS_NOTE = "node-h: node-hours (--wide adds GPU-hours, node-hours x GPUs per node)"


def fit_note(r: Any) -> str | None:
    """Why a ranking's first pick is one whose fit in memory is in doubt (None when it fits, or for a saved
    ranking, whose order was fixed when it was ranked)."""
    from axoplan.search.fit import first_pick_note

    if not isinstance(r, Ranking) or "p_fit" not in r.prediction.columns:
        return None
    return first_pick_note(r.order, r.num_feasible, r.column("t_step_s"), r.column("p_fit"), r.fit,
                           lambda i: _layout_spelling(r.candidates.layout(i)))


_INTERVAL_NOTE = ("interval: central prediction interval (--level, default 80%); P(best): probability of being "
                  "fastest, from the machine's parameter spread and model error; '=' after P(best) marks layouts "
                  "tied with the best (docs/uncertainty.md)")


def _run_cost(r: Ranking, t_step_s: float, tokens: int) -> Any:
    from axoplan.cost.budget import run_cost

    return run_cost(tokens, r.options.global_batch, r.options.seq_len, t_step_s, r.world_size,
                    r.machine.devices_per_node)


def _records(r: Ranking, rows: Sequence[int], tokens: int | None = None) -> list[dict[str, Any]]:
    """Each row as a flat record: every column of the table (and more), missing values None."""
    out = []
    for n, i in enumerate(rows, start=1):
        rec: dict[str, Any] = {"rank": n, "layout": _layout_spelling(r.candidates.layout(i)), **r.row(i)}
        if tokens is not None:
            timed = r.has_time(i)
            cost = _run_cost(r, rec["t_step_s"], tokens) if timed else None
            rec |= {"tokens": tokens, "steps": cost.steps if cost else None, "nodes": cost.nodes if cost else None,
                    "days": cost.days if cost else None, "node_hours": cost.node_hours if cost else None,
                    "gpu_hours": cost.gpu_hours if cost else None}
        out.append({k: _finite_or_none(v) for k, v in rec.items()})
    return out


def _finite_or_none(value: Any) -> Any:
    """NaN and infinities become None: JSON null (strict parsers refuse NaN), an empty CSV cell."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def format_csv(r: Ranking, rows: Sequence[int], tokens: int | None = None) -> str:
    records = _records(r, rows, tokens)
    buf = io.StringIO()
    if records:
        writer = csv.DictWriter(buf, fieldnames=list(records[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
    return buf.getvalue()


def format_json(r: Ranking, rows: Sequence[int], tokens: int | None = None) -> str:
    doc = {
        "model": r.model.model_dump(), "machine": r.machine.name, "world_size": r.world_size,
        "options": r.options.model_dump(mode="json"), "candidates": len(r.candidates),
        "feasible": r.num_feasible, "tokens": tokens,
        "rows": [json_numbers(rec) for rec in _records(r, rows, tokens)],  # counts and bytes as integers
    }
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def _sizes_label(lay: Layout) -> str:
    """'Gx=4 Gy=8 Gz=512 Gdata=2, order xyz' (the tensor-parallel order, innermost first)."""
    return " ".join(f"{a.label}={lay.size(a.name)}" for a in AXIS_DEFS) + f", order {order_name(lay.order)}"


def format_explain(r: Ranking, i: int, wide: bool = False) -> str:
    """Every collective, the compute and the memory of candidate i (within 120 columns unless `wide`)."""
    rec = r.row(i)
    lay = r.candidates.layout(i)
    head = f"{r.model.name} on {r.world_size} x {r.machine.name}: layout {_sizes_label(lay)}, " \
           f"micro-batch {rec['micro_batch']}, {_options_label(rec)}"
    if not r.has_time(i):
        return "\n".join([wrap(head, wide), f"INFEASIBLE: {rec['reason']}; no step time is predicted for it", "",
                          _memory_section(r, i, wide)])
    lines = [
        f"{head}, {plural(round(rec['grad_accum']), 'micro-batch', 'micro-batches')} per step",
        *([f"INFEASIBLE: {rec['reason']}"] if rec["reason"] else []),
        f"predicted {rec['t_step_s']:.4f} s/iter = compute {rec['t_compute_s']:.4f} s + exposed communication "
        f"{rec['t_comm_exposed_s']:.4f} s + compute lost to hidden communication {rec['t_interference_s']:.4f} s "
        f"+ waiting for the slowest of {r.world_size} GPUs {rec['t_straggler_s']:.4f} s + host idle "
        f"{rec['t_host_idle_s']:.4f} s; MFU {rec['mfu']:.1f}%, HFU {rec['pct_peak']:.1f}% "
        f"({rec['tflops_per_gpu']:.1f} TFLOP/s per GPU run)",
        *filter(None, [_reach_note(r, i), _code_note(r), _routing_note(r), _attention_note(r)]),
    ]
    lines = [wrap(line, wide) for line in lines]
    lines += ["", "Compute per step", text_table(["part", "seconds"], [
        ["GEMMs (all linear layers, fwd + recompute + bwd)", f"{rec['t_gemm_s']:.4f}"],
        ["attention and element-wise (redundant over X)", f"{rec['t_nongemm_s']:.4f}"],
        ["optimizer step", f"{rec['t_optimizer_s']:.4f}"],
        ["lost to collectives hidden behind the compute (their SMs and HBM traffic)",
         f"{rec['t_interference_s']:.4f}"],
        [f"waiting for the slowest of {r.world_size} GPUs (device.speed_variation)", f"{rec['t_straggler_s']:.4f}"],
        ["host-bound idle (the host issues ops slower than the device runs them)", f"{rec['t_host_idle_s']:.4f}"],
    ], [False, True])]
    lines += _ledger_section(rec)
    if wide:
        lines += _ledger_ops(r, i)
    lines += ["", "Collectives per step (bytes per call; hidden = overlapped with compute)",
              _collectives_table(r, i, wide)]
    lines += ["", _memory_section(r, i, wide)]
    return "\n".join(lines)


def _code_note(r: Ranking) -> str | None:
    """Where the run's framework runs other code on its path (``RunOptions.code_profile``), which code priced it."""
    code = r.options.code_profile(r.model).name
    if code == r.options.framework:
        return None
    return (f"priced from the code of {code}: --framework {r.options.framework} runs it on the Hugging Face path "
            f"(docs/algorithm.md §5e)")


def _routing_note(r: Ranking) -> str | None:
    """Where the run's MoE module routes another number of experts per token than the model (``RunOptions.code_model``),
    what was priced."""
    code = r.options.code_model(r.model)
    if code.moe is None or r.model.moe is None or code.moe.top_k == r.model.moe.top_k:
        return None
    return (f"priced with top-{code.moe.top_k} routing, as --framework {r.options.framework}'s native MoE module runs "
            f"(the model says top-{r.model.moe.top_k}; MFU counts the experts it runs; docs/algorithm.md §4c)")


def _attention_note(r: Ranking) -> str | None:
    """Where ``--attention`` asks for a kernel the framework's code does not run (its op ledger runs the kernel its
    code names, ``Ledger.attention_kernel``): which kernel priced the attention instead. For the default (flash), only
    where the code runs no fused kernel at all (Megatron-DeepSpeed's traced unfused core)."""
    from axoplan.cost.model import framework_ledger

    option = r.options.attention
    profile = r.options.code_profile(r.model)
    ledger = framework_ledger(profile, r.model, r.machine, r.options)
    if ledger is None or (kernel := ledger.attention_kernel(option)) == option:
        return None
    if option == "flash":
        if kernel != "unfused":
            return None
        return (f"attention: the code of {profile.name} runs unfused attention (its batched GEMMs, softmax and "
                "dropout, each in its op ledger), which prices it whatever --attention says")
    kernels = r.machine.kernels
    picked = kernels.default_attention if kernels is not None else None
    what = kernel or (f"scaled_dot_product_attention's pick on the device ({picked})" if picked
                      else "scaled_dot_product_attention's pick on the device")
    return (f"--attention {option}: the code of {profile.name} does not run it; its attention is priced as the kernel "
            f"that code runs, {what} (docs/algorithm.md, the op ledger)")


def _ledger_section(rec: dict[str, Any]) -> list[str]:
    """The op ledger's device seconds per step by class (``axoplan.cost.ledger``), to hold against a profiler
    trace's split (``axoplan trace``); nothing for a framework without a ledger."""
    classes = {k[len("t_class_"):-len("_s")]: float(v) for k, v in rec.items() if k.startswith("t_class_")}
    classes["optimizer"] = float(rec["t_optimizer_s"])
    if len(classes) <= 2:
        return []
    stall = classes.pop("host_sync", 0.0)  # not a kernel: the device waiting at the host syncs
    total = sum(classes.values())
    rows = [[name, f"{t:.4f}", f"{100.0 * t / total:.1f}"] for name, t in sorted(classes.items(), key=lambda kv: -kv[1])
            if t > 0]
    rows.append(["total (kernels only: no gaps, host or communication)", f"{total:.4f}", "100.0"])
    if stall > 0:
        rows.append(["host syncs (the device drained, waiting for the host)", f"{stall:.4f}", ""])
    return ["", "Op ledger by class, device seconds per step", text_table(["class", "seconds", "%"], rows,
                                                                          [False, True, True])]


def _ledger_ops(r: Ranking, i: int) -> list[str]:
    """``explain --wide``: every op of the ledger as candidate i runs it, per run of its scope (a block's ops run
    once per layer and micro-batch), to hold against a profiler trace op by op; nothing without a ledger."""
    from axoplan.cost.ledger import op_rows
    from axoplan.cost.model import framework_ledger
    ledger = framework_ledger(r.options.code_profile(r.model), r.model, r.machine, r.options)
    if ledger is None:
        return []
    rows = [[o.scope, o.op, o.op_class, str(o.count), f"{o.bytes_per_call / 1e6:.3f}",
             f"{o.flops_per_call / 1e9:.3f}" if o.flops_per_call else "",
             "tile model" if o.seconds is None else f"{o.seconds * 1e6:.1f}"]
            for o in op_rows(ledger, r.machine, r.model, r.options.seq_len, r.candidates, i, r.options.hf_path,
                             r.options.attention)]
    title = (f"Op ledger {ledger.name}-{ledger.family}, op by op (per run of its scope; a block's run once per layer "
             "and micro-batch; GEMMs of the 4D linears priced by the tile model above)")
    return ["", title, text_table(["scope", "op", "class", "calls", "MB/call", "GFLOP/call", "us"], rows,
                                  [False, False, False, True, True, True, True])]


def _memory_section(r: Ranking, i: int, wide: bool = False) -> str:
    from axoplan.search.fit import memory_fit_of

    mem, verdict = r.prediction.memory, r.feasibility.memory
    assert verdict is not None
    head = wrap(f"Memory per GPU: {memory_fit_of(verdict, i, float(mem.total[i])).describe()}", wide)
    total = "peak (gradients or activations with logits, the larger)" if mem.gradients_apart[i] else "total"
    return head + "\n" + text_table(
        ["part", "GB"],
        [[k, f"{getattr(mem, k)[i] / _GB:.2f}"] for k in mem.CATEGORIES] + [[total, f"{mem.total[i] / _GB:.2f}"]],
        [False, True])


def _collectives_table(r: Ranking, i: int, wide: bool = False) -> str:
    """One row per collective of candidate i; `wide` adds the stride and the hidden seconds and spells the
    placement out (by default a measured bandwidth is marked ``*``)."""
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
    right = [False] * 4 + [True, True, False] + [True] * 6
    notes = []
    if any(row[2].endswith("(drain)") for row in rows):
        notes.append("drain: the extra wait, once per micro-batch, for the first all-gather of the forward and the "
                     "last reduce-scatter of the backward, which no compute hides (docs/algorithm.md §5c)")
    if not wide:
        keep = [k for k, h in enumerate(headers) if h not in ("stride", "hidden s")]
        measured = any(row[6].endswith(" (measured)") for row in rows)
        for row in rows:
            row[1] = _SHORT_PHASE.get(row[1], row[1])
            row[2] = row[2].replace(" (drain)", " drain")
            row[6] = row[6].replace(" (measured)", "*").replace(" + ", "+")
        headers[headers.index("MB/call")] = "MB"
        headers, right = [headers[k] for k in keep], [right[k] for k in keep]
        rows = [[row[k] for k in keep] for row in rows]
        if measured:
            notes.append("placement*: bandwidth from the machine's measured table; --wide adds each group's stride "
                         "and the hidden seconds")
        if any(row[1] == _SHORT_PHASE["recompute"] for row in rows):
            notes.append("refwd: the forward that activation recompute runs again in the backward")
    return text_table(headers, rows, right) + "".join("\n" + wrap(n, wide) for n in notes)


_SHORT_PHASE = {"forward": "fwd", "backward": "bwd", "recompute": "refwd"}


def _collective_row(t: CollectiveTerm, i: int, calls: float, link: str) -> list[str]:
    total, exposed = float(t.total_s[i]), float(t.exposed_s[i])
    if t.is_drain:  # its traffic is counted in its collective's row; here only the extra wait
        total = exposed
    bw = float(t.bandwidth_gbs[i])
    return [t.layer, t.phase, t.op, t.axis, str(int(t.group_size[i])), str(int(t.stride[i])), link,
            f"{t.nbytes[i] / 1e6:.2f}", f"{calls:g}", "inf" if not np.isfinite(bw) else f"{bw:.1f}",
            f"{total:.4f}", f"{total - exposed:.4f}", f"{exposed:.4f}"]
