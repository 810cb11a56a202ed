"""Measured-run records: what the executor writes and `validate` / `calibrate` read.

One record per run, one JSON object per line (JSON lines). A record embeds the plan
it ran (so the prediction can be recomputed later) and the measured time per
iteration with its spread and per-phase times. Records are appended with a single
``write`` of a whole line, so a crash never leaves half a record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from pydantic import Field, PositiveInt, ValidationError

from axoplan.errors import AxoplanError
from axoplan.plan import LaunchConfig
from axoplan.schema import Frozen, describe_validation_error

__all__ = ["RUN_SCHEMA_VERSION", "MeasuredRun", "append_run", "read_runs"]

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


def append_run(path: Path, run: MeasuredRun) -> None:
    """Append one record as one line with one write (no partial records)."""
    line = (run.model_dump_json() + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


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
