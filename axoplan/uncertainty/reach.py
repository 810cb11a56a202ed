"""How far a prediction reaches beyond what was measured, and how much that widens its interval (issue 29).

An untuned machine's time model has a relative error ``σ_model`` (10 %, :data:`DEFAULT_MODEL_SIGMA`) where
everything it prices was measured. Each way a prediction reaches beyond that adds a relative one-sigma error in
log space, and the terms add in quadrature (independent sources of error)::

    σ² = σ_model² + Σ σ_reach²

The reaches, each sigma with its source (``docs/decisions.md``, "Issue 29: intervals that widen with reach",
written before any coverage with them was computed):

* **framework counted, not traced** (a profile without a ``ledger``), on a device its steps were never measured
  on (``FrameworkProfile.measured_on``: Megatron-DeepSpeed on the A100 40 GB by vTrain's runs, PyTorch FSDP on
  both A100s by llm-foundry's): :data:`SIGMA_COUNTED` = 0.32, ``ln(1/(1 − 0.275))``: the counted model predicted
  all 16 held-out eager Hugging Face steps on the H100/H200 too fast, 27.5 % on average (issue 29). A counted
  profile reads none of the ledger's inputs, so the three terms below do not apply to it;
* **device's op classes never measured** (a ledger framework on a machine without ``kernels:``, unless the
  framework's steps were measured on the device, ``measured_on``, as for the counted ones):
  :data:`SIGMA_UNMEASURED` = 0.216, the spread (log standard deviation, n − 1) of the six op-class shares of HBM
  bandwidth measured on the H100 around any one number;
* **device's op classes derived from another device** (``kernels.derived``, as the H200's copy/cast, loss and
  optimizer are the H100's): :data:`SIGMA_DERIVED` = 0.105, the RMS of ``ln(H200/H100)`` over the classes
  measured on both;
* **model family no trace covers** (``ledger_family``/``shipped_family`` fall back on a neighbour's trace):
  :data:`SIGMA_FAMILY` = 0.22, the RMS of the per-class misses the traced GPT-2 ledger still shows against the
  GPT-2 profiles (``tests/test_ledger.py`` ``UNMET``);
* **sequence length outside the attention curve** (held flat beyond its ends): ``share · slope · d``, the
  attention class's share of the step times the curve's own change in ``ln`` efficiency per doubling at that
  end times the doublings beyond it.

The reach terms are one error shared by all layouts of a prediction (the issue's misses had one sign
everywhere): they widen each interval but, drawn once per draw for P(best), do not change which layout is fastest
(``axoplan.uncertainty.intervals.intervals``). A calibrated machine (one with a fitted
``uncertainty.model_error``) is not widened: its error was measured on runs of its device and framework, which is
what a reach term stands in for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from axoplan.inputs.framework import FrameworkProfile
    from axoplan.inputs.machine import Machine
    from axoplan.inputs.model import ModelSpec
    from axoplan.inputs.options import RunOptions

__all__ = ["Reach", "reaches", "reach_sigma", "beyond_attention_curve", "calibrated", "SIGMA_COUNTED",
           "SIGMA_UNMEASURED", "SIGMA_DERIVED", "SIGMA_FAMILY"]

Floats = npt.NDArray[np.float64]

SIGMA_COUNTED = 0.32
"""A framework counted by hand, not traced: ln(1/(1 − 0.275)), issue 29's mean miss of the counted model on 16
held-out eager steps (H100/H200) [decision, docs/decisions.md]."""
SIGMA_UNMEASURED = 0.216
"""A device without measured op classes: log standard deviation of the H100's six measured shares of HBM
bandwidth (0.869, 0.552, 0.511, 0.77, 0.783, 0.773; machines/dgx-h100.yaml; 0.21 with the optimizer's
share on the earlier 28-byte convention, 0.676) [decision, docs/decisions.md]."""
SIGMA_DERIVED = 0.105
"""Op classes taken from another device: RMS of ln(H200/H100) over the classes measured on both (element-wise,
norm, activation: -3.9, -14.7, -7.6 %) [decision, docs/decisions.md]."""
SIGMA_FAMILY = 0.22
"""A model family no trace covers: RMS of tests/test_ledger.py's UNMET per-class misses of the GPT-2 ledger
(0.17, 0.28, 0.27, 0.17, 0.23, 0.28, 0.18, 0.17, 0.19) [decision, docs/decisions.md]."""


@dataclass(frozen=True, slots=True)
class Reach:
    """One way a prediction reaches beyond what was measured: what, and its relative sigma per candidate;
    `by_share`: the sigma scales with a class's share of the step, so it needs the candidates' prediction columns."""

    what: str
    sigma: Floats
    by_share: bool = False


def reaches(model: ModelSpec, options: RunOptions, machine: Machine,
            columns: Mapping[str, Floats] | None = None, size: int = 1) -> tuple[Reach, ...]:
    """Every reach of `size` candidates of one model and run options on `machine`. `columns` (the candidates'
    prediction columns, for the attention class's share of the step) are needed only where the sequence length
    lies outside the attention curve; without them that share is taken as 1 (an upper bound)."""
    def flat(what: str, sigma: float) -> Reach:
        return Reach(what, np.full(size, sigma))

    profile = options.code_profile(model)
    ledger = profile.ledger
    if ledger is None:
        if machine.device.name in profile.measured_on:
            return ()  # its steps on this device were measured: the model's own error stands
        return (flat("framework counted, not traced", SIGMA_COUNTED),)
    found = []
    kernels = machine.kernels
    if machine.device.name in profile.measured_on:
        pass  # its steps on this device were measured: the device's op classes were held against whole steps
    elif kernels is None:
        found.append(flat("device's op classes never measured", SIGMA_UNMEASURED))
    elif kernels.derived:
        found.append(flat(f"device's {', '.join(kernels.derived)} taken from another device", SIGMA_DERIVED))
    used = _traced_for(model, ledger)
    family = getattr(model, "family", None)
    if family is None or used != family:
        named = f"model family {family} not" if family else "no model family"
        found.append(flat(f"{named} traced, priced with {used}'s op list", SIGMA_FAMILY))
    beyond = beyond_attention_curve(machine, options.seq_len, _attention_run(profile, machine, used, options))
    if beyond is not None:
        what, per_doubling = beyond
        share = np.ones(size) if columns is None else _attention_share(columns)
        found.append(Reach(what, share * per_doubling, by_share=True))
    return tuple(found)


def _traced_for(model: ModelSpec, ledger: str) -> str:
    """The family whose trace of `ledger` prices `model` (``ledger_family``, then ``shipped_family``: the one rule
    for which trace a model gets). The model's own family is covered only where this is it; otherwise the rule
    fell back on a neighbour's (by the MLP kind, Mixtral's for any mixture, GPT-2's where no other was traced)."""
    from axoplan.cost.ledger import ledger_family, shipped_family

    return shipped_family(ledger, ledger_family(model))


def _attention_run(profile: FrameworkProfile, machine: Machine, family: str, options: RunOptions) -> str | None:
    """The attention kernel the profile's ledger runs for these options (``Ledger.attention_kernel``): the one its
    code names, the run's ``--attention``, or None for SDPA's pick on the device."""
    from axoplan.cost.ledger import load_ledger

    name = profile.ledger_for(machine.device.kind)
    assert name is not None
    return load_ledger(name, family).attention_kernel(options.attention)


def beyond_attention_curve(machine: Machine, seq_len: int, backend: str | None = None) -> tuple[str, float] | None:
    """(what, sigma per unit of attention share) where `seq_len` lies beyond the ends of the attention curve the
    ledger prices with (`backend`'s, :func:`axoplan.cost.ledger.attention_curve`; None: the device's default
    backend), else None."""
    from axoplan.cost.ledger import attention_curve

    found = attention_curve(machine, backend)
    if found is None:
        return None
    name, curve = found
    seq, eff = curve.seq, curve.efficiency
    if len(seq) < 2 or seq[0] <= seq_len <= seq[-1]:
        return None
    low = seq_len < seq[0]
    (s0, e0), (s1, e1) = ((seq[0], eff[0]), (seq[1], eff[1])) if low else ((seq[-2], eff[-2]), (seq[-1], eff[-1]))
    slope = abs(math.log(e1 / e0)) / math.log2(s1 / s0)
    doublings = abs(math.log2(seq_len / (seq[0] if low else seq[-1])))  # beyond the end
    end = seq[0] if low else seq[-1]
    where = f"{'below' if low else 'above'} {name} attention's measured {end:,}"
    return f"sequence {seq_len:,} {where}", slope * doublings


def _attention_share(columns: Mapping[str, Floats]) -> Floats:
    step = np.asarray(columns["t_step_s"], dtype=np.float64)
    attention = np.asarray(columns.get("t_class_attention_s", np.zeros_like(step)), dtype=np.float64)
    return np.clip(np.divide(attention, step, out=np.zeros_like(step), where=step > 0), 0.0, 1.0)


def reach_sigma(machine: Machine, found: Sequence[Reach], size: int) -> Floats:
    """Every reach in quadrature, per candidate; zero on a calibrated machine. The interval's error is this and
    the machine's model error in quadrature (``axoplan.uncertainty.intervals.intervals``)."""
    if calibrated(machine):
        return np.zeros(size)
    return np.sqrt(sum((r.sigma**2 for r in found), np.zeros(size)))


def calibrated(machine: Machine) -> bool:
    """Whether the machine's model error was fitted (a calibrated machine is not widened)."""
    u = machine.uncertainty
    return u is not None and u.model_error is not None
