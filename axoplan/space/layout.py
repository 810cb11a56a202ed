"""4D layouts and the enumeration of every layout of G GPUs.

Vocabulary: an *axis* is a parallel axis (x, y, z, data; defined once in
:mod:`axoplan.inputs.axes`); a *dim* is a tensor dimension. A layout holds one size per axis and
its rank order (default AxoNN's, X innermost, then Y, Z, data)::

    rank = ((d·Gz + z)·Gy + y)·Gx + x

A group's *stride* is the product of the sizes inside it in that order: by default X 1,
Y Gx, Z Gx·Gy, data Gx·Gy·Gz. Stride, size and devices per node decide the group's
placement (``docs/algorithm.md`` §3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from axoplan.arrays import distinct
from axoplan.errors import AxoplanError
from axoplan.inputs.axes import AXES, AXIS_DEFS, DEFAULT_ORDER, check_order, mesh_dims, order_name, parse_tp_order

__all__ = ["AXES", "DEFAULT_ORDER", "Layout", "divisors", "ordered_factorizations", "parse_layout",
           "sequences_per_micro_step", "tokens_gathered", "activation_split"]

IntArray = npt.NDArray[np.int64]
IntLike = TypeVar("IntLike", int, "npt.NDArray[np.int64]")


@dataclass(frozen=True, slots=True)
class Layout:
    """One decomposition ``Gx × Gy × Gz × Gdata`` of the world, with its rank order."""

    gx: int
    gy: int
    gz: int
    gdata: int
    order: tuple[str, ...] = field(default=DEFAULT_ORDER, kw_only=True)  # innermost (fastest-varying) first

    def __post_init__(self) -> None:
        bad = {a: v for a, v in zip(AXES, self.sizes, strict=True) if v < 1}
        if bad:
            raise AxoplanError(f"layout sizes must be >= 1, got {bad}")
        try:
            object.__setattr__(self, "order", check_order(self.order))
        except ValueError as exc:
            raise AxoplanError(str(exc)) from None

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        """Sizes in the written order (Gx, Gy, Gz, Gdata), whatever the rank order."""
        return (self.gx, self.gy, self.gz, self.gdata)

    @property
    def world_size(self) -> int:
        return self.gx * self.gy * self.gz * self.gdata

    def size(self, axis: str) -> int:
        return self.sizes[AXES.index(axis)]

    def stride(self, axis: str) -> int:
        """Rank distance between neighbours of a group along `axis`."""
        i = self.order.index(axis)
        return int(np.prod([self.size(a) for a in self.order[:i]], dtype=np.int64))

    @property
    def mesh_dims(self) -> tuple[str, ...]:
        """DeviceMesh dimension names of `grid()`'s dimensions, outermost first."""
        return mesh_dims(self.order)

    def _shape(self) -> tuple[int, ...]:
        return tuple(self.size(a) for a in reversed(self.order))

    def grid(self) -> IntArray:
        """Global rank at index ``[outermost, ..., innermost]`` (``[d, z, y, x]`` by default);
        the one definition of rank order."""
        return np.arange(self.world_size, dtype=np.int64).reshape(self._shape())

    def groups(self, axis: str) -> IntArray:
        """``(world_size // g, g)`` array: each row lists the ranks of one group along `axis`.

        Rows are ordered by the other axes' coordinates, outermost first."""
        k = tuple(reversed(self.order)).index(axis)
        grid = self.grid()
        return np.moveaxis(grid, k, -1).reshape(-1, grid.shape[k])

    def group_row(self, axis: str, coords: dict[str, int]) -> int:
        """Index of the row of `groups(axis)` that holds the rank with these coordinates."""
        index = 0
        for a in reversed(self.order):
            if a != axis:
                index = index * self.size(a) + coords[a]
        return index

    def coords(self, rank: int) -> dict[str, int]:
        """The (x, y, z, data) coordinates of a global rank."""
        values = np.unravel_index(rank, self._shape())
        by_axis = {a: int(v) for a, v in zip(reversed(self.order), values, strict=True)}
        return {a: by_axis[a] for a in AXES}

    def to_axonn_init(self) -> dict[str, int]:
        """Keyword arguments for ``axonn.init``, from each axis's ``axonn_init`` name.

        AxoNN calls X the column/inner group (``G_intra_c``), Y the row/outer group
        (``G_intra_r``) and Z the depth group (``G_intra_d``); pipelining is off
        (``G_inter`` 1).
        """
        named = {a.axonn_init: self.size(a.name) for a in AXIS_DEFS}
        return {"G_inter": 1, "G_data": named["G_data"], "G_intra_r": named["G_intra_r"],
                "G_intra_c": named["G_intra_c"], "G_intra_d": named["G_intra_d"]}

    def __str__(self) -> str:
        """``Gx x Gy x Gz x Gdata``, then ``/zxy`` when the tensor-parallel order is not AxoNN's default."""
        text = "x".join(str(v) for v in self.sizes)
        return text if self.order == DEFAULT_ORDER else f"{text}/{order_name(self.order)}"


def sequences_per_micro_step(gx: IntLike, gy: IntLike, gz: IntLike, gdata: IntLike, micro_batch: IntLike,
                             hf_path: bool) -> IntLike:
    """The sequences one micro-step of a layout takes: ``Gdata·Gz·micro-batch``, times ``Gx·Gy`` on AxoNN's
    Hugging Face path. Z shards the batch as data parallelism does (each Z rank holds its own sequences); on the
    hf path every GPU holds its own too (the Lightning strategy samples over the whole world), on Megatron-AxoNN's
    an X·Y group shares its sequences. The global batch must be a multiple of this, and ``global batch / this`` is
    the gradient-accumulation count (the one batch rule: cost model, feasibility, advice, plans, executor). Ints
    or arrays."""
    return gdata * gz * micro_batch * tokens_gathered(gx, gy, hf_path)


def nodes_needed(gpus: int, devices_per_node: int) -> int:
    """The nodes `gpus` GPUs occupy, a partial node counted whole (the one node count: plans, budgets, exports)."""
    return -(-gpus // devices_per_node)


def tokens_gathered(gx: IntLike, gy: IntLike, hf_path: bool) -> IntLike | int:
    """How many GPUs' own tokens one of a layout's linears takes at once: its X·Y group's (``Gx·Gy``) on AxoNN's
    Hugging Face path, where every GPU holds its own sequences and each linear gathers its group's first; 1 on
    Megatron-AxoNN's, where the X·Y group shares its sequences (``docs/algorithm.md`` §4b). One half of the hf
    path's view; :func:`activation_split` is the other."""
    return gx * gy if hf_path else 1


def activation_split(gx: IntLike, gy: IntLike, hf_path: bool) -> tuple[IntLike, IntLike]:
    """How a block's activations (the work between its linears: norms, attention heads, element-wise work, the
    logits) divide over X and Y: hidden features over ``Gx`` and heads, FFN and vocabulary over ``Gy`` on
    Megatron-AxoNN's path; whole (1, 1) on the Hugging Face path, each GPU its own tokens at full width
    (``docs/algorithm.md`` §4b). Ints, or arrays shaped as `gx` and `gy`."""
    if not hf_path:
        return gx, gy
    return (np.ones_like(gx), np.ones_like(gy)) if isinstance(gx, np.ndarray) else (1, 1)


def parse_layout(text: str) -> Layout:
    """'8x4x16x64' (Gx×Gy×Gz×Gdata) -> Layout; '8x4x16x64/zxy' also names the tensor-parallel order."""
    text, _, order_text = text.partition("/")
    order = DEFAULT_ORDER
    if order_text:
        try:
            order = parse_tp_order(order_text.strip().lower())
        except ValueError as exc:
            raise AxoplanError(f"layout {text}/{order_text}: {exc}") from None
    parts = text.lower().replace("×", "x").replace(",", "x").split("x")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        sizes = []
    if len(sizes) != 4:
        raise AxoplanError(f"layout {text!r} is not four sizes Gx x Gy x Gz x Gdata, e.g. 8x4x16x64")
    return Layout(*sizes, order=order)


def divisors(n: int) -> IntArray:
    """Sorted divisors of n."""
    if n < 1:
        raise ValueError(f"divisors of {n} are undefined")
    small = np.arange(1, int(np.sqrt(n)) + 1, dtype=np.int64)
    small = small[n % small == 0]
    return distinct(np.concatenate([small, n // small]))


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
