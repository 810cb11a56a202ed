"""Whether a layout fits in device memory, as a probability, and the rank order that respects it.

**The probability.** The cost model gives each candidate a memory need (the reserve included) and
its central interval at a level (:func:`axoplan.cost.memory.memory_verdict`: *fits* when the
interval's high end is within the HBM, *does not fit* when even its low end exceeds it, *tight*
between). Read as a normal distribution of the need's logarithm whose central `level` interval is
that interval (the spread above the need from the high end, below it from the low end), the
probability that the need is within the HBM is::

    P(fit) = Φ(z · ln(HBM / need) / ln(high / need))   where need <= HBM
    P(fit) = Φ(z · ln(HBM / need) / ln(need / low))    where need >  HBM

with ``z = Φ⁻¹(1/2 + level/2)``. It agrees with the verdict by construction: *fits* is
``P(fit) >= Φ(z)`` (0.9 at the 80 % level), *does not fit* is ``P(fit) < Φ(-z)`` (0.1), and a point
estimate above the HBM is ``P(fit) < 1/2``. The need and its interval are read from the verdict, so
whatever the cost model takes the need and its spread to be, this follows.

**The order** (:func:`fit_order`). A layout whose fit is *in doubt* (``P(fit) < 1 - risk``) is
never ranked above one that fits within the margin of its time, and one that more likely does not fit
than fits (its point estimate above the HBM, ``P(fit) < 1/2``) is never ranked above one in doubt
within the margin either: each layout is ordered as if it took ``(1 + margin)^doubt`` times its
predicted time, ``doubt`` 0 where it fits, 1 where its fit is in doubt, 2 where its point estimate is
above the HBM. So a layout comes first despite a doubt only when every layout with less doubt is more
than the margin slower, and with ``margin = 0`` the order is the order by time. Defaults
(:class:`FitPolicy`): a 5 % margin and a 10 % risk (docs/decisions.md, issue 30).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt
from pydantic import Field

from axoplan.cost.memory import VERDICTS, MemoryVerdict, memory_verdict
from axoplan.inputs.machine import Machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.inputs.schema import Frozen

__all__ = ["FitPolicy", "TIGHT_LEVEL", "fit_probability", "fit_order", "doubtful", "doubt_level", "MemoryFit",
           "memory_fit", "memory_fit_of", "first_pick_note"]

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

TIGHT_LEVEL: float = inspect.signature(memory_verdict).parameters["level"].default
"""The level of the memory interval whose straddling of the HBM makes a layout *tight*: the cost
model's own default (read from :func:`memory_verdict`, so a change there follows here)."""


class FitPolicy(Frozen):
    """How far a layout whose fit is in doubt yields to one that fits (``--fit-margin``, ``--fit-risk``)."""

    margin: float = Field(0.05, ge=0.0, le=1.0, description="Fraction of step time a layout that fits may be "
                          "slower and still rank above one whose fit is in doubt (0.05: 5 %).")
    risk: float = Field(0.10, gt=0.0, lt=1.0, description="Largest probability of running out of memory "
                        "a layout may have and count as fitting (0.1: it fits with probability 0.9 or more).")

    @property
    def min_p_fit(self) -> float:
        """The probability of fitting at or above which a layout counts as fitting."""
        return 1.0 - self.risk


def fit_probability(verdict: MemoryVerdict, level: float = TIGHT_LEVEL) -> Floats:
    """Per candidate, the probability that its memory need is within the HBM (module docstring);
    `level` is the level `verdict`'s interval was made at."""
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    need = np.asarray(verdict.need_bytes, dtype=np.float64)
    x = np.log(verdict.hbm_bytes / need)
    spread = np.where(x >= 0.0, np.log(verdict.high_bytes / need), np.log(need / verdict.low_bytes)) / z
    with np.errstate(divide="ignore", invalid="ignore"):
        p = _normal_cdf(x / spread)
    return np.where(spread > 0.0, p, np.where(x >= 0.0, 1.0, 0.0)).astype(np.float64)


_ERFC = np.frompyfunc(math.erfc, 1, 1)
_TAIL = 8.3
"""Beyond ±8.3 standard deviations Φ is 1 to double precision (and under 6e-17 below): taken as 1 and 0."""


def _normal_cdf(u: Floats) -> Floats:
    """Φ(u) = erfc(-u/√2)/2, element-wise (math.erfc where it is not 0 or 1; scipy.special would add about half a
    second to every command's start)."""
    u = np.asarray(u, dtype=np.float64)
    out = np.where(u > 0.0, 1.0, 0.0)
    inside = np.abs(u) < _TAIL
    out[inside] = 0.5 * np.asarray(_ERFC(-u[inside] / math.sqrt(2.0)), dtype=np.float64)
    return np.where(np.isnan(u), np.nan, out)


def doubtful(p_fit: Floats, policy: FitPolicy) -> Bools:
    """Where a layout's fit is in doubt: it runs out of memory with more than the policy's risk."""
    return np.asarray(p_fit < policy.min_p_fit)


def doubt_level(p_fit: Floats, policy: FitPolicy) -> npt.NDArray[np.int64]:
    """0 where a layout fits, 1 where its fit is in doubt, 2 where it more likely does not fit than fits."""
    likely_not = p_fit < min(0.5, policy.min_p_fit)
    return doubtful(p_fit, policy).astype(np.int64) + likely_not.astype(np.int64)


def fit_order(t_step_s: Floats, p_fit: Floats, feasible: Bools, policy: FitPolicy) -> npt.NDArray[np.int64]:
    """Candidate indices, feasible first, each part by time with a feasible layout's time counted
    ``(1 + margin)^doubt`` times (:func:`doubt_level`; ties: the one with less doubt first)."""
    doubt = np.where(feasible, doubt_level(p_fit, policy), 0)
    key = t_step_s * (1.0 + policy.margin) ** doubt
    return np.lexsort((doubt, key, ~feasible)).astype(np.int64)


@dataclass(frozen=True, slots=True)
class MemoryFit:
    """One layout's memory against its device: need, capacity, the verdict and the probability of fitting."""

    need_bytes: float  # live tensors and the reserve
    live_bytes: float
    low_bytes: float
    high_bytes: float
    hbm_bytes: float
    usable_bytes: float  # the HBM less the reserve: what live tensors may use
    verdict: str  # one of VERDICTS
    p_fit: float
    level: float

    def describe(self) -> str:
        """One line: need, usable memory, interval, verdict and P(fit)."""
        gb, reserve = 1e9, self.hbm_bytes - self.usable_bytes
        return (f"needs {self.live_bytes / gb:.1f} GB of tensors, of {self.usable_bytes / gb:.1f} GB usable "
                f"({self.hbm_bytes / gb:.0f} GB HBM less a {reserve / gb:.1f} GB reserve); "
                f"with the reserve {self.need_bytes / gb:.1f} GB, {self.level:.0%} interval "
                f"{self.low_bytes / gb:.1f}-{self.high_bytes / gb:.1f} GB: {self.verdict} (P(fit) {self.p_fit:.2f})")


def memory_fit(live_bytes: float, machine: Machine, model: ModelSpec, options: RunOptions) -> MemoryFit:
    """The memory verdict of one layout of `model` needing `live_bytes` of tensors per GPU, run with `options`
    (its code's profile: ``RunOptions.code_profile``)."""
    v = memory_verdict(np.array([live_bytes], dtype=np.float64), machine, options.code_profile(model),
                       level=TIGHT_LEVEL)
    return memory_fit_of(v, 0, live_bytes)


def memory_fit_of(verdict: MemoryVerdict, i: int, live_bytes: float) -> MemoryFit:
    """Candidate i of a verdict made at :data:`TIGHT_LEVEL` (`live_bytes`: its tensors, without the reserve)."""
    p = fit_probability(verdict, TIGHT_LEVEL)[[i]]
    return MemoryFit(float(verdict.need_bytes[i]), live_bytes, float(verdict.low_bytes[i]),
                     float(verdict.high_bytes[i]), verdict.hbm_bytes, verdict.usable_bytes,
                     VERDICTS[int(verdict.verdict[i])], float(p[0]), TIGHT_LEVEL)


def first_pick_note(order: npt.NDArray[np.int64], num_feasible: int, t_step_s: Floats, p_fit: Floats,
                    policy: FitPolicy, layout_of: Callable[[int], str]) -> str | None:
    """Why the first pick (``order[0]``) is one whose fit is in doubt, or None when it fits (or nothing is
    feasible): no layout fits within the margin of its time; the fastest that fits and how much slower it is."""
    if num_feasible == 0:
        return None
    first = int(order[0])
    if not doubtful(p_fit[[first]], policy)[0]:
        return None
    feasible = order[:num_feasible]
    fitting = feasible[~doubtful(p_fit[feasible], policy)]
    head = (f"rank 1 fits in memory only with probability {p_fit[first]:.2f} (under {policy.min_p_fit:.2f}, "
            f"--fit-risk {policy.risk:g})")
    if fitting.size == 0:
        return f"{head}: no feasible layout fits with probability {policy.min_p_fit:.2f} or more"
    best = int(fitting[np.argmin(t_step_s[fitting])])
    slower = t_step_s[best] / t_step_s[first] - 1.0
    return (f"{head}: the fastest layout that fits, {layout_of(best)}, is {slower:.1%} slower, more than the "
            f"{policy.margin * 100:g} % margin (--fit-margin {policy.margin:g})")
