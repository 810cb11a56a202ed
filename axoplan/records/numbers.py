"""Numbers as the JSON outputs write them: what is whole by nature as an integer (issue 30).

The prediction's columns are float arrays, so a row holds ``64.0`` micro-batches and ``51080413184.0``
bytes. A count (``grad_accum``), a flag (``tied``, ``mem_tight``: 0 or 1) and a byte count (every
``*_bytes`` column) are written as integers; every other number (seconds, fractions, rates) stays a float,
even where it is 0.0. Reading a file back gives the same floats: ``64`` reads as ``64.0``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["WHOLE_COLUMNS", "is_whole", "json_numbers"]

WHOLE_COLUMNS = frozenset({"grad_accum", "tied", "mem_tight"})
"""Columns that are counts or flags; with every column whose name ends in ``_bytes``."""


def is_whole(name: str) -> bool:
    """Whether column `name` is whole by nature (a count, a flag or bytes)."""
    return name in WHOLE_COLUMNS or name.endswith("_bytes")


def json_numbers(record: Mapping[str, Any]) -> dict[str, Any]:
    """`record` with its whole columns' finite floats as integers (bytes rounded to the byte)."""
    return {k: round(v) if isinstance(v, float) and is_whole(k) and math.isfinite(v) else v
            for k, v in record.items()}
