"""Layouts: rank order, groups, the AxoNN mapping, and the enumeration of all layouts."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from axoplan.errors import AxoplanError
from axoplan.inputs.axes import AXES, AXIS_DEFS, DEFAULT_ORDER
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import Layout, divisors, ordered_factorizations, parse_layout


def _prime_exponents(n: int) -> list[int]:
    exps, p = Counter(), 2
    while p * p <= n:
        while n % p == 0:
            exps[p] += 1
            n //= p
        p += 1
    if n > 1:
        exps[n] += 1
    return list(exps.values())


def test_816_layouts_of_32768():
    """Ordered factorizations of 2^15 into four factors: C(15+3, 3) = 816 (brief §5)."""
    gx, gy, gz, gd = ordered_factorizations(2**15)
    assert gx.size == 816


def test_6144_is_not_a_power_of_two_but_enumerates():
    """6144 = 3·2^11: C(1+3,3)·C(11+3,3) = 4·364 = 1456 layouts, some with a factor 3."""
    gx, gy, gz, gd = ordered_factorizations(6144)
    assert gx.size == 1456
    assert ((gx * gy * gz * gd) == 6144).all()
    assert (gd % 3 == 0).any() and (gx % 3 == 0).any()


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=5000))
def test_enumeration_matches_divisor_function(g: int):
    """Count = Π C(e_i + 3, 3) over the prime exponents e_i; all distinct; product = G."""
    gx, gy, gz, gd = ordered_factorizations(g)
    expected = math.prod(math.comb(e + 3, 3) for e in _prime_exponents(g))
    assert gx.size == expected
    assert ((gx * gy * gz * gd) == g).all()
    assert len(set(zip(gx.tolist(), gy.tolist(), gz.tolist(), gd.tolist(), strict=True))) == expected


def test_candidates_cross_options():
    opts = RunOptions(micro_batches=(1, 2, 4), recompute="search", cache_weights="on", tp_order="xyz")
    c = Candidates.enumerate(64, opts)
    assert len(c) == ordered_factorizations(64)[0].size * 3 * 2
    assert set(c.micro_batch.tolist()) == {1, 2, 4}
    assert c.cache_weights.all()


def test_every_distinct_tensor_parallel_order_is_searched_once():
    """A layout with k tensor-parallel axes above 1 has k! distinct placements (an axis of size 1
    can sit anywhere without moving the others' strides): 1, 1, 2 or 6 orders."""
    import math

    opts = RunOptions(micro_batches=(1,), recompute="off", cache_weights="on")
    c = Candidates.enumerate(64, opts)
    gx, gy, gz, _ = ordered_factorizations(64)
    expected = sum(math.factorial(int(x > 1) + int(y > 1) + int(z > 1)) for x, y, z in zip(gx, gy, gz, strict=True))
    assert len(c) == expected
    seen = {(int(c.gx[i]), int(c.gy[i]), int(c.gz[i]), int(c.gdata[i]), tuple(int(v[i]) for v in c.strides().values()))
            for i in range(len(c))}
    assert len(seen) == len(c)  # no two rows place the same layout the same way
    two = [c.order(i) for i in range(len(c)) if (c.gx[i], c.gy[i], c.gz[i]) == (2, 1, 4)]
    assert len(two) == 2 and ("x", "y", "z", "data") in two  # the default order is the one kept


def test_divisors():
    assert divisors(12).tolist() == [1, 2, 3, 4, 6, 12]
    assert divisors(1).tolist() == [1]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
def test_grid_follows_axonn_rank_formula(gx: int, gy: int, gz: int, gd: int):
    lay = Layout(gx, gy, gz, gd)
    grid = lay.grid()
    for d, z, y, x in np.ndindex(grid.shape):
        assert grid[d, z, y, x] == ((d * gz + z) * gy + y) * gx + x
        assert lay.coords(int(grid[d, z, y, x])) == {"x": x, "y": y, "z": z, "data": d}
    for axis in ("x", "y", "z", "data"):
        groups = lay.groups(axis)
        assert groups.shape == (lay.world_size // lay.size(axis), lay.size(axis))
        assert sorted(groups.ravel().tolist()) == list(range(lay.world_size))
        if lay.size(axis) > 1:
            assert set(np.diff(groups, axis=1).ravel().tolist()) == {lay.stride(axis)}


def test_axonn_2221_groups_match_reference():
    """executor.md §1.1: layout 2,2,2,1, rank 7 has inner [6,7], outer [5,7], depth [3,7]."""
    lay = Layout(2, 2, 2, 1)
    assert [6, 7] in lay.groups("x").tolist()
    assert [5, 7] in lay.groups("y").tolist()
    assert [3, 7] in lay.groups("z").tolist()


def test_axonn_init_mapping():
    assert Layout(8, 4, 16, 2).to_axonn_init() == {
        "G_inter": 1, "G_data": 2, "G_intra_r": 4, "G_intra_c": 8, "G_intra_d": 16}


def test_parse_layout():
    assert parse_layout("8x4x16x64") == Layout(8, 4, 16, 64)
    assert parse_layout("8×4×16×64") == Layout(8, 4, 16, 64)
    for bad in ("8x4x16", "axbxcxd", "8x4x0x2"):
        with pytest.raises(AxoplanError):
            parse_layout(bad)


ORDERS = st.permutations(AXES)


@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), ORDERS)
def test_any_rank_order_is_one_value(gx: int, gy: int, gz: int, gd: int, order: list[str]):
    """Rank = mixed-radix number in `order` (innermost first); groups vary only their own coordinate."""
    lay = Layout(gx, gy, gz, gd, order=tuple(order))
    for rank in range(lay.world_size):
        coords = lay.coords(rank)
        assert rank == sum(coords[a] * lay.stride(a) for a in AXES)
        for axis in AXES:
            row = lay.groups(axis)[lay.group_row(axis, coords)].tolist()
            assert rank in row
            assert [lay.coords(r)[axis] for r in row] == list(range(lay.size(axis)))
            assert all(lay.coords(r)[a] == coords[a] for r in row for a in AXES if a != axis)
    inside = 1
    for axis in order:
        assert lay.stride(axis) == inside
        inside *= lay.size(axis)
    assert lay.mesh_dims == tuple(reversed(order))


def test_default_order_is_axonns():
    assert DEFAULT_ORDER == ("x", "y", "z", "data")
    assert Layout(2, 3, 4, 5).mesh_dims == ("data", "z", "y", "x")
    assert Layout(2, 3, 4, 5, order=("y", "x", "z", "data")).stride("x") == 3


def test_a_rank_order_that_is_not_a_permutation_is_refused():
    with pytest.raises(AxoplanError, match="not a permutation"):
        Layout(2, 2, 1, 1, order=("x", "x", "z", "data"))


@pytest.mark.parametrize("tp_order", ["search", "xyz", "zxy", "yzx"])
def test_vectorised_strides_are_each_layouts(tp_order: str):
    """The candidate table's strides (one array per axis) equal each layout's own strides, in
    its own order (one fixed order, or all of them searched)."""
    c = Candidates.enumerate(24, RunOptions(micro_batches=(1,), recompute="off", cache_weights="off",
                                            tp_order=tp_order))
    strides = c.strides()
    for i in range(len(c)):
        lay = c.layout(i)
        if tp_order != "search":
            assert lay.order == (*tp_order, "data")
        assert {a: int(strides[a][i]) for a in AXES} == {a: lay.stride(a) for a in AXES}


def test_plan_fields_and_table_headers_follow_the_axes():
    from axoplan.records.plan import LayoutSpec

    assert tuple(LayoutSpec.model_fields) == (*(a.field for a in AXIS_DEFS), "tp_order")
    assert LayoutSpec.of(Layout(2, 3, 4, 5)).to_layout() == Layout(2, 3, 4, 5)
    permuted = Layout(2, 3, 4, 5, order=("z", "x", "y", "data"))
    assert LayoutSpec.of(permuted).tp_order == "zxy" and LayoutSpec.of(permuted).to_layout() == permuted
    assert set(Layout(2, 3, 4, 5).to_axonn_init()) == {"G_inter", *(a.axonn_init for a in AXIS_DEFS)}
