"""Launch configs: one versioned, schema-checked JSON file per chosen layout.

A launch config ("plan") says everything needed to run one candidate and to check the
run afterwards: machine, model, run options, the 4D layout, micro-batch, gradient
accumulation, node count, the prediction with its breakdown, and the matching
``axonn.init(...)`` arguments. The executor reads it; measured-run records embed it.

    >>> plan = LaunchConfig.load("plans/01-4x8x512x2/plan.json")   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import Field, PositiveInt, ValidationError, field_serializer, field_validator, model_validator

from axoplan.cost.budget import TrainingCost, steps_for
from axoplan.errors import AxoplanError
from axoplan.inputs.axes import AXIS_DEFS, DEFAULT_ORDER, FIELDS, TpOrderName, order_name, parse_tp_order
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.inputs.schema import Frozen, describe_validation_error
from axoplan.records.numbers import is_whole, json_numbers
from axoplan.space.layout import Layout, nodes_needed, sequences_per_micro_step

__all__ = ["SCHEMA_VERSION", "LayoutSpec", "PredictedStep", "LaunchConfig", "plan_id", "plan_from_ranking"]

SCHEMA_VERSION = 1


class LayoutSpec(Frozen):
    """``Gx × Gy × Gz × Gdata`` (one field per axis of ``axoplan.inputs.axes``, checked by the tests) and the
    tensor-parallel rank order, innermost first (``xyz``, AxoNN's default; data is outermost)."""

    gx: PositiveInt
    gy: PositiveInt
    gz: PositiveInt
    gdata: PositiveInt
    tp_order: TpOrderName = "xyz"

    @classmethod
    def of(cls, layout: Layout) -> LayoutSpec:
        if layout.order[-1] != "data":
            raise AxoplanError(f"a plan keeps data outermost; layout order {layout.order} cannot run with AxoNN")
        return cls.model_validate({**{a.field: layout.size(a.name) for a in AXIS_DEFS},
                                   "tp_order": order_name(layout.order)})

    def to_layout(self) -> Layout:
        return Layout(*(getattr(self, f) for f in FIELDS), order=parse_tp_order(self.tp_order))

    @property
    def world_size(self) -> int:
        return self.gx * self.gy * self.gz * self.gdata


class PredictedStep(Frozen):
    """The cost model's prediction for this plan."""

    t_step_s: float = Field(ge=0)
    t_compute_s: float = Field(ge=0)
    t_comm_exposed_s: float = Field(ge=0)
    mem_total_bytes: float = Field(ge=0)
    tflops_per_gpu: float = Field(ge=0)
    pct_peak: float = Field(ge=0)
    breakdown: dict[str, float] = Field(default_factory=dict, description="Every column of the prediction.")

    @field_validator("mem_total_bytes")
    @classmethod
    def _to_the_byte(cls, value: float) -> float:
        """Bytes are whole (a ledger's saved tensors divided over a layout's GPUs may leave a fraction): kept as
        they are written, so that a plan reads back unchanged."""
        return float(json_numbers({"mem_total_bytes": value})["mem_total_bytes"])

    @field_validator("breakdown")
    @classmethod
    def _whole_columns_in(cls, value: dict[str, float]) -> dict[str, float]:
        return {k: float(v) if isinstance(v, int) else v for k, v in json_numbers(value).items()}

    @field_serializer("mem_total_bytes")
    def _whole_bytes(self, value: float) -> float | int:
        return json_numbers({"mem_total_bytes": value})["mem_total_bytes"]

    @field_serializer("breakdown")
    def _whole_columns(self, value: dict[str, float]) -> dict[str, Any]:
        """Counts, flags and bytes written as integers (:mod:`axoplan.records.numbers`)."""
        return json_numbers(value)


class LaunchConfig(Frozen):
    """One runnable layout with its prediction."""

    schema_version: int = SCHEMA_VERSION
    plan_id: str
    machine: str = Field(description="Machine name (or the YAML path it was ranked with).")
    devices_per_node: PositiveInt
    model: ModelSpec
    options: RunOptions
    layout: LayoutSpec
    micro_batch: PositiveInt = Field(description="Sequences per GPU per micro-batch.")
    recompute: bool
    cache_weights: bool
    grad_accum_steps: PositiveInt
    world_size: PositiveInt
    nodes: PositiveInt
    prediction: PredictedStep | None = None
    axonn_init: dict[str, int]
    training: TrainingCost | None = Field(
        None, description="Time to train `export --tokens` tokens with this layout (days, node-hours, GPU-hours).")

    @model_validator(mode="after")
    def _consistent(self) -> LaunchConfig:
        """A hand-edited plan must not contradict itself: each derived field is checked against its source."""
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema version {self.schema_version} is not {SCHEMA_VERSION}")
        problem = _contradiction(self)
        if problem:
            raise ValueError(problem)
        return self

    @classmethod
    def build(cls, *, machine: str, devices_per_node: int, model: ModelSpec, options: RunOptions, layout: Layout,
              micro_batch: int, recompute: bool, cache_weights: bool,
              prediction: PredictedStep | None = None) -> LaunchConfig:
        """A plan for one layout; grad accumulation, nodes and the AxoNN arguments are derived."""
        per_micro = sequences_per_micro_step(layout.gx, layout.gy, layout.gz, layout.gdata, micro_batch,
                                             options.hf_path)
        if options.global_batch % per_micro:
            what = "GPUs*micro-batch" if options.hf_path else "Gdata*Gz*micro-batch"
            raise AxoplanError(f"global batch {options.global_batch} is not divisible by {what} = {per_micro}")
        nodes = nodes_needed(layout.world_size, devices_per_node)
        spec = LayoutSpec.of(layout)
        ident = plan_id(machine, model, options, layout, micro_batch, recompute, cache_weights)
        return cls(plan_id=ident, machine=machine, devices_per_node=devices_per_node, model=model, options=options,
                   layout=spec, micro_batch=micro_batch, recompute=recompute, cache_weights=cache_weights,
                   grad_accum_steps=options.global_batch // per_micro, world_size=layout.world_size, nodes=nodes,
                   prediction=prediction, axonn_init=layout.to_axonn_init())

    def to_json(self) -> str:
        return self.model_dump_json(indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "plan") -> LaunchConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AxoplanError(f"{source}: not valid JSON at line {exc.lineno}: {exc.msg}") from None
        return cls.from_dict(data, source)

    @classmethod
    def from_dict(cls, data: Any, source: str = "plan") -> LaunchConfig:
        if not isinstance(data, dict):
            raise AxoplanError(f"{source}: a launch config must be a JSON object")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise AxoplanError(f"{source}: launch-config schema version {version!r} is not supported; this "
                               f"axoplan reads version {SCHEMA_VERSION} (re-export the plan with this axoplan)")
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise AxoplanError(describe_validation_error(err, source, cls)) from None

    @classmethod
    def load(cls, path: str | Path) -> LaunchConfig:
        p = Path(path)
        from axoplan.fileio import read_text

        text = read_text(p, "launch config")
        return cls.from_json(text, str(p))


def _contradiction(plan: LaunchConfig) -> str | None:
    """The first field of `plan` that contradicts the others, as a sentence naming it; None if none does."""
    lay, opts = plan.layout, plan.options
    if lay.world_size != plan.world_size:
        return f"field 'world_size' is {plan.world_size}, but layout {lay.to_layout()} has {lay.world_size} GPUs"
    nodes = nodes_needed(plan.world_size, plan.devices_per_node)
    if plan.nodes != nodes:
        return (f"field 'nodes' is {plan.nodes}, but {plan.world_size} GPUs at {plan.devices_per_node} per node "
                f"need {nodes}")
    per_step = sequences_per_micro_step(lay.gx, lay.gy, lay.gz, lay.gdata, plan.micro_batch,
                                        opts.hf_path) * plan.grad_accum_steps
    if per_step != opts.global_batch:
        return (f"field 'grad_accum_steps': Gdata*Gz*micro_batch*grad_accum_steps = {per_step} is not the global "
                f"batch {opts.global_batch} (options.global_batch)")
    if plan.micro_batch not in opts.micro_batches:
        return (f"field 'micro_batch' is {plan.micro_batch}, not one of options.micro_batches "
                f"{list(opts.micro_batches)}")
    for name in ("recompute", "cache_weights"):
        choice = getattr(opts, name)
        if getattr(plan, name) not in RunOptions.choice_values(choice):
            return f"field {name!r} is {getattr(plan, name)}, but options.{name} is {choice!r}"
    if opts.tp_order not in ("search", lay.tp_order):
        return f"field 'layout.tp_order' is {lay.tp_order!r}, but options.tp_order is {opts.tp_order!r}"
    if plan.axonn_init != lay.to_layout().to_axonn_init():
        return "field 'axonn_init' does not match the layout"
    if plan.training is not None:
        steps = steps_for(plan.training.tokens, opts.global_batch, opts.seq_len)
        if (plan.training.nodes, plan.training.steps) != (plan.nodes, steps):
            return (f"field 'training': {plan.training.steps} steps on {plan.training.nodes} nodes, but its tokens "
                    f"take {steps} steps and the plan has {plan.nodes} nodes")
    ident = plan_id(plan.machine, plan.model, opts, lay.to_layout(), plan.micro_batch, plan.recompute,
                    plan.cache_weights)
    if plan.plan_id != ident and plan.plan_id not in _earlier_ids(plan):
        return (f"field 'plan_id' is {plan.plan_id!r}, but these fields have id {ident!r} (after an intended edit, "
                f"set plan_id to {ident!r})")
    return None


_EARLIER_SCHEME = ("tuned_gemm", "concurrent_z", "attention", "framework", "tp_order")
"""The options some versions before 2026-11-25 hashed even at their default (``_earlier_ids``)."""

_LATER_OPTIONS = (*_EARLIER_SCHEME, "axonn_path", "moe_impl", "expert_tp", "backward_gather", "grad_sync")
"""Run options newer than the plan-id scheme: hashed only when not at their default (issue 24's are also left
out of the options' dump at their default, ``axoplan.inputs.options.LATER_FIELDS``)."""


def _earlier_ids(plan: LaunchConfig) -> set[str]:
    """The ids versions before 2026-11-25 gave this plan: they hashed some later options even at their default."""
    from itertools import combinations

    names = [n for n in _EARLIER_SCHEME if n != "tuned_gemm"]  # tuned_gemm was left out at its default from the start
    subsets = [c for k in range(1, len(names) + 1) for c in combinations(names, k)]
    return {plan_id(plan.machine, plan.model, plan.options, plan.layout.to_layout(), plan.micro_batch, plan.recompute,
                    plan.cache_weights, hashed_defaults=s) for s in subsets}


def plan_id(machine: str, model: ModelSpec, options: RunOptions, layout: Layout, micro_batch: int,
            recompute: bool, cache_weights: bool, hashed_defaults: tuple[str, ...] = ()) -> str:
    """Short stable hash of everything that defines a plan; runs and predictions join on it.

    Options added later with their default left out, so earlier plans keep their ids (those
    in `hashed_defaults` are hashed even at their default, as some earlier versions did)."""
    opts = options.model_dump(mode="json")
    model_fields = model.model_dump(mode="json")
    model_fields.pop("family", None)  # a label (issue 30), not a shape: presets carry it and keep their ids
    for name in _LATER_OPTIONS:
        if name not in hashed_defaults and opts.get(name) == RunOptions.model_fields[name].default:
            opts.pop(name, None)
    key = json.dumps({
        "machine": machine, "model": model_fields, "options": opts,
        "layout": list(layout.sizes), "micro_batch": micro_batch, "recompute": recompute, "cache": cache_weights,
        **({} if layout.order == DEFAULT_ORDER else {"tp_order": order_name(layout.order)}),
    }, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def plan_from_ranking(ranking: Any, index: int, machine_ref: str | None = None) -> LaunchConfig:
    """The launch config of candidate `index` of a :class:`axoplan.search.ranking.Ranking`."""
    c = ranking.candidates
    rec = ranking.row(index)
    if not rec["feasible"]:
        raise AxoplanError(f"layout {c.layout(index)} is infeasible: {rec['reason']}")
    from axoplan.uncertainty.intervals import INTERVAL_COLUMNS

    numeric = {k: float(v) for k, v in rec.items() if k not in INTERVAL_COLUMNS and (  # a saved row: whole as int
        isinstance(v, float) or (is_whole(k) and isinstance(v, int) and not isinstance(v, bool)))}
    pred = PredictedStep(t_step_s=rec["t_step_s"], t_compute_s=rec["t_compute_s"],
                         t_comm_exposed_s=rec["t_comm_exposed_s"], mem_total_bytes=rec["mem_total_bytes"],
                         tflops_per_gpu=rec["tflops_per_gpu"], pct_peak=rec["pct_peak"], breakdown=numeric)
    return LaunchConfig.build(
        machine=machine_ref or ranking.machine.name, devices_per_node=ranking.machine.devices_per_node,
        model=ranking.model, options=ranking.options, layout=c.layout(index), micro_batch=rec["micro_batch"],
        recompute=rec["recompute"], cache_weights=rec["cache_weights"], prediction=pred)
