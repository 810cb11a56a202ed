"""The model in one process, its parameters, and how they are cut into 4D shards.

The model is GPT-style (``ModelSpec``): token embedding (tied to the LM head unless
``tied_embeddings`` is false), optional learned positions, ``num_layers`` pre-norm blocks
(LayerNorm, causal attention, LayerNorm, MLP with GeLU or SwiGLU, residuals), a final
LayerNorm and the LM head; loss = mean next-token cross-entropy. ``biases: false``
drops the linear biases and the LayerNorm shifts (a LayerNorm, not an RMSNorm).

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

import hashlib

import torch
import torch.nn.functional as F
from torch import nn

from axoplan.executor.moe import EXPERT_WEIGHTS, expert_local, expert_shard_numel, moe_mlp
from axoplan.inputs.model import BLOCK_LAYERS, HEAD_LAYER, ModelSpec, layer_axes
from axoplan.space.layout import Layout

__all__ = ["ReferenceGPT", "full_state", "local_state", "param_shapes", "to_local", "weight_kind", "attention_core",
           "activation"]

LN_EPS = 1e-5


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


def attention_core(qkv: torch.Tensor, batch: int, seq: int, kv_heads: int, group: int, head_dim: int) -> torch.Tensor:
    """Causal attention of ``[batch·seq, kv·(group+2)·d]`` grouped QKV -> ``[batch·seq, kv·group·d]``."""
    t = qkv.view(batch, seq, kv_heads, group + 2, head_dim)
    q = t[:, :, :, :group].reshape(batch, seq, kv_heads * group, head_dim).transpose(1, 2)
    k = t[:, :, :, group].transpose(1, 2).repeat_interleave(group, dim=1)
    v = t[:, :, :, group + 1].transpose(1, 2).repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(batch * seq, kv_heads * group * head_dim)


def activation(u: torch.Tensor, kind: str) -> torch.Tensor:
    """GeLU (erf), or SwiGLU over interleaved gate/up columns."""
    if kind == "swiglu":
        return F.silu(u[..., 0::2]) * u[..., 1::2]
    return F.gelu(u)


class _Block(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, bias = spec.hidden, spec.biases
        lin = {lay.name: lay for lay in spec.block_linears()}
        self.ln1 = nn.LayerNorm(h, eps=LN_EPS, bias=bias)
        self.qkv = nn.Linear(lin["qkv"].k_in, lin["qkv"].n_out, bias=bias)
        self.attn_out = nn.Linear(lin["attn_out"].k_in, lin["attn_out"].n_out, bias=bias)
        self.ln2 = nn.LayerNorm(h, eps=LN_EPS, bias=bias)
        if spec.moe is not None:
            self.moe = _WholeMoE(spec)
        else:
            self.mlp_up = nn.Linear(lin["mlp_up"].k_in, lin["mlp_up"].n_out, bias=bias)
            self.mlp_down = nn.Linear(lin["mlp_down"].k_in, lin["mlp_down"].n_out, bias=bias)
        self.spec = spec

    def forward(self, h: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        s = self.spec
        qkv = self.qkv(self.ln1(h))
        h = h + self.attn_out(attention_core(qkv, batch, seq, s.kv_heads, s.num_heads // s.kv_heads, s.head_dim))
        if s.moe is not None:
            return h + self.moe(self.ln2(h))
        return h + self.mlp_down(activation(self.mlp_up(self.ln2(h)), s.ffn_kind))


class _Weight(nn.Module):
    """One whole weight, named ``<module>.weight`` as the sharded model names its shard."""

    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(*shape))


class _WholeMoE(nn.Module):
    """A mixture-of-experts MLP with every weight whole (``axoplan.executor.moe``)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None
        e, i, h = moe.num_experts, moe.expert_ffn_hidden, spec.hidden
        self.top_k = moe.top_k
        self.router = nn.Linear(h, e, bias=False)
        self.experts_fc, self.experts_proj = _Weight(e, 2 * i, h), _Weight(e, h, i)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return moe_mlp(x, self.router.weight, self.experts_fc.weight, self.experts_proj.weight, self.top_k)


class ReferenceGPT(nn.Module):
    """The whole model on one device; parameter names match the 4D model's."""

    def __init__(self, spec: ModelSpec, vocab: int) -> None:
        super().__init__()
        self.spec, self.vocab = spec, vocab
        self.lm_head = nn.Linear(spec.hidden, vocab, bias=False)
        if not spec.tied_embeddings:
            self.embed = nn.Embedding(vocab, spec.hidden)
        if spec.max_positions:
            self.pos = nn.Embedding(spec.max_positions, spec.hidden)
        self.blocks = nn.ModuleList(_Block(spec) for _ in range(spec.num_layers))
        self.ln_f = nn.LayerNorm(spec.hidden, eps=LN_EPS, bias=spec.biases)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        batch, seq = ids.shape
        table = self.lm_head.weight if self.spec.tied_embeddings else self.embed.weight
        h = F.embedding(ids, table)
        if self.spec.max_positions:
            h = h + self.pos.weight[:seq]
        h = h.reshape(batch * seq, -1)
        for block in self.blocks:
            h = block(h, batch, seq)
        logits = self.lm_head(self.ln_f(h))
        return F.cross_entropy(logits.float(), targets.reshape(-1))


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
    """Name and full shape of every parameter, as ``ReferenceGPT`` has them (without building it:
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
    """The MoE MLP's router and grouped expert weights, as ``_WholeMoE`` names them."""
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
