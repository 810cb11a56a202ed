"""The one GPT-style model of the executor, with its path injected (``docs/algorithm.md`` §1, §4b).

Token embedding (tied to the LM head unless ``tied_embeddings`` is false), optional learned positions,
``num_layers`` pre-norm blocks (LayerNorm, causal attention, LayerNorm, MLP with GeLU or SwiGLU, or a mixture
of experts; residuals), a final LayerNorm and the LM head; loss = mean next-token cross-entropy.

The block and forward bodies are written once; a `Path` supplies what differs between the three ways the
executor runs them, as AxoNN's one ``Linear`` switches its transitions by mode around the same core:

* the reference (``reference.WholePath``): every parameter whole, in one process;
* the Megatron path (``layers.MegatronPath``, AxoNN's expert mode): the residual stream ``[m_l, H/Gx]``
  split over X and repeated over Y, heads split over Y, 4D linears without transitions, LayerNorm over X,
  vocabulary-parallel embedding and loss over Y::

      h ─LN(X)→ QKV (plain) → [m_l, heads/Gy] ─attention→ attn-out (transposed) → [m_l, H/Gx] + h
        ─LN(X)→ MLP-up (plain) → [m_l, F/Gy] ─act→ MLP-down (transposed) → + h

* the hf path (``hfmodel.HFPath``): every rank its own tokens at full width, the same 4D linears with the
  data-parallel <-> 4D transitions around them, everything else whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from axoplan.inputs.model import LinearLayer, ModelSpec

__all__ = ["GPT", "Path", "Norm", "Weight", "attention_core", "activation", "LN_EPS"]

LN_EPS = 1e-5


class Path(Protocol):
    """What a path injects into `GPT` (module docstring)."""

    heads_split: int  # the attention's heads are split this many ways (Gy on the Megatron path)
    loss_redundant: tuple[str, ...]  # axes along which a rank's loss repeats another's
    recompute: str  # "off", "checkpoint" (non-reentrant) or "reentrant"

    def param(self, params: dict[str, torch.Tensor], name: str) -> nn.Parameter: ...
    def linear(self, lay: LinearLayer, name: str, params: dict[str, torch.Tensor]) -> nn.Module: ...
    def head(self, lay: LinearLayer, params: dict[str, torch.Tensor]) -> nn.Module: ...
    def table(self, spec: ModelSpec, vocab: int, params: dict[str, torch.Tensor]) -> nn.Module: ...
    def moe(self, spec: ModelSpec, prefix: str, params: dict[str, torch.Tensor]) -> nn.Module: ...
    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor: ...
    def embed(self, ids: torch.Tensor, table: nn.Module) -> torch.Tensor: ...
    def x_part(self, n: int) -> slice: ...
    def loss(self, logits: torch.Tensor, targets: torch.Tensor, head: nn.Module) -> torch.Tensor: ...
    def attention_span(self) -> contextlib.AbstractContextManager[Any]: ...
    def recomputing(self) -> contextlib.AbstractContextManager[Any]: ...


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


class Weight(nn.Module):
    """One parameter, named ``<module>.weight`` (positions, a whole token table, a router, an expert shard)."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight


class Norm(nn.Module):
    """A LayerNorm's whole weight and bias, applied as its path applies it."""

    def __init__(self, path: Path, params: dict[str, torch.Tensor], prefix: str) -> None:
        super().__init__()
        self.path = path
        self.weight = path.param(params, f"{prefix}.weight")
        self.bias = path.param(params, f"{prefix}.bias") if f"{prefix}.bias" in params else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.path.layer_norm(x, self.weight, self.bias)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, prefix: str, params: dict[str, torch.Tensor], path: Path) -> None:
        super().__init__()
        self.spec, self.path = spec, path
        lin = {lay.name: lay for lay in spec.block_linears()}
        self.ln1 = Norm(path, params, f"{prefix}.ln1")
        self.qkv = path.linear(lin["qkv"], f"{prefix}.qkv", params)
        self.attn_out = path.linear(lin["attn_out"], f"{prefix}.attn_out", params)
        self.ln2 = Norm(path, params, f"{prefix}.ln2")
        if spec.moe is not None:
            self.moe = path.moe(spec, f"{prefix}.moe", params)
        else:
            self.mlp_up = path.linear(lin["mlp_up"], f"{prefix}.mlp_up", params)
            self.mlp_down = path.linear(lin["mlp_down"], f"{prefix}.mlp_down", params)

    def forward(self, h: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        s = self.spec
        qkv = self.qkv(self.ln1(h))
        with self.path.attention_span():
            attn = attention_core(qkv, batch, seq, s.kv_heads // self.path.heads_split, s.num_heads // s.kv_heads,
                                  s.head_dim)
        h = h + self.attn_out(attn)
        if s.moe is not None:
            return h + self.moe(self.ln2(h))
        return h + self.mlp_down(activation(self.mlp_up(self.ln2(h)), s.ffn_kind))


class GPT(nn.Module):
    """This rank's part of the model (all of it on the reference path); ``forward`` returns the mean loss of
    its tokens. `params` holds every parameter this rank keeps, by its reference name.

    Recompute (`Path.recompute`) uses torch's non-reentrant checkpoint, or the reentrant one (AxoNN's ORS
    finds a weight by the tensor its backward saved, which only the reentrant checkpoint keeps: measured, the
    non-reentrant one loses those weight gradients).
    """

    def __init__(self, spec: ModelSpec, vocab: int, params: dict[str, torch.Tensor], path: Path) -> None:
        super().__init__()
        self.spec, self.vocab, self.path = spec, vocab, path
        self.lm_head = path.head(spec.head_linear(vocab), params)
        if not spec.tied_embeddings:
            self.embed = path.table(spec, vocab, params)
        if spec.max_positions:
            self.pos = Weight(path.param(params, "pos.weight"))
        self.blocks = nn.ModuleList(Block(spec, f"blocks.{i}", params, path) for i in range(spec.num_layers))
        self.ln_f = Norm(path, params, "ln_f")

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        batch, seq = ids.shape
        path = self.path
        h = path.embed(ids.reshape(-1), self.lm_head if self.spec.tied_embeddings else self.embed)
        if self.spec.max_positions:
            pos = self.pos.weight[:seq, path.x_part(self.spec.hidden)]
            h = (h.view(batch, seq, -1) + pos).view(batch * seq, -1)
        for block in self.blocks:
            h = self._run_block(block, h, batch, seq)  # type: ignore[arg-type]  # a Block
        logits = self.lm_head(self.ln_f(h))
        return path.loss(logits, targets.reshape(-1), self.lm_head)

    def _run_block(self, block: Block, h: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        path = self.path
        if path.recompute == "off":
            return block(h, batch, seq)
        if path.recompute == "reentrant":  # forward under no_grad, recompute under grad: that tells them apart
            return checkpoint(self._marked(block), h, batch, seq, use_reentrant=True)
        return checkpoint(block, h, batch, seq, use_reentrant=False,
                          context_fn=lambda: (contextlib.nullcontext(), path.recomputing()))

    def _marked(self, block: Block) -> Callable[..., torch.Tensor]:
        def run(h: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
            with self.path.recomputing() if torch.is_grad_enabled() else contextlib.nullcontext():
                return block(h, batch, seq)

        return run
