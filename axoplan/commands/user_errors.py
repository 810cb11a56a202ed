"""The CLI's error path: an AxoplanError (or a file error that escaped ``axoplan.fileio``) becomes one
``axoplan: error: ...`` line and exit 2; a warning becomes one ``axoplan: warning: ...`` line."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Any, TextIO, TypeVar

import typer

from axoplan.errors import AxoplanError

__all__ = ["user_errors", "usage_message"]

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Report an AxoplanError as one line on stderr and exit 2, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default")  # each distinct warning once
                warnings.filterwarnings("ignore", category=DeprecationWarning)  # libraries' notes to developers
                warnings.filterwarnings("ignore", category=PendingDeprecationWarning)
                warnings.showwarning = _one_line
                return fn(*args, **kwargs)
        except AxoplanError as err:
            typer.echo(f"axoplan: error: {err}", err=True)
            raise typer.Exit(2) from None
        except BrokenPipeError:
            raise  # the reader of our output went away (`| head`): click ends quietly, status 1
        except (OSError, UnicodeDecodeError) as exc:  # a file path that escaped axoplan.fileio: still one line
            from pathlib import Path

            from axoplan.fileio import file_error

            where = getattr(exc, "filename", None) or "input"
            typer.echo(f"axoplan: error: {file_error(Path(str(where)), exc)}", err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def _one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
              file: TextIO | None = None, line: str | None = None) -> None:
    """Show a warning as one line: axoplan's own (UserWarning) as they are; any other (a numerical
    warning from numpy) with where it arose, since it means a bug to report."""
    text = str(message).splitlines()[0] if str(message) else category.__name__
    if not issubclass(category, UserWarning):
        where = filename.replace("\\", "/").rsplit("/", 1)[-1]
        text = f"{text} ({category.__name__} at {where}:{lineno}; please report it with the command)"
    typer.echo(f"axoplan: warning: {text}", err=True)


def usage_message(exc: Any) -> str:
    """typer's message for a bad flag value (``axoplan.cli.main``), except for a number that is not finite: the
    range check reports 'nan' as out of range ('less than or equal to 0.99'), which points the wrong way."""
    param, errors = getattr(exc, "param", None), getattr(exc.__cause__, "errors", None)
    if param is not None and callable(errors):
        for value in (err.get("input") for err in errors()):
            if _not_finite(value):
                return f"Invalid value for {param.opts[0]!r}: {value} is not a finite number"
    return str(exc.format_message())


def _not_finite(value: object) -> bool:
    try:
        return isinstance(value, str | float) and not math.isfinite(float(value))
    except ValueError:
        return False
