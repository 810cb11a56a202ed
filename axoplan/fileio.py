"""Writing files without ever leaving half a file or silently replacing the user's."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from axoplan.errors import AxoplanError

__all__ = ["write_text_atomic", "check_writable"]


def check_writable(path: Path, force: bool) -> None:
    """Refuse to replace an existing file unless `force`."""
    if path.exists() and not force:
        raise AxoplanError(f"{path} already exists; pass --force to overwrite it")
    if path.exists() and path.is_dir():
        raise AxoplanError(f"{path} is a directory, not a file")


def write_text_atomic(path: Path, text: str, *, force: bool = False) -> None:
    """Write `text` to `path` via a temporary file and rename, so readers never see half a file."""
    check_writable(path, force)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise AxoplanError(f"cannot write {path}: folder {parent} does not exist")
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
