"""Calibrate a machine's op-class constants from a ``torch.profiler`` trace of one training step (issue 31).

    summary = read_trace(Path("trace.json.gz"))
    step = TracedStep.of(model, options)           # the step's model, micro-batch, recompute, framework
    fit = fit_trace(summary, step, load_machine("dgx-h100"))
    print(format_trace_fit(fit))

The trace says how long each op class's kernels ran in the step (:mod:`axoplan.records.trace`; the median
over the trace's steps); the op ledger (:mod:`axoplan.cost.ledger`) says how long the machine's constants make
them. Each class has one constant that sets its time, so the constants are fitted class by class:

* a memory-bound class (``kernels.<class>``: element-wise, activation, norm, copy/cast, reduction, loss, memset,
  the optimizer) by its share of HBM bandwidth, ``t ∝ 1/share``;
* attention by one factor on its backend's measured curve (``kernels.attention.<backend>``, shown as the
  curve's efficiency at the traced sequence length), or ``attention_efficiency`` on a machine without curves;
* GEMMs by ``gemm.max_efficiency`` (the tile model's time is ``∝ 1/max_efficiency``).

The fit is maximum a posteriori in log space, as ``axoplan calibrate`` fits runs
(:func:`axoplan.validate.calibrate._fit`): one residual per class, ``log(ledger/trace)`` over the trace's own
spread (:data:`TRACE_SIGMA`, or the class's spread over the trace's steps where that is larger), and one per
constant, ``(log θ − log θ₀)/σ₀``, θ₀ the machine's sourced value and σ₀ its prior spread from
:func:`axoplan.uncertainty.intervals.prior_spread` (its sourced range where the YAML gives one, else how it is
sourced: a class measured on the device ``measured``, one taken from another device, ``kernels.derived``,
``vendor``). So a class the trace shows far from its micro-benchmark moves most of the way, and a constant
keeps its prior where the trace says nothing about it (a class the ledger does not price, or the trace lacks).

The host's cost per op (``host.op_us``) is fitted only where the device waited for the host: the trace's idle
time (span − busy) beyond its kernel gaps (``device.kernel_gap_us`` per kernel) over :data:`HOST_WAIT_SHARE` of
the span. Otherwise the trace bounds it from above only (the host kept ahead), and the report says so.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from axoplan.errors import AxoplanError
from axoplan.inputs.machine import KernelModel, Machine
from axoplan.inputs.machine_params import parameter_value
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.inputs.parameters import fit_bounds
from axoplan.records.kernel_classes import KernelClass
from axoplan.records.trace import TraceSummary
from axoplan.validate.calibrate import FittedParameter
from axoplan.validate.yamledit import format_value

__all__ = ["TRACE_SIGMA", "HOST_WAIT_SHARE", "LEDGER_CLASSES", "TracedStep", "HostFinding", "TraceFit",
           "trace_classes", "ledger_classes", "check_shapes", "check_device", "fit_trace", "carry_over", "format_split",
           "format_trace_fit", "trace_machine_yaml", "trace_header",
           "explain_trace"]

MEMORY_CLASSES: tuple[KernelClass, ...] = ("elementwise", "activation", "norm", "copy_cast", "reduction", "loss",
                                           "memset", "optimizer")
LEDGER_CLASSES: tuple[KernelClass, ...] = ("gemm", "attention", *MEMORY_CLASSES)
"""The classes a ledger prices (its optimizer step included), in the trace's KERNEL_CLASSES order."""

TRACE_SIGMA = 0.02
"""Relative one-sigma spread of a class's seconds in one traced step: the shared GPT-2 trace's classes against the
mean of three other steps of the same run differ by up to 1.5 % (the GEMMs; tests/test_trace.py) [meas]."""
HOST_WAIT_SHARE = 0.02
"""Device idle beyond its kernel gaps, as a share of the span, from which the host is taken to have held the
device back (below it, the idle is the launch jitter of a device that is ahead) [decision, docs/decisions.md]."""

_LOW = 1e-3  # lowest efficiency or attention factor the fit may reach
_NEGLIGIBLE = 1e-4  # a class the ledger prices below this share of the step's kernels prices nothing to fit
_OP_US = (fit_bounds("host.op_us").low, fit_bounds("host.op_us").high)  # as calibrate fits it (the registry's)


@dataclass(frozen=True, slots=True)
class TracedStep:
    """The step a trace holds: one GPU's training step of `model` under `options` (its one micro-batch size and
    recompute setting; ``global_batch`` is the sequences this GPU ran in the step)."""

    model: ModelSpec
    options: RunOptions
    micro_batch: int
    recompute: bool

    @classmethod
    def of(cls, model: ModelSpec, options: RunOptions) -> TracedStep:
        """The traced step, or an AxoplanError naming the option that does not pin one step down."""
        if len(options.micro_batches) != 1:
            raise AxoplanError(f"--micro-batch {','.join(map(str, options.micro_batches))}: give the traced step's "
                               f"one micro-batch size, e.g. --micro-batch 4")
        if options.recompute not in ("on", "off"):
            raise AxoplanError(f"--recompute {options.recompute}: give whether the traced step recomputed its "
                               f"activations, --recompute on or --recompute off")
        if options.code_profile(model).ledger is None:
            raise AxoplanError(f"--framework {options.framework} prices no op ledger, so its op classes cannot be "
                               f"set beside a trace; give the traced framework's ledger profile, e.g. "
                               f"--framework hf-transformers")
        return cls(model, options, options.micro_batches[0], options.recompute == "on")


@dataclass(frozen=True, slots=True)
class LedgerStep:
    """The ledger's seconds per class and the step as the machine prices the traced step."""

    classes: dict[str, float]
    step_s: float
    host_idle_s: float


def ledger_classes(step: TracedStep, machine: Machine) -> LedgerStep:
    """The traced step priced on `machine` (one GPU, layout 1x1x1x1)."""
    from axoplan.cost.model import predict
    from axoplan.space.candidates import Candidates
    from axoplan.space.layout import Layout

    c = Candidates.single(Layout(gx=1, gy=1, gz=1, gdata=1), step.micro_batch, step.recompute, False)
    cols = predict(step.model, machine, step.options, c).columns
    return LedgerStep(_class_seconds(cols, 0), float(cols["t_step_s"][0]), float(cols["t_host_idle_s"][0]))


def _class_seconds(cols: dict[str, Any], index: int) -> dict[str, float]:
    """Seconds per ledger class of candidate `index` of a prediction's columns (the optimizer's own column)."""
    out: dict[str, float] = {c: float(cols[f"t_class_{c}_s"][index]) if f"t_class_{c}_s" in cols else 0.0
                             for c in LEDGER_CLASSES}
    out["optimizer"] = float(cols["t_optimizer_s"][index])
    return out


@dataclass(frozen=True, slots=True)
class TraceClasses:
    """The trace's seconds per class (median over its steps), each class's relative spread, and the steps' span,
    busy time and kernels (medians)."""

    seconds: dict[str, float]
    sigma: dict[str, float]
    steps: int
    span_s: float
    busy_s: float
    kernels: float


def trace_classes(summary: TraceSummary) -> TraceClasses:
    """Each class's seconds per step, the median over the trace's steps."""
    steps = summary.steps
    classes: tuple[KernelClass, ...] = (*LEDGER_CLASSES, "collective", "other")
    seconds: dict[str, float] = {c: statistics.median(s.by_class[c].seconds for s in steps) for c in classes}
    sigma: dict[str, float] = {c: _spread([s.by_class[c].seconds for s in steps]) for c in classes}
    return TraceClasses(seconds, sigma, len(steps), statistics.median(s.span_s for s in steps),
                        statistics.median(s.busy_s for s in steps), statistics.median(s.kernels for s in steps))


def _spread(values: list[float]) -> float:
    """The relative one-sigma spread of one class over the steps, at least :data:`TRACE_SIGMA`."""
    logs = [math.log(v) for v in values if v > 0]
    return max(TRACE_SIGMA, statistics.stdev(logs)) if len(logs) >= 3 else TRACE_SIGMA


# ---- the trace's shapes against the given model -------------------------------------------------------------

_GEMM_OPS = frozenset({"aten::mm", "aten::addmm"})
_ATTENTION_OP = re.compile(r"^aten::(?:scaled_dot_product|_scaled_dot_product_\w+_attention$|_flash_attention_"
                          r"forward$|_efficient_attention_forward$)")


def check_shapes(summary: TraceSummary, step: TracedStep) -> None:
    """Refuse, naming the mismatch, a trace recorded with shapes (``record_shapes=True``) whose attention or GEMM
    shapes are not those of `step`'s model, micro-batch and sequence length; a trace without shapes passes."""
    model, seq = step.model, step.options.seq_len
    found: list[str] = []
    for op in summary.op_shapes:
        dims = [d for d in op.input_dims if isinstance(d, list)]
        if _ATTENTION_OP.match(op.name) and dims and len(dims[0]) == 4:
            b, nh, s, d = dims[0]
            given = (step.micro_batch, model.num_heads, seq, model.head_dim)
            for what, got, want in zip(("micro-batch", "query heads", "sequence length", "head dim"), (b, nh, s, d),
                                       given, strict=True):
                if got != want:
                    found.append(f"{what}: the trace's attention has {got}, the given step {want}")
        elif op.name == "aten::embedding" and dims and len(dims[0]) == 2 and dims[0][1] != model.hidden:
            found.append(f"hidden size: the trace's embedding is {dims[0][1]} wide, the given model {model.hidden}")
        elif op.name in _GEMM_OPS and len(dims) >= 2 and len(dims[-2 if op.name == "aten::addmm" else 0]) == 2:
            inner = int(dims[-2 if op.name == "aten::addmm" else 0][1])
            if inner not in _inner_dims(step):
                found.append(f"a GEMM of the trace sums over {inner}, a dimension of neither the model (hidden "
                             f"{model.hidden}, FFN {model.ffn}, vocabulary {model.vocab}) nor the micro-batch's "
                             f"{step.micro_batch * seq} tokens")
    if found:
        order = ("hidden size", "micro-batch", "sequence length", "query heads", "head dim", "a GEMM")
        distinct = sorted(set(found), key=lambda f: next(i for i, p in enumerate(order) if f.startswith(p)))
        first, more = distinct[0], len(distinct) - 1
        raise AxoplanError(f"trace {summary.path} is not of the given step: {first}"
                           + (f" (and {more} more)" if more else "")
                           + "; give the traced step's --model/--hidden/--micro-batch/--seq-len")


def _inner_dims(step: TracedStep) -> set[int]:
    """What a GEMM of the step may sum over: a layer's input width (forward), its output width (the input
    gradient), the tokens of the micro-batch (a weight gradient)."""
    m = step.model
    kv = m.kv_heads * m.head_dim
    widths = {m.hidden, m.ffn, 2 * m.ffn, m.attention_width, kv, m.attention_width + 2 * kv, m.vocab}
    if m.moe is not None:
        widths |= {m.moe.expert_ffn_hidden, 2 * m.moe.expert_ffn_hidden, m.moe.num_experts}
    return widths | {step.micro_batch * step.options.seq_len}


# ---- the fit ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Knob:
    """One constant the fit moves: its path, the class whose seconds it sets, its value, upper bound and prior."""

    path: str
    op_class: str
    value: float
    high: float
    prior_sigma: float


@dataclass(frozen=True, slots=True)
class HostFinding:
    """What the trace says about ``host.op_us``: fitted (`after` set) or bounded from above only."""

    idle_s: float
    gaps_s: float
    span_s: float
    before: float
    after: float | None
    at_most: float | None
    note: str


@dataclass(frozen=True, slots=True)
class TraceFit:
    """The machine fitted to a trace, each constant moved, and the split before and after."""

    original: Machine
    calibrated: Machine
    step: TracedStep
    trace: TraceClasses
    fitted: tuple[FittedParameter, ...]
    not_fitted: tuple[tuple[str, str], ...]  # (class, why)
    before: LedgerStep
    after: LedgerStep
    attention_factor: float  # the attention curve's scale (1.0 where attention was not fitted)
    attention_backend: str | None
    host: HostFinding
    prior: bool = True


def _with_kernels(machine: Machine) -> Machine:
    """`machine` with a ``kernels`` section: its own, or every memory-bound class at ``memory_efficiency`` (how the
    ledger prices a machine without one), so each class can be fitted on its own."""
    if machine.kernels is not None:
        return machine
    me = machine.memory_efficiency
    return machine.model_copy(update={"kernels": KernelModel.model_validate(dict.fromkeys(MEMORY_CLASSES, me))})


def _backend(machine: Machine) -> str | None:
    """The attention backend the ledger prices with on `machine` (its measured curve), None for the flat figure."""
    k = machine.kernels
    return k.default_attention if k is not None and k.default_attention in k.attention else None


def _attention_at(machine: Machine, seq_len: int) -> float:
    from axoplan.cost.ledger import attention_efficiency

    return attention_efficiency(machine, None, seq_len)


def _apply(machine: Machine, values: dict[str, float], seq_len: int) -> Machine:
    """`machine` with each knob's value: a dotted scalar, or an attention curve scaled to reach the value at
    `seq_len` (every point by the same factor)."""
    data = machine.model_dump()
    for path, value in values.items():
        if path.startswith("kernels.attention."):
            curve = data["kernels"]["attention"][path.rsplit(".", 1)[1]]
            factor = value / _attention_at(machine, seq_len)
            curve["efficiency"] = [min(float(format_value(e * factor)), 1.0) for e in curve["efficiency"]]
            continue
        *parents, leaf = path.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[leaf] = float(value)
    return Machine.model_validate(data)


def _knobs(machine: Machine, step: TracedStep, fitted_classes: list[str], measured: bool) -> list[_Knob]:
    """The constant of each fitted class with its bound and prior spread (the machinery of issue 10's priors):
    a class `measured` on the device (the machine's own ``kernels`` section) by micro-benchmark, one taken from
    another device (``kernels.derived``) as a vendor figure, and on a machine without the section each class as
    ``memory_efficiency`` is sourced."""
    from axoplan.uncertainty.intervals import DEFAULT_SOURCES, prior_spread

    assert machine.kernels is not None
    backend = _backend(machine)
    paths: dict[str, str] = {}
    for c in fitted_classes:
        if c == "gemm":
            paths[c] = "gemm.max_efficiency"
        elif c == "attention":
            paths[c] = f"kernels.attention.{backend}" if backend else "attention_efficiency"
        else:
            paths[c] = f"kernels.{c}"
    u = machine.uncertainty
    own = dict(u.sources) if u is not None else {}
    unmeasured = own.get("memory_efficiency", DEFAULT_SOURCES["memory_efficiency"])
    sources: dict[str, str] = {p: ("vendor" if p.split(".")[-1] in machine.kernels.derived else "measured")
                               if measured else unmeasured for p in paths.values() if p.startswith("kernels.")}
    spread = prior_spread(sources | own, ranges=dict(u.ranges) if u is not None else None)
    sigma = dict(zip(spread.paths, spread.rel_sigma, strict=True))
    knobs = []
    for c, p in paths.items():
        if p.startswith("kernels.attention."):
            curve = machine.kernels.attention[backend or ""]
            value = _attention_at(machine, step.options.seq_len)
            high = value / max(curve.efficiency)
        else:
            value, high = parameter_value(machine, p), 1.0
        knobs.append(_Knob(p, c, value, high, float(sigma[p])))
    return knobs


_GPU_MODEL = re.compile(r"\b(?:GH|GB|MI|[ABHLTV])\d{2,3}[A-Z]?\b")


def check_device(summary: TraceSummary, machine: Machine) -> None:
    """Refuse a trace profiled on another GPU model than `machine`'s (an H100 trace for an A100 machine); a trace
    or machine whose GPU model is not named passes."""
    traced = _GPU_MODEL.findall(summary.device or "")
    own = _GPU_MODEL.findall(machine.device.name)
    if traced and own and traced[0] != own[0]:
        raise AxoplanError(f"trace {summary.path} was profiled on {summary.device}, machine {machine.name} is "
                           f"{machine.device.name}: give the machine the trace was taken on (--machine)")


def fit_trace(summary: TraceSummary, step: TracedStep, machine: Machine, prior: bool = True) -> TraceFit:
    """Fit `machine`'s class constants to the trace (module docstring); the host's cost per op where it binds.
    Without `prior`, least squares: each class's seconds matched as closely as the bounds allow."""
    check_device(summary, machine)
    check_shapes(summary, step)
    measured = trace_classes(summary)
    base = _with_kernels(machine)
    before = ledger_classes(step, base)
    _check_scale(measured, before, step)
    fitted_classes, not_fitted = _fittable(measured, before)
    knobs, deaf = _sensitive(_knobs(base, step, fitted_classes, machine.kernels is not None), base, step, before)
    not_fitted += deaf
    if not knobs:
        raise AxoplanError(f"the trace {summary.path} and the ledger of --framework {step.options.framework} time no "
                           f"op class in common on {machine.name}; nothing to fit")
    seq = step.options.seq_len
    z0 = np.log([k.value for k in knobs])
    low = np.full(len(knobs), math.log(_LOW))
    high = np.log([k.high for k in knobs])
    data_sigma = np.array([measured.sigma[k.op_class] for k in knobs])
    target = np.log([measured.seconds[k.op_class] for k in knobs])
    prior_sigma = np.array([k.prior_sigma for k in knobs])

    def values(z: np.ndarray) -> dict[str, float]:
        return {k.path: float(v) for k, v in zip(knobs, np.exp(np.clip(z, low, high)), strict=True)}

    def residuals(z: np.ndarray) -> np.ndarray:
        split = ledger_classes(step, _apply(base, values(z), seq)).classes
        pred = np.log([split[k.op_class] for k in knobs])
        data = (pred - target) / data_sigma
        return np.concatenate([data, (z - z0) / prior_sigma]) if prior else data

    start = np.clip(z0, low + 1e-9, high - 1e-9)
    result = least_squares(residuals, start, bounds=(low, high), method="trf", diff_step=1e-3, xtol=1e-10,
                           ftol=1e-10, max_nfev=40 * len(knobs) + 40)
    post = np.linalg.pinv(result.jac.T @ result.jac)  # the Laplace posterior: every row is already in sigmas
    rounded = {p: float(format_value(v)) for p, v in values(result.x).items()}  # as the YAML will hold them
    fitted_machine = _apply(base, rounded, seq)
    fitted = tuple(FittedParameter(k.path, k.value, rounded[k.path], float(math.sqrt(max(post[i, i], 0.0))),
                                   bool(abs(result.x[i] - low[i]) < 1e-6 or abs(result.x[i] - high[i]) < 1e-6))
                   for i, k in enumerate(knobs))
    host, fitted_machine = _fit_host(step, fitted_machine, measured, base, prior)
    att = next((f.after / f.before for f in fitted if f.path.startswith("kernels.attention.")), 1.0)
    return TraceFit(machine, fitted_machine, step, measured, fitted, tuple(not_fitted), before,
                    ledger_classes(step, fitted_machine), att, _backend(base), host, prior)


def _sensitive(knobs: list[_Knob], machine: Machine, step: TracedStep,
               before: LedgerStep) -> tuple[list[_Knob], list[tuple[str, str]]]:
    """The knobs whose class's seconds move when they do (a GEMM table measured by `axoplan probe` prices the
    GEMMs without gemm.max_efficiency, for one), and why each other one is left."""
    kept: list[_Knob] = []
    left: list[tuple[str, str]] = []
    for k in knobs:
        moved = ledger_classes(step, _apply(machine, {k.path: k.value * 0.95}, step.options.seq_len))
        if abs(moved.classes[k.op_class] / before.classes[k.op_class] - 1) > 1e-3:
            kept.append(k)
        else:
            left.append((k.op_class, f"its seconds do not move with {k.path} on {machine.name}"))
    return kept, left


def _check_scale(measured: TraceClasses, before: LedgerStep, step: TracedStep) -> None:
    """Refuse a step the ledger prices at another scale than the trace: wrong batch or model, not constants."""
    traced = sum(measured.seconds[c] for c in LEDGER_CLASSES)
    priced = sum(before.classes.values())
    if not 1 / 3 <= priced / traced <= 3:
        raise AxoplanError(f"the ledger prices the given step at {priced:.4g} s of kernels, the trace holds "
                           f"{traced:.4g} s a step: more than 3 times apart, so not the same step; give the "
                           f"sequences this GPU ran in the traced step as --global-batch (now "
                           f"{step.options.global_batch}), and its --micro-batch and --model")


def _fittable(measured: TraceClasses, before: LedgerStep) -> tuple[list[str], list[tuple[str, str]]]:
    """The classes both the trace and the ledger time, and why each other class is left alone."""
    fitted: list[str] = []
    left: list[tuple[str, str]] = []
    floor = _NEGLIGIBLE * sum(before.classes.values())
    for c in LEDGER_CLASSES:
        m, p = measured.seconds[c], before.classes[c]
        p = p if p > floor else 0.0
        if m > 0 and p > 0:
            fitted.append(c)
        elif m > 0:
            left.append((c, f"the trace's {m * 1e3:.2f} ms has no op of the ledger to set it"))
        elif p > 0:
            left.append((c, f"the ledger prices {p * 1e3:.2f} ms, the trace has no kernel of the class"))
    for c in ("collective", "other"):
        if measured.seconds[c] > 0:
            left.append((c, f"{measured.seconds[c] * 1e3:.2f} ms in the trace, not a ledger class"))
    return fitted, left


def _fit_host(step: TracedStep, machine: Machine, measured: TraceClasses, base: Machine,
              prior: bool) -> tuple[HostFinding, Machine]:
    """``host.op_us`` where the device waited for the host beyond its kernel gaps, else its upper bound."""
    idle = max(measured.span_s - measured.busy_s, 0.0)
    gaps = measured.kernels * machine.device.kernel_gap_us * 1e-6
    before = machine.host.op_us

    def step_s(op_us: float) -> LedgerStep:
        return ledger_classes(step, _apply(machine, {"host.op_us": op_us}, step.options.seq_len))

    if idle - gaps > HOST_WAIT_SHARE * measured.span_s:
        if step_s(_OP_US[0]).step_s >= measured.span_s:
            return HostFinding(idle, gaps, measured.span_s, before, None, None,
                               "not fitted: the device waited for the host, but the ledger's device time alone "
                               "fills the trace's span"), machine
        fit = _bisect(lambda v: step_s(v).step_s - measured.span_s)
        op_us = _map_blend(before, fit, _host_prior(base)) if prior else float(format_value(fit))
        return (HostFinding(idle, gaps, measured.span_s, before, op_us, None,
                            f"fitted: the device waited {(idle - gaps) * 1e3:.2f} ms beyond its kernel gaps"),
                _apply(machine, {"host.op_us": op_us}, step.options.seq_len))
    bound = _bisect(lambda v: step_s(v).host_idle_s - 1e-9) if step_s(_OP_US[1]).host_idle_s > 0 else None
    shown = f"; the trace says only that op_us <= {format_value(bound)} us" if bound is not None else ""
    return HostFinding(idle, gaps, measured.span_s, before, None, bound,
                       f"not fitted: the device idled {idle * 1e3:.2f} ms of the step's {measured.span_s * 1e3:.1f} "
                       f"ms, no more than its kernel gaps ({measured.kernels:.0f} kernels x "
                       f"{machine.device.kernel_gap_us:g} us = {gaps * 1e3:.2f} ms): the host kept ahead"
                       f"{shown}"), machine


def _bisect(f: Any, lo: float = _OP_US[0], hi: float = _OP_US[1]) -> float:
    """The root of increasing `f` in [lo, hi], by bisection in log space (to 0.1 %)."""
    a, b = math.log(lo), math.log(hi)
    while b - a > 1e-3:
        mid = (a + b) / 2
        a, b = (mid, b) if f(math.exp(mid)) < 0 else (a, mid)
    return math.exp((a + b) / 2)


def _host_prior(machine: Machine) -> float:
    from axoplan.uncertainty.intervals import prior_spread

    u = machine.uncertainty
    spread = prior_spread(dict(u.sources) if u else None, ranges=dict(u.ranges) if u else None)
    return float(spread.rel_sigma[spread.paths.index("host.op_us")])


def _map_blend(prior: float, measured: float, prior_sigma: float) -> float:
    """The maximum a posteriori value of one log-parameter: the prior and the trace's value, each by its weight."""
    w = prior_sigma**2 / (prior_sigma**2 + TRACE_SIGMA**2)
    return float(format_value(math.exp((1 - w) * math.log(prior) + w * math.log(measured))))


def carry_over(fit: TraceFit, onto: Machine) -> Machine:
    """`onto` (another device) with what a trace fit found that transfers: each memory-bound class's share of HBM
    bandwidth (applied to `onto`'s own bandwidth), ``gemm.max_efficiency`` and the attention curve's factor
    (applied to `onto`'s own measured curve). Its bandwidth, peak and host stay its own."""
    target = _with_kernels(onto)
    values = {f.path: f.after for f in fit.fitted if f.path.startswith("kernels.") and
              not f.path.startswith("kernels.attention.")}
    values |= {f.path: f.after for f in fit.fitted if f.path == "gemm.max_efficiency"}
    backend = _backend(target)
    seq = fit.step.options.seq_len
    if backend is not None and fit.attention_factor != 1.0:
        values[f"kernels.attention.{backend}"] = _attention_at(target, seq) * fit.attention_factor
    elif backend is None:
        values |= {f.path: f.after for f in fit.fitted if f.path == "attention_efficiency"}
    return _apply(target, values, seq)


# ---- output ------------------------------------------------------------------------------------------------------


def format_split(measured: TraceClasses, columns: list[tuple[str, dict[str, float]]]) -> str:
    """The trace's seconds and share per class beside each of `columns` (label, seconds per class) and its ratio
    to the trace."""
    from axoplan.report import text_table

    classes = [c for c in LEDGER_CLASSES if measured.seconds[c] > 0 or any(col[c] > 0 for _, col in columns)]
    extra = [c for c in ("collective", "other") if measured.seconds[c] > 0]
    traced = sum(measured.seconds[c] for c in (*classes, *extra))
    headers = ["class", "trace s", "%"]
    for label, _ in columns:
        headers += [f"{label} s", "%", "ratio"]
    rows: list[list[str]] = []
    for c in (*classes, *extra, "total"):
        m = traced if c == "total" else measured.seconds[c]
        row = [c, f"{m:.5f}", f"{100 * m / traced:.1f}"]
        for _, col in columns:
            total = sum(col.values())
            p = total if c == "total" else col.get(c, 0.0)
            ratio = f"{p / m:.3f}" if m > 0 and c not in extra else "-"
            row += [f"{p:.5f}" if c not in extra else "-", f"{100 * p / total:.1f}" if c not in extra else "-", ratio]
        rows.append(row)
    return text_table(headers, rows, [False] + [True] * (len(headers) - 1))


def explain_trace(summary: TraceSummary, ranking: Any, index: int) -> str:
    """`explain --trace`: the ledger's seconds per class for candidate `index` of `ranking` (one GPU's step) beside
    the trace's, refused where the framework has no ledger or the trace's shapes are not this candidate's step."""
    cols = ranking.prediction.columns
    if "t_class_gemm_s" not in cols:
        raise AxoplanError(f"--framework {ranking.options.framework} prices no op ledger, so there is no split by "
                           f"op class to set beside the trace; give the traced framework's ledger profile, e.g. "
                           f"--framework hf-transformers")
    c = ranking.candidates
    step = TracedStep(ranking.model, ranking.options, int(c.micro_batch[index]), bool(c.recompute[index]))
    check_shapes(summary, step)
    measured = trace_classes(summary)
    predicted = _class_seconds(cols, index)
    where = "" if ranking.world_size == 1 else " (one GPU's share of the layout's step)"
    head = (f"op classes: the ledger on {ranking.machine.name}{where}, micro-batch {step.micro_batch}, recompute "
            f"{'on' if step.recompute else 'off'},\nbeside the trace {summary.path} "
            f"({summary.device or 'GPU not named'}, {measured.steps} step{'s' if measured.steps != 1 else ''}, "
            f"median per class)")
    tail = (f"ratio: the ledger's seconds over the trace's; the step: the trace's span {measured.span_s:.4f} s, "
            f"busy {measured.busy_s:.4f} s; the model's {float(cols['t_step_s'][index]):.4f} s")
    return "\n".join([head, "", format_split(measured, [("ledger", predicted)]), "", tail])


def format_trace_fit(fit: TraceFit) -> str:
    """What the fit moved, what it left and why, and the split before and after."""
    from axoplan.report import text_table

    rows = []
    for f in fit.fitted:
        name = f.path + (f" (at {fit.step.options.seq_len} tokens)" if f.path.startswith("kernels.attention.") else "")
        rows.append([name, format_value(f.before), format_value(f.after), f"{100 * (f.after / f.before - 1):+.1f} %",
                     f"{100 * f.rel_sigma:.1f} %" + (" (at its bound)" if f.at_bound else "")])
    host = fit.host
    if host.after is not None:
        rows.append(["host.op_us", format_value(host.before), format_value(host.after),
                     f"{100 * (host.after / host.before - 1):+.1f} %", ""])
    how = ("maximum a posteriori: each class's seconds at " f"{100 * TRACE_SIGMA:.0f} % (or its spread over the "
           "steps), each constant at its prior spread") if fit.prior else "least squares (--no-prior)"
    lines = [f"{fit.original.name} fitted to {fit.trace.steps} traced step{'s' if fit.trace.steps != 1 else ''} "
             f"(median per class) by {how}", "",
             text_table(["constant", "before", "after", "change", "sigma after"], rows,
                        [False, True, True, True, True]), ""]
    for c, why in fit.not_fitted:
        lines.append(f"not fitted: {c}: {why}")
    lines.append(f"host.op_us {host.note}")
    lines += ["", format_split(fit.trace, [("before", fit.before.classes), ("after", fit.after.classes)]), "",
              f"step: the trace's span {fit.trace.span_s:.4f} s; the model's step {fit.before.step_s:.4f} s before, "
              f"{fit.after.step_s:.4f} s after ({100 * (fit.after.step_s / fit.trace.span_s - 1):+.1f} %)"]
    return "\n".join(lines)


def trace_header(fit: TraceFit, trace: str, source: str, when: str) -> str:
    """The calibrated YAML's header: what it was fitted to, when, and each constant moved."""
    m, o = fit.step.model, fit.step.options
    moved = "; ".join(f"{f.path} {format_value(f.before)} -> {format_value(f.after)}" for f in fit.fitted)
    if fit.host.after is not None:
        moved += f"; host.op_us {format_value(fit.host.before)} -> {format_value(fit.host.after)}"
    lines = [f"{source} calibrated {when} by `axoplan calibrate --trace` (issue 31) to the torch.profiler trace",
             f"{trace}: {m.name} ({m.num_layers} layers, hidden {m.hidden}), --framework {o.framework}, micro-batch "
             f"{fit.step.micro_batch} of {o.seq_len} tokens, recompute {'on' if fit.step.recompute else 'off'}.",
             f"Moved: {moved}.",
             f"The step: trace span {fit.trace.span_s:.4f} s, the model {fit.before.step_s:.4f} s before and "
             f"{fit.after.step_s:.4f} s after."]
    return "".join(f"# {line}\n" for line in lines)


def trace_machine_yaml(fit: TraceFit, source_text: str, header: str, note: str) -> str:
    """The calibrated machine's YAML: the original text with each fitted line replaced and marked (an attention
    curve's line rewritten), as :func:`axoplan.validate.yamledit.machine_yaml` writes a runs calibration."""
    import yaml
    from pydantic import ValidationError

    from axoplan.validate.yamledit import edit_values, machine_yaml

    text = source_text
    values: dict[str, float] = {}
    for f in fit.fitted:
        if f.path.startswith("kernels.attention."):
            text = _curve_line(text, f.path.rsplit(".", 1)[1], fit.calibrated, note, fit.attention_factor)
        else:
            values[f.path] = f.after
    if fit.host.after is not None:
        values["host.op_us"] = fit.host.after
    try:  # the uncertainty block kept as written, comments and all: a trace fit leaves it as it was
        body = edit_values(text, values, note)
        if Machine.model_validate(yaml.safe_load(body)) == fit.calibrated:
            return header.rstrip("\n") + "\n" + body
    except (KeyError, yaml.YAMLError, ValidationError):
        pass
    return machine_yaml(text, fit.calibrated, values, header, note)


def _curve_line(text: str, backend: str, machine: Machine, note: str, factor: float) -> str:
    """`text` with backend's flow-mapping curve line given `machine`'s efficiencies (unchanged if not found: the
    YAML is then dumped whole)."""
    assert machine.kernels is not None
    curve = machine.kernels.attention[backend]
    pattern = re.compile(rf"^(\s*{re.escape(backend)}:\s*\{{seq:\s*\[[^\]]*\],\s*efficiency:\s*)\[[^\]]*\](\}})(.*)$")
    effs = ", ".join(format_value(e) for e in curve.efficiency)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = pattern.match(line)
        if m:
            tail = m.group(3).strip()
            lines[i] = (f"{m.group(1)}[{effs}]{m.group(2)}  # {note}, x{factor:.4g} of the curve it had"
                        + (f"; {tail.lstrip('#').strip()}" if tail else ""))
            break
    return "\n".join(lines) + "\n"
