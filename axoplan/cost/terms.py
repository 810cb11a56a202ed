"""One collective of one layer in one phase, for every candidate: the unit the cost model sums and
`explain` lists."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["CollectiveTerm"]

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class CollectiveTerm:
    """One collective of one layer in one phase, for every candidate.

    ``seconds_per_call`` is the collective's own time, ``exposed_per_call`` the part of it the
    step waits for. A *drain* row (``op`` ending in "(drain)") adds no traffic of its own
    (``seconds_per_call`` 0): it is the extra wait for a collective already counted in another
    row, at a point where nothing is left to hide it behind."""

    layer: str
    phase: str
    op: str
    axis: str
    group_size: Ints
    stride: Ints
    nbytes: Floats
    calls_per_step: Floats
    bandwidth_gbs: Floats
    seconds_per_call: Floats
    exposed_per_call: Floats
    total_s: Floats = field(init=False)  # calls_per_step · seconds_per_call
    exposed_s: Floats = field(init=False)  # calls_per_step · exposed_per_call

    def __post_init__(self) -> None:  # products computed once: every column and report reads them
        object.__setattr__(self, "total_s", self.calls_per_step * self.seconds_per_call)
        object.__setattr__(self, "exposed_s", self.calls_per_step * self.exposed_per_call)

    @property
    def is_drain(self) -> bool:
        """A wait for a collective counted in another row (no call of its own)."""
        return self.op.endswith("(drain)")
