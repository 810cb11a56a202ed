"""Plausible values of every number in a machine or model file, in one place.

A machine's ranges are its registry's (:mod:`axoplan.inputs.parameters`, one entry per field); a model's and a
run's are here.

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
from axoplan.inputs.parameters import MACHINE_PARAMETERS, format_bound

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
            raise AxoplanError(f"{where} = {format_bound(value)} {self.unit} is outside {format_bound(lo)}-"
                               f"{format_bound(hi)} {self.unit}{hint}")
        ulo, uhi = self.usual
        if not ulo <= value <= uhi:
            hint = f"; {self.slip}" if self.slip and value > uhi else "; check it"
            return (f"{where} = {format_bound(value)} {self.unit} is unusual (usually {format_bound(ulo)}-"
                    f"{format_bound(uhi)} {self.unit}){hint}")
        return None


MACHINE_RANGES: dict[str, Range] = {p.path: Range(p.unit, p.hard, p.usual, p.slip) for p in MACHINE_PARAMETERS}
"""Every numeric field of a machine YAML (``*``: any item of a list) with its unit and ranges, from the registry
(:mod:`axoplan.inputs.parameters`)."""

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
