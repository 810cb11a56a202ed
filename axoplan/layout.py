"""4D layouts, the rank order, and the enumeration of every layout of G GPUs.

Vocabulary: an *axis* is a parallel axis (x, y, z, data); a *dim* is a tensor dimension.
Rank order (AxoNN ``communication.py``): X innermost, then Y, then Z, then data::

    rank = ((d·Gz + z)·Gy + y)·Gx + x

A group's *stride* is the product of the sizes inside it: X 1, Y Gx, Z Gx·Gy,
data Gx·Gy·Gz. Stride, size and devices per node decide the group's placement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from axoplan.errors import AxoplanError

__all__ = ["AXES", "Layout", "divisors", "ordered_factorizations", "parse_layout"]

AXES: Final = ("x", "y", "z", "data")  # fastest-varying rank first

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Layout:
    """One decomposition ``Gx × Gy × Gz × Gdata`` of the world."""

    gx: int
    gy: int
    gz: int
    gdata: int

    def __post_init__(self) -> None:
        bad = {a: v for a, v in zip(AXES, self.sizes, strict=True) if v < 1}
        if bad:
            raise AxoplanError(f"layout sizes must be >= 1, got {bad}")

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        return (self.gx, self.gy, self.gz, self.gdata)

    @property
    def world_size(self) -> int:
        return self.gx * self.gy * self.gz * self.gdata

    def stride(self, axis: str) -> int:
        """Rank distance between neighbours of a group along `axis`."""
        i = AXES.index(axis)
        return int(np.prod(self.sizes[:i], dtype=np.int64))

    def size(self, axis: str) -> int:
        return self.sizes[AXES.index(axis)]

    def grid(self) -> IntArray:
        """Global rank at index ``[d, z, y, x]``; the one definition of rank order."""
        return np.arange(self.world_size, dtype=np.int64).reshape(self.gdata, self.gz, self.gy, self.gx)

    def groups(self, axis: str) -> IntArray:
        """``(world_size // g, g)`` array: each row lists the ranks of one group along `axis`."""
        k = ("data", "z", "y", "x").index(axis)
        grid = self.grid()
        return np.moveaxis(grid, k, -1).reshape(-1, grid.shape[k])

    def coords(self, rank: int) -> dict[str, int]:
        """The (x, y, z, data) coordinates of a global rank."""
        d, z, y, x = (int(v) for v in np.unravel_index(rank, (self.gdata, self.gz, self.gy, self.gx)))
        return {"x": x, "y": y, "z": z, "data": d}

    def to_axonn_init(self) -> dict[str, int]:
        """Keyword arguments for ``axonn.init``: the only place the naming map lives.

        AxoNN calls X the column/inner group (``G_intra_c``), Y the row/outer group
        (``G_intra_r``) and Z the depth group (``G_intra_d``); pipelining is off.
        """
        return {"G_inter": 1, "G_data": self.gdata, "G_intra_r": self.gy, "G_intra_c": self.gx,
                "G_intra_d": self.gz}

    def __str__(self) -> str:
        return f"{self.gx}x{self.gy}x{self.gz}x{self.gdata}"


def parse_layout(text: str) -> Layout:
    """'8x4x16x64' (Gx×Gy×Gz×Gdata) -> Layout."""
    parts = text.lower().replace("×", "x").replace(",", "x").split("x")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        sizes = []
    if len(sizes) != 4:
        raise AxoplanError(f"layout {text!r} is not four sizes Gx x Gy x Gz x Gdata, e.g. 8x4x16x64")
    return Layout(*sizes)


def divisors(n: int) -> IntArray:
    """Sorted divisors of n."""
    if n < 1:
        raise ValueError(f"divisors of {n} are undefined")
    small = np.arange(1, int(np.sqrt(n)) + 1, dtype=np.int64)
    small = small[n % small == 0]
    return np.unique(np.concatenate([small, n // small]))


def ordered_factorizations(world_size: int) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """Every ``(gx, gy, gz, gdata)`` with product `world_size`, as four aligned arrays.

    For ``G = p^a`` there are ``C(a+3, 3)`` of them (816 for 2^15).
    """
    d = divisors(world_size)
    gx, gy = (a.ravel() for a in np.meshgrid(d, d, indexing="ij"))
    keep = world_size % (gx * gy) == 0
    gx, gy = gx[keep], gy[keep]
    gx, gz = np.repeat(gx, d.size), np.tile(d, gx.size)
    gy = np.repeat(gy, d.size)
    keep = world_size % (gx * gy * gz) == 0
    gx, gy, gz = gx[keep], gy[keep], gz[keep]
    return gx, gy, gz, world_size // (gx * gy * gz)
