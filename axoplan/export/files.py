"""Write a set of files all or nothing.

Every file is first written complete into a staging folder inside the output folder
(same file system, so moving is an atomic rename). Then each file is renamed into place;
a file it replaces (only with ``force``) is first moved aside. If anything fails, the
moves are undone in reverse order: new files removed, replaced files put back, folders
this call created removed. Nobody ever sees half a file, and a failed export leaves the
output folder as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from axoplan.errors import AxoplanError
from axoplan.fileio import check_writable, umask

__all__ = ["NewFile", "write_all_or_nothing"]


@dataclass(frozen=True, slots=True)
class NewFile:
    """A file to write: path relative to the output folder, text, permission bits (before the umask)."""

    relpath: str
    text: str
    mode: int = 0o666


def write_all_or_nothing(out_dir: Path, files: Sequence[NewFile], *, force: bool) -> list[Path]:
    """Write `files` under `out_dir`; refuse existing ones unless `force`. Returns the paths written."""
    targets = [out_dir / f.relpath for f in files]
    _precheck(out_dir, targets, force)
    created = _make_dirs([out_dir, *(t.parent for t in targets)])
    try:
        staging = Path(tempfile.mkdtemp(dir=out_dir, prefix=".axoplan-export-"))
    except OSError as exc:
        _remove_dirs(created)
        raise AxoplanError(f"cannot write into {out_dir}: {exc.strerror}") from None
    try:
        staged = _stage(staging, files)
        _commit(staging, staged, targets)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_dirs(created)
        raise AxoplanError(f"writing {exc.filename or out_dir} failed ({exc.strerror}); nothing was changed "
                           f"in {out_dir}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_dirs(created)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return targets


def _precheck(out_dir: Path, targets: Sequence[Path], force: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise AxoplanError(f"--out-dir {out_dir} is a file, not a folder")
    for t in targets:
        for parent in t.parents:
            if parent == out_dir.parent:
                break
            if parent.exists() and not parent.is_dir():
                raise AxoplanError(f"cannot write {t}: {parent} is a file, not a folder")
        check_writable(t, force, parents=True)


def _make_dirs(dirs: Sequence[Path]) -> list[Path]:
    """Create missing folders (parents first); return those created, in creation order."""
    created: list[Path] = []
    for d in dirs:
        missing = [p for p in (d, *d.parents) if not p.exists()][::-1]
        for p in missing:
            try:
                p.mkdir()
            except OSError as exc:
                _remove_dirs(created)
                raise AxoplanError(f"cannot create folder {p}: {exc.strerror}") from None
            created.append(p)
    return created


def _remove_dirs(created: Sequence[Path]) -> None:
    for d in reversed(created):
        with contextlib.suppress(OSError):  # not empty: something else was put there meanwhile; leave it
            d.rmdir()


def _stage(staging: Path, files: Sequence[NewFile]) -> list[Path]:
    mask = umask()
    staged = []
    for i, f in enumerate(files):
        path = staging / f"{i:04d}"
        with path.open("w", encoding="utf-8", newline="\n") as fh:
            fh.write(f.text)
            fh.flush()
            os.fsync(fh.fileno())
        path.chmod(f.mode & ~mask)
        staged.append(path)
    return staged


def _commit(staging: Path, staged: Sequence[Path], targets: Sequence[Path]) -> None:
    done: list[tuple[Path, Path | None]] = []  # (target, backup of what it replaced)
    try:
        for i, (src, dst) in enumerate(zip(staged, targets, strict=True)):
            backup = None
            if dst.exists():
                backup = staging / f"{i:04d}.old"
                os.replace(dst, backup)
            done.append((dst, backup))
            os.replace(src, dst)
    except BaseException:
        _undo(done)
        raise


def _undo(done: Sequence[tuple[Path, Path | None]]) -> None:
    for dst, backup in reversed(done):
        if backup is None:
            dst.unlink(missing_ok=True)
        elif backup.exists():
            os.replace(backup, dst)
