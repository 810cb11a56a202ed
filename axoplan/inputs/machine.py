"""Machine descriptions: one YAML per machine, loaded into frozen, strict models.

A machine is a set of identical nodes. Within a node, device pairs are joined by
*link classes* (on Frontier the two GCDs of one MI250X are joined far faster than
GCDs on different cards); nodes are joined by NICs. A *scale-up domain* joins the devices
of several nodes as one fabric (a GB200 NVL72 rack: 72 GPUs of 18 nodes on NVLink
switches). A device may share its memory with the CPU (*unified memory*: an MI300A's one
HBM pool, a GH200's coherent CPU memory). Every number in a shipped YAML carries its
source in a comment. Bandwidths are GB/s (1e9 bytes/s) per direction.

    >>> from axoplan.inputs.machine import load_machine
    >>> load_machine("frontier").devices_per_node
    8
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, PositiveFloat, PositiveInt, ValidationError, model_validator

from axoplan.errors import AxoplanError, closest_hint
from axoplan.fileio import check_readable
from axoplan.inputs.launcher import LauncherSpec
from axoplan.inputs.parameters import SourceKind, named_parameters
from axoplan.inputs.plausible import MACHINE_RANGES, check_plausible
from axoplan.inputs.schema import Frozen, describe_validation_error, load_yaml_mapping, shipped_folder

__all__ = ["Machine", "Reserve", "UnifiedMemory", "ScaleUpDomain", "load_machine", "merge_fragment", "shipped_machines",
           "machines_dir",
           "Orientation", "ORIENTATIONS", "OrientationEfficiency", "KernelModel", "AttentionCurve", "OpClass"]

Fraction = float


class Reserve(Frozen):
    """HBM a training process holds beyond its live tensors, per device, from its parts.

    ``hidden + runtime + per_communicator · communicators + fragmentation · hbm_gb`` GB, the
    communicators being the framework's (``frameworks/<name>.yaml``, ``memory.communicators``).
    The defaults are NVIDIA/NCCL figures (docs/decisions.md, issue 9, "Allocator reserve"):
    the CUDA context with lazy module loading is 0.29–0.4 GB (PyTorch PR 86509, issue 109888)
    and a training process loads cuBLAS, cuDNN, NCCL and fused kernels on top [estimate: 1.0 GB
    in all]; one NCCL process group held 544 MB (2 ranks) to 688 MB (more) on 4×A100 NVLink
    (NCCL issue 964) [0.6 GB]; the caching allocator's fragmentation averaged 9.2 GB of an 80 GB
    A100 across eight LLM trainings (GMLake, Guo et al., ASPLOS 2024) [0.115 of HBM]."""

    hidden_gb: float = Field(0.0, ge=0, description="HBM the system does not expose to the process, GB.")
    runtime_gb: float = Field(1.0, ge=0, description="Runtime context and loaded kernel libraries, GB.")
    per_communicator_gb: float = Field(0.6, ge=0, description="Collective-library buffers per communicator, GB.")
    fragmentation: float = Field(0.115, ge=0, lt=1, description="Caching-allocator fragmentation, fraction of HBM.")

    def gb(self, hbm_gb: float, communicators: int) -> float:
        """The reserve of a device with `hbm_gb` of HBM under a framework keeping `communicators`, GB."""
        return (self.hidden_gb + self.runtime_gb + self.per_communicator_gb * communicators
                + self.fragmentation * hbm_gb)


class UnifiedMemory(Frozen):
    """The CPU and the device in one memory (docs/decisions.md, issue 25, "Unified memory").

    ``shared``: one HBM pool serves both (AMD MI300A: 128 GB of HBM3 per APU, "a unified HBM3-based memory
    system" for its CPU and GPU chiplets [doc LLNL El Capitan systems overview]); the operating system, the
    CPU side of each training process (Python, the data loader, pinned buffers) and the page cache then
    live in the device's HBM, so ``host_share_gb`` is taken off what the device's tensors may use.
    ``coherent``: the device keeps its own HBM and can also address CPU memory over a coherent link (GH200:
    96 GB of HBM3 and 120 GB of LPDDR5X over the 900 GB/s NVLink-C2C [doc CSCS, doc JSC]); the operating
    system lives in the CPU memory, so the HBM is unchanged, and the model places no tensor in CPU memory
    (no offload is modelled): ``cpu_memory_gb`` and ``cpu_link_gbs`` describe the part.
    """

    kind: Literal["shared", "coherent"] = Field(description="shared: one memory for CPU and device (an APU); "
                                                "coherent: the device's HBM plus CPU memory it can address.")
    host_share_gb: float = Field(0.0, ge=0, description="shared: the device's HBM the operating system and the CPU "
                                 "side of its process hold, GB per device.")
    cpu_memory_gb: float = Field(0.0, ge=0, description="coherent: CPU memory per device the device can address, GB.")
    cpu_link_gbs: PositiveFloat | None = Field(None, description="coherent: the CPU-device link, GB/s per direction.")

    @model_validator(mode="after")
    def _one_kind(self) -> UnifiedMemory:
        if self.kind == "shared" and (self.cpu_memory_gb or self.cpu_link_gbs is not None):
            raise ValueError("shared memory has no separate CPU memory: give host_share_gb, not cpu_memory_gb or "
                             "cpu_link_gbs")
        if self.kind == "coherent" and self.host_share_gb:
            raise ValueError("coherent memory keeps the operating system in CPU memory: give cpu_memory_gb, not "
                             "host_share_gb (a share of HBM the system hides is device.reserve.hidden_gb)")
        return self


class Device(Frozen):
    """One accelerator as the framework sees it (a GPU, or one GCD of an MI250X)."""

    name: str
    peak_bf16_tflops: PositiveFloat = Field(description="Dense bf16 peak, TFLOP/s per device.")
    peak_fp32_tflops: PositiveFloat | None = Field(
        None, description="fp32 peak without tensor cores (CUDA cores, SIMT), TFLOP/s per device: where an fp32 GEMM "
        "runs (autocast does not reach transformers' grouped expert GEMMs). None: a sixteenth of the bf16 peak.")
    hbm_gb: PositiveFloat = Field(description="HBM capacity per device, GB (1e9 bytes).")
    hbm_bandwidth_gbs: PositiveFloat = Field(description="HBM bandwidth per device, GB/s.")
    reserve: Reserve = Field(
        default_factory=Reserve, description="HBM not available to live tensors (runtime context, "
        "collective-library buffers, caching-allocator fragmentation), from its sourced parts.")
    reserved_gb: float | None = Field(
        None, ge=0, description="A measured reserve, GB (e.g. hbm_gb minus torch.cuda.mem_get_info's free "
        "memory once the communicators are built, plus fragmentation); replaces `reserve` when given.")
    kind: Literal["gpu", "cpu"] = Field(
        "gpu", description="gpu: runs use NCCL/RCCL; cpu: one gloo rank per 'device' (the executor on a CPU box)."
    )
    compute_units: PositiveInt | None = Field(
        None, description="Streaming multiprocessors (NVIDIA) or compute units (AMD) that GEMM tiles are "
        "scheduled on, in waves; omit for a CPU.")
    kernel_gap_us: float = Field(
        2.0, ge=0, description="Device time between two queued kernels (drain, launch, ramp-up), microseconds.")
    cores_per_node: PositiveInt | None = Field(
        None, description="CPU 'devices' only: the cores a node's ranks share. With more ranks on a node than "
        "cores, each rank computes and issues ops at cores/ranks of one core (time-sharing); omit for a GPU.")
    speed_variation: float = Field(
        0.0, ge=0, lt=0.5, description="Relative spread (one sigma) of sustained compute speed between devices of "
        "this kind; a synchronous step waits for the slowest of its N devices (axoplan/cost/scale.py).")
    unified_memory: UnifiedMemory | None = Field(
        None, description="CPU and device in one memory (MI300A, GH200); None: the device's HBM is its own.")


class Host(Frozen):
    """The CPU that drives a device from an eager framework (PyTorch without graphs)."""

    op_us: PositiveFloat = Field(
        description="Host time of one framework op on host tensors (Python, dispatcher, allocator), "
        "microseconds: the unit of a framework profile's host_ops.")
    launch_us: float = Field(
        0.0, ge=0, description="Host time to launch one kernel on the device, on top of op_us (the driver's "
        "launch call; 0 for a CPU 'device'), microseconds.")
    overlaps_device: bool = Field(
        True, description="true: kernels run asynchronously while the host issues the next ones (a GPU); "
        "false: the host runs the op itself, so its overhead adds to the compute (a CPU 'device').")


class LinkClass(Frozen):
    """Device pairs inside a node joined at one bandwidth."""

    name: str
    bandwidth_gbs: PositiveFloat = Field(description="Per pair, per direction, GB/s.")
    pairs: tuple[tuple[int, int], ...] | None = Field(
        None, description="Local device index pairs; omit for 'every pair not listed elsewhere'."
    )


class IntraNode(Frozen):
    link_classes: tuple[LinkClass, ...] = Field(min_length=1)
    device_bandwidth_gbs: PositiveFloat | None = Field(
        None, description="Cap on one device's total link bandwidth (NVSwitch ports, NVLink count), GB/s."
    )
    latency_us: PositiveFloat = Field(description="Per-step collective latency inside a node, microseconds.")
    efficiency: float = Field(0.75, gt=0, le=1, description="Achieved fraction of link bandwidth in collectives.")
    processor_usage: float = Field(
        0.0, ge=0, lt=1, description="Share of the device's compute a collective inside a node takes from the work "
        "it overlaps (Calculon's processor_usage).")


class ScaleUpDomain(Frozen):
    """Devices of several nodes joined by one switched fabric, as fast as inside a node (NVLink Switch).

    A GB200 NVL72 rack: 18 compute trays (nodes) of 4 GPUs, all 72 on NVLink switches at 900 GB/s per GPU and
    direction. A group whose members all sit in one domain runs over that fabric, not the NICs
    (axoplan/cost/placement.py); ranks fill domains in order, as they fill nodes.
    """

    name: str = Field(description="The fabric, shown as the link of a group placed on it.")
    devices: PositiveInt = Field(description="Devices in one domain: a multiple of devices_per_node.")
    bandwidth_gbs: PositiveFloat = Field(description="Per device, per direction, through the switches, GB/s.")
    latency_us: PositiveFloat = Field(description="Per-step collective latency across the fabric, microseconds.")
    efficiency: float = Field(0.75, gt=0, le=1, description="Achieved fraction of the bandwidth in collectives.")


class InterNode(Frozen):
    nics_per_node: PositiveInt
    nic_bandwidth_gbs: PositiveFloat = Field(description="Per NIC, per direction, GB/s.")
    latency_us: PositiveFloat = Field(description="Per-step collective latency across nodes, microseconds.")
    efficiency: float = Field(0.8, gt=0, le=1, description="Achieved fraction of injection bandwidth.")
    processor_usage: float = Field(
        0.0, ge=0, lt=1, description="Share of the device's compute a collective across nodes takes from the work "
        "it overlaps (Calculon's processor_usage).")
    nodes_per_group: PositiveInt | None = Field(None, description="Nodes in one dragonfly group, if tapered.")
    global_bandwidth_fraction: float = Field(
        1.0, gt=0, le=1, description="Bandwidth fraction left to groups spanning several dragonfly groups."
    )
    scale_exponent: float = Field(
        0.0, ge=0, le=1, description="Collective bandwidth falls with the nodes a group spans: "
        "bw(N) = bw(reference) · (N / scale_reference_nodes)^(−scale_exponent) beyond the reference (0: flat).")
    scale_reference_nodes: PositiveInt = Field(
        2, description="Node count at which the bandwidth figures (and a measured table's rows) were taken.")

    def scale_factor(self, nodes: int) -> float:
        """Fraction of the reference bandwidth left to a group spanning `nodes` nodes (1 up to the reference)."""
        ratio = max(nodes, self.scale_reference_nodes) / self.scale_reference_nodes
        return float(ratio ** (-self.scale_exponent))

    @property
    def injection_gbs(self) -> float:
        """Node injection bandwidth, GB/s per direction."""
        return self.nics_per_node * self.nic_bandwidth_gbs


Orientation = Literal["nn", "nt", "tn", "tt"]
"""Operand layouts of ``C = A·B`` as torch hands them to BLAS: per operand ``n`` (row-major, as
stored) or ``t`` (a transposed view of row-major memory); first letter A, second B."""

ORIENTATIONS: tuple[Orientation, ...] = ("nn", "nt", "tn", "tt")


class GemmPoint(Frozen):
    """One measured GEMM: local shape, operand layouts and achieved efficiency (fraction of peak)."""

    m: PositiveInt
    n: PositiveInt
    k: PositiveInt
    efficiency: float = Field(gt=0, le=1)
    orientation: Orientation = Field("nn", description="Operand layouts it was measured with (nn: a @ b of "
                                     "contiguous tensors).")


class OrientationEfficiency(Frozen):
    """GEMM efficiency of each operand layout relative to ``nn``; 1 (no penalty) unless measured."""

    nn: PositiveFloat = 1.0
    nt: PositiveFloat = 1.0
    tn: PositiveFloat = 1.0
    tt: PositiveFloat = 1.0

    def of(self, orientation: Orientation) -> float:
        return float(getattr(self, orientation))


class GemmTile(Frozen):
    """One output tile shape the BLAS library may pick, with its efficiency relative to the best."""

    m: PositiveInt
    n: PositiveInt
    relative_efficiency: float = Field(1.0, gt=0, le=1)


class GemmModel(Frozen):
    """How fast a local GEMM runs (``axoplan/cost/compute.py`` has the formulas).

    With ``tiles`` and the device's ``compute_units`` (a GPU): tile and wave quantization;
    ``max_efficiency`` is the fraction of peak one full wave of the best tile reaches.
    Without tiles (a CPU): ``eff = max_efficiency · Π_d d/(d + half_efficiency_dim)``. Either way
    a GEMM is never faster than its HBM traffic allows; a measured ``table`` (``axoplan probe``)
    overrides both with the nearest measured shape. ``orientation_efficiency`` scales the
    efficiency by operand layout (relative to ``nn``, which the curve and an ``nn`` table
    describe); table rows measured in an orientation take precedence over its factor.
    """

    max_efficiency: float = Field(gt=0, le=1)
    fp32_efficiency: float | None = Field(
        None, gt=0, le=1, description="Fraction of the fp32 CUDA-core peak a large fp32 GEMM reaches (SIMT kernels, "
        "not the tensor cores max_efficiency describes); None: max_efficiency.")
    half_efficiency_dim: PositiveFloat = 96.0
    tiles: tuple[GemmTile, ...] = ()
    table: tuple[GemmPoint, ...] = ()
    orientation_efficiency: OrientationEfficiency = OrientationEfficiency()


class MeasuredBandwidth(Frozen):
    """Measured collective bus bandwidth for groups of one stride and size."""

    stride: PositiveInt = Field(description="Rank distance between group members; rows match strides >= this.")
    size: int = Field(ge=2, description="Group size; rows match sizes >= this.")
    bandwidth_gbs: PositiveFloat = Field(description="Bus bandwidth, GB/s (nccl-tests busbw convention).")
    latency_us: PositiveFloat | None = Field(
        None, description="Per-step latency α fitted with the bandwidth to a message-size sweep "
        "(axoplan.validate.collective_fit), µs; the machine's intra_node/inter_node latency when absent.")


class ParameterUncertainty(Frozen):
    """How sure the machine's fittable numbers are (issue 10; see docs/uncertainty.md).

    ``sources`` names how each parameter was obtained (measured, vendor, assumption), which
    sets its prior spread; ``ranges`` gives a parameter's sourced range (low, high), which sets
    it instead (the range is read as the central 80 % of the prior) and is where the validation
    report's sensitivity band moves it; a calibration writes ``log_cov`` (covariance of the
    fitted parameters' logarithms, in the order of ``log_cov_paths``) and ``model_error``
    (relative one-sigma error of the model on held-out runs).
    """

    sources: dict[str, SourceKind] = {}
    ranges: dict[str, tuple[PositiveFloat, PositiveFloat]] = {}
    log_cov_paths: tuple[str, ...] = ()
    log_cov: tuple[tuple[float, ...], ...] = ()
    model_error: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _square(self) -> ParameterUncertainty:
        for path, (low, high) in self.ranges.items():
            if not low < high:
                raise ValueError(f"ranges: {path} is ({low}, {high}); give (low, high) with low < high")
        n = len(self.log_cov_paths)
        if len(self.log_cov) != n or any(len(row) != n for row in self.log_cov):
            raise ValueError(f"log_cov must be a {n} x {n} matrix matching log_cov_paths")
        return self

    @model_validator(mode="after")
    def _known_paths(self) -> ParameterUncertainty:
        """A path no parameter has (a typo) would be silently ignored: refuse it, naming the closest."""
        known = named_parameters()
        for key, paths in (("sources", self.sources), ("ranges", self.ranges), ("log_cov_paths", self.log_cov_paths)):
            for path in paths:
                if path not in known:
                    raise ValueError(f"{key}: {path!r} is no machine parameter{closest_hint(path, known)}; "
                                     f"docs/machines.md lists them")
        return self


OpClass = Literal["elementwise", "activation", "norm", "copy_cast", "reduction", "loss", "optimizer", "memset"]
"""The memory-bound op classes of a ledger (``axoplan.cost.ledger``), each priced at its own share of HBM bandwidth."""


class AttentionCurve(Frozen):
    """A fused attention backend's forward+backward fraction of peak by sequence length (causal, the
    FlashAttention-2 flop convention), interpolated in log2 of the length and held flat beyond its ends."""

    seq: tuple[PositiveInt, ...] = Field(min_length=1, description="Sequence lengths measured, ascending.")
    efficiency: tuple[float, ...] = Field(min_length=1, description="Fraction of dense bf16 peak at each length.")

    @model_validator(mode="after")
    def _same_length(self) -> AttentionCurve:
        if len(self.seq) != len(self.efficiency) or list(self.seq) != sorted(self.seq):
            raise ValueError("seq and efficiency must be equally long, seq ascending")
        if not all(0 < e <= 1 for e in self.efficiency):
            raise ValueError("every efficiency must be in (0, 1]")
        return self


class KernelModel(Frozen):
    """Per op class, what the device's kernels reach (``axoplan.cost.ledger`` prices each ledger entry with
    it): memory-bound classes as a share of HBM bandwidth, fused attention per backend as a curve."""

    elementwise: float = Field(gt=0, le=1, description="Element-wise kernels (add, mul, ...), share of HBM bandwidth.")
    activation: float = Field(gt=0, le=1, description="Fused activation kernels (GeLU, SiLU, their backward).")
    norm: float = Field(gt=0, le=1, description="Layer and RMS norm kernels, forward and backward.")
    copy_cast: float = Field(gt=0, le=1, description="Copies, dtype casts, concatenations, embedding look-ups.")
    reduction: float = Field(gt=0, le=1, description="Reductions over rows (bias gradients, sums).")
    loss: float = Field(gt=0, le=1, description="log_softmax and nll_loss, forward and backward, over the logits.")
    optimizer: float = Field(gt=0, le=1, description="The fused optimizer's multi-tensor kernels.")
    memset: float = Field(0.85, gt=0, le=1, description="Fills and zeroed allocations.")
    attention: dict[str, AttentionCurve] = Field(
        default_factory=dict, description="Fused attention backends measured on this device (flash, cudnn, efficient).")
    default_attention: str | None = Field(
        None, description="The backend PyTorch's SDPA picks on this device (cudnn on Hopper with PyTorch 2.11).")
    unaligned_gemm_efficiency: float = Field(
        1.0, gt=0, le=1, description="A GEMM whose dimension is not a multiple of 8 runs on align1 kernels at this "
        "fraction of the aligned speed.")
    derived: tuple[str, ...] = Field(
        (), description="Op classes whose numbers were taken from another device's measurement, not measured on "
        "this one (they widen the prediction interval: axoplan.uncertainty.reach).")

    def of(self, op_class: OpClass) -> float:
        return float(getattr(self, op_class))


class Machine(Frozen):
    """A homogeneous GPU machine as the cost model needs it."""

    name: str
    description: str = ""
    devices_per_node: PositiveInt
    nodes: PositiveInt | None = Field(
        None, description="Nodes the machine has (its size); a GPU count beyond nodes x devices_per_node is refused. "
        "None for a node type without a fixed size (dgx-a100, local-cpu).")
    device: Device
    intra_node: IntraNode
    scale_up: ScaleUpDomain | None = Field(
        None, description="A fabric joining the devices of several nodes (GB200 NVL72); None: nodes meet only on "
        "the network.")
    inter_node: InterNode
    gemm: GemmModel
    attention_efficiency: float = Field(
        0.45, gt=0, le=1, description="Fraction of peak a fused attention kernel (FlashAttention-2) reaches over its "
        "forward and backward, on the flops it computes (axoplan/cost/attention.py).")
    attention_triton_efficiency: float | None = Field(
        None, gt=0, le=1, description="The same for the Triton FlashAttention kernel (--attention flash-triton); "
        "attention_efficiency when absent.")
    memory_efficiency: float = Field(0.7, gt=0, le=1, description="Achieved fraction of HBM bandwidth.")
    kernels: KernelModel | None = Field(
        None, description="Op classes measured on this device (a ledger prices each op with them); None: every "
        "memory-bound class at memory_efficiency and attention at attention_efficiency.")
    host: Host
    measured_bandwidth: tuple[MeasuredBandwidth, ...] = Field(
        (), description="Measured bus bandwidths; when a row matches a group it overrides the theory."
    )
    launcher: LauncherSpec | None = None
    uncertainty: ParameterUncertainty | None = None

    @model_validator(mode="after")
    def _check_links(self) -> Machine:
        n = self.devices_per_node
        defaults = [c.name for c in self.intra_node.link_classes if c.pairs is None]
        if len(defaults) > 1:
            raise ValueError(f"only one link class may omit 'pairs'; got {defaults}")
        seen: set[tuple[int, int]] = set()
        for c in self.intra_node.link_classes:
            for a, b in c.pairs or ():
                if not (0 <= a < n and 0 <= b < n) or a == b:
                    raise ValueError(f"link class {c.name!r}: pair ({a}, {b}) is not two devices of 0..{n - 1}")
                key = (min(a, b), max(a, b))
                if key in seen:
                    raise ValueError(f"device pair {key} is listed in two link classes")
                seen.add(key)
        if not defaults and n > 1 and len(seen) < n * (n - 1) // 2:
            raise ValueError("some device pairs have no link class; add a class without 'pairs'")
        if self.gemm.tiles and self.device.compute_units is None:
            raise ValueError("gemm.tiles need device.compute_units (the SMs or CUs tiles are scheduled on)")
        domain = self.scale_up
        if domain is not None and (domain.devices <= n or domain.devices % n):
            raise ValueError(f"scale_up.devices {domain.devices} must be a multiple of devices_per_node ({n}) larger "
                             f"than one node")
        return self

    @property
    def pair_bandwidth_gbs(self) -> np.ndarray:
        """Matrix of link bandwidth between local devices (GB/s); diagonal is inf. Read-only, and built
        once per set of link classes (:func:`_pair_matrix` is cached by exactly what it reads)."""
        return _pair_matrix(self.devices_per_node, self.intra_node.link_classes)

    def link_class_name(self, a: int, b: int) -> str:
        """Name of the link class joining local devices a and b."""
        key = (min(a, b), max(a, b))
        for c in self.intra_node.link_classes:
            if c.pairs is not None and key in {(min(p), max(p)) for p in c.pairs}:
                return c.name
        return next(c.name for c in self.intra_node.link_classes if c.pairs is None)

    def reserved_gb(self, communicators: int) -> float:
        """HBM per device not available to live tensors, GB, for a framework keeping `communicators`
        communicators: the measured ``device.reserved_gb``, or the sum of the parts and, on a device whose
        HBM the CPU shares (an APU), the operating system's and the CPU's share of it."""
        d = self.device
        if d.reserved_gb is not None:
            return d.reserved_gb
        parts = d.reserve.gb(d.hbm_gb, communicators)
        return parts if d.unified_memory is None else parts + d.unified_memory.host_share_gb

    def hbm_usable_bytes(self, communicators: int) -> float:
        """HBM left to live tensors, bytes."""
        return (self.device.hbm_gb - self.reserved_gb(communicators)) * 1e9

    @property
    def total_devices(self) -> int | None:
        """Devices in the whole machine, or None when its size is not given."""
        return None if self.nodes is None else self.nodes * self.devices_per_node

    @property
    def peak_fp32_flops(self) -> float:
        """The device's fp32 SIMT peak, flop/s (``device.peak_fp32_tflops``; without it a sixteenth of the bf16
        peak [assumed: the A100's datasheet ratio, 19.5 of 312; the H100 SXM's is 67 of 989, 1/14.8])."""
        tflops = self.device.peak_fp32_tflops
        return (tflops if tflops is not None else self.device.peak_bf16_tflops / 16.0) * 1e12

    @property
    def peak_flops(self) -> float:
        """Dense bf16 peak per device, flop/s."""
        return self.device.peak_bf16_tflops * 1e12


@cache
def _pair_matrix(n: int, classes: tuple[LinkClass, ...]) -> np.ndarray:
    default = next((c.bandwidth_gbs for c in classes if c.pairs is None), np.nan)
    bw = np.full((n, n), default, dtype=np.float64)
    for c in classes:
        for a, b in c.pairs or ():
            bw[a, b] = bw[b, a] = c.bandwidth_gbs
    np.fill_diagonal(bw, np.inf)
    bw.flags.writeable = False
    return bw


def machines_dir() -> Path:
    """Folder of shipped machine YAMLs (inside the wheel, or the source checkout)."""
    return shipped_folder("machines")


def shipped_machines() -> list[str]:
    """Names of the machines that ship with axoplan."""
    return sorted(p.stem for p in machines_dir().glob("*.yaml"))


def merge_fragment(machine: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    """`machine` with `fragment` (``axoplan probe``'s output) merged in: nested mappings merge, everything else
    (numbers, lists such as a GEMM table) is replaced."""
    out = dict(machine)
    for key, value in fragment.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_fragment(out[key], value)
        else:
            out[key] = value
    return out


def _leaf_paths(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted path of every non-mapping value in `tree`."""
    paths: list[str] = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        paths += _leaf_paths(value, f"{path}.") if isinstance(value, dict) else [path]
    return paths


def _as_measured(data: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    """`data` with each parameter `fragment` sets marked measured: its ``uncertainty.sources`` entry becomes
    ``measured`` and its sourced range, which described the value it replaced, is dropped."""
    known = named_parameters()
    measured = [p for p in _leaf_paths(fragment) if p in known]
    if not measured:
        return data
    uncertainty = dict(data.get("uncertainty") or {})
    uncertainty["sources"] = {**(uncertainty.get("sources") or {}), **dict.fromkeys(measured, "measured")}
    uncertainty["ranges"] = {k: v for k, v in (uncertainty.get("ranges") or {}).items() if k not in measured}
    return {**data, "uncertainty": uncertainty}


def load_machine(name_or_path: str | Path, fragment: Path | None = None) -> Machine:
    """Load a shipped machine by name, or a user's machine YAML by path; with `fragment`, a probe's machine-YAML
    fragment of the host it was measured on merged in first (:func:`merge_fragment`)."""
    path = _resolve(str(name_or_path))
    data = load_yaml_mapping(path)
    if fragment is not None:
        check_readable(fragment, "probe fragment")
        measured = load_yaml_mapping(fragment)
        data = _as_measured(merge_fragment(data, measured), measured)
        path = Path(f"{path} + {fragment}")
    if "launch_floor_us_per_layer" in data:
        raise AxoplanError(f"{path}: 'launch_floor_us_per_layer' is gone: the host floor now follows from kernel "
                           "counts; replace it with a 'host:' block with 'op_us' (host time per framework op, "
                           "e.g. 10) as in the shipped machines/")
    check_plausible(data, MACHINE_RANGES, str(path))
    try:
        return Machine.model_validate(data)
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, str(path), Machine)) from None


def _resolve(name: str) -> Path:
    path = Path(name)
    if path.suffix in {".yaml", ".yml"} or path.exists():
        check_readable(path, "machine file")
        return path
    shipped = machines_dir() / f"{name}.yaml"
    if shipped.is_file():
        return shipped
    known = shipped_machines()
    raise AxoplanError(
        f"unknown machine {name!r}{closest_hint(name, known)}; known: {', '.join(known)} (or give a path to a YAML)"
    )
