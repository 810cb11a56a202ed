"""What a run needs before any process starts: settings, scale-down, and the checks.

Everything here is plain Python (no torch), so a bad plan, a layout that does not divide
the model, or a wrong world size is refused in milliseconds, before start-up.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, ValidationError

from axoplan.errors import AxoplanError
from axoplan.inputs.axes import DEFAULT_ORDER
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.inputs.schema import Frozen, describe_validation_error
from axoplan.records.plan import LaunchConfig
from axoplan.space.layout import sequences_per_micro_step

__all__ = ["ExecSettings", "make_settings", "Scale", "scale_plan", "check_runnable", "check_world"]


class ExecSettings(Frozen):
    """How to run a plan (not what to run: that is the plan)."""

    iterations: PositiveInt = Field(10, description="Timed iterations (optimizer steps).")
    warmup: int = Field(2, ge=0, description="Untimed iterations first; the first records the OAG order.")
    timeout_s: PositiveFloat = Field(120.0, description="Limit on every collective and on start-up, seconds.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when available, else cpu.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="auto: bfloat16 on cuda (the plan's precision), float32 on cpu.")
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: PositiveFloat = 1e-4
    seed: int = 0
    init: Literal["local", "full"] = Field(
        "local", description="local: each rank draws its own shards; full: slice one full model (small models).")
    phase_timing: bool = Field(True, description="Time every phase (GEMM, each collective, waits).")
    engine: Literal["native", "axonn"] = Field("native", description="axonn: AxoNN's expert-mode linears (GPU).")
    trace: bool = Field(False, description="Record the last iteration's op sequence (benchmarks).")
    progress: bool = Field(False, description="Rank 0 prints one line per iteration on stderr.")
    checkpoint_dir: str | None = Field(None, description="The run's checkpoint folder (axoplan.executor.checkpoint).")
    save_checkpoint: bool = Field(False, description="Write a checkpoint to checkpoint_dir at the end of the run.")
    resume: bool = Field(False, description="Start from the checkpoint in checkpoint_dir (AXOPLAN_RESUME=1).")
    fault: str = Field("", pattern=r"^(\d+:(raise|exit|kill|hang)@\d+)?$",
                       description="Fault drill 'RANK:KIND@ITERATION': that rank raises, exits, is killed or "
                                   "hangs when the iteration starts (to check a cluster's failure handling).")

    def fault_at(self, rank: int, iteration: int) -> str | None:
        """The kind of fault this rank must show at this iteration, if any."""
        if not self.fault:
            return None
        where, _, when = self.fault.partition("@")
        bad, _, kind = where.partition(":")
        return kind if int(bad) == rank and int(when) == iteration else None


def make_settings(**values: object) -> ExecSettings:
    """ExecSettings from command-line values; a bad value is an AxoplanError."""
    try:
        return ExecSettings.model_validate(values)
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, "run settings", ExecSettings)) from None


class Scale(Frozen):
    """Scale a plan's model down for a small machine; None keeps the plan's value."""

    layers: PositiveInt | None = None
    hidden: PositiveInt | None = None
    seq_len: PositiveInt | None = None
    vocab: PositiveInt | None = None
    grad_accum: PositiveInt | None = Field(None, description="Gradient-accumulation steps (sets the global batch).")

    @property
    def is_identity(self) -> bool:
        return all(v is None for v in self.model_dump().values())


def scale_plan(plan: LaunchConfig, scale: Scale) -> LaunchConfig:
    """The plan with a smaller model, same layout, micro-batch and options (a new plan id).

    A new hidden size keeps the head count and scales an explicit FFN width in proportion.
    """
    if scale.is_identity:
        return plan
    model = _scaled_model(plan.model, scale)
    accum = scale.grad_accum or plan.grad_accum_steps
    lay = plan.layout
    batch = sequences_per_micro_step(lay.gx, lay.gy, lay.gz, lay.gdata, plan.micro_batch, plan.options.hf_path) * accum
    try:
        options = RunOptions.model_validate({**plan.options.model_dump(), "global_batch": batch,
                                             "seq_len": scale.seq_len or plan.options.seq_len})
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, "scaled run options", RunOptions)) from None
    return LaunchConfig.build(machine=plan.machine, devices_per_node=plan.devices_per_node, model=model,
                              options=options, layout=lay.to_layout(), micro_batch=plan.micro_batch,
                              recompute=plan.recompute, cache_weights=plan.cache_weights, prediction=None)


def _scaled_model(model: ModelSpec, scale: Scale) -> ModelSpec:
    updates: dict[str, object] = {}
    if scale.layers is not None:
        updates["num_layers"] = scale.layers
    if scale.hidden is not None:
        updates["hidden"] = scale.hidden
        if model.ffn_hidden is not None:
            updates["ffn_hidden"] = max(1, round(model.ffn_hidden * scale.hidden / model.hidden))
    if scale.vocab is not None:
        updates["vocab"] = scale.vocab
    if scale.seq_len is not None and model.max_positions:
        updates["max_positions"] = max(model.max_positions, scale.seq_len)
    parts = [f"{k}={v}" for k, v in (("layers", scale.layers), ("hidden", scale.hidden), ("vocab", scale.vocab))
             if v is not None]
    if parts:
        updates["name"] = f"{model.name} scaled ({', '.join(parts)})"
    try:
        return ModelSpec.model_validate({**model.model_dump(), **updates})
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, "scaled model", ModelSpec)) from None



def check_runnable(plan: LaunchConfig, engine: str = "native") -> None:
    """Refuse a plan the planner's rules refuse (AxoplanError, one line).

    The plan is checked as a one-row candidate table by ``axoplan.search.feasibility.check``,
    the rules ``rank`` applies, so the reasons read the same; memory is not checked
    (the executor cannot know it before it runs). AxoNN's linears also need Gz to divide
    each weight block (the native engine pads).
    """
    from axoplan.search.feasibility import check
    from axoplan.space.candidates import Candidates

    lay = plan.layout.to_layout()
    one = Candidates.single(lay, plan.micro_batch, plan.recompute, plan.cache_weights)
    problems = check(plan.model, plan.options, one, engine, framework_code=False).texts(0)
    if engine == "axonn" and lay.order != DEFAULT_ORDER:
        raise AxoplanError(f"AxoNN 0.2.0 has X innermost only (tensor_parallel_order is on its Gordon Bell branch); "
                           f"layout {lay} needs the native engine, or export with --tp-order xyz")
    if engine == "axonn" and plan.options.concurrent_z:
        raise AxoplanError("AxoNN 0.2.0 has no second Z communicator (--concurrent-z is on its Gordon Bell branch "
                           "only); run with the native engine, or export without --concurrent-z")
    if plan.options.hf_path and plan.model.tied_embeddings:
        problems.append("the hf path's executor runs untied models (auto_parallelize gives the LM head its own "
                        "weight); scale or choose an untied model (tied_embeddings: false)")
    if plan.options.hf_path and engine == "axonn":
        problems.append("the AxoNN engine runs expert-mode linears; the hf path runs on the native engine")
    if plan.model.attention_head_dim is not None or plan.model.qkv_bias:
        problems.append("the executor builds heads of hidden/num_heads features without a QKV-only bias (a config's "
                        "head_dim or Qwen2's q/k/v biases are not built)")
    moe = plan.model.moe
    if moe is not None and (plan.options.moe_module != "native" or plan.options.hf_path or moe.shared_experts
                            or plan.model.biases):
        problems.append("the executor runs AxoNN's native MoE module (--moe-impl native) on the megatron path, without "
                        "shared experts or biases; the Mixtral patch's per-expert linears run with AxoNN itself "
                        "(docs/decisions.md)")
    if engine == "axonn" and plan.options.tuned_gemm:
        problems.append("AxoNN's released linears have no GEMM tuner (it lives on its add-timers-gordon-bell "
                        "branch); run the native engine or plan without --tuned-gemm")
    if problems:
        raise AxoplanError(f"layout {lay} cannot run {plan.model.name}: {'; '.join(problems)} "
                           f"(choose another layout, or scale the model with --hidden/--layers/--seq-len)")


def check_world(plan: LaunchConfig, world_size: int, where: str) -> None:
    """Refuse to start when the launcher's world size is not the layout's."""
    if world_size != plan.world_size:
        lay = plan.layout.to_layout()
        raise AxoplanError(f"{where} has {world_size} ranks but layout {lay} needs {plan.world_size}; "
                           f"start {plan.world_size} ranks (e.g. --local {plan.world_size})")
