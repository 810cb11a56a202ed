"""Every read and write of a user's path goes through here.

One place turns the ways a file can fail (missing, a folder where a file was expected,
no permission, not UTF-8 text, a device or FIFO where a file was expected, a full disk)
into one :class:`AxoplanError` line that names the file and the fix, so no command shows a
traceback for them (nor reads ``/dev/zero`` forever); a failure only a write can have is
reported as "cannot write", whoever reports it. Writes go to a temporary file in the same
folder and are renamed into place, so a reader never sees half a file and a failed write
leaves the user's old file as it was; the new file gets the permissions the user's umask
gives any new file (``mkstemp`` alone would leave it ``0600``). :func:`check_writable` is
called before long work, so nothing is measured or computed that could not be saved.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from axoplan.errors import AxoplanError

__all__ = ["read_text", "write_text_atomic", "check_writable", "check_readable", "atomic_path", "file_error",
           "write_with", "make_folder", "umask", "not_a_regular_file"]

# errors only a write can raise: reported as "cannot write" even where the caller did not say which it was
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def file_error(path: Path, exc: BaseException, what: str = "", verb: str = "read") -> AxoplanError:
    """One line for an OSError or UnicodeDecodeError on `path`."""
    name = f"{what} {path}".strip()
    if isinstance(exc, OSError) and exc.errno in _WRITE_ERRNOS:
        verb = "write"
    if isinstance(exc, UnicodeDecodeError):
        return AxoplanError(f"cannot read {name}: not a UTF-8 text file (byte {exc.start}); give the text file "
                            f"axoplan wrote or documents")
    if isinstance(exc, IsADirectoryError):
        return AxoplanError(f"cannot {verb} {name}: it is a folder; give a file path")
    if isinstance(exc, FileNotFoundError):
        return AxoplanError(f"cannot {verb} {name}: no such file or folder")
    if isinstance(exc, PermissionError):
        return AxoplanError(f"cannot {verb} {name}: permission denied; choose a path you may {verb}")
    reason = getattr(exc, "strerror", None) or str(exc)
    return AxoplanError(f"cannot {verb} {name}: {reason}")


_KINDS = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"),
          (stat.S_ISSOCK, "socket"))


def not_a_regular_file(path: Path, mode: int, what: str = "file") -> AxoplanError | None:
    """The one line refusing a device, FIFO or socket as an input (reading one may never end); None for a file."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "special file")
    return AxoplanError(f"{what} {path} is not a regular file (a {kind}); give the path of a file")


def check_readable(path: Path, what: str = "file") -> Path:
    """`path` if it names a readable regular file; else one line saying which of the ways it fails."""
    path = Path(path)
    if path.is_dir():
        raise AxoplanError(f"{what} {path} is a folder; give the path of a file")
    if not path.exists():
        raise AxoplanError(f"{what} {path} does not exist")
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise file_error(path, exc, what) from None
    refusal = not_a_regular_file(path, mode, what)
    if refusal is not None:
        raise refusal
    if not os.access(path, os.R_OK):
        raise AxoplanError(f"cannot read {what} {path}: permission denied")
    return path


def read_text(path: Path, what: str = "file") -> str:
    """The UTF-8 text of `path`; every failure is one AxoplanError line naming `what` and the path.

    The file is opened without blocking and checked to be a regular file before anything is read:
    opening a FIFO would wait for a writer, and a device such as /dev/zero never ends.
    """
    path = Path(path)
    if path.is_dir():
        raise AxoplanError(f"{what} {path} is a folder; give the path of a file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise file_error(path, exc, what) from None
    try:
        refusal = not_a_regular_file(path, os.fstat(fd).st_mode, what)
        if refusal is not None:
            raise refusal
        os.set_blocking(fd, True)
        with os.fdopen(fd, "r", encoding="utf-8", closefd=False) as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise file_error(path, exc, what) from None
    finally:
        os.close(fd)


def check_writable(path: Path, force: bool = False, what: str = "", *, parents: bool = False) -> None:
    """Refuse, before any work, an output that cannot be written or would replace a file without `force`.

    `parents`: the caller creates missing folders, so the nearest existing one must be writable.
    """
    path = Path(path)
    name = f"{what} {path}".strip()
    if path.is_dir():
        raise AxoplanError(f"cannot write {name}: it is a folder; give a file path such as {path / 'out'}")
    if path.exists() and not force:
        raise AxoplanError(f"{path} already exists; pass --force to overwrite it")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir() and not parents:
        raise AxoplanError(f"cannot write {name}: folder {parent} does not exist")
    existing = next(p for p in (parent, *parent.parents, Path(".")) if p.exists())
    if not existing.is_dir():
        raise AxoplanError(f"cannot write {name}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise AxoplanError(f"cannot write {name}: permission denied; choose a writable folder")


@contextmanager
def atomic_path(path: Path, force: bool = False, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside `path` to write; renamed onto `path` (umask permissions) when the block succeeds.

    On any failure the temporary file is removed and `path` is left as it was.
    """
    path = Path(path)
    check_writable(path, force)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=suffix)
        os.close(fd)
    except OSError as exc:
        raise file_error(path, exc, verb="write") from None
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise file_error(path, exc, verb="write") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str, *, force: bool = False) -> None:
    """Write `text` to `path` through a temporary file and a rename (see :func:`atomic_path`)."""
    with atomic_path(Path(path), force) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_with(path: Path, writer: Callable[[Path], None], *, force: bool = False, suffix: str = ".tmp") -> None:
    """Let `writer` fill a temporary file, then rename it onto `path` (figures: the suffix picks the format)."""
    with atomic_path(Path(path), force, suffix) as tmp:
        writer(tmp)


def make_folder(folder: Path, what: str = "folder") -> None:
    """Create `folder` (and its parents) or say in one line why it cannot be."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise file_error(Path(folder), exc, what, verb="create") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise AxoplanError(f"cannot write into {what} {folder}: permission denied; choose a writable folder")


def umask() -> int:
    """The process's umask (read by setting and restoring it: POSIX has no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
