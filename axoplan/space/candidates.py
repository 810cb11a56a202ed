"""All candidates of a search as aligned arrays: layout × micro-batch × option choices."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np
import numpy.typing as npt

from axoplan.inputs.axes import AXIS_DEFS, DEFAULT_ORDER, TP_ORDERS, check_order, order_name, parse_tp_order, strides
from axoplan.inputs.options import RunOptions
from axoplan.space.layout import Layout, ordered_factorizations

__all__ = ["Candidates"]

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Candidates:
    """Row i is one candidate: a layout, its rank order, a per-GPU micro-batch, recompute and caching.

    Row i's rank order (innermost axis first, ``axoplan.inputs.axes``) is ``orders[order_id[i]]``.
    """

    gx: Ints
    gy: Ints
    gz: Ints
    gdata: Ints
    micro_batch: Ints
    recompute: Bools
    cache_weights: Bools
    order_id: Ints | None = field(default=None, kw_only=True)
    orders: tuple[tuple[str, ...], ...] = field(default=(DEFAULT_ORDER,), kw_only=True)

    def __post_init__(self) -> None:
        if self.order_id is None:
            object.__setattr__(self, "order_id", np.zeros_like(self.gx))
        object.__setattr__(self, "orders", tuple(check_order(o) for o in self.orders))

    @classmethod
    def enumerate(cls, world_size: int, options: RunOptions) -> Candidates:
        """Every ordered factorization of `world_size` in every distinct tensor-parallel order
        (``options.tp_order``), crossed with the searched options."""
        gx, gy, gz, gd, order_id, orders = _layouts_with_orders(world_size, options.tp_order)
        mbs = np.array(options.micro_batches, dtype=np.int64)
        rec = np.array(RunOptions.choice_values(options.recompute))
        cache = np.array(RunOptions.choice_values(options.cache_weights))
        lay, mb, rc, ch = (a.ravel() for a in np.meshgrid(
            np.arange(gx.size), np.arange(mbs.size), np.arange(rec.size), np.arange(cache.size), indexing="ij"))
        if cache.size > 1:  # with Gz = 1 nothing is gathered, so caching is a no-op: one row, not two identical
            keep = ~((gz[lay] == 1) & cache[ch])
            lay, mb, rc, ch = lay[keep], mb[keep], rc[keep], ch[keep]
        return cls(gx[lay], gy[lay], gz[lay], gd[lay], mbs[mb], rec[rc], cache[ch], order_id=order_id[lay],
                   orders=orders)

    @classmethod
    def single(cls, layout: Layout, micro_batch: int, recompute: bool, cache_weights: bool) -> Candidates:
        def one(v: object, dtype: type) -> npt.NDArray:
            return np.array([v], dtype=dtype)

        sizes = {a.field: one(layout.size(a.name), np.int64) for a in AXIS_DEFS}
        return cls(**sizes, micro_batch=one(micro_batch, np.int64), recompute=one(recompute, bool),
                   cache_weights=one(cache_weights, bool), order_id=one(0, np.int64), orders=(layout.order,))

    def __len__(self) -> int:
        return int(self.gx.size)

    def take(self, index: npt.ArrayLike) -> Candidates:
        """The candidates at `index` (an int array or boolean mask)."""
        arrays = {f.name: getattr(self, f.name)[index] for f in fields(self) if f.name != "orders"}
        return replace(self, **arrays)

    def layout(self, i: int) -> Layout:
        return Layout(*(int(getattr(self, a.field)[i]) for a in AXIS_DEFS), order=self.order(i))

    def order(self, i: int) -> tuple[str, ...]:
        """Row i's rank order."""
        assert self.order_id is not None
        return self.orders[int(self.order_id[i])]

    def order_names(self) -> list[str]:
        """Each row's tensor-parallel order as ``xyz`` text (innermost first)."""
        assert self.order_id is not None
        names = [order_name(o) for o in self.orders]
        return [names[k] for k in self.order_id.tolist()]

    def sizes(self) -> dict[str, Ints]:
        """Each axis's group size per candidate, by axis name."""
        return {a.name: getattr(self, a.field) for a in AXIS_DEFS}

    def strides(self) -> dict[str, Ints]:
        """Each axis's group stride per candidate, in its own rank order."""
        assert self.order_id is not None
        sizes = self.sizes()
        out = strides(sizes, self.orders[0])
        for k, order in enumerate(self.orders[1:], start=1):
            rows = self.order_id == k
            if rows.any():
                these = strides(sizes, order)
                out = {a: np.where(rows, these[a], v) for a, v in out.items()}
        return out

    @property
    def world_size(self) -> Ints:
        return self.gx * self.gy * self.gz * self.gdata


def _layouts_with_orders(world_size: int, tp_order: str) -> tuple[Ints, Ints, Ints, Ints, Ints,
                                                                     tuple[tuple[str, ...], ...]]:
    """Every factorization once per tensor-parallel order that places its groups differently.

    Orders that give every axis of more than one GPU the same stride are the same placement
    (an axis of size 1 can sit anywhere), so only the first of them (the default order comes
    first) is kept: a layout with one tensor-parallel axis above 1 is searched once."""
    gx, gy, gz, gd = ordered_factorizations(world_size)
    if tp_order != "search":
        return gx, gy, gz, gd, np.zeros_like(gx), (parse_tp_order(tp_order),)
    sizes = {"x": gx, "y": gy, "z": gz, "data": gd}
    keys = []
    for order in TP_ORDERS:
        st = strides(sizes, order)
        keys.append(np.stack([np.where(sizes[a] > 1, st[a], 0) for a in ("x", "y", "z")], axis=1))
    stacked = np.stack(keys, axis=1)  # layouts x orders x 3
    keep = np.ones(stacked.shape[:2], dtype=bool)
    for k in range(1, len(TP_ORDERS)):
        same = np.zeros(len(gx), dtype=bool)
        for j in range(k):
            same |= keep[:, j] & (stacked[:, k] == stacked[:, j]).all(axis=1)
        keep[:, k] = ~same
    lay, order_id = np.nonzero(keep)
    return gx[lay], gy[lay], gz[lay], gd[lay], order_id.astype(np.int64), TP_ORDERS
