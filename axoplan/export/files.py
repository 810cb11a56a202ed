"""Write a set of files all or nothing.

Every file is first written complete into a staging folder inside the output folder
(same file system, so moving is an atomic rename). Then each file is renamed into place;
a file it replaces (only with ``force``) is first moved aside. If anything fails, the
moves are undone in reverse order: new files removed, replaced files put back, folders
this call created removed. Nobody ever sees half a file, and a failed export leaves the
output folder as it was.

The whole write holds an exclusive lock on ``.axoplan-export.lock`` in the output folder
(``flock``, released by the kernel if the process dies): a second export into the same
folder while one is writing there is refused at once instead of mixing its files with the
first one's. The lock file is removed when the export ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from axoplan.errors import AxoplanError
from axoplan.fileio import check_writable, umask

__all__ = ["NewFile", "write_all_or_nothing", "export_lock", "LOCK_NAME"]

LOCK_NAME = ".axoplan-export.lock"


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
    created = _make_dirs([out_dir])
    try:
        with export_lock(out_dir):
            _precheck(out_dir, targets, force)  # again: another export may have written here before we held the lock
            created += _make_dirs(t.parent for t in targets)
            _write(out_dir, files, targets)
    except BaseException:
        _remove_dirs(created)  # after the lock file is gone, so a folder this call made can go too
        raise
    return targets


@contextlib.contextmanager
def export_lock(out_dir: Path) -> Iterator[None]:
    """Hold `out_dir`/.axoplan-export.lock exclusively, or refuse at once: another export is writing there."""
    lock = out_dir / LOCK_NAME
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)  # the kernel applies the umask
        except OSError as exc:
            raise AxoplanError(f"cannot write the export lock {lock}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AxoplanError(f"another export is writing into {out_dir} now; wait for it to finish, or choose "
                               f"another --out-dir") from None
        except OSError as exc:  # e.g. a network file system without locks
            os.close(fd)
            raise AxoplanError(f"cannot lock {lock} ({exc.strerror}), so another export could write into {out_dir} "
                               f"at the same time; choose an --out-dir on a file system with locks") from None
        try:  # the export before us may have removed the file after we opened it: lock the one that is there
            current = os.stat(lock)
        except OSError:
            current = None
        if current is not None and os.path.samestat(os.fstat(fd), current):
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()
        os.close(fd)


def _write(out_dir: Path, files: Sequence[NewFile], targets: Sequence[Path]) -> None:
    """Stage every file, then rename them into place; on a failure, undo and say which file could not be written."""
    try:
        staging = Path(tempfile.mkdtemp(dir=out_dir, prefix=".axoplan-export-"))
    except OSError as exc:
        raise AxoplanError(f"cannot write into {out_dir}: {exc.strerror}") from None
    try:
        staged = _stage(staging, files, targets)
        _commit(staging, staged, targets)
    except OSError as exc:
        raise AxoplanError(f"cannot write {exc.filename or out_dir}: {exc.strerror or exc}; nothing was changed "
                           f"in {out_dir}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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


def _make_dirs(dirs: Iterable[Path]) -> list[Path]:
    """Create missing folders (parents first); return those created, in creation order."""
    created: list[Path] = []
    for d in dirs:
        missing = [p for p in (d, *d.parents) if not p.exists()][::-1]
        for p in missing:
            try:
                p.mkdir()
            except FileExistsError:
                continue  # made meanwhile by another process: not ours to remove
            except OSError as exc:
                _remove_dirs(created)
                raise AxoplanError(f"cannot create folder {p}: {exc.strerror}") from None
            created.append(p)
    return created


def _remove_dirs(created: Sequence[Path]) -> None:
    for d in reversed(created):
        with contextlib.suppress(OSError):  # not empty: something else was put there meanwhile; leave it
            d.rmdir()


def _stage(staging: Path, files: Sequence[NewFile], targets: Sequence[Path]) -> list[Path]:
    mask = umask()
    staged = []
    for i, (f, target) in enumerate(zip(files, targets, strict=True)):
        path = staging / f"{i:04d}"
        try:
            with path.open("w", encoding="utf-8", newline="\n") as fh:
                fh.write(f.text)
                fh.flush()
                os.fsync(fh.fileno())
            path.chmod(f.mode & ~mask)
        except OSError as exc:  # name the file the user asked for, not the staging copy
            raise OSError(exc.errno, exc.strerror, str(target)) from exc
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
    except OSError as exc:
        _undo(done)
        raise OSError(exc.errno, exc.strerror, str(dst)) from exc
    except BaseException:
        _undo(done)
        raise


def _undo(done: Sequence[tuple[Path, Path | None]]) -> None:
    for dst, backup in reversed(done):
        if backup is None:
            dst.unlink(missing_ok=True)
        elif backup.exists():
            os.replace(backup, dst)
