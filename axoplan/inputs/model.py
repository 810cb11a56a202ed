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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np
import numpy.typing as npt
from pydantic import Field, PositiveInt, ValidationError, model_validator

from axoplan.errors import AxoplanError, closest_hint
from axoplan.fileio import check_readable
from axoplan.inputs.plausible import MODEL_RANGES, check_plausible
from axoplan.inputs.schema import Frozen, describe_validation_error, load_yaml_mapping

__all__ = ["ModelSpec", "LinearLayer", "BLOCK_LAYERS", "HEAD_LAYER", "TRANSPOSED_LAYERS", "layer_axes", "PRESETS",
           "load_model", "parse_param_count", "padded_vocab"]

Role = Literal["attention", "mlp", "head"]
IntLike = TypeVar("IntLike", int, "npt.NDArray[np.int64]")
Feeds = Literal["norm", "attention", "activation"]


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
      on its own (SwiGLU's gate and up projections: 2).
    """

    name: str
    role: Role
    input: Feeds
    transposed: bool
    recomputed: bool
    k_in: int = 0
    n_out: int = 0
    out_chunks: int = 1

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
        return self.k_in * self.n_out

    def with_shape(self, k_in: int, n_out: int, out_chunks: int = 1) -> LinearLayer:
        return replace(self, k_in=k_in, n_out=n_out, out_chunks=out_chunks)


BLOCK_LAYERS: tuple[LinearLayer, ...] = (
    LinearLayer("qkv", "attention", "norm", transposed=False, recomputed=True),
    LinearLayer("attn_out", "attention", "attention", transposed=True, recomputed=True),
    LinearLayer("mlp_up", "mlp", "norm", transposed=False, recomputed=True),
    LinearLayer("mlp_down", "mlp", "activation", transposed=True, recomputed=True),
)
"""A block's linear layers in execution order, without shapes (``ModelSpec.block_linears``)."""

HEAD_LAYER = LinearLayer("lm_head", "head", "norm", transposed=False, recomputed=False)
"""The LM head: vocabulary rows over Y (padded to a multiple of Gx·Gy), run once per micro-batch."""

TRANSPOSED_LAYERS: frozenset[str] = frozenset(lin.name for lin in BLOCK_LAYERS if lin.transposed)


def layer_axes(transposed: bool) -> tuple[str, str]:
    """(input-feature axis, output-feature axis): X, Y for a plain layer; Y, X transposed."""
    return ("y", "x") if transposed else ("x", "y")


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

    @model_validator(mode="after")
    def _check_heads(self) -> ModelSpec:
        if self.hidden % self.num_heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.kv_heads}")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    def block_linears(self) -> tuple[LinearLayer, ...]:
        """The four (sharded) weight matrices of one block, in execution order, with shapes."""
        h, f = self.hidden, self.ffn
        qkv_out = (self.num_heads + 2 * self.kv_heads) * self.head_dim
        chunks = 2 if self.ffn_kind == "swiglu" else 1
        shapes = {"qkv": (h, qkv_out, 1), "attn_out": (h, h, 1), "mlp_up": (h, chunks * f, chunks),
                  "mlp_down": (f, h, 1)}
        return tuple(lin.with_shape(*shapes[lin.name]) for lin in BLOCK_LAYERS)

    def head_linear(self, vocab: int) -> LinearLayer:
        """The LM head for a (padded) vocabulary of `vocab` rows."""
        return HEAD_LAYER.with_shape(self.hidden, vocab)

    def unsharded_params_per_block(self) -> int:
        """Norm weights (and biases) that every GPU holds whole; reduced over the world."""
        norms = 2 * self.hidden * (2 if self.biases else 1)
        biases = sum(lin.n_out for lin in self.block_linears()) if self.biases else 0
        return norms + biases

    def embedding_params(self) -> int:
        heads = 1 if self.tied_embeddings else 2
        return heads * self.vocab * self.hidden + self.max_positions * self.hidden

    def num_params(self) -> int:
        """Total parameter count."""
        block = sum(lin.num_params for lin in self.block_linears()) + self.unsharded_params_per_block()
        final_norm = self.hidden * (2 if self.biases else 1)
        return self.num_layers * block + self.embedding_params() + final_norm


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name=name, num_layers=layers, hidden=hidden, num_heads=heads, vocab=51200, max_positions=2048,
        source="AxoNN GPT family, Megatron-AxoNN model-table.md (axonn.md §4.1); GPT-2 vocab padded to 51200",
    )


def _llama(name: str, layers: int, hidden: int, heads: int, ffn: int) -> ModelSpec:
    return ModelSpec(
        name=name, num_layers=layers, hidden=hidden, num_heads=heads, num_kv_heads=8, ffn_hidden=ffn,
        ffn_kind="swiglu", vocab=128256, tied_embeddings=False, biases=False,
        source="Llama 3.1 model card / config.json (Meta, 2024)",
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
    """A preset by name (case-insensitive), or a model YAML by path; `overrides` replace fields."""
    base = _base_model(str(name_or_path))
    updates = {k: v for k, v in overrides.items() if v is not None}
    if not updates:
        return base
    check_plausible(updates, MODEL_RANGES, "model options")
    try:
        return ModelSpec.model_validate({**base.model_dump(), **updates})
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, "model options", ModelSpec)) from None


def _base_model(name: str) -> ModelSpec:
    path = Path(name)
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
