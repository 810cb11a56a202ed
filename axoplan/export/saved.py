"""A ranking saved by ``axoplan rank --out FILE.json``, read back for export.

It offers what :func:`axoplan.records.plan.plan_from_ranking` reads from a live ranking
(``row``, ``candidates.layout``, ``model``, ``options``, ``machine``), so a saved and a
fresh ranking give byte-identical launch configs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, PositiveInt, ValidationError

from axoplan.errors import AxoplanError
from axoplan.inputs.axes import TpOrderName, parse_tp_order
from axoplan.inputs.machine import Machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.inputs.schema import Frozen, describe_validation_error
from axoplan.space.layout import Layout

__all__ = ["SavedRanking", "SavedRow", "load_saved_ranking"]


class SavedRow(Frozen):
    """One candidate row of a saved ranking; prediction columns ride along as extra fields."""

    model_config = ConfigDict(extra="allow", frozen=True)

    rank: PositiveInt
    gx: PositiveInt
    gy: PositiveInt
    gz: PositiveInt
    gdata: PositiveInt
    tp_order: TpOrderName = "xyz"
    micro_batch: PositiveInt
    recompute: bool
    cache_weights: bool
    feasible: bool
    reason: str = ""
    t_step_s: float
    t_compute_s: float
    t_comm_exposed_s: float
    mem_total_bytes: float
    tflops_per_gpu: float
    pct_peak: float


class _SavedFile(Frozen):
    model: ModelSpec
    machine: str = Field(description="Machine name the ranking was made for.")
    world_size: PositiveInt
    options: RunOptions
    candidates: int = 0
    feasible: int = 0
    tokens: int | None = Field(None, description="`rank --tokens`: the rows' days, node_hours and gpu_hours "
                               "are for it.")
    rows: tuple[SavedRow, ...]


@dataclass(frozen=True)
class SavedRanking:
    """Rows of a saved ranking, in rank order, with the machine they were ranked on."""

    model: ModelSpec
    options: RunOptions
    machine: Machine
    world_size: int
    rows: tuple[SavedRow, ...]
    records: tuple[dict[str, Any], ...]  # the rows as read, key order kept (the plan's breakdown follows it)

    @property
    def candidates(self) -> SavedRanking:
        return self  # plan_from_ranking asks ranking.candidates.layout(i)

    def layout(self, i: int) -> Layout:
        r = self.rows[i]
        return Layout(r.gx, r.gy, r.gz, r.gdata, order=parse_tp_order(r.tp_order))

    def row(self, i: int) -> dict[str, Any]:
        """Row i as :meth:`axoplan.search.ranking.Ranking.row` gives it (without the 'rank' column)."""
        return {k: v for k, v in self.records[i].items() if k != "rank"}

    def top(self, k: int) -> list[int]:
        """Indices of the k best feasible rows."""
        order = sorted(range(len(self.rows)), key=lambda i: self.rows[i].rank)
        return [i for i in order if self.rows[i].feasible][:k]


def load_saved_ranking(path: Path, machine_for: Any) -> SavedRanking:
    """Read `path`; `machine_for(name)` loads the machine the file names (or the user's --machine)."""
    if path.suffix != ".json":
        raise AxoplanError(f"--ranking {path} must be the .json file written by `axoplan rank --out FILE.json` "
                           f"(a CSV has no model or options)")
    from axoplan.fileio import read_text

    text = read_text(path, "ranking")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AxoplanError(f"{path}: not valid JSON at line {exc.lineno}: {exc.msg}") from None
    try:
        saved = _SavedFile.model_validate(data)
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, str(path), _SavedFile)) from None
    for r in saved.rows:
        if r.gx * r.gy * r.gz * r.gdata != saved.world_size:
            raise AxoplanError(f"{path}: row {r.rank} has layout {r.gx}x{r.gy}x{r.gz}x{r.gdata}, which is not "
                               f"{saved.world_size} GPUs")
    machine = machine_for(saved.machine)
    return SavedRanking(saved.model, saved.options, machine, saved.world_size, saved.rows, tuple(data["rows"]))
