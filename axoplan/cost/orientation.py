"""GEMM orientation per training phase, and AxoNN's GEMM tuner as the cost model sees it.

A linear ``y = x·Wᵀ`` (x ``[m×k]``, W ``[n×k]``, both row-major) runs three GEMMs; torch
hands BLAS the operands as views, so each phase has its own layouts (``n``: row-major as
stored, ``t``: a transposed view; first letter the left operand):

=========  ============  ===========  ===========
phase      torch call    shape        orientation
=========  ============  ===========  ===========
forward    ``x @ W.T``   (m, n, k)    nt
dX         ``dY @ W``    (m, k, n)    nn
dW         ``dY.T @ x``  (n, k, m)    tn
=========  ============  ===========  ===========

AxoNN's tuner (``axonn/intra_layer/tuned_matmul.py``, branch ``add-timers-gordon-bell``)
times, per phase and shape, the variants ``default`` (the call as is), ``nn``, ``nt``, ``tn``
(an operand materialised in the other memory order, ``X.t().contiguous().t()``) in two
formulations, ``C = A·B`` and ``Cᵀ = Bᵀ·Aᵀ`` (shape ``(n, m, k)``), and keeps the fastest.
It tunes the forward and the dX GEMMs, not dW. Here a variant costs its GEMM in the
orientation it runs plus the copy of each operand it re-lays (read and write,
memory-bound), and the swapped formulation the copy of ``Cᵀ`` back to row-major
(``axoplan.executor.tuned_matmul`` makes it: the collectives that follow need contiguous
tensors). ``default`` is among the candidates, so a tuned GEMM is never slower than the
untuned one.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

from axoplan.cost.compute import BYTES_BF16, gemm_s, memory_bound_s
from axoplan.inputs.machine import Machine, Orientation

__all__ = ["Phase", "PHASE_ORIENTATION", "TUNED_PHASES", "VARIANTS", "phase_gemm_s", "tuned_gemm_s"]

Floats = npt.NDArray[np.float64]
Phase = Literal["forward", "dx", "dw"]

PHASE_ORIENTATION: dict[Phase, Orientation] = {"forward": "nt", "dx": "nn", "dw": "tn"}
"""How torch lays out the operands of each phase's GEMM (table above)."""

TUNED_PHASES: frozenset[Phase] = frozenset({"forward", "dx"})
"""The phases AxoNN's tuner tunes (its dW tuning is commented out)."""

VARIANTS: tuple[str, ...] = ("default", "nn", "nt", "tn")
"""AxoNN's variants: the call as is, or the operands re-laid to these orientations."""


def _flip(layout: str) -> str:
    return "t" if layout == "n" else "n"


def _swapped(orientation: Orientation) -> Orientation:
    """Layouts of ``Bᵀ·Aᵀ`` when ``A·B`` has `orientation`: the transpose of a view flips it."""
    a, b = orientation
    return _flip(b) + _flip(a)  # type: ignore[return-value]


def _variant_s(machine: Machine, m: Floats, n: Floats, k: Floats, natural: Orientation, variant: str) -> Floats:
    """Seconds for ``[m×k]·[k×n]`` whose operands come as `natural`, run as `variant` (copies included)."""
    run: Orientation = natural if variant == "default" else variant  # type: ignore[assignment]
    t = gemm_s(machine, m, n, k, run)
    if run[0] != natural[0]:
        t = t + memory_bound_s(machine, 2.0 * BYTES_BF16 * m * k)
    if run[1] != natural[1]:
        t = t + memory_bound_s(machine, 2.0 * BYTES_BF16 * k * n)
    return t


def tuned_gemm_s(machine: Machine, m: Floats, n: Floats, k: Floats, natural: Orientation) -> Floats:
    """Seconds of the fastest (formulation, variant) of AxoNN's tuner for this GEMM."""
    best = _variant_s(machine, m, n, k, natural, "default")
    for variant in VARIANTS[1:]:
        best = np.minimum(best, _variant_s(machine, m, n, k, natural, variant))
    swapped, copy_back = _swapped(natural), memory_bound_s(machine, 2.0 * BYTES_BF16 * m * n)
    for variant in VARIANTS:
        best = np.minimum(best, _variant_s(machine, n, m, k, swapped, variant) + copy_back)
    return best


def phase_gemm_s(machine: Machine, m: Floats, n: Floats, k: Floats, phase: Phase, tuned: bool = False) -> Floats:
    """Seconds of one phase's GEMM ``[m×k]·[k×n]``: as torch calls it, or tuned where AxoNN tunes."""
    natural = PHASE_ORIENTATION[phase]
    if tuned and phase in TUNED_PHASES:
        return tuned_gemm_s(machine, m, n, k, natural)
    return gemm_s(machine, m, n, k, natural)
