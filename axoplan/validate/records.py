"""Measured runs from any source, as `validate` and `calibrate` read them.

Three inputs are accepted (``docs/validate.md`` documents each):

* the executor's measured-run records (``.jsonl``; :mod:`axoplan.records.runs`), which embed
  the plan they ran;
* axoplan's measured-run CSV (``.csv``) for runs timed with other tools: one row per
  run with the machine, the model's shape, the run options, the layout and the measured
  seconds per iteration (:data:`CSV_REQUIRED`, :data:`CSV_OPTIONAL`);
* the vTrain A100 CSV (``.csv`` whose header is vTrain's), converted row by row with
  :func:`vtrain_plan` (Megatron tensor parallelism ``t`` and data parallelism ``d`` are
  the layout ``1 × t × 1 × d``).

Every input error names the file and line and stops the read: a malformed line is never
skipped.
"""

from __future__ import annotations

import builtins
import csv
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from axoplan.errors import AxoplanError, closest_hint
from axoplan.fileio import check_readable, read_text
from axoplan.inputs.axes import parse_tp_order
from axoplan.inputs.machine import Machine, load_machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.inputs.schema import describe_validation_error
from axoplan.records.plan import LaunchConfig
from axoplan.records.runs import read_runs
from axoplan.report import plural
from axoplan.space.layout import Layout

__all__ = ["Measured", "load_runs", "machine_matches", "runs_of_machine", "skipped_note",
           "by_machine", "recorded_name", "vtrain_plan", "CSV_REQUIRED", "CSV_OPTIONAL", "VTRAIN_COLUMNS",
           "VTRAIN_MACHINE"]


@dataclass(frozen=True, slots=True)
class Measured:
    """One measured run of one plan; `where` is ``file:line`` for messages."""

    plan: LaunchConfig
    t_step_s: float
    where: str
    t_step_std_s: float = 0.0
    phase_s: Mapping[str, float] = field(default_factory=dict)
    backend: str = ""  # the collective backend the run recorded (gloo, nccl); "" when the file has none


CSV_REQUIRED: tuple[str, ...] = (
    "machine", "layers", "hidden", "heads", "seq_len", "global_batch", "micro_batch",
    "gx", "gy", "gz", "gdata", "recompute", "t_step_s",
)
"""Columns every row of an axoplan measured-run CSV must have."""

CSV_OPTIONAL: dict[str, str] = {
    "model_name": "", "kv_heads": "", "ffn_hidden": "", "ffn_kind": "gelu", "vocab": "51200",
    "max_positions": "0", "tied_embeddings": "true", "biases": "true", "cache_weights": "false",
    "oar": "true", "ors": "true", "oag": "true", "overlap_forward_all_reduce": "false",
    "grad_reduce_dtype": "fp32", "devices_per_node": "", "t_step_std_s": "0", "framework": "axonn",
    "attention": "flash", "tp_order": "xyz", "num_params": "", "family": "",
}
"""Optional columns and their defaults ('' = derived: GQA off, 4·H FFN, the machine's node size; no
parameter-count check). ``framework`` names the training code that ran (``frameworks/<name>.yaml``:
its host work, memory and collectives), ``attention`` its attention kernel (``flash`` or ``unfused``),
``tp_order`` the tensor-parallel rank order innermost first, ``num_params`` the parameter count the
source reports (a row whose model shape gives another count is refused), ``family`` the architecture the model is
(``mpt``, ``llama``, ...: which traced op list a ledger framework prices it with). Columns named
``phase_<name>_s`` carry measured seconds per iteration by phase."""

VTRAIN_COLUMNS: tuple[str, ...] = (
    "gpus", "global_batch", "micro_batch", "hidden", "heads", "layers", "seq_len", "t", "d", "p", "iteration_ms",
)
"""vTrain ``ground_truth_single.csv`` columns, in file order (its header names them in words)."""

VTRAIN_MACHINE = "dgx-a100"
VTRAIN_VOCAB = 50304  # GPT-2's 50,257 padded by Megatron to a multiple of 128 (--make-vocab-size-divisible-by)
VTRAIN_DEVICES_PER_NODE = 8
VTRAIN_FRAMEWORK = "megatron-deepspeed"  # the vTrain runs' training code (frameworks/megatron-deepspeed.yaml)

_TRUE = {"true", "1", "yes", "on", "y", "t"}
_FALSE = {"false", "0", "no", "off", "n", "f"}


def load_runs(paths: Sequence[Path]) -> list[Measured]:
    """Every measured run in `paths` (JSON lines or CSV), in file order."""
    runs: list[Measured] = []
    for path in paths:
        p = Path(path)
        check_readable(p, "runs file")
        if p.suffix in {".jsonl", ".json", ".ndjson"}:
            runs.extend(_read_jsonl(p))
        elif p.suffix == ".csv":
            runs.extend(_read_csv(p))
        else:
            raise AxoplanError(f"{p}: unknown runs file type {p.suffix!r}; give .jsonl records or a .csv")
    if not runs:
        raise AxoplanError(f"no measured runs in {', '.join(str(p) for p in paths)}")
    return runs


EXECUTOR_FRAMEWORK = "axoplan-executor"
"""Records written by `axoplan run` are runs of axoplan's own executor, whatever the plan was ranked for."""


def _read_jsonl(path: Path) -> list[Measured]:
    text = read_text(path, "runs file")
    _refuse_one_document(path, text)
    numbers = [n for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    return [Measured(_as_executed(r.plan), r.t_step_s, f"{path}:{n}", r.t_step_std_s, dict(r.phase_s), r.backend)
            for n, r in zip(numbers, read_runs(path), strict=True)]


def _refuse_one_document(path: Path, text: str) -> None:
    """Refuse a file that is one JSON document rather than records one per line: a launch config
    (``plan.json``, which `axoplan run` times into ``runs.jsonl`` beside it) or any other JSON."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return  # JSON lines, or broken: the record reader names the line
    if isinstance(doc, dict) and "t_step_s" in doc:
        return  # a file of one record
    runs = path.parent / "runs.jsonl"
    if isinstance(doc, dict) and {"plan_id", "layout", "axonn_init"} <= doc.keys():
        raise AxoplanError(f"{path} is a launch config (a plan), not measured runs: `axoplan run {path}` times "
                           f"it and appends its record to {runs}; validate that file")
    kind = "object" if isinstance(doc, dict) else "array" if isinstance(doc, list) else "value"
    raise AxoplanError(f"{path} holds one JSON {kind}, not measured-run records one per line "
                       "(the executor's runs.jsonl, or a .csv; docs/validate.md)")


def _as_executed(plan: LaunchConfig) -> LaunchConfig:
    """The plan with the framework that actually ran it (see EXECUTOR_FRAMEWORK)."""
    options = plan.options.model_copy(update={"framework": EXECUTOR_FRAMEWORK})
    return plan.model_copy(update={"options": options})


def _read_csv(path: Path) -> list[Measured]:
    lines = read_text(path, "runs file").removeprefix("\ufeff").splitlines()  # a spreadsheet's byte-order mark
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and "iteration time" in lines[first].lower():  # vTrain's header is a '#' line
        return _rows(path, lines, first, _vtrain_row, header=VTRAIN_COLUMNS)
    first = next((i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")), None)
    if first is None:
        return []
    header = [h.strip() for h in next(csv.reader([lines[first]]))]
    _check_header(path, first + 1, header)
    machines: dict[str, int] = {}
    return _rows(path, lines, first, lambda row, where: _axoplan_row(row, where, machines), header=tuple(header))


def _rows(path: Path, lines: list[str], first: int, convert: Callable[[dict[str, str], str], Measured],
          header: tuple[str, ...]) -> list[Measured]:
    out = []
    for number, line in enumerate(lines[first + 1:], start=first + 2):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{number}"
        cells = next(csv.reader([line]))
        if len(cells) != len(header):
            raise AxoplanError(f"{where}: malformed row: {len(cells)} fields, the header has {len(header)}")
        out.append(convert(dict(zip(header, (c.strip() for c in cells), strict=True)), where))
    return out


def _check_header(path: Path, line: int, header: list[str]) -> None:
    known = set(CSV_REQUIRED) | set(CSV_OPTIONAL)
    for name in header:
        if name not in known and not (name.startswith("phase_") and name.endswith("_s")):
            raise AxoplanError(f"{path}:{line}: unknown column {name!r}{closest_hint(name, known)}; "
                               "see docs/validate.md for the columns")
    missing = [c for c in CSV_REQUIRED if c not in header]
    if missing:
        raise AxoplanError(f"{path}:{line}: missing column{'s' if len(missing) > 1 else ''} "
                           f"{', '.join(missing)} (required: {', '.join(CSV_REQUIRED)})")


def _axoplan_row(row: dict[str, str], where: str, node_sizes: dict[str, int]) -> Measured:
    get = _Cells(row, where)
    model = _model(where, num_layers=get.int("layers"), hidden=get.int("hidden"), num_heads=get.int("heads"),
                   num_kv_heads=get.int("kv_heads", None), ffn_hidden=get.int("ffn_hidden", None),
                   ffn_kind=get.text("ffn_kind"), vocab=get.int("vocab"), max_positions=get.int("max_positions"),
                   tied_embeddings=get.bool("tied_embeddings"), biases=get.bool("biases"),
                   name=get.text("model_name") or "custom", family=get.text("family") or None)
    mb, recompute, cache = get.int("micro_batch"), get.bool("recompute"), get.bool("cache_weights")
    options = _options(where, global_batch=get.int("global_batch"), seq_len=get.int("seq_len"), micro_batches=(mb,),
                       recompute="on" if recompute else "off", cache_weights="on" if cache else "off",
                       overlap_all_reduce=get.bool("oar"), overlap_reduce_scatter=get.bool("ors"),
                       overlap_all_gather=get.bool("oag"),
                       overlap_forward_all_reduce=get.bool("overlap_forward_all_reduce"),
                       grad_reduce_dtype=get.text("grad_reduce_dtype"), framework=get.text("framework"),
                       attention=get.text("attention"))
    _check_params(where, model, get.int("num_params", None))
    machine = get.text("machine")
    per_node = get.int("devices_per_node", None) or _node_size(machine, where, node_sizes)
    layout = _layout(where, get.int("gx"), get.int("gy"), get.int("gz"), get.int("gdata"), order=get.text("tp_order"))
    plan = _plan(where, machine=machine, devices_per_node=per_node, model=model, options=options, layout=layout,
                 micro_batch=mb, recompute=recompute, cache_weights=cache)
    phases = {k[len("phase_"):-len("_s")]: get.positive(k) for k in row if k.startswith("phase_") and row[k]}
    return Measured(plan, get.positive("t_step_s"), where, get.float("t_step_std_s"), phases)


def vtrain_plan(row: Mapping[str, int]) -> LaunchConfig:
    """The axoplan plan of one vTrain row (``docs/validate.md``, "vTrain A100 data").

    Megatron-DeepSpeed's tensor parallelism ``t`` runs the collectives of ``Gy = t`` with
    ``Gx = Gz = 1``, and its data parallelism ``d`` is ``Gdata = d``. Fixed for all rows:
    GPT-2 blocks (GeLU MLP of 4·H, learned positions up to the sequence length, tied
    embeddings, vocabulary 50,257 padded to 50,304: model family ``gpt2``), full activation recompute, no weight
    caching, no overlap of the tensor-parallel all-reduces (OAR off), 16-bit gradients
    all-reduced after the backward (vTrain's ``use_gradient_bucket: false``).
    """
    seq = int(row["seq_len"])
    model = ModelSpec(name=f"gpt-h{row['hidden']}-l{row['layers']}", num_layers=int(row["layers"]),
                      hidden=int(row["hidden"]), num_heads=int(row["heads"]), vocab=VTRAIN_VOCAB, max_positions=seq,
                      family="gpt2", source="vTrain ground_truth_single.csv (Megatron-DeepSpeed GPT)")
    mb = int(row["micro_batch"])
    options = RunOptions(global_batch=int(row["global_batch"]), seq_len=seq, micro_batches=(mb,), recompute="on",
                         cache_weights="off", overlap_all_reduce=False, overlap_reduce_scatter=False,
                         overlap_all_gather=False, grad_reduce_dtype="bf16",
                         attention="unfused", framework=VTRAIN_FRAMEWORK)
    return LaunchConfig.build(machine=VTRAIN_MACHINE, devices_per_node=VTRAIN_DEVICES_PER_NODE, model=model,
                              options=options, layout=Layout(1, int(row["t"]), 1, int(row["d"])), micro_batch=mb,
                              recompute=True, cache_weights=False)


def _vtrain_row(row: dict[str, str], where: str) -> Measured:
    get = _Cells(row, where)
    values = {k: get.int(k) for k in VTRAIN_COLUMNS if k != "iteration_ms"}
    if values["p"] != 1:
        raise AxoplanError(f"{where}: pipeline parallelism {values['p']} is not an axoplan layout; keep rows with "
                           "p = 1")
    if values["t"] * values["d"] != values["gpus"]:
        raise AxoplanError(f"{where}: t·d = {values['t'] * values['d']} is not the {values['gpus']} GPUs of the row")
    try:
        plan = vtrain_plan(values)
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, where, LaunchConfig)) from None
    except AxoplanError as err:
        raise AxoplanError(f"{where}: {err}") from None
    return Measured(plan, get.positive("iteration_ms") / 1e3, where)


class _Cells:
    """Typed access to one CSV row's cells; errors name the row and the column."""

    def __init__(self, row: dict[str, str], where: str) -> None:
        self.row, self.where = row, where

    def text(self, name: str) -> str:
        value = self.row.get(name, "")
        return value if value != "" else CSV_OPTIONAL.get(name, "")

    def int(self, name: str, default: Any = ...) -> Any:
        value = self.text(name)
        if value == "" and default is not ...:
            return default
        try:
            return int(value)
        except ValueError:
            raise AxoplanError(f"{self.where}: column {name!r}: {value!r} is not a whole number") from None

    def float(self, name: str) -> float:
        value = self.text(name)
        try:
            return float(value)
        except ValueError:
            raise AxoplanError(f"{self.where}: column {name!r}: {value!r} is not a number") from None

    def positive(self, name: str) -> builtins.float:
        value = self.float(name)
        if not value > 0:
            raise AxoplanError(f"{self.where}: column {name!r}: {value!r} must be a positive time")
        return value

    def bool(self, name: str) -> bool:
        value = self.text(name).lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise AxoplanError(f"{self.where}: column {name!r}: {self.text(name)!r} is not true/false")


def _model(where: str, **fields: Any) -> ModelSpec:
    try:
        return ModelSpec(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, f"{where} (model)", ModelSpec)) from None


def _options(where: str, **fields: Any) -> RunOptions:
    try:
        return RunOptions(**fields)
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, f"{where} (run options)", RunOptions)) from None


def _layout(where: str, *sizes: int, order: str = "xyz") -> Layout:
    try:
        return Layout(*sizes, order=parse_tp_order(order))
    except (ValueError, AxoplanError) as err:
        raise AxoplanError(f"{where}: {err}") from None


def _check_params(where: str, model: ModelSpec, reported: int | None) -> None:
    """Refuse a row whose model shape contradicts the parameter count its source reports."""
    if reported is not None and model.num_params() != reported:
        raise AxoplanError(f"{where}: column 'num_params': the row's shape gives {model.num_params():,} parameters, "
                           f"not {reported:,}; check layers, hidden, heads, vocab, max_positions, biases and "
                           "tied_embeddings")


def _plan(where: str, **fields: Any) -> LaunchConfig:
    try:
        return LaunchConfig.build(**fields)
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, f"{where} (plan)", LaunchConfig)) from None
    except AxoplanError as err:
        raise AxoplanError(f"{where}: {err}") from None


def _node_size(machine: str, where: str, cache: dict[str, int]) -> int:
    if machine not in cache:
        try:
            cache[machine] = load_machine(machine).devices_per_node
        except AxoplanError:
            raise AxoplanError(f"{where}: machine {machine!r} is not a shipped machine or a YAML path; add a "
                               "devices_per_node column") from None
    return cache[machine]


def machine_matches(recorded: str, machine: Machine, reference: str) -> bool:
    """Whether a run recorded on `recorded` (a name or a YAML path) belongs to `machine`.

    A run matches the machine's ``name`` or the file stem of the YAML it was loaded from,
    so a calibrated copy (same ``name``, another file) still matches its runs.
    """
    names = {machine.name, Path(reference).stem}
    return recorded in names or Path(recorded).stem in names


def _belongs(run: Measured, machine: Machine, reference: str) -> bool:
    """A run of `machine`, or a CPU rehearsal of another machine's plan (backend gloo) when `machine` is a
    CPU machine: it ran there, whatever machine its plan was made for."""
    rehearsal = _BACKEND_KIND.get(run.backend) == "cpu" == machine.device.kind
    return rehearsal or machine_matches(run.plan.machine, machine, reference)


def _wrong_machine(run: Measured, machine: Machine) -> AxoplanError:
    return AxoplanError(f"{run.where}: run was recorded on machine {run.plan.machine!r}, not {machine.name!r}; "
                        "validate or calibrate each machine with its own runs")


def runs_of_machine(runs: Sequence[Measured], machine: Machine, reference: str,
                    any_device: bool = False) -> tuple[list[Measured], list[Measured]]:
    """(the runs of `machine`, the runs of other machines), for a file that holds several machines
    (``--machine`` picks one). An error when none is of `machine`, or when its runs ran on another
    kind of device (unless `any_device`)."""
    kept = [r for r in runs if _belongs(r, machine, reference)]
    names = list(by_machine(runs))
    if not kept and len(names) > 1:
        raise AxoplanError(f"no run was recorded on {machine.name}: the runs are of {', '.join(names)}; give "
                           "--machine one of them")
    if not kept:
        raise _wrong_machine(runs[0], machine)
    if not any_device:
        check_device_kind(kept, machine)
    return kept, [r for r in runs if not _belongs(r, machine, reference)]


def skipped_note(skipped: Sequence[Measured], machine: Machine) -> str:
    """One line naming the machines whose runs `--machine` left out, and how to validate them."""
    names = list(by_machine(skipped))
    return (f"note: skipped {plural(len(skipped), 'run')} recorded on {', '.join(names)} (not {machine.name}); "
            f"give --machine {names[0]} for {'those' if len(names) == 1 else 'each'}, or no --machine for "
            "every machine")


_BACKEND_KIND = {"nccl": "gpu", "rccl": "gpu", "gloo": "cpu"}  # what torch.distributed ran on; others: unknown


def check_device_kind(runs: Sequence[Measured], machine: Machine) -> None:
    """Refuse runs measured on another kind of device than `machine` describes (a CPU/gloo run vs a GPU machine).

    A CPU rehearsal of a Frontier plan records ``machine: frontier`` but ``backend: gloo``;
    comparing it with Frontier's predictions reports a meaningless -100 %.
    """
    wrong = [r for r in runs if _BACKEND_KIND.get(r.backend, machine.device.kind) != machine.device.kind]
    if wrong:
        first = wrong[0]
        on_gpu = _BACKEND_KIND[first.backend] == "gpu"
        ran_on = "GPUs" if on_gpu else "CPU ranks"
        other = "a GPU machine YAML" if on_gpu else "--machine local-cpu (or your CPU's YAML)"
        raise AxoplanError(f"{first.where}: {plural(len(wrong), 'run')} ran on {ran_on} ({first.backend}) but "
                           f"{machine.name} describes {machine.device.kind.upper()} devices; validate them with "
                           f"{other}, or pass --any-device to compare anyway")


def recorded_name(machine: str) -> str:
    """A run's machine as recorded: its name, or the stem of the YAML path it was recorded with."""
    return Path(machine).stem if machine.endswith((".yaml", ".yml")) else machine


def by_machine(runs: Sequence[Measured]) -> dict[str, list[Measured]]:
    """`runs` grouped by the machine they were recorded on, in order of first appearance."""
    out: dict[str, list[Measured]] = {}
    for run in runs:
        out.setdefault(recorded_name(run.plan.machine), []).append(run)
    return out
