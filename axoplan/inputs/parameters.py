"""Every number of a machine YAML, declared once: the registry of machine parameters (issue 32, item 1).

One :class:`MachineParameter` per numeric field of :class:`axoplan.inputs.machine.Machine` says what the number
is and how far it may be trusted: its dotted path in the YAML (``*`` for any item of a list, or any name of a
mapping keyed by name: ``kernels.attention.<backend>``), its unit, the values it can mean (``hard``: a YAML value
outside is refused in one line), the usual ones (outside: a one-line warning), the kind of source its number
usually has, whether it carries a prior spread in every prediction interval, its bounds when ``axoplan
calibrate`` may fit it, and whether ``axoplan probe`` or a trace (``axoplan calibrate --trace``) can measure it.

Everything else reads from here:

* plausibility (:data:`axoplan.inputs.plausible.MACHINE_RANGES`),
* the priors (:data:`DEFAULT_SOURCES`, :data:`PRIOR_REL_SIGMA`, used by ``axoplan.uncertainty.intervals``),
* calibration's parameter table (``axoplan.validate.calibrate.PARAMETERS``),
* the listing of docs/machines.md (``tests/test_parameters.py`` checks it is this table, and refreshes it).

The pydantic bounds stay beside their fields in ``axoplan/inputs/machine.py`` (they say what a value's type means:
a fraction is in (0, 1]); ``tests/test_parameters.py`` proves that every ``hard`` range lies inside its field's
bounds, so a YAML number is always judged here first, with its unit (docs/decisions.md, issue 32 item 1).

A curve is declared per point: ``kernels.attention.*.seq.*`` and ``kernels.attention.*.efficiency.*`` hold for
every point of every backend's curve. A prior range a YAML gives (``uncertainty.ranges.<path>``) obeys its own
parameter's entry, so it has none of its own.

**Order matters** for the parameters with a prior: their order here is the order of the columns of the interval's
sensitivities and of its random draws (``axoplan.uncertainty.intervals``) and of calibration's fit, so a
reordering changes P(best) in the last digits. Sections follow that order (GEMM, attention, memory, the op
classes, inside a node, the scale-up fabric, across nodes, the host, the device, the topology, measurements, the
centre's launcher, a calibration's output).

Adding a constant to the machine schema is one entry here (the test above names the missing path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["SourceKind", "Measurer", "FitBounds", "MachineParameter", "MACHINE_PARAMETERS", "PRIOR_REL_SIGMA",
           "DEFAULT_SOURCES", "machine_parameter", "named_parameters", "fit_bounds", "fittable", "parameters_table",
           "format_bound"]

SourceKind = Literal["measured", "vendor", "assumption"]
"""How a number is obtained: measured on the machine (nccl-tests, a GEMM sweep, ``axoplan probe``), a vendor or
centre figure (a datasheet, scaled by a typical achieved fraction where it is a rate), or an engineering guess."""

Measurer = Literal["probe", "trace"]
"""What can measure a number: ``axoplan probe`` (writes it in its fragment) or a ``torch.profiler`` trace of a
step (``axoplan calibrate --trace`` fits it, ``axoplan.validate.trace_fit``)."""

PRIOR_REL_SIGMA: dict[str, float] = {"measured": 0.05, "vendor": 0.15, "assumption": 0.40}
"""One-sigma relative spread of a parameter by how its number is sourced [decision, docs/uncertainty.md]."""


@dataclass(frozen=True, slots=True)
class FitBounds:
    """Where ``axoplan calibrate`` may move a parameter (inside its hard range, so a fitted YAML loads)."""

    low: float
    high: float
    floor: bool = False  # acts through max(): probed over its range, the fit started from a 1-D scan


@dataclass(frozen=True, slots=True)
class MachineParameter:
    """One numeric field of a machine YAML."""

    path: str
    unit: str
    hard: tuple[float, float]  # inclusive: a value outside is refused
    usual: tuple[float, float]  # inclusive: a value outside warns
    source: SourceKind | None  # None: no constant of the hardware (a site's policy, a calibration's output, nn's 1)
    meaning: str
    prior: bool = False  # carries its source's spread in every prediction interval (a machine may override)
    fit: FitBounds | None = None  # None: calibrate does not fit it
    measured_by: tuple[Measurer, ...] = ()
    slip: str = ""  # the likely cause of a value above the hard (or usual) range

    @property
    def prior_rel_sigma(self) -> float | None:
        """The one-sigma relative spread of its prior, None where it has none."""
        return PRIOR_REL_SIGMA[self.source] if self.prior and self.source is not None else None


_Kind = tuple[str, tuple[float, float], tuple[float, float]]  # unit, hard, usual


def _r(unit: str, hard: tuple[float, float], usual: tuple[float, float]) -> _Kind:
    return unit, hard, usual


def _p(path: str, kind: _Kind, source: SourceKind | None, meaning: str, *, prior: bool = False,
       fit: FitBounds | None = None, measured_by: tuple[Measurer, ...] = (), slip: str = "") -> MachineParameter:
    unit, hard, usual = kind
    return MachineParameter(path, unit, hard, usual, source, meaning, prior, fit, measured_by, slip)


_FRACTION = _r("(fraction)", (1e-3, 1.0), (0.05, 1.0))
_LATENCY = _r("us", (1e-3, 1e6), (0.05, 1e4))
_LINK = _r("GB/s", (1e-5, 1e5), (1e-3, 1e4))  # 1 MB/s: gloo between CPU ranks of a shared core
_USAGE = _r("(fraction)", (0, 0.99), (0, 0.5))
_NODES = _r("nodes", (1, 1e6), (1, 1e5))
_GROUP_NODES = _r("nodes", (1, 1e6), (1, 1e4))
_ORIENTATION = _r("(relative to nn)", (1e-3, 4.0), (0.2, 1.5))

_OP_CLASSES = {
    "elementwise": "element-wise kernels (add, mul, ...), share of HBM bandwidth",
    "activation": "fused activation kernels (GeLU, SiLU, their backward), share of HBM bandwidth",
    "norm": "layer and RMS norm kernels, forward and backward, share of HBM bandwidth",
    "copy_cast": "copies, dtype casts, concatenations, embedding look-ups, share of HBM bandwidth",
    "reduction": "reductions over rows (bias gradients, sums), share of HBM bandwidth",
    "loss": "log_softmax and nll_loss over the logits, forward and backward, share of HBM bandwidth",
    "optimizer": "the fused optimizer's multi-tensor kernels, share of HBM bandwidth",
    "memset": "fills and zeroed allocations, share of HBM bandwidth",
}

MACHINE_PARAMETERS: tuple[MachineParameter, ...] = (
    # GEMMs
    _p("gemm.max_efficiency", _FRACTION, "vendor", "fraction of peak one full wave of the best GEMM tile reaches "
       "(without tiles: of a large GEMM)", prior=True, fit=FitBounds(0.02, 1.0), measured_by=("probe", "trace")),
    _p("gemm.half_efficiency_dim", _r("elements", (1, 1e6), (1, 1e5)), "assumption",
       "GEMM dimension at which efficiency halves (machines without tiles)", prior=True,
       fit=FitBounds(1.0, 16384.0), measured_by=("probe",)),
    _p("gemm.fp32_efficiency", _FRACTION, "assumption",
       "fraction of the fp32 CUDA-core peak a large fp32 GEMM reaches; max_efficiency when absent"),
    _p("gemm.tiles.*.m", _r("rows", (1, 4096), (8, 1024)), "vendor", "rows of an output tile the BLAS library picks"),
    _p("gemm.tiles.*.n", _r("columns", (1, 4096), (8, 1024)), "vendor",
       "columns of an output tile the BLAS library picks"),
    _p("gemm.tiles.*.relative_efficiency", _FRACTION, "assumption", "a tile's efficiency relative to the best"),
    _p("gemm.table.*.efficiency", _r("(fraction)", (1e-6, 1.0), (1e-3, 1.0)), "measured",
       "fraction of peak a measured GEMM reached", measured_by=("probe",)),
    _p("gemm.table.*.m", _r("rows", (1, 1 << 24), (1, 1 << 20)), "measured", "rows of a measured GEMM",
       measured_by=("probe",)),
    _p("gemm.table.*.n", _r("columns", (1, 1 << 24), (1, 1 << 20)), "measured", "columns of a measured GEMM",
       measured_by=("probe",)),
    _p("gemm.table.*.k", _r("elements", (1, 1 << 24), (1, 1 << 20)), "measured",
       "inner dimension of a measured GEMM", measured_by=("probe",)),
    _p("gemm.orientation_efficiency.nn", _ORIENTATION, None,
       "the reference layout's own factor: 1, the layout the curve and an nn table describe"),
    *(_p(f"gemm.orientation_efficiency.{o}", _ORIENTATION, "measured",
         f"GEMM speed with operands laid out {o}, relative to nn", measured_by=("probe",))
      for o in ("nt", "tn", "tt")),
    # attention and memory-bound work
    _p("attention_efficiency", _FRACTION, "assumption", "fraction of peak in fused attention (FlashAttention-2), "
       "forward and backward, on the flops it computes", prior=True, fit=FitBounds(0.005, 1.0),
       measured_by=("trace",)),
    _p("attention_triton_efficiency", _FRACTION, "assumption",
       "the same for the Triton FlashAttention kernel; attention_efficiency when absent", prior=True,
       fit=FitBounds(0.005, 1.0)),
    _p("memory_efficiency", _FRACTION, "vendor", "fraction of HBM bandwidth in element-wise work", prior=True,
       fit=FitBounds(0.01, 1.0)),
    # the op classes a ledger prices
    *(_p(f"kernels.{name}", _FRACTION, "measured", meaning, measured_by=("probe", "trace"))
      for name, meaning in _OP_CLASSES.items()),
    _p("kernels.unaligned_gemm_efficiency", _FRACTION, "measured",
       "speed of a GEMM with a dimension not a multiple of 8 relative to an aligned one", measured_by=("probe",)),
    _p("kernels.attention.*.seq.*", _r("tokens", (1, 1 << 24), (16, 1 << 21)), "measured",
       "a sequence length at which a fused attention backend was measured (a curve's point)",
       measured_by=("probe",)),
    _p("kernels.attention.*.efficiency.*", _FRACTION, "measured",
       "a fused attention backend's fraction of peak at that length, forward and backward (a curve's point)",
       measured_by=("probe", "trace")),
    # inside a node
    _p("intra_node.efficiency", _FRACTION, "assumption", "fraction of link bandwidth collectives reach inside a node",
       prior=True, fit=FitBounds(0.005, 1.0)),
    _p("intra_node.latency_us", _LATENCY, "assumption", "per-step collective latency inside a node", prior=True,
       fit=FitBounds(0.01, 1e5)),
    _p("intra_node.processor_usage", _USAGE, "assumption",
       "share of compute a collective inside a node takes from the work it overlaps", prior=True),
    _p("intra_node.link_classes.*.bandwidth_gbs", _LINK, "vendor", "a link class's bandwidth per pair and direction"),
    _p("intra_node.link_classes.*.pairs.*.*", _r("device index", (0, 4095), (0, 143)), "vendor",
       "a device of a pair a link class joins"),
    _p("intra_node.device_bandwidth_gbs", _LINK, "vendor", "cap on one device's total link bandwidth"),
    # the scale-up fabric
    _p("scale_up.devices", _r("devices", (2, 1e5), (2, 576)), "vendor",  # NVLink 5 switches join at most 576 GPUs
       "devices one scale-up fabric joins (a multiple of devices_per_node)"),
    _p("scale_up.bandwidth_gbs", _LINK, "vendor", "per device and direction through the fabric's switches"),
    _p("scale_up.latency_us", _LATENCY, "assumption", "per-step collective latency across the fabric"),
    _p("scale_up.efficiency", _FRACTION, "assumption", "fraction of the fabric's bandwidth collectives reach"),
    # across nodes
    _p("inter_node.efficiency", _FRACTION, "assumption", "fraction of injection bandwidth collectives reach",
       prior=True, fit=FitBounds(0.005, 1.0)),
    _p("inter_node.latency_us", _LATENCY, "assumption", "per-step collective latency across nodes", prior=True,
       fit=FitBounds(0.01, 1e5)),
    _p("inter_node.processor_usage", _USAGE, "assumption",
       "share of compute a collective across nodes takes from the work it overlaps", prior=True),
    _p("inter_node.scale_exponent", _r("(exponent)", (0, 1), (0, 0.5)), "assumption",
       "bandwidth loss with the nodes a group spans, (N/N_ref)^-x", prior=True, fit=FitBounds(1e-4, 1.0)),
    _p("inter_node.nics_per_node", _r("NICs", (1, 1024), (1, 32)), "vendor", "NICs per node"),
    _p("inter_node.nic_bandwidth_gbs", _r("GB/s per NIC", (1e-3, 200), (0.1, 100)), "vendor",
       "per NIC and direction",
       slip="no NIC is that fast (the fastest carry 800 Gb/s = 100 GB/s): did you give Gb/s? Divide by 8"),
    _p("inter_node.nodes_per_group", _GROUP_NODES, "vendor",
       "nodes in one dragonfly group, if tapered"),
    _p("inter_node.global_bandwidth_fraction", _FRACTION, "assumption",
       "bandwidth left to groups spanning several dragonfly groups"),
    _p("inter_node.scale_reference_nodes", _GROUP_NODES, "measured",
       "node count at which the bandwidth figures were taken"),
    # the host
    _p("host.op_us", _r("us", (1e-2, 1e4), (0.5, 1e3)), "assumption",
       "host time per framework op on host tensors (binds where the host is slower than the device)", prior=True,
       fit=FitBounds(0.01, 1e4, floor=True), measured_by=("probe", "trace")),
    _p("host.launch_us", _r("us", (0, 1e4), (0, 100)), "assumption", "host time to launch one kernel beyond op_us",
       prior=True, measured_by=("probe",)),
    # the device
    _p("device.speed_variation", _r("(relative sigma)", (0, 0.49), (0, 0.1)), "assumption",
       "one-sigma spread of sustained speed between devices", prior=True),
    _p("device.peak_bf16_tflops", _r("TFLOP/s", (1e-3, 1e5), (0.05, 1e4)), "vendor", "dense bf16 peak per device"),
    _p("device.peak_fp32_tflops", _r("TFLOP/s", (1e-3, 1e5), (0.1, 1e4)), "vendor",
       "fp32 peak without tensor cores per device; a sixteenth of the bf16 peak when absent"),
    _p("device.hbm_gb", _r("GB", (0.1, 1e4), (1, 1024)), "vendor", "HBM capacity per device"),
    _p("device.hbm_bandwidth_gbs", _r("GB/s", (0.1, 1e6), (5, 3e4)), "vendor", "HBM bandwidth per device"),
    _p("device.reserved_gb", _r("GB", (0, 1e4), (0, 64)), "measured",
       "a measured reserve of HBM, replacing the sum of device.reserve's parts"),
    _p("device.compute_units", _r("SMs or CUs", (1, 1e5), (1, 2048)), "vendor",
       "streaming multiprocessors or compute units GEMM tiles are scheduled on"),
    _p("device.kernel_gap_us", _r("us", (0, 1e4), (0, 100)), "assumption", "device time between two queued kernels"),
    _p("device.cores_per_node", _r("cores", (1, 1e5), (1, 1024)), "measured",
       "CPU devices: the cores a node's ranks share", measured_by=("probe",)),
    _p("device.reserve.hidden_gb", _r("GB", (0, 1e4), (0, 64)), "vendor", "HBM the system does not expose"),
    _p("device.reserve.runtime_gb", _r("GB", (0, 1e3), (0, 16)), "assumption",
       "runtime context and loaded kernel libraries"),
    _p("device.reserve.per_communicator_gb", _r("GB", (0, 100), (0, 4)), "measured",
       "collective-library buffers per communicator"),
    _p("device.reserve.fragmentation", _r("(fraction of HBM)", (0, 0.99), (0, 0.5)), "measured",
       "caching-allocator fragmentation"),
    _p("device.unified_memory.host_share_gb", _r("GB", (0, 1e4), (0, 64)), "assumption",
       "shared memory: HBM the operating system and the CPU side of a process hold"),
    _p("device.unified_memory.cpu_memory_gb", _r("GB", (0, 1e5), (0, 2048)), "vendor",
       "coherent memory: CPU memory per device the device can address"),
    _p("device.unified_memory.cpu_link_gbs", _LINK, "vendor", "coherent memory: the CPU-device link per direction"),
    # the topology
    _p("devices_per_node", _r("devices", (1, 4096), (1, 144)), "vendor", "devices in one node"),
    _p("nodes", _NODES, "vendor", "nodes the machine has; absent for a node type without a fixed size"),
    # measured collectives
    _p("measured_bandwidth.*.bandwidth_gbs", _LINK, "measured", "a group shape's measured bus bandwidth",
       measured_by=("probe",)),
    _p("measured_bandwidth.*.latency_us", _LATENCY, "measured",
       "per-step latency fitted with the bandwidth to a message-size sweep"),
    _p("measured_bandwidth.*.stride", _r("ranks", (1, 1e7), (1, 1e6)), "measured",
       "rank distance of the measured group's members", measured_by=("probe",)),
    _p("measured_bandwidth.*.size", _r("ranks", (2, 1e7), (2, 1e6)), "measured", "members of the measured group",
       measured_by=("probe",)),
    # the centre's launcher (its policy, not a constant of the hardware)
    _p("launcher.queues.*.min_nodes", _NODES, None, "fewest nodes a queue takes"),
    _p("launcher.queues.*.max_nodes", _NODES, None, "most nodes a queue takes"),
    _p("launcher.queues.*.max_walltime_minutes", _r("minutes", (1, 1e6), (1, 2e4)), None,
       "longest job a queue runs"),
    _p("launcher.staging.min_nodes", _NODES, None, "node count from which a job stages its files first"),
    _p("launcher.staging.margin_minutes_per_1000_nodes", _r("minutes", (0, 1e4), (0, 120)), None,
       "wall time kept for staging per 1000 nodes"),
    # a calibration's output
    _p("uncertainty.model_error", _r("(relative sigma)", (0, 10), (0, 1)), None,
       "the model's one-sigma relative error on the runs a calibration fitted"),
    _p("uncertainty.log_cov.*.*", _r("(log-space covariance)", (-100, 100), (-4, 4)), None,
       "covariance of the fitted parameters' logarithms"),
)
"""Every numeric field of a machine YAML, once; parameters with a prior in the order the intervals use them."""

_BY_PATH: dict[str, MachineParameter] = {p.path: p for p in MACHINE_PARAMETERS}
_NAMED = frozenset(p.path for p in MACHINE_PARAMETERS if "*" not in p.path)

DEFAULT_SOURCES: dict[str, SourceKind] = {p.path: p.source for p in MACHINE_PARAMETERS
                                          if p.prior and p.source is not None}
"""How each uncertain parameter of a machine is sourced unless its YAML says (``uncertainty.sources``); a
parameter the machine does not set (``attention_triton_efficiency``) or sets to 0 has no spread."""


def machine_parameter(path: str) -> MachineParameter:
    """The entry of a dotted path as the registry spells it (``*`` for list items); KeyError if there is none."""
    return _BY_PATH[path]


def named_parameters() -> frozenset[str]:
    """The paths a machine's ``uncertainty:`` block may name: the entries of one number each (no ``*``)."""
    return _NAMED


def fit_bounds(path: str) -> FitBounds:
    """Where calibrate may move the parameter at `path`; ValueError if it may not fit it."""
    fit = machine_parameter(path).fit
    if fit is None:
        raise ValueError(f"{path} is not fittable")
    return fit


def fittable() -> tuple[MachineParameter, ...]:
    """The parameters ``axoplan calibrate`` may fit, in the registry's order."""
    return tuple(p for p in MACHINE_PARAMETERS if p.fit is not None)


def parameters_table() -> str:
    """The registry as a Markdown table (docs/machines.md)."""
    rows = ["| path | unit | refused outside | usual | source | prior σ | calibrate | measured by | what it is |",
            "|---|---|---|---|---|---|---|---|---|"]
    for p in MACHINE_PARAMETERS:
        sigma = p.prior_rel_sigma
        cells = (f"`{p.path}`", p.unit, _span(p.hard), _span(p.usual), p.source or "—",
                 "" if sigma is None else f"{100 * sigma:.0f} %",
                 "" if p.fit is None else _span((p.fit.low, p.fit.high)) + (" (floor)" if p.fit.floor else ""),
                 ", ".join(p.measured_by), p.meaning)
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _span(bounds: tuple[float, float]) -> str:
    return f"{format_bound(bounds[0])}–{format_bound(bounds[1])}"


def format_bound(v: float) -> str:
    """A bound or value as the plausibility messages and the docs print it: an integer without a point."""
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e12 else f"{v:g}"
