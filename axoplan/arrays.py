"""Array helpers the ranking path needs, without numpy's slow corners.

:func:`distinct` is ``np.unique(a)`` for a plain array: sorted distinct values. ``np.unique`` checks for a
masked array first, which imports ``numpy.ma`` (about 10 ms, a sixtieth of ``axoplan rank``'s whole run).
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

__all__ = ["distinct"]

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
