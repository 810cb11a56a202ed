"""`axoplan --version`: the installed distribution's version (pyproject.toml's)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["version", "options"]


def version() -> str:
    """The installed distribution's version, or the package's own (``axoplan.__version__``) where it is not
    installed (a checkout on ``PYTHONPATH``)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("axoplan")
    except PackageNotFoundError:
        from axoplan import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"axoplan {version()}")
        raise typer.Exit()


def options(
    show_version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                               help="Print axoplan's version and exit.")] = False,
) -> None:
    """Options before the command (the app's help text is `app`'s own)."""
