"""The model as AxoNN's Hugging Face / Lightning path runs it (``docs/algorithm.md`` §4b; issue 24).

Every rank holds its own sequences at full width (Lightning's ``AxonnStrategy`` samples over the whole
world). Each linear is AxoNN's default ("non-expert") ``Linear``: the 4D linear of
``axoplan.executor.linear4d`` on the rows of its X·Y group, with the transitions of
``intra_layer/fully_connected.py`` ``Linear.forward`` around it (``asym_communication.py``)::

    [m, k] ─all-to-all over in (GatherBatchScatterChannels)→ [p_in·m, k/p_in]
           ─all-gather over out (Gatherv)→ [p_out·p_in·m, k/p_in] ─4D linear→ [M, n/p_out]
           ─all-to-all over out (GatherChannelsScatterBatch)→ [p_in·m, n] ─own rows (Dropv)→ [m, n]

(the backward runs the reverses). Norms, attention (every head) and element-wise work run on the
rank's own tokens, repeated nowhere; every parameter outside the 4D linears (norms, biases, the token
table, positions) is whole on every rank and its gradient, a sum over the rank's own tokens, is
all-reduced over the world (``sync_gradients``). With ``Gx·Gy = 1`` no transition moves anything.

The token table is kept whole on every rank (auto_parallelize's choice when ``Gx > 1``); the cost model
prices AxoNN's sharded ``Embedding`` where ``Gx = 1``, which the executor does not run [simplification].
The LM head is tied to nothing (models on this path are untied; a tied model is refused).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from axoplan.executor.linear4d import Linear4D, Runtime
from axoplan.executor.reference import LN_EPS, activation, attention_core
from axoplan.inputs.model import ModelSpec

__all__ = ["GPTHF", "HFLinear"]


def _all_to_all(rt: Runtime, t: torch.Tensor, axis: str) -> torch.Tensor:
    """Send row block j of `t` to the axis group's member j; return the blocks received, in member order."""
    p = rt.comm.size(axis)
    if p == 1:
        return t
    out = torch.empty_like(t)
    with rt.timer.span(f"all_to_all_{axis}", ("all_to_all", axis, t.numel(), True)):
        torch.distributed.all_to_all_single(out, t.contiguous(), group=rt.groups.group[axis])
    return out


def _gather_rows(rt: Runtime, t: torch.Tensor, axis: str) -> torch.Tensor:
    """All-gather `t`'s rows over the axis group, in member order."""
    p = rt.comm.size(axis)
    if p == 1:
        return t
    return rt.comm.all_gather(t.contiguous().reshape(-1), axis).view(p * t.shape[0], *t.shape[1:])


def _own_rows(rt: Runtime, t: torch.Tensor, axis: str) -> torch.Tensor:
    p = rt.comm.size(axis)
    rows = t.shape[0] // p
    i = rt.groups.coords[axis]
    return t[i * rows:(i + 1) * rows]


def _columns_to_rows(t: torch.Tensor, p: int) -> torch.Tensor:
    """[m, k] → [p·m, k/p]: column chunk j as row block j (what member j receives from this rank)."""
    return torch.cat(torch.chunk(t, p, dim=-1), dim=0)


def _rows_to_columns(t: torch.Tensor, p: int) -> torch.Tensor:
    """[p·m, c] → [m, p·c]: row block j as column chunk j."""
    return torch.cat(torch.chunk(t, p, dim=0), dim=-1)


class _GatherBatchScatterChannels(torch.autograd.Function):
    """``[m, k]`` → ``[p·m, k/p]`` over `axis` (an all-to-all); backward the reverse all-to-all."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rt: Runtime, axis: str) -> torch.Tensor:
        ctx.rt, ctx.axis = rt, axis
        return _all_to_all(rt, _columns_to_rows(x, rt.comm.size(axis)), axis)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        back = _all_to_all(ctx.rt, grad.contiguous(), ctx.axis)
        return _rows_to_columns(back, ctx.rt.comm.size(ctx.axis)), None, None


class _Gatherv(torch.autograd.Function):
    """All-gather the rows over `axis` (AxoNN's Gatherv); backward takes this member's rows."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rt: Runtime, axis: str) -> torch.Tensor:
        ctx.rt, ctx.axis = rt, axis
        return _gather_rows(rt, x, axis)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _own_rows(ctx.rt, grad, ctx.axis).contiguous(), None, None


class _GatherChannelsScatterBatch(torch.autograd.Function):
    """``[p·r, c]`` → ``[r, p·c]`` over `axis` (an all-to-all); backward the reverse all-to-all."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rt: Runtime, axis: str) -> torch.Tensor:
        ctx.rt, ctx.axis = rt, axis
        return _rows_to_columns(_all_to_all(rt, x, axis), rt.comm.size(axis))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        p = ctx.rt.comm.size(ctx.axis)
        return _all_to_all(ctx.rt, _columns_to_rows(grad.contiguous(), p), ctx.axis), None, None


class _Dropv(torch.autograd.Function):
    """This member's rows over `axis` (a slice); backward all-gathers the gradients' rows."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rt: Runtime, axis: str) -> torch.Tensor:
        ctx.rt, ctx.axis = rt, axis
        return _own_rows(rt, x, axis).contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _gather_rows(ctx.rt, grad, ctx.axis), None, None


class HFLinear(nn.Module):
    """AxoNN's non-expert ``Linear``: the 4D linear with its transitions, and its whole bias."""

    def __init__(self, linear: Linear4D, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.linear = linear
        self.bias = nn.Parameter(bias) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lin, rt = self.linear, self.linear.rt
        a, b = lin.in_axis, lin.out_axis
        if rt.comm.size(a) * rt.comm.size(b) > 1:  # PR #102: no transitions for a one-GPU X·Y group
            x = _Gatherv.apply(_GatherBatchScatterChannels.apply(x, rt, a), rt, b)
            x = _Dropv.apply(_GatherChannelsScatterBatch.apply(lin(x), rt, b), rt, a)
        else:
            x = lin(x)
        return x if self.bias is None else x + self.bias


class _Whole(nn.Module):
    """A whole parameter (and bias) every rank holds: a norm, the token table, the positions."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None


class _BlockHF(nn.Module):
    def __init__(self, spec: ModelSpec, prefix: str, params: dict[str, torch.Tensor], rt: Runtime) -> None:
        super().__init__()
        self.spec = spec

        def norm(name: str) -> _Whole:
            return _Whole(params[f"{prefix}.{name}.weight"], params.get(f"{prefix}.{name}.bias"))

        def linear(name: str) -> HFLinear:
            lay = {lin.name: lin for lin in spec.block_linears()}[name]
            inner = Linear4D(name, lay.k_in, lay.n_out, lay.transposed, rt, params[f"{prefix}.{name}.weight"])
            return HFLinear(inner, params.get(f"{prefix}.{name}.bias"))

        self.ln1, self.ln2 = norm("ln1"), norm("ln2")
        self.qkv, self.attn_out = linear("qkv"), linear("attn_out")
        self.mlp_up, self.mlp_down = linear("mlp_up"), linear("mlp_down")

    def forward(self, h: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        s = self.spec
        qkv = self.qkv(_layer_norm(h, self.ln1))
        h = h + self.attn_out(attention_core(qkv, batch, seq, s.kv_heads, s.num_heads // s.kv_heads, s.head_dim))
        return h + self.mlp_down(activation(self.mlp_up(_layer_norm(h, self.ln2)), s.ffn_kind))


def _layer_norm(x: torch.Tensor, norm: _Whole) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, LN_EPS)


class GPTHF(nn.Module):
    """This rank's model on the hf path; ``forward`` returns the mean loss of its own tokens."""

    def __init__(self, spec: ModelSpec, vocab: int, params: dict[str, torch.Tensor], rt: Runtime,
                 recompute: bool) -> None:
        super().__init__()
        if spec.tied_embeddings:
            raise ValueError("the hf path's executor runs untied models (the LM head is its own AxoNN linear)")
        self.spec, self.rt, self.recompute = spec, rt, recompute
        head = spec.head_linear(vocab)
        self.lm_head = HFLinear(Linear4D(head.name, head.k_in, head.n_out, False, rt, params["lm_head.weight"]), None)
        self.embed = _Whole(params["embed.weight"])
        if spec.max_positions:
            self.pos = _Whole(params["pos.weight"])
        self.blocks = nn.ModuleList(_BlockHF(spec, f"blocks.{i}", params, rt) for i in range(spec.num_layers))
        self.ln_f = _Whole(params["ln_f.weight"], params.get("ln_f.bias"))

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        batch, seq = ids.shape
        h = F.embedding(ids, self.embed.weight)
        if self.spec.max_positions:
            h = h + self.pos.weight[:seq]
        h = h.reshape(batch * seq, -1)
        for block in self.blocks:
            h = (checkpoint(block, h, batch, seq, use_reentrant=False, context_fn=self._recompute_context)
                 if self.recompute else block(h, batch, seq))
        logits = self.lm_head(_layer_norm(h, self.ln_f))
        return F.cross_entropy(logits.float(), targets.reshape(-1))

    def _recompute_context(self) -> tuple[Any, Any]:
        import contextlib

        return contextlib.nullcontext(), self.rt.recomputing()

    def sharded(self) -> Iterator[tuple[str, nn.Parameter]]:
        """The 4D-sharded weights (gradients reduced over data)."""
        for name, p in self.named_parameters():
            if name.endswith(".linear.weight"):
                yield name.replace(".linear.", "."), p

    def replicated(self) -> Iterator[tuple[str, nn.Parameter, tuple[str, ...]]]:
        """Whole parameters; no copy is redundant (every rank's gradient is its own tokens'), so no axes."""
        for name, p in self.named_parameters():
            if not name.endswith(".linear.weight"):
                yield name, p, ()
