"""The CLI's error path: an AxoplanError becomes one ``axoplan: error: ...`` line and exit 2."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from axoplan.errors import AxoplanError

__all__ = ["user_errors"]

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Report an AxoplanError as one line on stderr and exit 2, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AxoplanError as err:
            typer.echo(f"axoplan: error: {err}", err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]
