"""Hugging Face ``config.json`` files read as models, one reader per family (``model_type``).

Nothing is downloaded: the file on disk is read, its ``model_type`` picks the reader, and the reader
maps that family's keys onto :class:`~axoplan.inputs.model.ModelSpec` (``family`` records which).
The keys and their defaults are those of the transformers configuration classes (transformers 4.4x/5,
``models/<family>/configuration_<family>.py``):

* dense: ``gpt2`` (``n_embd``, ``n_layer``, ``n_head``, ``n_inner`` default 4·H, learned positions
  ``n_positions``, GeLU MLP, biases everywhere, tied embeddings); ``gpt_neox`` (Pythia: ``hidden_size``...,
  rotary, GeLU MLP, biases, an untied ``embed_out``; ``use_parallel_residual`` changes no shape);
  ``llama``, ``mistral``, ``qwen2``, ``qwen3`` (RMSNorm, rotary, SwiGLU, grouped-query
  ``num_key_value_heads``; Qwen2's q/k/v projections carry a bias, Qwen3's ``head_dim`` may differ
  from hidden/heads);
* mixtures of experts, each a :class:`~axoplan.inputs.model.MoESpec` of SwiGLU experts: ``mixtral``
  (``num_local_experts``), ``qwen2_moe`` (``num_experts``, ``moe_intermediate_size`` and a shared expert of
  ``shared_expert_intermediate_size``, a whole number of expert widths), ``qwen3_moe`` and ``olmoe``
  (``num_experts``; OLMoE's expert width is ``intermediate_size``), ``deepseek``/``deepseek_v2``/``deepseek_v3``
  (``n_routed_experts``, ``n_shared_experts``).

What MoESpec cannot express is refused in one line naming the key: dense and MoE layers mixed
(``decoder_sparse_step``, ``mlp_only_layers``, ``first_k_dense_replace``, ``moe_layer_freq``), multi-head
latent attention (``kv_lora_rank``), an unknown ``model_type``, or an MoE key in a dense family's config.
A mixture of experts is never read as a dense model. Small tensors no cost term uses are left out of the
counts: Qwen2-MoE's shared-expert gate (H per layer), Qwen3's and OLMoE's q/k norms (< 0.01 %).
Published totals (GPT-2 XL, Pythia-1.4B, Qwen1.5-MoE-A2.7B, OLMoE-1B-7B, Qwen3-30B-A3B) are checked in
``tests/test_hf_config.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from axoplan.errors import AxoplanError
from axoplan.fileio import check_readable, read_text
from axoplan.inputs.plausible import MODEL_RANGES, check_plausible

__all__ = ["read_hf_config", "READERS", "MOE_KEYS"]

Config = Mapping[str, Any]
Fields = dict[str, object]

MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "moe_intermediate_size",
            "shared_expert_intermediate_size", "n_shared_experts", "num_experts_per_tok")
"""Keys that make a config a mixture of experts (where their value is not 0 or null)."""

_FIX = "write a model YAML with its shape (README, 'Models and machines') or give a preset"


class _Refused(Exception):
    """A key the reader does not understand: the message names it."""


def read_hf_config(path: Path) -> Fields:
    """The ModelSpec fields of a Hugging Face ``config.json``, checked for plausibility (AxoplanError, one line,
    for one axoplan cannot read); ``axoplan.inputs.model.load_hf_config`` validates them into a ModelSpec."""
    check_readable(path, "model config")
    try:
        data = json.loads(read_text(path, "model config"))
    except json.JSONDecodeError as exc:
        raise AxoplanError(f"{path}: not valid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise AxoplanError(f"{path}: not a Hugging Face model config (a JSON object with model_type); give a "
                           "config.json of a decoder-only model, a model YAML, or a preset")
    try:
        fields = _reader(data, path)(data)
    except _Refused as exc:
        raise AxoplanError(f"{path}: {exc}; {_FIX}") from None
    except KeyError as exc:
        raise AxoplanError(f"{path}: a {data.get('model_type', 'llama-style')} config needs the key {exc.args[0]!r}, "
                           "which this one lacks; give the model's whole config.json") from None
    fields["name"] = str(data.get("_name_or_path") or path.parent.name or path.stem)
    fields["source"] = f"Hugging Face config.json (model_type {data.get('model_type', 'not given')})"
    check_plausible(fields, MODEL_RANGES, str(path))
    return fields


def _reader(data: Config, path: Path) -> Callable[[Config], Fields]:
    """The reader of `data`'s family: its ``model_type``, or (none given) the keys it has."""
    kind = data.get("model_type")
    if kind is None:
        if "n_embd" in data:
            return READERS["gpt2"]
        if all(k in data for k in ("hidden_size", "num_hidden_layers", "num_attention_heads")):
            return READERS["mixtral" if data.get("num_local_experts") else "llama"]
        raise AxoplanError(f"{path}: not a Hugging Face model config (no model_type, and neither n_embd nor "
                           "hidden_size, num_hidden_layers, num_attention_heads); give a config.json of a "
                           "decoder-only model, a model YAML, or a preset")
    reader = READERS.get(str(kind))
    if reader is None:
        raise AxoplanError(f"{path}: model_type {kind!r} is not a family axoplan reads ({', '.join(READERS)}); "
                           f"{_FIX}")
    return reader


def _moe_keys_in(data: Config) -> list[str]:
    return [k for k in MOE_KEYS if data.get(k)]


def _dense(data: Config) -> None:
    """Refuse an MoE key in a dense family's config: it would be priced as dense."""
    keys = _moe_keys_in(data)
    if keys:
        raise _Refused(f"key {keys[0]!r} says mixture of experts, but model_type {data.get('model_type')!r} is a "
                       "dense family and no MoE reader knows this config")


def _no_mla(data: Config) -> None:
    for key in ("kv_lora_rank", "q_lora_rank"):
        if data.get(key):
            raise _Refused(f"key {key!r} is multi-head latent attention (DeepSeek-V2/V3's MLA), which axoplan "
                           "does not price (it prices multi-head and grouped-query attention)")


def _every_layer_moe(data: Config, first: str = "", step: str = "") -> None:
    """Refuse dense layers mixed with MoE ones: MoESpec puts the experts in every block."""
    if first and data.get(first, 0):
        raise _Refused(f"key {first!r} = {data[first]}: the first layers are dense and the rest MoE, which axoplan "
                       "cannot express (its MoE models have experts in every block)")
    if step and data.get(step, 1) != 1:
        raise _Refused(f"key {step!r} = {data[step]}: dense and MoE layers alternate, which axoplan cannot express "
                       "(its MoE models have experts in every block)")
    if data.get("mlp_only_layers"):
        raise _Refused("key 'mlp_only_layers' lists dense layers among the MoE ones, which axoplan cannot express "
                       "(its MoE models have experts in every block)")


def _head_dim(data: Config) -> object:
    """``head_dim`` where it differs from hidden/heads (Qwen3, Mistral-Nemo), else None (a value of the wrong
    type is passed on for the schema to report)."""
    dim, heads, hidden = data.get("head_dim"), data["num_attention_heads"], data["hidden_size"]
    if dim is None or all(isinstance(v, int) for v in (dim, heads, hidden)) and dim * heads == hidden:
        return None
    return dim


def _llama_like(data: Config, family: str) -> Fields:
    """RMSNorm, rotary, SwiGLU (SiLU gate), grouped-query attention: Llama and the families built like it."""
    act = str(data.get("hidden_act", "silu"))
    fields: Fields = {
        "num_layers": data["num_hidden_layers"], "hidden": data["hidden_size"],
        "num_heads": data["num_attention_heads"], "num_kv_heads": data.get("num_key_value_heads"),
        "ffn_hidden": data.get("intermediate_size"), "ffn_kind": "swiglu" if act in ("silu", "swish") else "gelu",
        "vocab": data.get("vocab_size", 32000), "max_positions": 0,
        "tied_embeddings": bool(data.get("tie_word_embeddings", False)),
        "biases": bool(data.get("attention_bias", False) or data.get("mlp_bias", False)), "family": family,
    }
    head_dim = _head_dim(data)
    if head_dim is not None:
        fields["attention_head_dim"] = head_dim
    if data.get("model_type") in ("qwen2", "qwen2_moe") and not fields["biases"]:
        fields["qkv_bias"] = True  # Qwen2Attention: q/k/v_proj(bias=True), o_proj(bias=False); no config key
    return fields


def _llama(data: Config) -> Fields:
    _dense(data)
    _no_mla(data)
    return _llama_like(data, "llama")


def _qwen2(data: Config) -> Fields:
    """Llama's block with biases on the query, key and value projections (``Qwen2Attention``)."""
    _dense(data)
    return _llama_like(data, "qwen2")


def _qwen3(data: Config) -> Fields:
    """Llama's block with an RMSNorm on every query and key head (``Qwen3Attention.q_norm``, ``k_norm``)."""
    _dense(data)
    return _llama_like(data, "qwen3")


def _gpt2(data: Config) -> Fields:
    """GPT-2 (``GPT2Config``): Conv1D linears with biases, LayerNorm, learned positions, tied head."""
    _dense(data)
    return {
        "num_layers": data["n_layer"], "hidden": data["n_embd"], "num_heads": data["n_head"],
        "ffn_hidden": data.get("n_inner"), "ffn_kind": "gelu", "vocab": data.get("vocab_size", 50257),
        "max_positions": data.get("n_positions", 1024), "tied_embeddings": bool(data.get("tie_word_embeddings", True)),
        "biases": True, "family": "gpt2",
    }


def _gpt_neox(data: Config) -> Fields:
    """GPT-NeoX / Pythia (``GPTNeoXConfig``): rotary on ``rotary_pct`` of each head, LayerNorm and biases,
    an untied ``embed_out`` unless ``tie_word_embeddings``."""
    _dense(data)
    return {
        "num_layers": data["num_hidden_layers"], "hidden": data["hidden_size"],
        "num_heads": data["num_attention_heads"], "ffn_hidden": data.get("intermediate_size"), "ffn_kind": "gelu",
        "vocab": data.get("vocab_size", 50432), "max_positions": 0,
        "tied_embeddings": bool(data.get("tie_word_embeddings", False)),
        "biases": bool(data.get("attention_bias", True)), "family": "gpt-neox",
    }


def _moe(data: Config, family: str, experts: str, width: str, shared_width: str = "", shared: str = "") -> Fields:
    """A Llama-like block whose MLP is `experts` SwiGLU experts of `width`, plus shared ones."""
    _no_mla(data)
    fields = _llama_like(data, family)
    expert_width = data[width]
    top_k = data.get("num_experts_per_tok", 2) if family == "mixtral" else data["num_experts_per_tok"]
    moe: Fields = {"num_experts": data[experts], "top_k": top_k, "expert_ffn_hidden": expert_width}
    if shared and data.get(shared):
        moe["shared_experts"] = data[shared]
    if shared_width and data.get(shared_width):
        count, rest = divmod(data[shared_width], expert_width) if isinstance(expert_width, int) else (0, 1)
        if rest or not count:
            raise _Refused(f"key {shared_width!r} = {data[shared_width]} is not a whole number of expert widths "
                           f"({width} {expert_width}), which axoplan's shared experts are")
        moe["shared_experts"] = count
    fields["moe"] = moe
    fields["ffn_hidden"] = expert_width
    return fields


def _mixtral(data: Config) -> Fields:
    return _moe(data, "mixtral", "num_local_experts", "intermediate_size")


def _qwen2_moe(data: Config) -> Fields:
    _every_layer_moe(data, step="decoder_sparse_step")
    return _moe(data, "qwen2-moe", "num_experts", "moe_intermediate_size", "shared_expert_intermediate_size")


def _qwen3_moe(data: Config) -> Fields:
    _every_layer_moe(data, step="decoder_sparse_step")
    return _moe(data, "qwen3-moe", "num_experts", "moe_intermediate_size")


def _olmoe(data: Config) -> Fields:
    return _moe(data, "olmoe", "num_experts", "intermediate_size")


def _deepseek(data: Config) -> Fields:
    _no_mla(data)  # named first: the attention, not only the layer mix, is what axoplan cannot price
    _every_layer_moe(data, first="first_k_dense_replace", step="moe_layer_freq")
    return _moe(data, "deepseek", "n_routed_experts", "moe_intermediate_size", shared="n_shared_experts")


READERS: dict[str, Callable[[Config], Fields]] = {
    "gpt2": _gpt2, "gpt_neox": _gpt_neox, "llama": _llama, "mistral": _llama, "qwen2": _qwen2, "qwen3": _qwen3,
    "mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe, "olmoe": _olmoe,
    "deepseek": _deepseek, "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
}
"""The reader of each ``model_type`` axoplan understands."""
