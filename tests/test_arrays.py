"""axoplan.arrays.distinct is np.unique for plain arrays, and the ranking path does not import numpy.ma."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from axoplan.arrays import distinct, distinct_rows


@given(arrays(np.int64, st.integers(0, 40), elements=st.integers(-50, 50)))
def test_distinct_is_np_unique_on_ints(a: np.ndarray) -> None:
    assert np.array_equal(distinct(a), np.unique(a))
    assert distinct(a).dtype == a.dtype


@given(arrays(np.float64, st.tuples(st.integers(0, 6), st.integers(0, 6)),
              elements=st.floats(-1e6, 1e6, allow_nan=False)))
def test_distinct_is_np_unique_on_2d_floats(a: np.ndarray) -> None:
    assert np.array_equal(distinct(a), np.unique(a))


@given(arrays(np.int64, st.tuples(st.integers(0, 30), st.integers(1, 4)), elements=st.integers(-3, 3)))
def test_distinct_rows_are_np_uniques_rows_and_rebuild_the_array(a: np.ndarray) -> None:
    first, inverse = distinct_rows(a)
    assert np.array_equal(a[first][inverse], a)
    if len(a):
        assert np.array_equal(a[first], np.unique(a, axis=0))


def test_ranking_does_not_import_numpy_ma() -> None:
    """np.unique's masked-array check imports numpy.ma (about 10 ms of `axoplan rank`); the ranking path avoids it."""
    code = ("import sys; from axoplan.cli import main; sys.argv = ['axoplan', 'rank', '--model', '5B', '--gpus', '64', "
            "'--machine', 'frontier', '--top', '1']\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('numpy.ma' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"
