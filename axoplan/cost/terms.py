"""One collective of one layer in one phase, for every candidate: the unit the cost model sums and
`explain` lists, and its one constructor (:func:`collective_term`), which reads the group it runs on."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from axoplan.cost.groups import Group

__all__ = ["CollectiveTerm", "collective_term"]

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


def collective_term(layer: str, phase: str, op: str, axis: str, group: Group, nbytes: Floats,
                    calls_per_step: Floats, seconds_per_call: Floats,
                    exposed_per_call: Floats | None = None) -> CollectiveTerm:
    """A collective of `layer` in `phase` on `group` (its size, stride and bandwidth recorded), counted under
    `axis`; exposed wholly unless `exposed_per_call` says what is left after overlap (a blocking collective)."""
    exposed = seconds_per_call if exposed_per_call is None else exposed_per_call
    return CollectiveTerm(layer, phase, op, axis, group.members, group.stride, nbytes,
                          calls_per_step, group.bw, seconds_per_call, exposed)
