"""Run options: batch, sequence, and the AxoNN features that are flags or search axes.

Defaults (stated in the README too): global batch 2048 sequences of 2048 tokens (the
AxoNN Frontier script's 2048 × 2048), per-GPU micro-batches 1, 2, 4 and 8 searched,
activation recompute and weight caching searched (both values), OAR, ORS and OAG on
(the production flags of Megatron-AxoNN), the 2-chunk forward all-reduce overlap off
(it exists only on AxoNN's Gordon Bell branch), bf16 with fp32 gradient reduction.

Issue 24 added the way AxoNN's users run it (``docs/algorithm.md`` §4b, §5d, §9): the path
(``axonn_path``: Megatron-AxoNN's expert-mode linears, or the Hugging Face / Lightning path whose
linears redistribute activations on entry and exit), the mixture-of-experts module
(``moe_impl``), and two overlap behaviours of AxoNN's code (``backward_gather``, ``grad_sync``).
Their defaults reproduce the model as it was; they are serialised only when not at their default,
so plans, plan ids and saved rankings of earlier versions read the same (:data:`LATER_FIELDS`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    Field,
    PositiveInt,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from axoplan.inputs.axes import tp_order_name
from axoplan.inputs.plausible import RUN_RANGES, check_plausible
from axoplan.inputs.schema import Frozen

if TYPE_CHECKING:
    from axoplan.inputs.framework import FrameworkProfile
    from axoplan.inputs.model import ModelSpec

__all__ = ["RunOptions", "Choice", "LATER_FIELDS"]

Choice = Literal["on", "off", "search"]

LATER_FIELDS = ("axonn_path", "moe_impl", "expert_tp", "backward_gather", "grad_sync", "recompute_policy")
"""Options added after the first plans (issue 24, then issue 29's ``recompute_policy``): left out of every dump while at
their default (earlier outputs unchanged)."""


class RunOptions(Frozen):
    """Training-run settings shared by every candidate layout."""

    global_batch: PositiveInt = Field(2048, description="Sequences per optimizer step.")
    seq_len: PositiveInt = Field(2048, description="Tokens per sequence.")
    micro_batches: tuple[PositiveInt, ...] = Field(
        (1, 2, 4, 8), min_length=1, max_length=32, description="Per-GPU micro-batch sizes (sequences) to search "
        "(at most 32: each multiplies the candidates)."
    )
    recompute: Choice = Field(
        "search", description="Activation recompute as the framework checkpoints (full recompute; torchtitan: its "
        "selective policy): on, off, or search both.")
    cache_weights: Choice = Field(
        "search", description="Keep Z-gathered weights from forward to backward: on, off, or search both."
    )
    overlap_all_reduce: bool = Field(True, description="OAR: hide the backward all-reduce behind the dW GEMM.")
    overlap_reduce_scatter: bool = Field(True, description="ORS: hide Z reduce-scatters behind the backward.")
    overlap_all_gather: bool = Field(True, description="OAG: prefetch the next layer's Z all-gather.")
    overlap_forward_all_reduce: bool = Field(
        False, description="Split the local batch in two chunks to hide the forward all-reduce."
    )
    tp_order: str = Field(
        "search", description="Tensor-parallel rank order, innermost first (xyz: X innermost, AxoNN's default; "
        "data is always outermost), or search every order (AxoNN's tensor_parallel_order).")
    concurrent_z: bool = Field(
        False, description="A second Z communicator, so the backward's Z all-gathers and reduce-scatters run at "
        "once (AxoNN's Gordon Bell branch); they still share the Z links.")
    attention: Literal["flash", "flash-triton", "unfused"] = Field(
        "flash", description="Attention kernel: flash (FlashAttention-2, fused), flash-triton (the Triton "
        "FlashAttention kernel, fused) or unfused (scores materialised in HBM).")
    precision: Literal["bf16"] = Field("bf16", description="Weights and activations in bf16 (2 bytes).")
    grad_reduce_dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="Gradient-reduction dtype: the data-parallel all-reduce (the AxoNN authors' model "
        "uses fp32), and the Z reduce-scatter where the framework reduces in it (FSDP's reduce_dtype)."
    )
    tuned_gemm: bool = Field(
        False, description="AxoNN's GEMM tuner: forward and dX GEMMs take their fastest operand layout.")
    framework: str = Field(
        "axonn", description="Framework profile (frameworks/<name>.yaml): host ops and kernels per block.")
    axonn_path: Literal["megatron", "hf"] = Field(
        "megatron", description="How AxoNN is run: megatron (Megatron-AxoNN's expert-mode linears, the batch over "
        "Gdata·Gz) or hf (Hugging Face / Lightning: auto_parallelize's linears, every GPU its own sequences, "
        "activations redistributed around every linear).")
    moe_impl: Literal["auto", "hf-mixtral", "native", "transformers"] = Field(
        "auto", description="Mixture-of-experts module (MoE models only): hf-mixtral (AxoNN's Mixtral patch, one "
        "4D linear per expert), native (AxoNN's DroplessMoEMLP: a grouped GEMM over a tensor-parallel group inside "
        "Z), transformers (transformers' own grouped experts, which AxoNN does not shard) or auto (transformers "
        "under a framework that is transformers' code, hf-mixtral on the hf path, native on the megatron path).")
    expert_tp: PositiveInt = Field(
        1, description="DroplessMoEMLP's tensor-parallel size: tokens are gathered over this many Z ranks, "
        "expert weights sharded over the other Gz/expert_tp (native MoE only).")
    backward_gather: Literal["prefetched", "blocking"] = Field(
        "prefetched", description="The backward's Z all-gathers: prefetched behind the neighbouring layer (the model's "
        "assumption) or blocking as AxoNN's AsyncLinear.backward calls them (cache=False), unless cached.")
    grad_sync: Literal["auto", "flat", "per-tensor"] = Field(
        "auto", description="Gradient all-reduce of replicated parameters: flat (one call), per-tensor (AxoNN's "
        "sync_gradients, one call per parameter tensor) or auto (flat on the megatron path, per-tensor on hf).")
    recompute_policy: Literal["framework", "full"] = Field(
        "framework", description="What a recompute reruns: the framework's own checkpointing as its op ledger traced "
        "it (torchtitan: its selective policy; every other framework: full), or full (every block's whole forward "
        "again, keeping only its input: torchtitan's FullAC).")

    @model_validator(mode="before")
    @classmethod
    def _plausible(cls, data: Any) -> Any:
        if isinstance(data, dict):
            check_plausible(data, RUN_RANGES, "run options")
        return data

    @model_serializer(mode="wrap")
    def _drop_later_defaults(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in LATER_FIELDS:
            if getattr(self, name) == type(self).model_fields[name].default:
                data.pop(name, None)
        return data

    @field_validator("tp_order")
    @classmethod
    def _tp_order(cls, v: str) -> str:
        if v != "search":
            try:
                tp_order_name(v)
            except ValueError:
                raise ValueError(f"tensor-parallel order {v!r}: give 'search' or a permutation of 'xyz' (innermost "
                                 "first)") from None
        return v

    @field_validator("framework")
    @classmethod
    def _known_framework(cls, v: str) -> str:
        from axoplan.inputs.framework import shipped_frameworks

        known = shipped_frameworks()
        if v not in known:
            raise ValueError(f"unknown framework {v!r}; known: {', '.join(known)}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _ledger_frameworks_run_the_hf_path(cls, data: Any) -> Any:
        """A framework that runs Hugging Face's eager model (its profile's ``axonn_path: hf``) runs on AxoNN's
        Hugging Face path: every GPU its own sequences at full width (``docs/decisions.md``, issue 29)."""
        if isinstance(data, dict) and isinstance(data.get("framework"), str):
            from axoplan.inputs.framework import frameworks_dir, load_framework

            path = frameworks_dir() / f"{data['framework']}.yaml"
            if path.is_file() and load_framework(data["framework"]).axonn_path == "hf":
                data = {**data, "axonn_path": "hf"}
        return data

    @field_validator("micro_batches")
    @classmethod
    def _sorted_unique(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(set(v)))

    @property
    def hf_path(self) -> bool:
        """The Hugging Face / Lightning path: every GPU holds its own sequences (``axonn_path``)."""
        return self.axonn_path == "hf"

    def code_profile(self, model: ModelSpec) -> FrameworkProfile:
        """The profile of the code this run executes, the one rule by which the cost model, the memory verdicts, the
        interval's reach, the trace fit and ``explain`` pick it: the framework's own, except for a dense model on the
        Hugging Face path of a framework that names the code that path runs (``hf_path_code``): AxoNN's path wraps
        Hugging Face's eager model, whose op ledger then prices it (``docs/decisions.md``, issue 29). A mixture there
        keeps the framework's own profile (AxoNN's patch of transformers' Mixtral, counted)."""
        from axoplan.inputs.framework import load_framework

        profile = load_framework(self.framework)
        if self.hf_path and model.moe is None and profile.hf_path_code is not None:
            return load_framework(profile.hf_path_code)
        return profile

    def code_model(self, model: ModelSpec) -> ModelSpec:
        """The model the run's code computes, the one rule by which the cost model (and so the memory verdicts and
        ``explain``) takes it: `model`, except a mixture on a native MoE module whose code routes a fixed number of
        experts per token (``FrameworkProfile.native_moe_top_k``: AxoNN's ``DroplessMoEMLP`` builds its router with
        ``top_k=1``, ``axonn/intra_layer/moe/layer.py`` @0e02dbf), whose experts then run on that many per token."""
        if model.moe is None or self.moe_module != "native":
            return model
        from axoplan.inputs.framework import load_framework

        top_k = load_framework(self.framework).native_moe_top_k
        if top_k is None or top_k == model.moe.top_k:
            return model
        return model.model_copy(update={"moe": model.moe.model_copy(update={"top_k": top_k})})

    @property
    def moe_module(self) -> str:
        """The MoE module actually used: ``moe_impl``, with auto resolved by the path."""
        if self.moe_impl != "auto":
            return self.moe_impl
        from axoplan.inputs.framework import load_framework

        if load_framework(self.framework).axonn_path == "hf":
            return "transformers"
        return "hf-mixtral" if self.hf_path else "native"

    @property
    def per_tensor_sync(self) -> bool:
        """Whether replicated parameters are all-reduced one tensor at a time (``grad_sync``)."""
        return self.grad_sync == "per-tensor" or (self.grad_sync == "auto" and self.hf_path)

    @property
    def tokens(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def grad_reduce_bytes(self) -> int:
        return 4 if self.grad_reduce_dtype == "fp32" else 2

    @staticmethod
    def choice_values(choice: Choice) -> tuple[bool, ...]:
        return {"on": (True,), "off": (False,), "search": (False, True)}[choice]
