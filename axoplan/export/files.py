"""Write a set of files all or nothing, even when the export is killed.

Every file is first written complete (and fsynced) into a hidden staging folder inside the output
folder, ``.axoplan-export-<pid>-*`` (same file system, so moving is an atomic rename). Then the
result is published: a layout folder that does not exist yet is staged whole and appears with one
rename, so nobody ever sees a folder with ``plan.json`` but no ``job.sh``; a file that replaces
one (only with ``force``, in a folder that may hold the user's own files, e.g. a run's
``checkpoint/``) is renamed into place after the old one is moved aside. If anything fails, the
moves are undone in reverse order: new folders and files removed, replaced files put back, folders
this call created removed. A failed export leaves the output folder as it was.

Killed exports. Before it publishes anything, the export writes the list of its moves
(``journal.json``) into its staging folder. A SIGTERM (or Ctrl-C) while writing undoes the moves,
removes the staging folder and the lock and then ends the process by the same signal (exit status
143 in a shell). A SIGKILL cannot be caught: what it leaves is a hidden staging folder (nothing
visible, when it struck while staging, which is nearly all of an export's time) or, in the
milliseconds of publishing, some complete layout folders. The next export into the folder finds
the dead export's staging folder while it holds the lock (so its owner is gone), undoes the moves
its journal lists (a layout folder it published loses the files the export put there and, once
empty, the folder; a replaced file is put back) and removes it.

The whole write holds an exclusive lock on ``.axoplan-export.lock`` in the output folder
(``flock``, released by the kernel when the process dies, so a lock file left by a killed export,
which holds that export's process id, is taken over): a second export into the same folder while
one is writing there is refused at once instead of mixing its files with the first one's. The lock
file is removed when the export ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from axoplan.errors import AxoplanError
from axoplan.fileio import check_writable, umask

__all__ = ["NewFile", "write_all_or_nothing", "export_lock", "LOCK_NAME", "STAGING_PREFIX", "JOURNAL_NAME",
           "recover_stale_staging"]

LOCK_NAME = ".axoplan-export.lock"
STAGING_PREFIX = ".axoplan-export-"
JOURNAL_NAME = "journal.json"
_PAUSE_ENV = "AXOPLAN_TEST_EXPORT_PAUSE"  # tests only: "<phase>:<marker file>" (see _pause_for_tests)


@dataclass(frozen=True, slots=True)
class NewFile:
    """A file to write: path relative to the output folder, text, permission bits (before the umask)."""

    relpath: str
    text: str
    mode: int = 0o666


@dataclass(frozen=True, slots=True)
class _Move:
    """One rename that publishes: a whole new folder (`files` inside it) or one file, relative to the output
    folder; `backup` is where the file it replaces waits, relative to the staging folder."""

    relpath: str
    files: tuple[str, ...] = ()
    backup: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"relpath": self.relpath, "files": list(self.files), "backup": self.backup}


def write_all_or_nothing(out_dir: Path, files: Sequence[NewFile], *, force: bool) -> list[Path]:
    """Write `files` under `out_dir`; refuse existing ones unless `force`. Returns the paths written."""
    targets = [out_dir / f.relpath for f in files]
    with _sigterm_as_exception():
        if out_dir.is_dir() and any(out_dir.glob(f"{STAGING_PREFIX}*")):
            with export_lock(out_dir):  # a killed export's folders must not count as the user's files
                recover_stale_staging(out_dir)
        _precheck(out_dir, targets, force)
        created = _make_dirs([out_dir])
        try:
            with export_lock(out_dir):
                recover_stale_staging(out_dir)
                _precheck(out_dir, targets, force)  # again: another export may have written here before we held it
                _write(out_dir, files, targets)
        except BaseException:
            _remove_dirs(created)  # after the lock file is gone, so a folder this call made can go too
            raise
    return targets


class _Terminated(BaseException):
    """SIGTERM arrived while writing: unwinds like Ctrl-C, so every undo and ``finally`` runs."""


@contextlib.contextmanager
def _sigterm_as_exception() -> Iterator[None]:
    """While writing, a SIGTERM raises `_Terminated`; once everything is undone the process ends by the signal
    itself (a shell sees 143), under whatever handler was there before. Only the main thread gets signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the undo short
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminated) or signal.SIG_DFL  # None: set outside Python
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, previous)
        os.kill(os.getpid(), signal.SIGTERM)
        raise SystemExit(128 + signal.SIGTERM) from None  # the previous handler let the process live
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def export_lock(out_dir: Path) -> Iterator[None]:
    """Hold `out_dir`/.axoplan-export.lock exclusively, or refuse at once: another export is writing there.

    The lock file holds the holder's process id (shown when another export is refused)."""
    lock = out_dir / LOCK_NAME
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)  # the kernel applies the umask
        except OSError as exc:
            raise AxoplanError(f"cannot write the export lock {lock}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise AxoplanError(f"another export is writing into {out_dir} now{holder}; wait for it to finish, or "
                               f"choose another --out-dir") from None
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
        _claim(fd)
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()
        os.close(fd)


def _holder(fd: int) -> str:
    """' (process 1234)' from the lock file of the export that holds it; '' where it holds no number."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return f" (process {text})" if text.isdigit() else ""


def _claim(fd: int) -> None:
    """Write our process id into the lock file we hold (replacing a killed export's)."""
    with contextlib.suppress(OSError):  # only shown in messages: never a reason to fail
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def recover_stale_staging(out_dir: Path) -> list[Path]:
    """Undo and remove the staging folders of exports that were killed (call it holding the lock: no live export
    writes into `out_dir` then). Returns the staging folders removed."""
    removed = []
    for staging in sorted(out_dir.glob(f"{STAGING_PREFIX}*")):
        if not staging.is_dir() or staging.is_symlink():
            continue
        moves = _read_journal(staging)
        if moves:
            _undo(out_dir, staging, moves)
        shutil.rmtree(staging, ignore_errors=True)
        removed.append(staging)
    return removed


def _read_journal(staging: Path) -> list[_Move]:
    try:
        data = json.loads((staging / JOURNAL_NAME).read_text(encoding="utf-8"))
        return [_Move(str(m["relpath"]), tuple(map(str, m["files"])), m["backup"]) for m in data["moves"]]
    except (OSError, ValueError, KeyError, TypeError):  # killed before the journal was complete: nothing published
        return []


def _write(out_dir: Path, files: Sequence[NewFile], targets: Sequence[Path]) -> None:
    """Stage every file, then publish; on a failure, undo and say which file could not be written."""
    try:
        staging = Path(tempfile.mkdtemp(dir=out_dir, prefix=f"{STAGING_PREFIX}{os.getpid()}-"))
    except OSError as exc:
        raise AxoplanError(f"cannot write into {out_dir}: {exc.strerror}") from None
    try:
        _stage(staging, files, targets)
        _pause_for_tests("staged")
        _commit(out_dir, staging, _moves(out_dir, files))
    except OSError as exc:
        raise AxoplanError(f"cannot write {exc.filename or out_dir}: {exc.strerror or exc}; nothing was changed "
                           f"in {out_dir}") from None
    finally:
        if not (staging / JOURNAL_NAME).exists() or not any((staging / "old").glob("*")):
            shutil.rmtree(staging, ignore_errors=True)  # else a file the undo could not put back waits there


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


def _stage(staging: Path, files: Sequence[NewFile], targets: Sequence[Path]) -> None:
    """Each file, complete and on disk, at its own relative path under ``staging/tree``."""
    mask = umask()
    tree = staging / "tree"
    for f, target in zip(files, targets, strict=True):
        path = tree / f.relpath
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", encoding="utf-8", newline="\n") as fh:
                fh.write(f.text)
                fh.flush()
                os.fsync(fh.fileno())
            path.chmod(f.mode & ~mask)
        except OSError as exc:  # name the file the user asked for, not the staging copy
            raise OSError(exc.errno, exc.strerror, str(target)) from exc


def _moves(out_dir: Path, files: Sequence[NewFile]) -> list[_Move]:
    """The renames that publish `files`: the outermost folder under `out_dir` that does not exist yet moves whole
    (once), a file in an existing folder moves alone."""
    moves: dict[str, list[str]] = {}
    singles: list[_Move] = []
    for i, f in enumerate(files):
        parts = Path(f.relpath).parts
        new = next((k for k in range(1, len(parts)) if not (out_dir.joinpath(*parts[:k])).exists()), None)
        if new is None:
            backup = f"old/{i:04d}" if (out_dir / f.relpath).exists() else None
            singles.append(_Move(f.relpath, (), backup))
        else:
            moves.setdefault(str(Path(*parts[:new])), []).append(f.relpath)
    return [*(_Move(rel, tuple(inside)) for rel, inside in moves.items()), *singles]


def _commit(out_dir: Path, staging: Path, moves: Sequence[_Move]) -> None:
    """Journal the moves, then make them; undo the ones made if any fails (or the process is told to stop)."""
    journal = staging / JOURNAL_NAME
    with journal.open("w", encoding="utf-8") as fh:
        json.dump({"moves": [m.as_json() for m in moves]}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    (staging / "old").mkdir()
    done: list[_Move] = []
    dst = out_dir
    try:
        for move in moves:
            dst = out_dir / move.relpath
            done.append(move)  # first: a signal between the two renames must still see the old file put back
            if move.backup is not None:
                os.replace(dst, staging / move.backup)
            os.replace(staging / "tree" / move.relpath, dst)
            _pause_for_tests("published")
        journal.unlink()  # published: nothing to undo any more (what the new files replaced goes with the staging)
    except OSError as exc:
        _undo(out_dir, staging, done)
        raise OSError(exc.errno, exc.strerror, str(dst)) from exc
    except BaseException:
        _undo(out_dir, staging, done)
        raise


def _undo(out_dir: Path, staging: Path, moves: Sequence[_Move]) -> None:
    """Reverse `moves` (made, or perhaps made, by this or a killed export): put back what each replaced, remove
    what each added."""
    for move in reversed(moves):
        dst = out_dir / move.relpath
        if move.backup is not None:
            if (staging / move.backup).exists():
                os.replace(staging / move.backup, dst)
            continue
        if not move.files:
            dst.unlink(missing_ok=True)
            continue
        for rel in move.files:  # only what the export put there: a run may have written beside it since
            (out_dir / rel).unlink(missing_ok=True)
        inner = sorted({p for rel in move.files for p in (out_dir / rel).parents if dst == p or dst in p.parents},
                       key=lambda p: len(p.parts), reverse=True)
        _remove_dirs(inner[::-1])


def _pause_for_tests(phase: str) -> None:
    """Tests only: with AXOPLAN_TEST_EXPORT_PAUSE=<phase>:<marker>, create <marker> at `phase` and wait there to
    be signalled, so a test can stop the export at a known point without racing it."""
    wanted = os.environ.get(_PAUSE_ENV)
    if not wanted or not wanted.startswith(f"{phase}:"):
        return
    import time

    Path(wanted.split(":", 1)[1]).write_text(f"{os.getpid()}\n")
    time.sleep(300)
