"""All candidates of a search as aligned arrays: layout × micro-batch × option choices."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np
import numpy.typing as npt

from axoplan.axes import AXIS_DEFS, DEFAULT_ORDER, check_order, strides
from axoplan.layout import Layout, ordered_factorizations
from axoplan.options import RunOptions

__all__ = ["Candidates"]

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Candidates:
    """Row i is one candidate: a layout, a per-GPU micro-batch, recompute and caching.

    `order` is the rank order every row shares (innermost axis first, ``axoplan.axes``).
    """

    gx: Ints
    gy: Ints
    gz: Ints
    gdata: Ints
    micro_batch: Ints
    recompute: Bools
    cache_weights: Bools
    order: tuple[str, ...] = field(default=DEFAULT_ORDER, kw_only=True)

    @classmethod
    def enumerate(cls, world_size: int, options: RunOptions, order: tuple[str, ...] = DEFAULT_ORDER) -> Candidates:
        """Every ordered factorization of `world_size` crossed with the searched options, in rank `order`."""
        gx, gy, gz, gd = ordered_factorizations(world_size)
        mbs = np.array(options.micro_batches, dtype=np.int64)
        rec = np.array(RunOptions.choice_values(options.recompute))
        cache = np.array(RunOptions.choice_values(options.cache_weights))
        lay, mb, rc, ch = (a.ravel() for a in np.meshgrid(
            np.arange(gx.size), np.arange(mbs.size), np.arange(rec.size), np.arange(cache.size), indexing="ij"))
        if cache.size > 1:  # with Gz = 1 nothing is gathered, so caching is a no-op: one row, not two identical
            keep = ~((gz[lay] == 1) & cache[ch])
            lay, mb, rc, ch = lay[keep], mb[keep], rc[keep], ch[keep]
        return cls(gx[lay], gy[lay], gz[lay], gd[lay], mbs[mb], rec[rc], cache[ch], order=check_order(order))

    @classmethod
    def single(cls, layout: Layout, micro_batch: int, recompute: bool, cache_weights: bool) -> Candidates:
        def one(v: object, dtype: type) -> npt.NDArray:
            return np.array([v], dtype=dtype)

        sizes = {a.field: one(layout.size(a.name), np.int64) for a in AXIS_DEFS}
        return cls(**sizes, micro_batch=one(micro_batch, np.int64), recompute=one(recompute, bool),
                   cache_weights=one(cache_weights, bool), order=layout.order)

    def __len__(self) -> int:
        return int(self.gx.size)

    def take(self, index: npt.ArrayLike) -> Candidates:
        """The candidates at `index` (an int array or boolean mask)."""
        arrays = {f.name: getattr(self, f.name)[index] for f in fields(self) if f.name != "order"}
        return replace(self, **arrays)

    def layout(self, i: int) -> Layout:
        return Layout(*(int(getattr(self, a.field)[i]) for a in AXIS_DEFS), order=self.order)

    def sizes(self) -> dict[str, Ints]:
        """Each axis's group size per candidate, by axis name."""
        return {a.name: getattr(self, a.field) for a in AXIS_DEFS}

    def strides(self) -> dict[str, Ints]:
        """Each axis's group stride per candidate, in this table's rank order."""
        return strides(self.sizes(), self.order)

    @property
    def world_size(self) -> Ints:
        return self.gx * self.gy * self.gz * self.gdata
