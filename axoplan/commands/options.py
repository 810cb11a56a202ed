"""The options every planning command shares, declared once: run options and the model.

``RUN_FLAGS`` has one flag per field of :class:`axoplan.inputs.options.RunOptions` (a test fails
when a field has none, or when a default or a choice differs from the field's);
``MODEL_FLAGS`` names a preset or YAML, or builds a custom model. The decorator
:func:`shared_options` adds them to a command's signature and hands the command a built
``RunOptions`` (``run_options``) and a :class:`ModelFlags` (``model_flags``), so `rank`,
`explain`, `export` and `plot` take the same flags with the same defaults and help.

Only typer and the standard library are imported here (the CLI starts fast); pydantic
and the option model are imported when a command runs.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

__all__ = ["Flag", "RUN_FLAGS", "MODEL_FLAGS", "FIT_FLAGS", "ModelFlags", "shared_options", "OnOffSearch", "Attention",
           "Precision", "GradReduceDtype", "AxonnPath", "MoeImpl", "BackwardGather", "GradSync", "parse_ints",
           "GpusOpt", "MachineOpt", "TokensOpt"]

F = TypeVar("F", bound=Callable[..., Any])


class OnOffSearch(StrEnum):
    on = "on"
    off = "off"
    search = "search"


class Attention(StrEnum):
    flash = "flash"
    flash_triton = "flash-triton"
    unfused = "unfused"


class Precision(StrEnum):
    bf16 = "bf16"


class GradReduceDtype(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"


class AxonnPath(StrEnum):
    megatron = "megatron"
    hf = "hf"


class MoeImpl(StrEnum):
    auto = "auto"
    hf_mixtral = "hf-mixtral"
    native = "native"
    transformers = "transformers"


class BackwardGather(StrEnum):
    prefetched = "prefetched"
    blocking = "blocking"


class GradSync(StrEnum):
    auto = "auto"
    flat = "flat"
    per_tensor = "per-tensor"


class RecomputePolicy(StrEnum):
    framework = "framework"
    full = "full"


@dataclass(frozen=True, slots=True)
class Flag:
    """One command-line option: the Python parameter `name`, its declarations, type and default."""

    name: str
    decls: tuple[str, ...]
    type: Any
    default: Any
    help: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The flag as a user types it (its first long name)."""
        return self.decls[0].split("/")[0]

    def parameter(self) -> inspect.Parameter:
        option = typer.Option(*self.decls, help=self.help, **self.extra)
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY, default=self.default,
                                 annotation=Annotated[self.type, option])


RUN_FLAGS: tuple[Flag, ...] = (
    Flag("global_batch", ("--global-batch",), int, 2048, "Sequences per optimizer step."),
    Flag("seq_len", ("--seq-len",), int, 2048, "Tokens per sequence."),
    Flag("micro_batches", ("--micro-batch",), str, "1,2,4,8", "Per-GPU micro-batch sizes to search, e.g. 1,2,4."),
    Flag("recompute", ("--recompute",), OnOffSearch, OnOffSearch.search,
         "Activation recompute, as the framework checkpoints: full recompute (torchtitan: its selective policy)."),
    Flag("cache_weights", ("--cache-weights",), OnOffSearch, OnOffSearch.search,
         "Keep Z-gathered weights for the backward."),
    Flag("overlap_all_reduce", ("--oar/--no-oar",), bool, True, "Overlap the backward all-reduce (OAR)."),
    Flag("overlap_reduce_scatter", ("--ors/--no-ors",), bool, True, "Overlap Z reduce-scatters (ORS)."),
    Flag("overlap_all_gather", ("--oag/--no-oag",), bool, True, "Prefetch Z all-gathers (OAG)."),
    Flag("overlap_forward_all_reduce", ("--overlap-forward-all-reduce/--no-overlap-forward-all-reduce",), bool,
         False, "2-chunk forward all-reduce overlap."),
    Flag("tp_order", ("--tp-order",), str, "search",
         "Tensor-parallel rank order, innermost first: xyz (AxoNN's default), any permutation, or search all."),
    Flag("concurrent_z", ("--concurrent-z/--no-concurrent-z",), bool, False,
         "A second Z communicator: backward Z all-gathers and reduce-scatters run at once."),
    Flag("attention", ("--attention",), Attention, Attention.flash,
         "Attention kernel: flash (FlashAttention-2), flash-triton (Triton FlashAttention) or unfused (scores "
         "materialised in HBM)."),
    Flag("precision", ("--precision",), Precision, Precision.bf16, "Weights and activations in bf16."),
    Flag("grad_reduce_dtype", ("--grad-reduce-dtype",), GradReduceDtype, GradReduceDtype.fp32,
         "Gradient-reduction dtype: the data-parallel all-reduce, and the Z reduce-scatter where the framework "
         "reduces in it (FSDP's reduce_dtype)."),
    Flag("tuned_gemm", ("--tuned-gemm/--no-tuned-gemm",), bool, False,
         "AxoNN's GEMM tuner: forward and dX GEMMs in their fastest operand layout."),
    Flag("framework", ("--framework",), str | None, None,
         "[default: axonn; hf-transformers for a Hugging Face config.json whose family has a traced op ledger] "
         "Training code whose host work, memory and collectives are modelled (frameworks/<name>.yaml): axonn, "
         "hf-transformers (Trainer(bf16=True): fp32 weights, bf16 autocast), hf-transformers-bf16, "
         "pytorch-fsdp (llm-foundry's MPT under Composer FSDP, traced), torchtitan (Llama 3 under FSDP2, traced), "
         "megatron-lm, megatron-deepspeed or axoplan-executor."),
    Flag("axonn_path", ("--axonn-path",), AxonnPath, AxonnPath.megatron,
         "How AxoNN is run: megatron (Megatron-AxoNN's expert-mode linears) or hf (Hugging Face / Lightning: "
         "every GPU its own sequences, activations redistributed around every linear)."),
    Flag("moe_impl", ("--moe-impl",), MoeImpl, MoeImpl.auto,
         "MoE models: hf-mixtral (AxoNN's Mixtral patch, a 4D linear per expert), native (AxoNN's DroplessMoEMLP), "
         "transformers (transformers' grouped experts, unsharded: Gx=Gy=Gz=1) or auto (transformers under "
         "--framework hf-transformers, hf-mixtral on the hf path, native on megatron)."),
    Flag("expert_tp", ("--expert-tp",), int, 1,
         "Native MoE: the tensor-parallel size of DroplessMoEMLP inside Z (tokens gathered over it).", {"min": 1}),
    Flag("backward_gather", ("--backward-gather",), BackwardGather, BackwardGather.prefetched,
         "Backward Z all-gathers: prefetched behind the neighbouring layer, or blocking as AxoNN's code runs them."),
    Flag("grad_sync", ("--grad-sync",), GradSync, GradSync.auto,
         "Replicated parameters' gradient all-reduce: flat (one call), per-tensor (AxoNN's sync_gradients) or auto "
         "(flat on megatron, per-tensor on hf)."),
    Flag("recompute_policy", ("--recompute-policy",), RecomputePolicy, RecomputePolicy.framework,
         "What --recompute reruns: framework (as the framework checkpoints: torchtitan's selective policy, full "
         "elsewhere) or full (every block's whole forward: torchtitan's FullAC)."),
)
"""One flag per RunOptions field, named by the field."""

_CUSTOM = {"layers": "num_layers", "hidden": "hidden", "heads": "num_heads", "kv_heads": "num_kv_heads",
           "ffn_hidden": "ffn_hidden", "vocab": "vocab"}

MODEL_FLAGS: tuple[Flag, ...] = (
    Flag("model", ("--model", "-m"), str | None, None, "Preset (see `axoplan models`) or path to a model YAML.",
         {"show_default": False}),
    Flag("layers", ("--layers",), int | None, None, "Custom model: number of layers.", {"min": 1}),
    Flag("hidden", ("--hidden",), int | None, None, "Custom model: hidden size.", {"min": 1}),
    Flag("heads", ("--heads",), int | None, None, "Custom model: attention heads.", {"min": 1}),
    Flag("kv_heads", ("--kv-heads",), int | None, None, "Custom model: KV heads (GQA).", {"min": 1}),
    Flag("ffn_hidden", ("--ffn-hidden",), int | None, None, "Custom model: FFN width.", {"min": 1}),
    Flag("vocab", ("--vocab",), int | None, None, "Custom model: vocabulary size.", {"min": 1}),
)


FIT_FLAGS: tuple[Flag, ...] = (
    Flag("fit_margin", ("--fit-margin",), float, 0.05,
         "Fraction of step time a layout that fits in memory may be slower and still rank above one whose fit is "
         "in doubt (0.05: 5 %; 0: rank by time alone)."),
    Flag("fit_risk", ("--fit-risk",), float, 0.1,
         "Largest chance of running out of memory a layout may have and count as fitting (0.1: it fits with "
         "probability 0.9 or more, the high end of its 80 % memory interval within the HBM)."),
)
"""The fit rule of the rank order (axoplan.search.fit.FitPolicy, one flag per field), for the commands that rank."""


@dataclass(frozen=True, slots=True)
class ModelFlags:
    """The model named on the command line: a preset or YAML (`name`), custom fields, or both."""

    name: str | None
    custom: dict[str, int | None]

    def load(self) -> Any:
        """The ModelSpec (AxoplanError when neither a model nor a whole custom model is given)."""
        from axoplan.errors import AxoplanError
        from axoplan.inputs.model import load_model

        overrides = {_CUSTOM[k]: v for k, v in self.custom.items() if v is not None}
        if self.name is not None:
            return load_model(self.name, **overrides)
        missing = [f"--{k.replace('_', '-')}" for k in ("layers", "hidden", "heads") if self.custom.get(k) is None]
        if missing:
            raise AxoplanError(f"give --model NAME|PATH, or a custom model with {', '.join(missing)}")
        from pydantic import ValidationError

        from axoplan.inputs.model import ModelSpec
        from axoplan.inputs.plausible import MODEL_RANGES, check_plausible
        from axoplan.inputs.schema import describe_validation_error

        check_plausible(overrides, MODEL_RANGES, "custom model")
        try:
            return ModelSpec.model_validate(overrides)
        except ValidationError as err:
            raise AxoplanError(describe_validation_error(err, "custom model", ModelSpec)) from None


def parse_ints(text: str, flag: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); anything else (an empty item too: '1,,2', '1,2,') is an AxoplanError naming `flag`."""
    from axoplan.errors import AxoplanError

    items = text.split(",")
    if not all(v.strip() for v in items):
        raise AxoplanError(f"{flag} {text!r} has an empty item between commas; write comma-separated integers, "
                           "e.g. 1,2,4")
    try:
        return tuple(int(v) for v in items)
    except ValueError:
        raise AxoplanError(f"{flag} {text!r} must be comma-separated integers, e.g. 1,2,4") from None


def _run_options(values: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    from axoplan.errors import AxoplanError
    from axoplan.inputs.options import RunOptions
    from axoplan.inputs.schema import describe_validation_error

    fields = {k: v.value if isinstance(v, StrEnum) else v for k, v in values.items()}
    fields["micro_batches"] = parse_ints(values["micro_batches"], "--micro-batch")
    try:
        return RunOptions.model_validate(fields)
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, "run options", RunOptions)) from None


def _default_framework(model_flags: ModelFlags | None) -> str:
    """What a user who names no --framework trains with: a Hugging Face config.json is trained by transformers'
    own code (``hf-transformers``) where its family has a traced op ledger; anything else by Megatron-AxoNN."""
    name = model_flags.name if model_flags is not None else None
    if not (name and name.endswith(".json")):
        return "axonn"
    from axoplan.cost.ledger import traced_for

    return "hf-transformers" if traced_for("hf-autocast", model_flags.load()) else "axonn"  # type: ignore[union-attr]


def _evaluated(annotation: Any, fn: Callable[..., Any]) -> Any:
    """A postponed (string) annotation evaluated in the command's module."""
    return eval(annotation, fn.__globals__) if isinstance(annotation, str) else annotation  # noqa: S307


def _fit_policy(values: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    from axoplan.errors import AxoplanError
    from axoplan.search.fit import FitPolicy

    try:
        return FitPolicy(margin=values["fit_margin"], risk=values["fit_risk"])
    except ValidationError as err:
        field_name = str(err.errors()[0]["loc"][0])
        flag = next(f for f in FIT_FLAGS if f.name == f"fit_{field_name}")
        description = FitPolicy.model_fields[field_name].description
        bounds = "0 to 1" if field_name == "margin" else "above 0 and below 1"
        raise AxoplanError(f"{flag.text} {values[flag.name]} must be a number {bounds}: {description}") from None


def shared_options(*, model: bool = True, fit: bool = False) -> Callable[[F], F]:
    """Add the run-option flags (and, with `model`, the model flags; with `fit`, the fit flags) to a command.

    The command declares keyword parameters ``run_options`` (a RunOptions), with `model`
    ``model_flags`` (a ModelFlags) and with `fit` ``fit_policy`` (a FitPolicy) instead of the flags
    themselves. The options are built when the command runs; a bad value is an AxoplanError (one line, exit 2).
    """
    flags = (*RUN_FLAGS, *(MODEL_FLAGS if model else ()), *(FIT_FLAGS if fit else ()))
    names = {f.name for f in flags}

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=_evaluated(p.annotation, fn))
               for p in sig.parameters.values() if p.name not in {"run_options", "model_flags", "fit_policy"}]
        clash = names & {p.name for p in own}
        if clash:
            raise TypeError(f"{fn.__name__} declares shared options itself: {sorted(clash)}")
        head = [f.parameter() for f in flags if f.name == "model"]
        tail = [f.parameter() for f in flags if f.name != "model"]
        params = [*head, *own, *tail]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            shared = {name: kwargs.pop(name) for name in names}
            if model:
                custom = {f.name: shared[f.name] for f in MODEL_FLAGS if f.name != "model"}
                kwargs["model_flags"] = ModelFlags(shared["model"], custom)
            if shared["framework"] is None:
                shared["framework"] = _default_framework(kwargs.get("model_flags"))
            kwargs["run_options"] = _run_options({f.name: shared[f.name] for f in RUN_FLAGS})
            if fit:
                kwargs["fit_policy"] = _fit_policy({f.name: shared[f.name] for f in FIT_FLAGS})
            return fn(**kwargs)

        command.__signature__ = sig.replace(parameters=params, return_annotation=None)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        del command.__wrapped__  # typer reads the signature above, not the wrapped function's
        return command  # type: ignore[return-value]

    return decorate


GpusOpt = Annotated[int, typer.Option("--gpus", "-g", help="Number of GPUs (GCDs on Frontier).")]
TokensOpt = Annotated[str | None, typer.Option(
    "--tokens", help="Tokens to train (e.g. 300B, 1.5T, 2e12): adds days, node-hours and GPU-hours.",
    show_default=False)]
MachineOpt = Annotated[str, typer.Option(
    "--machine", help="Shipped machine (see `axoplan machines`) or path to a machine YAML.")]
ProbeOpt = Annotated[Path | None, typer.Option(
    "--probe", help="The machine-YAML fragment `axoplan probe -o` wrote on the node that runs (or ran) the "
                    "training: its host, GEMM and op-class measurements replace the machine's (marked measured).",
    show_default=False)]
