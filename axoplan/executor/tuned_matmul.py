"""A GEMM tuner after AxoNN's (``axonn/intra_layer/tuned_matmul.py``, branch ``add-timers-gordon-bell``).

Per signature ``(phase, m, n, k)`` the first call times every (formulation, variant):
formulation ``ab`` computes ``C = A·B``, ``ba`` computes ``Cᵀ = Bᵀ·Aᵀ`` and copies it back
to row-major (the collectives that follow need contiguous tensors; ``axoplan.cost.orientation``
counts that copy too); variant ``default`` passes the operands as they come, ``nn``, ``nt``
and ``tn`` first lay each operand out row-major (``n``) or as a transposed view of
row-major memory (``t``, ``X.t().contiguous().t()``), so BLAS sees other transpose flags.
Timing as AxoNN's: 5 warm-up runs, then the total of 20 (CUDA events on a GPU,
``time.perf_counter`` on a CPU); the fastest is kept in this instance and reused. On a CPU
the candidates are timed fastest-looking first (one call each decides the order), and a
candidate stops being timed once its partial total exceeds the best complete one (it cannot
win), or once a warm-up call takes twice the best's mean trial: bf16 layouts that run 15×
slower than the best would otherwise make the first iteration minutes long. Every
variant computes the same product, so results agree with ``a @ b`` to rounding.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

import torch

__all__ = ["FORMULATIONS", "VARIANTS", "GemmTuner", "run_variant"]

FORMULATIONS: tuple[str, ...] = ("ab", "ba")
VARIANTS: tuple[str, ...] = ("default", "nn", "nt", "tn")

WARMUP_CUT = 2.0
"""On a CPU a warm-up call this many times slower than the best's mean trial ends the candidate."""

Choice = tuple[str, str]
Signature = tuple[str, int, int, int]


def _laid_out(x: torch.Tensor, layout: str) -> torch.Tensor:
    """`x` with row-major memory (``n``) or as a transposed view of row-major memory (``t``)."""
    return x.contiguous() if layout == "n" else x.t().contiguous().t()


def run_variant(a: torch.Tensor, b: torch.Tensor, formulation: str, variant: str) -> torch.Tensor:
    """``a @ b`` (row-major result) computed by one (formulation, variant)."""
    left, right = (a, b) if formulation == "ab" else (b.t(), a.t())
    if variant != "default":
        left, right = _laid_out(left, variant[0]), _laid_out(right, variant[1])
    out = left @ right
    return out if formulation == "ab" else out.t().contiguous()


class GemmTuner:
    """Times the variants of each new GEMM signature once, then runs the fastest."""

    def __init__(self, warmup: int = 5, trials: int = 20) -> None:
        self.warmup, self.trials = warmup, trials
        self.choices: dict[Signature, Choice] = {}

    def matmul(self, phase: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``a @ b`` by the choice for ``(phase, m, n, k)``, tuning it on the first call."""
        key = (phase, a.shape[0], b.shape[1], a.shape[1])
        choice = self.choices.get(key)
        if choice is None:
            choice = self.choices[key] = self._tune(a, b)
        return run_variant(a, b, *choice)

    def _tune(self, a: torch.Tensor, b: torch.Tensor) -> Choice:
        candidates = [(f, v) for f in FORMULATIONS for v in VARIANTS]
        if a.device.type != "cuda":  # likely-fastest first, so the cut-offs bite early
            once = {c: self._once(functools.partial(run_variant, a, b, *c)) for c in candidates}
            candidates.sort(key=once.__getitem__)
        best, best_s = candidates[0], math.inf
        for choice in candidates:
            seconds = self._seconds(functools.partial(run_variant, a, b, *choice), a.device, best_s)
            if seconds < best_s:
                best, best_s = choice, seconds
        return best

    @staticmethod
    def _once(fn: Callable[[], torch.Tensor]) -> float:
        with torch.no_grad():
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0

    def _seconds(self, fn: Callable[[], torch.Tensor], device: torch.device, limit_s: float = math.inf) -> float:
        """Total seconds of the trials after the warm-up; ``inf`` as soon as it passes `limit_s` (CPU)."""
        cpu = device.type != "cuda"
        with torch.no_grad():
            for _ in range(self.warmup):
                t0 = time.perf_counter()
                fn()
                if cpu and time.perf_counter() - t0 > WARMUP_CUT * limit_s / self.trials:
                    return math.inf
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(self.trials):
                    fn()
                end.record()
                end.synchronize()
                return start.elapsed_time(end) / 1e3
            t0 = time.perf_counter()
            for _ in range(self.trials):
                fn()
                if time.perf_counter() - t0 > limit_s:
                    return math.inf
            return time.perf_counter() - t0
