"""Per-phase timers: seconds spent in GEMMs, in each collective kind, and waiting.

On CPU a span is wall-clock time (``time.perf_counter``); every op there is synchronous
except the overlapped collectives, whose launch and wait are timed separately. On CUDA
a span is a pair of CUDA events on the current stream, read after the iteration's
synchronize, so timing adds no host synchronisation inside the step.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["PhaseTimer", "PHASES"]

PHASES = (
    "gemm", "attention", "optimizer",
    "all_gather_z", "reduce_scatter_z", "all_reduce_x", "all_reduce_y", "all_reduce_data", "all_reduce_world",
    "stats_all_reduce_x", "stats_all_reduce_y", "wait",
    "all_to_all_x", "all_to_all_y", "all_gather_x", "all_gather_y",  # the hf path's transitions (hfmodel.py)
)


class PhaseTimer:
    """Accumulates seconds by phase name; ``enabled=False`` makes every span free.

    With ``trace`` set to a list, every span also appends ``(phase, detail)`` (the op
    sequence, for ``benchmarks/executor_overhead.py``).
    """

    def __init__(self, device: torch.device, enabled: bool = True) -> None:
        self.enabled = enabled
        self.trace: list[tuple[str, tuple[Any, ...]]] | None = None
        self._cuda = device.type == "cuda"
        self._totals: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, Any, Any]] = []

    @contextmanager
    def span(self, phase: str, detail: tuple[Any, ...] = ()) -> Iterator[None]:
        """Time the enclosed code under `phase`; `detail` (shapes, sizes) goes to the trace."""
        if self.trace is not None:
            self.trace.append((phase, detail))
        if not self.enabled:
            yield
            return
        if self._cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((phase, start, end))
            return
        t0 = time.perf_counter()
        yield
        self._totals[phase] += time.perf_counter() - t0

    def collect(self) -> dict[str, float]:
        """Seconds by phase since the last `reset` (synchronizes CUDA first)."""
        if self._events:
            torch.cuda.synchronize()
            for phase, start, end in self._events:
                self._totals[phase] += start.elapsed_time(end) / 1e3
            self._events.clear()
        return dict(self._totals)

    def reset(self) -> None:
        self._totals.clear()
        self._events.clear()
