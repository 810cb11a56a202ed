"""`axoplan trace`: where each step of a torch.profiler trace spent its GPU time, by op class.

    axoplan trace trace.json.gz
    axoplan trace trace.json --format csv

The classes are the ledger's (:mod:`axoplan.records.kernel_classes`); the steps are the trace's
``ProfilerStep#N`` markers, else the optimizer's kernels (:mod:`axoplan.records.trace`). Only typer and
the standard library are imported here; the work is imported when the command runs.
"""

from __future__ import annotations

import csv
import io
import json
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from axoplan.records.trace import TraceStep, TraceSummary

__all__ = ["trace", "TraceFormat"]

_FROM = {"ProfilerStep": "its ProfilerStep markers", "optimizer": "the optimizer's kernels",
         "whole trace": "neither ProfilerStep markers nor optimizer kernels: the whole trace is one step"}


class TraceFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def trace(
    file: Annotated[Path, typer.Argument(help="A torch.profiler chrome trace (.json or .json.gz) of one or more "
                                              "training steps, profiled with CPU and CUDA activities.",
                                         show_default=False)],
    fmt: Annotated[TraceFormat, typer.Option("--format", "-f", help="Output format.")] = TraceFormat.table,
) -> None:
    """Split each step of a profiler trace by op class: seconds, share of the GPU time, kernels.

    Also the step's span, GPU busy time, CPU ops and host syncs; json adds every kernel name with its
    class and, where the trace was recorded with record_shapes=True, each CPU op's input shapes.
    """
    from axoplan.records.trace import read_trace

    summary = read_trace(file)
    if fmt is TraceFormat.json:
        typer.echo(json.dumps(summary.model_dump(mode="json"), indent=1, allow_nan=False))
    elif fmt is TraceFormat.csv:
        typer.echo(_csv(summary), nl=False)
    else:
        typer.echo(_table(summary))


def _share(seconds: float, step: TraceStep) -> float:
    """`seconds` as a percentage of the step's GPU time summed over classes."""
    total = sum(c.seconds for c in step.by_class.values())
    return 100.0 * seconds / total if total > 0 else 0.0


def _csv(summary: TraceSummary) -> str:
    """One row per step and class, every class included."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["step", "class", "seconds", "share_pct", "kernels"])
    for step in summary.steps:
        for cls, t in step.by_class.items():
            writer.writerow([step.label, cls, f"{t.seconds:.6f}", f"{_share(t.seconds, step):.2f}", t.kernels])
    return buf.getvalue()


def _table(summary: TraceSummary) -> str:
    """The head line, then one block per step: the classes with any GPU time, most first, and a total."""
    from axoplan.report import plural, text_table

    head = (f"{Path(summary.path).name}: {summary.device or 'device not named'}, {plural(len(summary.steps), 'step')} "
            f"from {_FROM[summary.steps_from]}")
    if summary.outside_kernels:
        head += f"; {plural(summary.outside_kernels, 'kernel')} outside any step (not counted)"
    blocks = [head]
    for step in summary.steps:
        rows = [[cls, f"{t.seconds:.5f}", f"{_share(t.seconds, step):.1f}", str(t.kernels)]
                for cls, t in sorted(step.by_class.items(), key=lambda kv: -kv[1].seconds) if t.seconds > 0]
        total = sum(t.seconds for t in step.by_class.values())
        rows.append(["total", f"{total:.5f}", "100.0" if total > 0 else "0.0", str(step.kernels)])
        blocks.append(f"\n{_step_line(step)}\n" + text_table(["class", "seconds", "share %", "kernels"], rows,
                                                             [False, True, True, True]))
    blocks.append("\nseconds: summed durations of the class's kernels (memsets and device copies as memset and "
                  "copy_cast, not counted\nas kernels); share: of the step's summed GPU time; busy: time with any "
                  "GPU work running, overlaps once")
    return "\n".join(blocks)


def _step_line(step: TraceStep) -> str:
    """The step's span, busy time, CPU ops and host syncs."""
    s = step.host_syncs
    syncs = ", ".join(f"{n} {what}" for n, what in ((s.stream_syncs, "stream"), (s.device_syncs, "device"),
                                                   (s.event_syncs, "event"), (s.d2h_copies, "device-to-host copy"))
                      if n) or "none"
    busy = 100.0 * step.busy_s / step.span_s if step.span_s > 0 else 0.0
    return (f"{step.label}: span {step.span_s:.4f} s, GPU busy {step.busy_s:.4f} s ({busy:.1f} %), "
            f"{step.kernels} kernels, {step.cpu_ops} CPU ops; host syncs: {syncs}")
