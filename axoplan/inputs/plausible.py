"""Plausible values of every number in a machine or model file, in one place.

Each numeric field has a unit, a range outside which the value cannot be meant (an error that
names the field, its value, its unit and the range) and a usual range outside which it is
probably a slip (a one-line warning). Some slips have a known cause, named in the message: a
NIC faster than any NIC that exists was most likely given in Gb/s where GB/s belong.

Ranges are physical bounds with a margin, not judgements of a design: the hard limits sit
well beyond every part that exists (the fastest NIC carries 800 Gb/s = 100 GB/s; the largest
HBM today is 288 GB per GPU; the widest NVLink domain built 72 GPUs, of up to 576 the switches
can join), so a future machine passes
with at most a warning.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from axoplan.errors import AxoplanError

__all__ = ["Range", "MACHINE_RANGES", "MODEL_RANGES", "RUN_RANGES", "TRAINING_TOKENS", "PlausibilityWarning",
           "check_plausible"]


class PlausibilityWarning(UserWarning):
    """A value inside what can be meant but outside what is usual: probably a slip."""


@dataclass(frozen=True, slots=True)
class Range:
    """A field's unit, the values it can mean (``hard``, inclusive) and the usual ones."""

    unit: str
    hard: tuple[float, float]
    usual: tuple[float, float]
    slip: str = ""  # the likely cause when a value is above the hard range

    def check(self, where: str, value: float) -> str | None:
        """Raise for a value outside `hard`; return a warning for one outside `usual`, else None."""
        lo, hi = self.hard
        if not lo <= value <= hi:
            hint = f"; {self.slip}" if self.slip and value > hi else ""
            raise AxoplanError(f"{where} = {_fmt(value)} {self.unit} is outside {_fmt(lo)}-{_fmt(hi)} "
                               f"{self.unit}{hint}")
        ulo, uhi = self.usual
        if not ulo <= value <= uhi:
            hint = f"; {self.slip}" if self.slip and value > uhi else "; check it"
            return f"{where} = {_fmt(value)} {self.unit} is unusual (usually {_fmt(ulo)}-{_fmt(uhi)} {self.unit}){hint}"
        return None


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e12 else f"{v:g}"


_FRACTION = Range("(fraction)", (1e-3, 1.0), (0.05, 1.0))
_LATENCY = Range("us", (1e-3, 1e6), (0.05, 1e4))
_LINK = Range("GB/s", (1e-5, 1e5), (1e-3, 1e4))  # 1 MB/s: gloo between CPU ranks of a shared core

MACHINE_RANGES: dict[str, Range] = {
    "devices_per_node": Range("devices", (1, 4096), (1, 144)),
    "nodes": Range("nodes", (1, 1e6), (1, 1e5)),
    "device.peak_bf16_tflops": Range("TFLOP/s", (1e-3, 1e5), (0.05, 1e4)),
    "device.hbm_gb": Range("GB", (0.1, 1e4), (1, 1024)),
    "device.hbm_bandwidth_gbs": Range("GB/s", (0.1, 1e6), (5, 3e4)),
    "device.reserved_gb": Range("GB", (0, 1e4), (0, 64)),
    "device.compute_units": Range("SMs or CUs", (1, 1e5), (1, 2048)),
    "device.kernel_gap_us": Range("us", (0, 1e4), (0, 100)),
    "device.cores_per_node": Range("cores", (1, 1e5), (1, 1024)),
    "device.speed_variation": Range("(relative sigma)", (0, 0.49), (0, 0.1)),
    "device.reserve.hidden_gb": Range("GB", (0, 1e4), (0, 64)),
    "device.reserve.runtime_gb": Range("GB", (0, 1e3), (0, 16)),
    "device.reserve.per_communicator_gb": Range("GB", (0, 100), (0, 4)),
    "device.reserve.fragmentation": Range("(fraction of HBM)", (0, 0.99), (0, 0.5)),
    "device.unified_memory.host_share_gb": Range("GB", (0, 1e4), (0, 64)),
    "device.unified_memory.cpu_memory_gb": Range("GB", (0, 1e5), (0, 2048)),
    "device.unified_memory.cpu_link_gbs": _LINK,
    "intra_node.link_classes.*.bandwidth_gbs": _LINK,
    "intra_node.device_bandwidth_gbs": _LINK,
    "intra_node.latency_us": _LATENCY,
    "intra_node.efficiency": _FRACTION,
    "intra_node.processor_usage": Range("(fraction)", (0, 0.99), (0, 0.5)),
    "scale_up.devices": Range("devices", (2, 1e5), (2, 576)),  # NVLink 5 switches join at most 576 GPUs [doc NVIDIA]
    "scale_up.bandwidth_gbs": _LINK,
    "scale_up.latency_us": _LATENCY,
    "scale_up.efficiency": _FRACTION,
    "inter_node.nics_per_node": Range("NICs", (1, 1024), (1, 32)),
    "inter_node.nic_bandwidth_gbs": Range(
        "GB/s per NIC", (1e-3, 200), (0.1, 100),
        slip="no NIC is that fast (the fastest carry 800 Gb/s = 100 GB/s): did you give Gb/s? Divide by 8"),
    "inter_node.latency_us": _LATENCY,
    "inter_node.efficiency": _FRACTION,
    "inter_node.processor_usage": Range("(fraction)", (0, 0.99), (0, 0.5)),
    "inter_node.nodes_per_group": Range("nodes", (1, 1e6), (1, 1e4)),
    "inter_node.global_bandwidth_fraction": _FRACTION,
    "inter_node.scale_exponent": Range("(exponent)", (0, 1), (0, 0.5)),
    "inter_node.scale_reference_nodes": Range("nodes", (1, 1e6), (1, 1e4)),
    "gemm.max_efficiency": _FRACTION,
    "gemm.fp32_efficiency": _FRACTION,
    "gemm.half_efficiency_dim": Range("elements", (1, 1e6), (1, 1e5)),
    "gemm.tiles.*.m": Range("rows", (1, 4096), (8, 1024)),
    "gemm.tiles.*.n": Range("columns", (1, 4096), (8, 1024)),
    "gemm.tiles.*.relative_efficiency": _FRACTION,
    "gemm.table.*.efficiency": Range("(fraction)", (1e-6, 1.0), (1e-3, 1.0)),
    "gemm.table.*.m": Range("rows", (1, 1 << 24), (1, 1 << 20)),
    "gemm.table.*.n": Range("columns", (1, 1 << 24), (1, 1 << 20)),
    "gemm.table.*.k": Range("elements", (1, 1 << 24), (1, 1 << 20)),
    **{f"gemm.orientation_efficiency.{o}": Range("(relative to nn)", (1e-3, 4.0), (0.2, 1.5))
       for o in ("nn", "nt", "tn", "tt")},
    "device.peak_fp32_tflops": Range("TFLOP/s", (1e-3, 1e5), (0.1, 1e4)),
    "attention_efficiency": _FRACTION,
    "attention_triton_efficiency": _FRACTION,
    "memory_efficiency": _FRACTION,
    **{f"kernels.{k}": _FRACTION for k in ("elementwise", "activation", "norm", "copy_cast", "reduction", "loss",
                                           "optimizer", "memset", "unaligned_gemm_efficiency")},
    "kernels.attention.*.seq.*": Range("tokens", (1, 1 << 24), (16, 1 << 21)),  # * after attention: a backend's name
    "kernels.attention.*.efficiency.*": _FRACTION,
    "host.op_us": Range("us", (1e-2, 1e4), (0.5, 1e3)),
    "host.launch_us": Range("us", (0, 1e4), (0, 100)),
    "measured_bandwidth.*.bandwidth_gbs": _LINK,
    "measured_bandwidth.*.latency_us": _LATENCY,
    "measured_bandwidth.*.stride": Range("ranks", (1, 1e7), (1, 1e6)),
    "measured_bandwidth.*.size": Range("ranks", (2, 1e7), (2, 1e6)),
    "intra_node.link_classes.*.pairs.*.*": Range("device index", (0, 4095), (0, 143)),
    "launcher.queues.*.min_nodes": Range("nodes", (1, 1e6), (1, 1e5)),
    "launcher.queues.*.max_nodes": Range("nodes", (1, 1e6), (1, 1e5)),
    "launcher.queues.*.max_walltime_minutes": Range("minutes", (1, 1e6), (1, 2e4)),
    "launcher.staging.min_nodes": Range("nodes", (1, 1e6), (1, 1e5)),
    "launcher.staging.margin_minutes_per_1000_nodes": Range("minutes", (0, 1e4), (0, 120)),
    "uncertainty.model_error": Range("(relative sigma)", (0, 10), (0, 1)),
    "uncertainty.log_cov.*.*": Range("(log-space covariance)", (-100, 100), (-4, 4)),
}
"""Every numeric field of a machine YAML (``*``: any item of a list) with its unit and ranges."""

MODEL_RANGES: dict[str, Range] = {
    "num_layers": Range("layers", (1, 1e5), (1, 1024)),
    "hidden": Range("features", (1, 1 << 22), (8, 1 << 17)),
    "num_heads": Range("heads", (1, 1 << 16), (1, 2048)),
    "num_kv_heads": Range("heads", (1, 1 << 16), (1, 2048)),
    "attention_head_dim": Range("features", (1, 1 << 16), (8, 1024)),
    "ffn_hidden": Range("features", (1, 1 << 24), (8, 1 << 19)),
    "vocab": Range("tokens", (1, 1 << 27), (2, 1 << 21)),
    "max_positions": Range("positions", (0, 1 << 26), (0, 1 << 22)),
    "moe.num_experts": Range("experts", (1, 1 << 16), (2, 1024)),
    "moe.top_k": Range("experts per token", (1, 1 << 16), (1, 16)),
    "moe.expert_ffn_hidden": Range("features", (1, 1 << 24), (8, 1 << 19)),
    "moe.shared_experts": Range("experts", (0, 1 << 10), (0, 16)),
    "moe.routing_skew": Range("(most loaded over mean)", (1, 1e3), (1, 4)),
}
"""Every numeric field of a model YAML with its unit and ranges."""

RUN_RANGES: dict[str, Range] = {
    "global_batch": Range("sequences", (1, 1 << 27), (1, 1 << 20)),
    "seq_len": Range("tokens", (1, 1 << 24), (1, 1 << 21)),
    "micro_batches.*": Range("sequences", (1, 1 << 20), (1, 1 << 12)),
    "expert_tp": Range("GPUs", (1, 1 << 24), (1, 1 << 12)),
}
"""Every numeric run option (``axoplan.inputs.options.RunOptions``) with its unit and ranges."""

TRAINING_TOKENS = Range("tokens", (1, 1e15), (1, 1e14))
"""--tokens: the largest published training runs read about 4e13 tokens; 1e15 is 25 times that."""


def check_plausible(data: Mapping[str, Any], ranges: dict[str, Range], source: str) -> None:
    """Check a file's raw mapping before it is validated: no allocation sized by an absurd value.

    Raises for a boolean where a number belongs and for a value no one can mean; warns
    (PlausibilityWarning, one line each) for an unusual value. Fields without a range and
    values that are not numbers are left to the schema.
    """
    for path, value in _leaves(data):
        rule = ranges.get(_pattern(path)) or _prior_rule(path, ranges)
        if rule is None:
            continue
        where = f"{source}: field {path!r}"
        if isinstance(value, bool):
            raise AxoplanError(f"{where}: expected a number in {rule.unit}, got {str(value).lower()}")
        number = _as_number(value)
        if number is None:
            continue
        note = rule.check(where, number)
        if note is not None:
            warnings.warn(note, PlausibilityWarning, stacklevel=2)


def _as_number(value: Any) -> float | None:
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def _prior_rule(path: str, ranges: dict[str, Range]) -> Range | None:
    """A machine's prior range ``uncertainty.ranges.<field>`` (low, high) obeys the field's own range."""
    prefix = "uncertainty.ranges."
    if not path.startswith(prefix):
        return None
    return ranges.get(_pattern(path[len(prefix):].rsplit(".", 1)[0]))


def _pattern(path: str) -> str:
    """The path with list positions, and the names under a mapping keyed by name (``kernels.attention.<backend>``),
    as ``*``."""
    parts = ["*" if part.isdigit() else part for part in path.split(".")]
    for i in range(2, len(parts)):
        if parts[i - 2:i] == ["kernels", "attention"]:
            parts[i] = "*"
    return ".".join(parts)


def _leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every leaf of a YAML mapping, list items by position."""
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _leaves(value, f"{prefix}{key}.")
    elif isinstance(obj, list | tuple):
        for i, item in enumerate(obj):
            yield from _leaves(item, f"{prefix}{i}.")
    elif prefix:
        yield prefix[:-1], obj
