"""Transformer models: presets, custom specs, and the linear layers the 4D algorithm shards.

A block has four linear layers (``docs/algorithm.md`` §1): QKV and MLP-up are *plain*
(input features over X, output features over Y); attention-out and MLP-down are
*transposed* (the roles of X and Y swap), so one layer's output layout is the next one's
input. Each layer is data (:class:`LinearLayer`): its role, shape, axes and whether full
recompute runs it again; the cost model, the feasibility rules and the executor read
these fields, never a layer's position.

Parameter counts follow the usual decomposition (Narayanan et al., SC'21, eq. 2,
generalised to grouped-query attention and gated FFNs)::

    per block   = H·(H + 2·kv·d_head)  [QKV]  + H·H [attn-out]  + m·H·F [MLP, m = 2 GeLU, 3 SwiGLU]
                  + biases and norms
    embeddings  = V·H (+ V·H again for an untied LM head) + positions·H

A mixture-of-experts block (``ModelSpec.moe``: Mixtral, issue 24) replaces the MLP with ``E`` experts of
width ``I`` (``3·H·I`` parameters each, SwiGLU), ``top_k`` of them run per token, plus ``shared_experts``
that every token runs and a replicated router ``H·E``. Its expert linears carry ``experts`` copies
that each see ``top_k/E`` of the tokens (:class:`LinearLayer`). Total and active counts are checked
against Mistral's published 46.7B/12.9B (8x7B) and 141B/39B (8x22B) in ``tests/test_model.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import (
    Field,
    NonNegativeInt,
    PositiveInt,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from axoplan.errors import AxoplanError, closest_hint
from axoplan.fileio import check_readable
from axoplan.inputs.plausible import MODEL_RANGES, check_plausible
from axoplan.inputs.schema import Frozen, describe_validation_error, load_yaml_mapping

__all__ = ["ModelSpec", "MoESpec", "Family", "LinearLayer", "BLOCK_LAYERS", "MOE_LAYERS", "HEAD_LAYER",
           "TRANSPOSED_LAYERS", "LATER_MODEL_FIELDS", "layer_axes", "PRESETS", "load_model", "load_hf_config",
           "custom_name", "parse_param_count", "padded_vocab"]

Role = Literal["attention", "mlp", "head"]
IntLike = TypeVar("IntLike", int, "npt.NDArray[np.int64]")
Feeds = Literal["norm", "attention", "activation"]
Family = Literal["llama", "qwen2", "qwen3", "gpt2", "gpt-neox", "mpt", "mixtral", "qwen2-moe", "qwen3-moe", "olmoe",
                 "deepseek"]
"""The architecture a model was read as (its Hugging Face ``model_type``, ``axoplan.inputs.hf_config``):
Llama/Mistral blocks are "llama" (pre-norm RMSNorm, rotary, SwiGLU); Qwen2's, which add biases to the query, key and
value projections, "qwen2"; Qwen3's, which add an RMSNorm on each query and key head, "qwen3"."""

LATER_MODEL_FIELDS: dict[str, object] = {"family": None, "attention_head_dim": None, "qkv_bias": False}
"""Fields added by issue 30, with their defaults: left out of every dump at them, so models, plan ids and saved
rankings of earlier versions read the same (``records.plan.plan_id`` leaves ``family`` out always: a label)."""


@dataclass(frozen=True, slots=True)
class LinearLayer:
    """One 4D-sharded weight matrix ``n_out × k_in``.

    * `role`: the sublayer it belongs to (attention, MLP, or the LM head);
    * `input`: what it reads: a norm's output, the attention's output, or the MLP's
      activation (the non-GEMM work that precedes it);
    * `transposed`: input features over Y and output features over X (``in_axis``,
      ``out_axis``), instead of X and Y;
    * `recomputed`: full activation recompute runs its forward again (block layers; not
      the LM head, which the loss needs once);
    * `out_chunks`: the output is this many equal parts, each sharded over ``out_axis``
      on its own (SwiGLU's gate and up projections: 2);
    * `experts`: copies of this weight in a block (a mixture of experts' ``E`` experts, 1 otherwise),
      each a separate 4D linear, and `token_share` the fraction of the block's tokens each copy sees
      (``top_k/E``; 1 for a dense layer).
    """

    name: str
    role: Role
    input: Feeds
    transposed: bool
    recomputed: bool
    k_in: int = 0
    n_out: int = 0
    out_chunks: int = 1
    experts: int = 1
    token_share: float = 1.0

    @property
    def in_axis(self) -> str:
        return layer_axes(self.transposed)[0]

    @property
    def out_axis(self) -> str:
        return layer_axes(self.transposed)[1]

    @property
    def kind(self) -> str:
        return "transposed" if self.transposed else "plain"

    @property
    def num_params(self) -> int:
        """Parameters of all its copies."""
        return self.k_in * self.n_out * self.experts

    @property
    def params_per_copy(self) -> int:
        """Parameters of one copy (one expert): what one Z all-gather of it moves."""
        return self.k_in * self.n_out

    @property
    def is_expert(self) -> bool:
        return self.token_share < 1.0

    def with_shape(self, k_in: int, n_out: int, out_chunks: int = 1, experts: int = 1,
                   token_share: float = 1.0) -> LinearLayer:
        return replace(self, k_in=k_in, n_out=n_out, out_chunks=out_chunks, experts=experts, token_share=token_share)


BLOCK_LAYERS: tuple[LinearLayer, ...] = (
    LinearLayer("qkv", "attention", "norm", transposed=False, recomputed=True),
    LinearLayer("attn_out", "attention", "attention", transposed=True, recomputed=True),
    LinearLayer("mlp_up", "mlp", "norm", transposed=False, recomputed=True),
    LinearLayer("mlp_down", "mlp", "activation", transposed=True, recomputed=True),
)
"""A block's linear layers in execution order, without shapes (``ModelSpec.block_linears``)."""

MOE_LAYERS: tuple[LinearLayer, ...] = (
    LinearLayer("qkv", "attention", "norm", transposed=False, recomputed=True),
    LinearLayer("attn_out", "attention", "attention", transposed=True, recomputed=True),
    LinearLayer("expert_up", "mlp", "norm", transposed=False, recomputed=True),
    LinearLayer("expert_down", "mlp", "activation", transposed=True, recomputed=True),
    LinearLayer("shared_up", "mlp", "norm", transposed=False, recomputed=True),
    LinearLayer("shared_down", "mlp", "activation", transposed=True, recomputed=True),
)
"""A mixture-of-experts block's linear layers (the shared experts only where the model has them): AxoNN's
Mixtral patch makes each expert's w1, w3 (gate and up, plain) and w2 (down, transposed) 4D linears
(``axonn/models/transformers/modify_mixtral.py``)."""

HEAD_LAYER = LinearLayer("lm_head", "head", "norm", transposed=False, recomputed=False)
"""The LM head: vocabulary rows over Y (padded to a multiple of Gx·Gy), run once per micro-batch."""

TRANSPOSED_LAYERS: frozenset[str] = frozenset(lin.name for lin in BLOCK_LAYERS if lin.transposed)


def layer_axes(transposed: bool) -> tuple[str, str]:
    """(input-feature axis, output-feature axis): X, Y for a plain layer; Y, X transposed."""
    return ("y", "x") if transposed else ("x", "y")


class MoESpec(Frozen):
    """A mixture-of-experts MLP: ``num_experts`` SwiGLU experts of width ``expert_ffn_hidden``, ``top_k`` per
    token, ``shared_experts`` that every token runs, and a replicated router ``H × E`` without bias
    (Mixtral's ``MixtralSparseMoeBlock.gate``)."""

    num_experts: PositiveInt = Field(description="Experts per MoE layer (E; Mixtral's num_local_experts).")
    top_k: PositiveInt = Field(2, description="Experts each token runs (Mixtral's num_experts_per_tok).")
    expert_ffn_hidden: PositiveInt = Field(description="Width I of one expert's SwiGLU (intermediate_size).")
    shared_experts: NonNegativeInt = Field(0, description="Experts every token runs besides the routed ones.")
    routing_skew: float = Field(
        1.0, ge=1.0, description="Systematic routing imbalance: tokens of the most loaded expert over the mean, "
        "beyond the sampling spread the model computes [assumed 1: no published figure reached, docs/decisions.md].")

    @model_validator(mode="after")
    def _check_top_k(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} is more than the {self.num_experts} experts")
        return self


class ModelSpec(Frozen):
    """A decoder-only transformer."""

    name: str = "custom"
    num_layers: PositiveInt
    hidden: PositiveInt = Field(description="Model width H.")
    num_heads: PositiveInt
    num_kv_heads: PositiveInt | None = Field(None, description="Grouped-query attention; default = num_heads.")
    ffn_hidden: PositiveInt | None = Field(None, description="FFN width F; default 4·H.")
    ffn_kind: Literal["gelu", "swiglu"] = "gelu"
    vocab: PositiveInt = 51200
    max_positions: int = Field(0, ge=0, description="Learned position embeddings (0 for rotary).")
    tied_embeddings: bool = True
    biases: bool = True
    source: str = ""
    moe: MoESpec | None = Field(None, description="Mixture of experts in every block instead of the MLP.")
    family: Family | None = Field(None, description="Architecture it was read as (a config.json's model_type); "
                                  "None where no family is claimed.")
    attention_head_dim: PositiveInt | None = Field(
        None, description="Features per attention head where a config sets them apart from hidden/num_heads "
        "(Qwen3's head_dim); default hidden/num_heads.")
    qkv_bias: bool = Field(False, description="Biases on the QKV projection only (Qwen2's q/k/v_proj), where "
                           "`biases` is false.")

    @model_serializer(mode="wrap")
    def _dense_as_before(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """A dense model dumps as it did before MoE models existed, and every model as it did before issue 30's
        fields where they are at their defaults (plan ids and saved rankings unchanged)."""
        data: dict[str, object] = handler(self)
        if self.moe is None:
            data.pop("moe", None)
        for name, default in LATER_MODEL_FIELDS.items():
            if getattr(self, name) == default:
                data.pop(name, None)
        return data

    @model_validator(mode="after")
    def _check_heads(self) -> ModelSpec:
        if self.attention_head_dim is None and self.hidden % self.num_heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.kv_heads}")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden // self.num_heads

    @property
    def attention_width(self) -> int:
        """Features of all query heads, ``num_heads·head_dim``: H, unless a config sets ``head_dim`` apart."""
        return self.num_heads * self.head_dim

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    def block_linears(self) -> tuple[LinearLayer, ...]:
        """The (sharded) weight matrices of one block, in execution order, with shapes: four for a dense
        block; attention, the experts and the shared experts for a mixture of experts."""
        h, f = self.hidden, self.ffn
        qkv_out = (self.num_heads + 2 * self.kv_heads) * self.head_dim
        chunks = 2 if self.ffn_kind == "swiglu" else 1
        if self.moe is not None:
            return self._moe_linears(h, qkv_out)
        shapes = {"qkv": (h, qkv_out, 1), "attn_out": (self.attention_width, h, 1), "mlp_up": (h, chunks * f, chunks),
                  "mlp_down": (f, h, 1)}
        return tuple(lin.with_shape(*shapes[lin.name]) for lin in BLOCK_LAYERS)

    def _moe_linears(self, h: int, qkv_out: int) -> tuple[LinearLayer, ...]:
        moe = self.moe
        assert moe is not None
        e, i, share = moe.num_experts, moe.expert_ffn_hidden, moe.top_k / moe.num_experts
        shared = moe.shared_experts * i
        qkv, out, up, down, s_up, s_down = MOE_LAYERS
        layers = [qkv.with_shape(h, qkv_out), out.with_shape(self.attention_width, h),
                  up.with_shape(h, 2 * i, 2, e, share), down.with_shape(i, h, 1, e, share)]
        if shared:
            layers += [s_up.with_shape(h, 2 * shared, 2), s_down.with_shape(shared, h)]
        return tuple(layers)

    def router_params(self) -> int:
        """The router ``H × E`` of one block (0 for a dense model): replicated, as AxoNN leaves it."""
        return self.hidden * self.moe.num_experts if self.moe is not None else 0

    def head_linear(self, vocab: int) -> LinearLayer:
        """The LM head for a (padded) vocabulary of `vocab` rows."""
        return HEAD_LAYER.with_shape(self.hidden, vocab)

    def unsharded_params_per_block(self) -> int:
        """Norm weights (and biases) that every GPU holds whole; reduced over the world."""
        norms = 2 * self.hidden * (2 if self.biases else 1)
        return norms + sum(lin.n_out * lin.experts for lin in self._biased()) + self.router_params()

    def _biased(self) -> tuple[LinearLayer, ...]:
        """The block's linears that carry a bias: all (`biases`), the QKV projection (`qkv_bias`), or none."""
        linears = self.block_linears()
        if self.biases:
            return linears
        return linears[:1] if self.qkv_bias else ()

    def replicated_tensors(self) -> int:
        """Parameter tensors every GPU holds whole, in the model: per block its norms (weight, and bias),
        the biases of its linears and the router; the final norm. One all-reduce each under AxoNN's
        ``sync_gradients`` (``RunOptions.grad_sync``)."""
        per_norm = 2 if self.biases else 1
        linears = sum(lin.experts for lin in self._biased())
        per_block = 2 * per_norm + linears + (1 if self.moe is not None else 0)
        return self.num_layers * per_block + per_norm

    def embedding_params(self) -> int:
        heads = 1 if self.tied_embeddings else 2
        return heads * self.vocab * self.hidden + self.max_positions * self.hidden

    def num_params(self) -> int:
        """Total parameter count."""
        block = sum(lin.num_params for lin in self.block_linears()) + self.unsharded_params_per_block()
        final_norm = self.hidden * (2 if self.biases else 1)
        return self.num_layers * block + self.embedding_params() + final_norm

    def active_params(self) -> int:
        """Parameters one token runs through: all but the experts it is not routed to (a dense model's all)."""
        unused = sum(lin.num_params - round(lin.num_params * lin.token_share) for lin in self.block_linears())
        return self.num_params() - self.num_layers * unused


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name=name, num_layers=layers, hidden=hidden, num_heads=heads, vocab=51200, max_positions=2048, family="gpt2",
        source="AxoNN GPT family, Megatron-AxoNN model-table.md (axonn.md §4.1); GPT-2 vocab padded to 51200",
    )


def _llama(name: str, layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    return ModelSpec(
        name=name, num_layers=layers, hidden=hidden, num_heads=heads, num_kv_heads=8, ffn_hidden=ffn,
        ffn_kind="swiglu", vocab=128256, tied_embeddings=False, biases=False, family="llama",
        source="Llama 3.1 model card / config.json (Meta, 2024)",
    )


def _mixtral(name: str, layers: int, hidden: int, heads: int, ffn: int, source: str) -> ModelSpec:
    return ModelSpec(
        name=name, num_layers=layers, hidden=hidden, num_heads=heads, num_kv_heads=8, ffn_hidden=ffn,
        ffn_kind="swiglu", vocab=32000, tied_embeddings=False, biases=False, source=source, family="mixtral",
        moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden=ffn),
    )


PRESETS: dict[str, ModelSpec] = {
    # name            layers hidden heads       ~params (checked in tests/test_model.py)
    "5B": _gpt("5B", 24, 4096, 32),  # 5.1e9
    "10B": _gpt("10B", 32, 5120, 40),  # 10.4e9
    "20B": _gpt("20B", 32, 7168, 56),  # 20.1e9
    "40B": _gpt("40B", 38, 9216, 72),  # 39.3e9
    "60B": _gpt("60B", 56, 9216, 72),  # 57.6e9
    "80B": _gpt("80B", 42, 12288, 96),  # 76.8e9
    "160B": _gpt("160B", 84, 12288, 96),  # 153e9
    "320B": _gpt("320B", 96, 16384, 128),  # 310e9
    "640B": _gpt("640B", 192, 16384, 128),  # 620e9
    "gpt3-175B": ModelSpec(
        name="gpt3-175B", num_layers=96, hidden=12288, num_heads=96, vocab=50257, max_positions=2048,
        source="Brown et al. 2020, Table 2.1",
    ),
    "llama3.1-8B": _llama("llama3.1-8B", 32, 4096, 32, 14336),
    "llama3.1-70B": _llama("llama3.1-70B", 80, 8192, 64, 28672),
    "llama3.1-405B": _llama("llama3.1-405B", 126, 16384, 128, 53248),
    # 46.7B total, 12.9B active (Mistral AI, "Mixtral of experts", 2023-12-11; Jiang et al. 2024, arXiv 2401.04088)
    "mixtral-8x7B": _mixtral("mixtral-8x7B", 32, 4096, 32, 14336,
                             "Mixtral-8x7B-v0.1 config.json (Hugging Face, mistralai); Jiang et al. 2024"),
    # 141B total, 39B active (Mistral AI, "Cheaper, Better, Faster, Stronger", 2024-04-17)
    "mixtral-8x22B": _mixtral("mixtral-8x22B", 56, 6144, 48, 16384,
                              "Mixtral-8x22B-v0.1 config.json (Hugging Face, mistralai); Mistral AI 2024-04-17"),
}


def padded_vocab(vocab: int, gx: IntLike, gy: IntLike) -> IntLike:
    """Vocabulary rounded up to a multiple of Gx·Gy, as Megatron pads it for tensor parallelism (the
    LM head and the tied embedding are plain 4D linears: vocabulary rows over Y). Works on ints and
    on integer arrays of candidates alike."""
    g = gx * gy
    return -(-vocab // g) * g


def parse_param_count(name: str) -> float:
    """'320B' -> 3.2e11, 'llama3.1-8B' -> 8e9 (the size suffix of a preset name)."""
    match = re.search(r"(\d+(?:\.\d+)?)([MBT])$", name)
    if not match:
        raise ValueError(f"no size suffix in {name!r}")
    scale = {"M": 1e6, "B": 1e9, "T": 1e12}[match.group(2)]
    return float(match.group(1)) * scale


def load_model(name_or_path: str | Path, **overrides: int | str | None) -> ModelSpec:
    """A preset by name (case-insensitive), a model YAML or a config.json by path; `overrides` replace fields,
    and a model they change is named for what it is (``20B (custom: 4 layers)``, :func:`custom_name`)."""
    base = _base_model(str(name_or_path))
    updates = {k: v for k, v in overrides.items() if v is not None and v != getattr(base, k, None)}
    if not updates:
        return base
    check_plausible(updates, MODEL_RANGES, "model options")
    try:
        return ModelSpec.model_validate({**base.model_dump(), **updates,
                                         "name": custom_name(base.name, updates)})
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, "model options", ModelSpec)) from None


_CHANGED = {"num_layers": "{} layers", "hidden": "hidden {}", "num_heads": "{} heads", "num_kv_heads": "{} KV heads",
            "ffn_hidden": "FFN {}", "vocab": "vocab {}"}


def custom_name(base: str, updates: Mapping[str, object]) -> str:
    """The name of model `base` with `updates` applied: ``20B (custom: 4 layers, hidden 1024)``. Every output
    (the rank header, JSON, plan.json, job scripts) shows this name, so a changed preset never passes for it."""
    changes = [_CHANGED.get(k, f"{k} {{}}").format(v) for k, v in updates.items() if k != "name"]
    return f"{base} (custom: {', '.join(changes)})" if changes else base


def _base_model(name: str) -> ModelSpec:
    path = Path(name)
    if path.suffix == ".json":
        return load_hf_config(path)
    if path.suffix in {".yaml", ".yml"} or path.is_file():
        check_readable(path, "model file")
        data = load_yaml_mapping(path)
        data.setdefault("name", path.stem)
        check_plausible(data, MODEL_RANGES, str(path))
        try:
            return ModelSpec.model_validate(data)
        except ValidationError as err:
            raise AxoplanError(describe_validation_error(err, str(path), ModelSpec)) from None
    by_lower = {k.lower(): v for k, v in PRESETS.items()}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    raise AxoplanError(
        f"unknown model {name!r}{closest_hint(name, PRESETS)}; presets: {', '.join(PRESETS)} "
        "(or give a path to a model YAML)"
    )


def load_hf_config(path: Path) -> ModelSpec:
    """A model from a Hugging Face ``config.json`` on disk, read by its family (``axoplan.inputs.hf_config``)."""
    from axoplan.inputs.hf_config import read_hf_config

    fields = read_hf_config(path)
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, str(path), ModelSpec)) from None
