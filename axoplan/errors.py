"""User-facing errors.

Every mistake a user can make (an unknown name, a bad YAML field, a GPU count with
no feasible layout) raises an :class:`AxoplanError` whose message is one line that
says what is wrong and, where possible, how to fix it. The CLI prints that line and
exits with status 2; it never shows a traceback for these.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["AxoplanError", "closest_hint"]


class AxoplanError(Exception):
    """A mistake in the user's input, reported as one line without a traceback."""


def closest_hint(name: str, known: Iterable[str]) -> str:
    """Return ' (did you mean X?)' for the closest known name, or '' if none is close."""
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""
