"""Fit a group's collective latency and bus bandwidth to a measured message-size sweep.

``nccl-tests`` (``all_reduce_perf -b 1M -e 1G -f 2``) prints, per message size, the time of
one all-reduce over a group. axoplan prices that all-reduce with the α-β form of
:func:`axoplan.cost.collectives.all_reduce_s`::

    t(bytes) = 2⌈log2 p⌉ · α  +  2(p−1)/p · bytes / β

which is linear in ``α`` and ``1/β``. The fit minimises the sum of squared *relative*
errors ``(t_model − t_measured) / t_measured`` over the sweep, so a 1 MB and a 1 GB message
weigh the same (a factor-2 sweep spaces sizes evenly in log scale): a weighted linear
least-squares problem with a closed-form solution. The result is one
``measured_bandwidth`` row of a machine YAML: ``bandwidth_gbs = β``, ``latency_us = α``.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from axoplan.cost.collectives import all_reduce_s
from axoplan.errors import AxoplanError

__all__ = ["AlphaBeta", "fit_all_reduce", "read_nccl_tests_csv", "read_nccl_tests_log"]

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class AlphaBeta:
    """A fitted (latency, bandwidth) pair and how well it reproduces the sweep."""

    group_size: int
    latency_us: float
    bandwidth_gbs: float
    max_relative_error: float  # the largest |t_model / t_measured − 1| over the sweep


def fit_all_reduce(nbytes: Floats, seconds: Floats, group_size: int) -> AlphaBeta:
    """α (µs per step) and β (bus GB/s) of the all-reduce model closest to a measured sweep."""
    nbytes, seconds = np.asarray(nbytes, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if group_size < 2 or nbytes.size < 2 or nbytes.shape != seconds.shape or np.unique(nbytes).size < 2:
        raise AxoplanError("fitting an all-reduce needs a group of 2 or more and at least two message sizes")
    if not (np.all(np.isfinite(seconds)) and np.all(seconds > 0) and np.all(nbytes > 0)):
        raise AxoplanError("every message size and time of the sweep must be positive")
    p = np.full_like(nbytes, float(group_size))
    per_latency_us = all_reduce_s(nbytes, p, np.full_like(nbytes, np.inf), np.ones_like(nbytes))
    per_inverse_gbs = all_reduce_s(nbytes, p, np.ones_like(nbytes), np.zeros_like(nbytes))
    design = np.column_stack([per_latency_us, per_inverse_gbs]) / seconds[:, None]
    (alpha_us, inverse_gbs), *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    if alpha_us <= 0 or inverse_gbs <= 0:
        raise AxoplanError(f"the sweep of a {group_size}-member group does not fit a positive latency and "
                           f"bandwidth (got α = {alpha_us:.3g} µs, 1/β = {inverse_gbs:.3g}); "
                           "measure sizes from about 1 MB to 1 GB")
    error = design @ np.array([alpha_us, inverse_gbs]) - 1.0
    return AlphaBeta(group_size, float(alpha_us), float(1.0 / inverse_gbs), float(np.abs(error).max()))


def read_nccl_tests_csv(path: Path) -> tuple[Floats, Floats]:
    """(bytes, seconds) from a CSV of nccl-tests rows: size in bytes first, out-of-place time (ns) fourth.

    This is the layout of vTrain's all-reduce tables (``size(B),count,type,time(ns),...``).
    """
    from axoplan.fileio import read_text

    text = read_text(path, "nccl-tests CSV")  # a device or FIFO is refused, not read forever
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))[1:]
        nbytes = np.array([float(r[0]) for r in rows])
        seconds = np.array([float(r[3]) * 1e-9 for r in rows])
    except (OSError, IndexError, ValueError) as err:
        raise AxoplanError(f"cannot read {path} as an nccl-tests CSV (size in bytes, count, type, time in ns, ...): "
                           f"{err}") from err
    return nbytes, seconds


_RANK_LINE = re.compile(r"^#\s+Rank\s+\d+\s")


def read_nccl_tests_log(path: Path) -> tuple[int, Floats, Floats]:
    """(group size, bytes, seconds) from what ``all_reduce_perf`` prints.

    The group size is the number of ``#  Rank N ...`` lines; each result line gives size in
    bytes, count, type, reduction, a root column (nccl-tests 2.13 and later), then the
    out-of-place time in µs. Lines that are not results (``#`` comments, launcher chatter) are
    skipped.
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise AxoplanError(f"cannot read {path}: {err.strerror or err}") from err
    ranks = sum(1 for line in lines if _RANK_LINE.match(line))
    points = [p for p in (_result(line) for line in lines) if p is not None]
    if ranks < 2 or len(points) < 2:
        raise AxoplanError(f"{path} does not look like all_reduce_perf output over 2 or more ranks "
                           f"(found {ranks} '# Rank' lines and {len(points)} result lines)")
    nbytes, seconds = (np.array(v, dtype=np.float64) for v in zip(*points, strict=True))
    return ranks, nbytes, seconds


def _result(line: str) -> tuple[float, float] | None:
    """(bytes, out-of-place seconds) of one result line; None for anything else."""
    tokens = line.split()
    if len(tokens) not in (12, 13) or not tokens[0].isdigit() or not tokens[1].isdigit():
        return None
    time_us = tokens[5] if len(tokens) == 13 else tokens[4]  # 13 tokens: with the root column
    try:
        return float(tokens[0]), float(time_us) * 1e-6
    except ValueError:
        return None
