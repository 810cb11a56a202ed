"""Measured-run records: what the executor writes and `validate` / `calibrate` read.

One record per run, one JSON object per line (JSON lines). A record embeds the plan
it ran (so the prediction can be recomputed later) and the measured time per
iteration with its spread and per-phase times. Records are appended with a single
``write`` of a whole line, so a crash never leaves half a record. A finished measurement
is never lost to a failed write: when the append fails (a full disk, a permission taken
away during the run), the record goes to a new file of its own in the home folder (else
the temp folder) and the one-line error names it; when even that fails, the record's JSON
line is written to stderr before the error.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pydantic import Field, PositiveInt, ValidationError, model_validator

from axoplan.errors import AxoplanError
from axoplan.inputs.schema import Frozen, describe_validation_error
from axoplan.records.plan import LaunchConfig

__all__ = ["RUN_SCHEMA_VERSION", "MeasuredRun", "append_run", "read_runs", "keep_record"]

RUN_SCHEMA_VERSION = 1


class MeasuredRun(Frozen):
    """One measured run of one plan."""

    schema_version: int = RUN_SCHEMA_VERSION
    plan_id: str
    plan: LaunchConfig = Field(description="The plan as run (after any scale-down of the model).")
    measured_at: str = Field(description="ISO 8601 time the run finished (UTC).")
    t_step_s: float = Field(gt=0, description="Median seconds per iteration over the timed iterations.")
    t_step_std_s: float = Field(ge=0, description="Standard deviation of the timed iterations.")
    iterations: PositiveInt
    warmup: int = Field(ge=0)
    phase_s: dict[str, float] = Field(default_factory=dict, description="Seconds per iteration by phase.")
    torch_version: str = ""
    backend: str = ""
    device_name: str = ""
    dtype: str = Field("", description="Parameter and activation dtype of the run (float32 on CPU, bfloat16 on GPU).")
    world_size: PositiveInt
    nodes: PositiveInt = 1
    source: str = Field("axoplan-executor", description="What produced the record.")

    @model_validator(mode="after")
    def _consistent(self) -> MeasuredRun:
        """A hand-edited record must not contradict its own plan."""
        if self.plan_id != self.plan.plan_id:
            raise ValueError(f"field 'plan_id' is {self.plan_id!r}, but its plan's is {self.plan.plan_id!r}")
        if self.world_size != self.plan.world_size:
            raise ValueError(f"field 'world_size' is {self.world_size}, but its plan's layout has "
                             f"{self.plan.world_size} GPUs")
        return self


def append_run(path: Path, run: MeasuredRun) -> None:
    """Append one record as one line with one write (no partial records).

    When the append fails, the record is kept in a file of its own (:func:`keep_record`) and
    the AxoplanError names it; if that fails too, the JSON line is printed to stderr first.
    """
    line = (run.model_dump_json() + "\n").encode()
    try:
        _append(Path(path), line)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        kept, tried = keep_record(line, run.plan_id)
        if kept is not None:
            raise AxoplanError(f"cannot write the run record to {path}: {reason}; the record was kept in {kept} "
                               f"(append it with: cat {kept} >> {path})") from None
        sys.stderr.write(line.decode())
        sys.stderr.flush()
        raise AxoplanError(f"cannot write the run record to {path}: {reason}, nor to a file of its own in "
                           f"{' or '.join(map(str, tried)) or 'the home or temp folder'}; the record is the JSON "
                           f"line printed above") from None


def _append(path: Path, line: bytes) -> None:
    """One ``write`` of `line` at the end of `path`; a short write (the disk filled up) is undone and raised."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        written = os.write(fd, line)
        if written != len(line):
            if os.fstat(fd).st_size == size + written:  # only our bytes were added: take them back
                os.ftruncate(fd, size)
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (only {written} of {len(line)} bytes "
                                        f"written)", str(path))
    finally:
        os.close(fd)


def keep_record(line: bytes, plan_id: str) -> tuple[Path | None, list[Path]]:
    """Write `line` to a new file of its own, in the home folder or else the temp folder.

    Returns the file written (None if none could be) and the folders tried.
    """
    from axoplan.fileio import umask

    tried: list[Path] = []
    for folder in _fallback_folders():
        tried.append(folder)
        try:
            fd, name = tempfile.mkstemp(prefix=f"axoplan-run-{plan_id}-", suffix=".jsonl", dir=folder)
        except OSError:
            continue
        ok = False
        try:
            ok = os.write(fd, line) == len(line)
            os.fchmod(fd, 0o666 & ~umask())
        except OSError:
            ok = False
        finally:
            try:
                os.close(fd)
            except OSError:
                ok = False
        if ok:
            return Path(name), tried
        Path(name).unlink(missing_ok=True)
    return None, tried


def _fallback_folders() -> list[Path]:
    """Where a record that could not be appended is kept: the home folder, then the temp folder."""
    folders = []
    home = os.path.expanduser("~")
    if home != "~":
        folders.append(Path(home))
    try:
        temp = Path(tempfile.gettempdir())
    except OSError:  # no usable temp folder at all
        return folders
    if temp not in folders:
        folders.append(temp)
    return folders


def read_runs(path: Path) -> Iterator[MeasuredRun]:
    """Records of a JSON-lines file; a malformed line is an error naming its line number."""
    from axoplan.fileio import read_text

    lines = read_text(Path(path), "runs file").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AxoplanError(f"{where}: malformed record (not JSON: {exc.msg})") from None
        if not isinstance(data, dict) or data.get("schema_version") != RUN_SCHEMA_VERSION:
            raise AxoplanError(f"{where}: not a version-{RUN_SCHEMA_VERSION} measured-run record")
        if isinstance(data.get("plan"), dict):
            LaunchConfig.from_dict(data["plan"], f"{where} (its plan)")
        try:
            yield MeasuredRun.model_validate(data)
        except ValidationError as err:
            raise AxoplanError(describe_validation_error(err, where, MeasuredRun)) from None
