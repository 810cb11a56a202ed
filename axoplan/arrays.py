"""Array helpers the ranking path needs, without numpy's slow corners.

:func:`distinct` is ``np.unique(a)`` for a plain array: sorted distinct values, and :func:`distinct_rows` is
``np.unique(a, axis=0, return_index=True, return_inverse=True)``'s indices. ``np.unique`` checks for a masked
array first, which imports ``numpy.ma`` (about 10 ms, a sixtieth of ``axoplan rank``'s whole run).
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

__all__ = ["distinct", "distinct_rows"]

T = TypeVar("T", bound=np.generic)


def distinct(a: npt.NDArray[T]) -> npt.NDArray[T]:
    """The sorted distinct values of `a`, flattened (``np.unique(a)`` without its masked-array check)."""
    s = np.sort(a.ravel())
    if s.size == 0:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def distinct_rows(a: npt.NDArray[T]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """For a 2-D `a`: the index of one row of each distinct row, in the rows' sorted order, and each row's number
    among them, so that ``a[first][inverse]`` is `a` (``np.unique(a, axis=0, ...)``'s indices, without numpy.ma)."""
    if a.shape[0] == 0:
        return np.empty(0, dtype=np.intp), np.empty(0, dtype=np.intp)
    order = np.lexsort(a.T[::-1])  # by the first column, then the second, ...
    s = a[order]
    new = np.empty(s.shape[0], dtype=bool)
    new[0] = True
    np.any(s[1:] != s[:-1], axis=1, out=new[1:])
    inverse = np.empty(s.shape[0], dtype=np.intp)
    inverse[order] = np.cumsum(new) - 1
    return order[new], inverse
