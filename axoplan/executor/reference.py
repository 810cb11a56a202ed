"""The model in one process (``model.GPT`` with every parameter whole), its parameters, and how they are
cut into 4D shards.

``biases: false`` drops the linear biases and the LayerNorm shifts (a LayerNorm, not an RMSNorm).

Two row orders make contiguous blocks over Y carry whole heads and whole gate/up pairs
(as Megatron lays out its fused weights): the QKV rows are grouped per KV head as
``[q heads of the group; k; v]``, and the SwiGLU up-projection interleaves gate and up
rows (``2i`` gate, ``2i+1`` up). The vocabulary is padded (``axoplan.inputs.model.padded_vocab``).

``to_local`` is the one definition of what a rank holds: the Z-chunk of its X/Y block of
a 4D weight (the flattened block zero-padded to a multiple of Gz), or the whole tensor
of a replicated one (norms, biases, positions). The
executor initialises from it and the tests cut reference gradients with it.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from axoplan.executor.model import GPT, LN_EPS, Weight
from axoplan.executor.moe import EXPERT_WEIGHTS, WholeMoE, expert_local, expert_shard_numel
from axoplan.executor.tags import Reduction, tag
from axoplan.inputs.model import BLOCK_LAYERS, HEAD_LAYER, LinearLayer, ModelSpec, layer_axes
from axoplan.space.layout import Layout

__all__ = ["WholePath", "WholeLinear", "reference_model", "full_state", "local_state", "param_shapes", "to_local",
           "weight_kind"]


def weight_kind(name: str) -> str:
    """'plain' or 'transposed' for a 4D-sharded weight, 'experts' for a grouped expert weight of the native MoE
    module, 'replicated' for everything else."""
    leaf = name.rsplit(".", 2)
    if leaf[-1] != "weight" or len(leaf) < 2:
        return "replicated"
    layer = leaf[-2]
    if layer in EXPERT_WEIGHTS:
        return "experts"
    sharded = {lin.name: lin.kind for lin in (*BLOCK_LAYERS, HEAD_LAYER)} | {"embed": HEAD_LAYER.kind}
    return sharded.get(layer, "replicated")


def _row_col_axes(kind: str) -> tuple[str, str]:
    """The axes a weight's rows (output features) and columns (input features) are split over."""
    in_axis, out_axis = layer_axes(kind == "transposed")
    return out_axis, in_axis


class WholeLinear(nn.Module):
    """A whole weight ``[n, k]`` and bias (``nn.Linear``'s arithmetic: one ``F.linear``)."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class WholePath:
    """The reference's injection into ``GPT``: every parameter whole, the model in one process."""

    heads_split = 1
    loss_redundant: tuple[str, ...] = ()
    recompute = "off"

    def param(self, params: dict[str, torch.Tensor], name: str) -> nn.Parameter:
        """A whole parameter: all-reduced over the world, repeated nowhere (its gradient is its own tokens')."""
        return tag(nn.Parameter(params[name]), Reduction(name, ("world",)))

    def linear(self, lay: LinearLayer, name: str, params: dict[str, torch.Tensor]) -> nn.Module:
        bias = self.param(params, f"{name}.bias") if f"{name}.bias" in params else None
        return WholeLinear(self.param(params, f"{name}.weight"), bias)

    def head(self, lay: LinearLayer, params: dict[str, torch.Tensor]) -> nn.Module:
        return WholeLinear(self.param(params, "lm_head.weight"), None)

    def table(self, spec: ModelSpec, vocab: int, params: dict[str, torch.Tensor]) -> nn.Module:
        return Weight(self.param(params, "embed.weight"))

    def moe(self, spec: ModelSpec, prefix: str, params: dict[str, torch.Tensor]) -> nn.Module:
        moe = spec.moe
        assert moe is not None
        return WholeMoE(moe.top_k, *(self.param(params, f"{prefix}.{w}.weight") for w in ("router", *EXPERT_WEIGHTS)))

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, LN_EPS)

    def embed(self, ids: torch.Tensor, table: nn.Module) -> torch.Tensor:
        return F.embedding(ids, cast(torch.Tensor, table.weight))

    def x_part(self, n: int) -> slice:
        return slice(None)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, head: nn.Module) -> torch.Tensor:
        return F.cross_entropy(logits.float(), targets)

    def attention_span(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def recomputing(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()


def reference_model(spec: ModelSpec, vocab: int, params: dict[str, torch.Tensor] | None = None) -> GPT:
    """The whole model on one device, from `params` (``full_state`` of seed 0 when None); its parameter names
    are the ones every path tags its parameters with."""
    return GPT(spec, vocab, full_state(spec, vocab, 0) if params is None else params, WholePath())


def full_state(spec: ModelSpec, vocab: int, seed: int, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Every parameter of the model, drawn from one seed (float32).

    Weights ~ N(0, std); LayerNorm scales 1 + N(0, 0.1) and all biases N(0, 0.1), so a
    wrong bias or norm gradient cannot hide behind an all-zero value.
    """
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in param_shapes(spec, vocab).items():
        noise = torch.randn(shape, generator=gen)
        if name.rsplit(".", 2)[-2].startswith("ln"):
            out[name] = 1.0 + 0.1 * noise if name.endswith("weight") else 0.1 * noise
        elif name.endswith("bias"):
            out[name] = 0.1 * noise
        else:
            out[name] = std * noise
    return out


def to_local(name: str, full: torch.Tensor, layout: Layout, coords: dict[str, int],
             expert_tp: int = 1) -> torch.Tensor:
    """What rank `coords` holds of parameter `name` (also used to cut its gradient)."""
    kind = weight_kind(name)
    if kind == "replicated":
        return full
    if kind == "experts":
        return expert_local(name, full, layout, coords, expert_tp)
    row_axis, col_axis = _row_col_axes(kind)
    n, k = full.shape
    rows, cols = n // layout.size(row_axis), k // layout.size(col_axis)
    r0, c0 = coords[row_axis] * rows, coords[col_axis] * cols
    block = full[r0:r0 + rows, c0:c0 + cols].reshape(-1)
    chunk = -(-block.numel() // layout.gz)  # zero-padded when Gz does not divide the block
    padded = torch.nn.functional.pad(block, (0, chunk * layout.gz - block.numel()))
    return padded[coords["z"] * chunk:(coords["z"] + 1) * chunk].clone()


def local_state(spec: ModelSpec, vocab: int, layout: Layout, coords: dict[str, int], seed: int,
                std: float = 0.02, expert_tp: int = 1, whole: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """This rank's parameters drawn directly (no full model in memory; for large models).

    A 4D shard is drawn from a seed of its (x, y, z) block, so data-parallel replicas
    agree; norms start at (1, 0), biases at 0, positions from the common seed. The parameters
    named in `whole` (the hf path's token table) are drawn whole, from the common seed, on every rank.
    """
    return {name: _draw(name, shape, layout, coords, seed, std, expert_tp, name in whole)
            for name, shape in param_shapes(spec, vocab).items()}


def param_shapes(spec: ModelSpec, vocab: int) -> dict[str, tuple[int, ...]]:
    """Name and full shape of every parameter, as the reference model has them (without building it:
    a 320B model's LM head alone is gigabytes, and meta tensors would import torch._dynamo)."""
    h = spec.hidden
    out: dict[str, tuple[int, ...]] = {"lm_head.weight": (vocab, h)}
    if not spec.tied_embeddings:
        out["embed.weight"] = (vocab, h)
    if spec.max_positions:
        out["pos.weight"] = (spec.max_positions, h)
    norm = ("weight", "bias") if spec.biases else ("weight",)
    for i in range(spec.num_layers):
        for lin in spec.block_linears():
            if lin.input == "norm":
                ln = "ln1" if lin.role == "attention" else "ln2"
                out.update({f"blocks.{i}.{ln}.{k}": (h,) for k in norm})
            if lin.is_expert:
                out.update(_expert_shapes(spec, i, lin.name))
                continue
            out[f"blocks.{i}.{lin.name}.weight"] = (lin.n_out, lin.k_in)
            if spec.biases:
                out[f"blocks.{i}.{lin.name}.bias"] = (lin.n_out,)
    out.update({f"ln_f.{k}": (h,) for k in norm})
    return out


def _expert_shapes(spec: ModelSpec, block: int, layer: str) -> dict[str, tuple[int, ...]]:
    """The MoE MLP's router and grouped expert weights, as ``moe.WholeMoE`` names them."""
    moe = spec.moe
    assert moe is not None
    e, i, h = moe.num_experts, moe.expert_ffn_hidden, spec.hidden
    prefix = f"blocks.{block}.moe"
    if layer == "expert_up":
        return {f"{prefix}.router.weight": (e, h), f"{prefix}.experts_fc.weight": (e, 2 * i, h)}
    return {f"{prefix}.experts_proj.weight": (e, h, i)}


def _draw(name: str, shape: tuple[int, ...], layout: Layout, coords: dict[str, int], seed: int,
          std: float, expert_tp: int = 1, whole: bool = False) -> torch.Tensor:
    kind = "replicated" if whole else weight_kind(name)
    if kind == "experts":
        numel = expert_shard_numel(shape[0] * shape[1] * shape[2] // expert_tp, layout.gz // expert_tp)
        gen = torch.Generator().manual_seed(_seed(seed, name, coords["z"]))
        return std * torch.randn(numel, generator=gen)
    if kind == "replicated":
        if name.endswith("weight") and name.rsplit(".", 2)[-2].startswith("ln"):
            return torch.ones(shape)
        if name.endswith("bias"):
            return torch.zeros(shape)
        return std * torch.randn(shape, generator=torch.Generator().manual_seed(_seed(seed, name)))
    n, k = shape
    block = n * k // (layout.gx * layout.gy)
    chunk = -(-block // layout.gz)
    where = (coords["x"], coords["y"], coords["z"])
    shard = std * torch.randn(chunk, generator=torch.Generator().manual_seed(_seed(seed, name, *where)))
    shard[max(0, block - coords["z"] * chunk):] = 0.0  # the padding of the last chunk(s)
    return shard


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:7], "little")
