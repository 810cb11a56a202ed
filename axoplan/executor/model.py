"""The GPT-style model built from 4D linears (``docs/algorithm.md`` §1 layer pattern).

Per block: QKV and MLP-up are plain, attention-out and MLP-down transposed, so each
layer's output layout is the next one's input and no activation is redistributed::

    h [m_l, H/Gx] ─LN(X)→ QKV (plain) → [m_l, heads/Gy] ─attention→ attn-out (transposed)
      → [m_l, H/Gx] + h ─LN(X)→ MLP-up (plain) → [m_l, F/Gy] ─act→ MLP-down (transposed) → + h

The residual stream is split over X and repeated over Y; heads are split over Y and the
attention runs redundantly on the X members (as in AxoNN). Parameters that every rank
holds whole (norms, biases, positions) are used by several members on the same data;
``replicated`` names, for each, the axes along which its gradient is a repeated copy,
so the world all-reduce counts each copy once (``train.sync_gradients``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from axoplan.executor.layers import cross_entropy_y, embedding_y, layer_norm_x
from axoplan.executor.linear4d import Linear4D, Runtime
from axoplan.executor.moe import NativeMoE
from axoplan.executor.reference import activation, attention_core
from axoplan.inputs.model import LinearLayer, ModelSpec

__all__ = ["GPT4D"]


class _Biased(nn.Module):
    """A 4D linear plus its whole bias (sliced to this rank's output block)."""

    def __init__(self, linear: Any, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.linear: Any = linear
        self.bias = nn.Parameter(bias) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if self.bias is None:
            return y
        return y + self.bias[self.linear.rt.part(self.linear.out_axis, self.bias.numel())]


class _NormX(nn.Module):
    """LayerNorm with whole weight and bias; this rank normalises its X block of features."""

    def __init__(self, hidden: int, weight: torch.Tensor, bias: torch.Tensor | None, rt: Runtime) -> None:
        super().__init__()
        self.hidden, self.rt = hidden, rt
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        part = self.rt.part("x", self.hidden)
        bias = self.bias[part] if self.bias is not None else None
        return layer_norm_x(x, self.weight[part], bias, self.hidden, self.rt)


class _Block4D(nn.Module):
    def __init__(self, spec: ModelSpec, prefix: str, params: dict[str, torch.Tensor], rt: Runtime,
                 factory: Callable[..., nn.Module]) -> None:
        super().__init__()
        self.spec, self.rt = spec, rt
        h = spec.hidden

        def linear(lay: LinearLayer) -> _Biased:
            lin = factory(lay.name, lay.k_in, lay.n_out, lay.transposed, rt, params[f"{prefix}.{lay.name}.weight"])
            return _Biased(lin, params.get(f"{prefix}.{lay.name}.bias"))

        lin = {lay.name: lay for lay in spec.block_linears()}
        self.ln1 = _NormX(h, params[f"{prefix}.ln1.weight"], params.get(f"{prefix}.ln1.bias"), rt)
        self.qkv = linear(lin["qkv"])
        self.attn_out = linear(lin["attn_out"])
        self.ln2 = _NormX(h, params[f"{prefix}.ln2.weight"], params.get(f"{prefix}.ln2.bias"), rt)
        if spec.moe is not None:  # AxoNN's native DroplessMoEMLP (axoplan.executor.moe); Gx = Gy = 1
            m = spec.moe
            self.moe = NativeMoE(m.num_experts, h, m.expert_ffn_hidden, m.top_k, params[f"{prefix}.moe.router.weight"],
                                 params[f"{prefix}.moe.experts_fc.weight"],
                                 params[f"{prefix}.moe.experts_proj.weight"], rt.moe_groups)
        else:
            self.mlp_up = linear(lin["mlp_up"])
            self.mlp_down = linear(lin["mlp_down"])

    def forward(self, h: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        s, gy = self.spec, self.rt.groups.size("y")
        qkv = self.qkv(self.ln1(h))
        with self.rt.timer.span("attention"):
            attn = attention_core(qkv, batch, seq, s.kv_heads // gy, s.num_heads // s.kv_heads, s.head_dim)
        h = h + self.attn_out(attn)
        if s.moe is not None:
            return h + self.moe(self.ln2(h))
        return h + self.mlp_down(activation(self.mlp_up(self.ln2(h)), s.ffn_kind))


class GPT4D(nn.Module):
    """This rank's part of the model; ``forward`` returns the mean loss of its tokens.

    `factory` makes the four block linears (``Linear4D``, or AxoNN's through
    ``axonn_backend``); the embedding and LM head are always ``Linear4D``. Recompute uses
    torch's non-reentrant checkpoint, or the reentrant one when `reentrant` (AxoNN's ORS
    finds a weight by the tensor its backward saved, which only the reentrant checkpoint
    keeps: measured, the non-reentrant one loses those weight gradients).
    """

    def __init__(self, spec: ModelSpec, vocab: int, params: dict[str, torch.Tensor], rt: Runtime,
                 recompute: bool, factory: Callable[..., nn.Module] = Linear4D, reentrant: bool = False) -> None:
        super().__init__()
        self.spec, self.rt, self.recompute, self.reentrant = spec, rt, recompute, reentrant
        head = spec.head_linear(vocab)
        self.lm_head = Linear4D(head.name, head.k_in, head.n_out, head.transposed, rt, params["lm_head.weight"])
        if not spec.tied_embeddings:
            self.embed = Linear4D("embed", spec.hidden, vocab, False, rt, params["embed.weight"])
        if spec.max_positions:
            self.pos = nn.Module()
            self.pos.weight = nn.Parameter(params["pos.weight"])
        self.blocks = nn.ModuleList(_Block4D(spec, f"blocks.{i}", params, rt, factory)
                                    for i in range(spec.num_layers))
        self.ln_f = _NormX(spec.hidden, params["ln_f.weight"], params.get("ln_f.bias"), rt)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        batch, seq = ids.shape
        table = self.lm_head if self.spec.tied_embeddings else self.embed
        h = embedding_y(ids.reshape(-1), table)
        if self.spec.max_positions:
            pos = self.pos.weight[:seq, self.rt.part("x", self.spec.hidden)]  # type: ignore[index]
            h = (h.view(batch, seq, -1) + pos).view(batch * seq, -1)
        for block in self.blocks:
            h = self._run_block(block, h, batch, seq)  # type: ignore[arg-type]  # a _Block4D
        logits = self.lm_head(self.ln_f(h))
        return cross_entropy_y(logits, targets.reshape(-1), self.lm_head).mean()

    def _run_block(self, block: _Block4D, h: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        if not self.recompute:
            return block(h, batch, seq)
        if self.reentrant:  # forward under no_grad, recompute under grad: that tells them apart
            return checkpoint(self._marked(block), h, batch, seq, use_reentrant=True)
        return checkpoint(block, h, batch, seq, use_reentrant=False,
                          context_fn=lambda: (contextlib.nullcontext(), self.rt.recomputing()))

    def _marked(self, block: _Block4D) -> Callable[..., torch.Tensor]:
        def run(h: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
            with self.rt.recomputing() if torch.is_grad_enabled() else contextlib.nullcontext():
                return block(h, batch, seq)

        return run

    def sharded(self) -> Iterator[tuple[str, nn.Parameter]]:
        """The 4D-sharded weights (gradients reduced over data)."""
        for name, p in self.named_parameters():
            if _canonical(name).endswith(".weight") and getattr(self._owner(name), "sharded_4d", False):
                yield _canonical(name), p

    def replicated(self) -> Iterator[tuple[str, nn.Parameter, tuple[str, ...]]]:
        """Whole parameters with the axes along which their gradient is a repeated copy."""
        for name, p in self.named_parameters():
            owner = self._owner(name)
            if getattr(owner, "sharded_4d", False):
                continue
            axes = (owner.linear.in_axis,) if isinstance(owner, _Biased) else ("y",)
            yield _canonical(name), p, axes

    def _owner(self, name: str) -> nn.Module:
        path = name.rsplit(".", 1)[0] if "." in name else ""
        return self.get_submodule(path) if path else self


def _canonical(name: str) -> str:
    """Module path -> the reference model's parameter name (``qkv.linear.weight`` -> ``qkv.weight``)."""
    return name.replace(".linear.", ".")
