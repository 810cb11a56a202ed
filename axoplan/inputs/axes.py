"""The parallel axes of a 4D layout: one ordered definition everything else derives from.

Each axis has a name (``x``), a role, a label for tables and flags (``Gx``), the field
that holds its size in a layout, a plan or a candidate table (``gx``), its DeviceMesh
dimension name, and its keyword in ``axonn.init`` (``docs/algorithm.md`` §2).

The *rank order* (which axis varies fastest with the global rank) is a separate value,
a permutation of the axis names, innermost first. AxoNN's default is X innermost, then
Y, Z and data (``docs/algorithm.md`` §3)::

    rank = ((d·Gz + z)·Gy + y)·Gx + x

A group's *stride* along an axis is the product of the sizes of the axes inside it in
that order. Like torchtitan's ``ParallelDims`` (one list of dimension names and sizes
from which the mesh is built) and picotron's process-group manager (one grid, every
group a slice of it), the groups, strides, mesh names and ``init`` arguments all read
this one list.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Final

import numpy as np
import numpy.typing as npt
from pydantic import AfterValidator

__all__ = ["Axis", "AXIS_DEFS", "AXES", "DEFAULT_ORDER", "AXIS_BY_NAME", "check_order", "strides", "mesh_dims",
           "label", "LABELS", "FIELDS", "TP_AXES", "TP_ORDERS", "order_name", "parse_tp_order", "axonn_order",
           "tp_order_name", "TpOrderName"]

Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Axis:
    """One parallel axis."""

    name: str
    role: str
    label: str
    field: str
    mesh_name: str
    axonn_init: str


AXIS_DEFS: Final[tuple[Axis, ...]] = (
    Axis("x", "tensor: input features of a plain layer, output features of a transposed one", "Gx", "gx", "x",
         "G_intra_c"),
    Axis("y", "tensor: output features of a plain layer, input features of a transposed one; heads", "Gy", "gy",
         "y", "G_intra_r"),
    Axis("z", "depth: weights sharded (ZeRO-3 style), batch split", "Gz", "gz", "z", "G_intra_d"),
    Axis("data", "data: weights replicated, batch split", "Gdata", "gdata", "data", "G_data"),
)
"""The axes in the order sizes are written (``Gx × Gy × Gz × Gdata``)."""

AXES: Final[tuple[str, ...]] = tuple(a.name for a in AXIS_DEFS)
FIELDS: Final[tuple[str, ...]] = tuple(a.field for a in AXIS_DEFS)
LABELS: Final[tuple[str, ...]] = tuple(a.label for a in AXIS_DEFS)
AXIS_BY_NAME: Final[Mapping[str, Axis]] = {a.name: a for a in AXIS_DEFS}
DEFAULT_ORDER: Final[tuple[str, ...]] = ("x", "y", "z", "data")
"""AxoNN's rank order, innermost (fastest-varying) axis first."""


TP_AXES: Final[tuple[str, ...]] = ("x", "y", "z")
"""The tensor-parallel axes, whose order inside the block AxoNN's ``tensor_parallel_order`` chooses."""

TP_ORDERS: Final[tuple[tuple[str, ...], ...]] = tuple(
    (*p, "data") for p in itertools.permutations(TP_AXES))
"""Every rank order AxoNN can run: a permutation of X, Y, Z inside, data outermost; the default first."""


def order_name(order: Sequence[str]) -> str:
    """``xyz`` for the order X, Y, Z, data (innermost first; data is always outermost)."""
    return "".join(a for a in order if a != "data")


def parse_tp_order(text: str) -> tuple[str, ...]:
    """The rank order named by ``xyz``-style text (ValueError if it is not a permutation of x, y, z)."""
    if sorted(text) != sorted(TP_AXES):
        raise ValueError(f"tensor-parallel order {text!r} is not a permutation of 'xyz' (innermost first)")
    return (*text, "data")


def tp_order_name(text: str) -> str:
    """`text` if it names a tensor-parallel order (``xyz``, ``zxy``, ...; ValueError otherwise)."""
    parse_tp_order(text)
    return text


TpOrderName = Annotated[str, AfterValidator(tp_order_name)]
"""A field holding a tensor-parallel order's name: what plans, saved rankings and options accept."""


def axonn_order(order: Sequence[str]) -> list[str]:
    """AxoNN's ``tensor_parallel_order`` for `order`: its letters c (X), r (Y), d (Z), innermost first."""
    return [AXIS_BY_NAME[a].axonn_init[-1] for a in order if a != "data"]


def check_order(order: Sequence[str]) -> tuple[str, ...]:
    """`order` as a tuple, if it is a permutation of the axis names (ValueError otherwise)."""
    out = tuple(order)
    if sorted(out) != sorted(AXES):
        raise ValueError(f"rank order {out} is not a permutation of {AXES}")
    return out


def label(axis: str) -> str:
    return AXIS_BY_NAME[axis].label


def strides(sizes: Mapping[str, Ints], order: Sequence[str] = DEFAULT_ORDER) -> dict[str, Ints]:
    """Each axis's stride, vectorised over candidates: the product of the sizes inside it."""
    out: dict[str, Ints] = {}
    inside = np.ones_like(sizes[order[0]])
    for axis in order:
        out[axis] = inside
        inside = inside * sizes[axis]
    return out


def mesh_dims(order: Sequence[str] = DEFAULT_ORDER) -> tuple[str, ...]:
    """DeviceMesh dimension names, outermost first (a mesh's last dimension varies fastest)."""
    return tuple(AXIS_BY_NAME[a].mesh_name for a in reversed(order))
