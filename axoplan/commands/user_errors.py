"""The CLI's error path: an AxoplanError (or a file error that escaped ``axoplan.fileio``) becomes one
``axoplan: error: ...`` line and exit 2."""

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
        except (OSError, UnicodeDecodeError) as exc:  # a file path that escaped axoplan.fileio: still one line
            from pathlib import Path

            from axoplan.fileio import file_error

            where = getattr(exc, "filename", None) or "input"
            typer.echo(f"axoplan: error: {file_error(Path(str(where)), exc)}", err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]
