"""The model as AxoNN's Hugging Face / Lightning path runs it (``docs/algorithm.md`` §4b; issue 24): ``model.GPT``
with ``HFPath`` injected.

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
all-reduced over the world (``train.sync_gradients``). With ``Gx·Gy = 1`` no transition moves anything.

The token table is kept whole on every rank (auto_parallelize's choice when ``Gx > 1``); the cost model
prices AxoNN's sharded ``Embedding`` where ``Gx = 1``, which the executor does not run [simplification].
The LM head is tied to nothing (models on this path are untied; a tied model is refused). Attention has no
phase of its own here (its time stays outside the timed phases, as on this path since issue 24).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from axoplan.executor.linear4d import Linear, Linear4D, Runtime
from axoplan.executor.model import GPT
from axoplan.executor.reference import WholePath
from axoplan.executor.tags import Reduction, tag
from axoplan.inputs.model import LinearLayer, ModelSpec

__all__ = ["HFPath", "hf_model", "transitions"]


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


def transitions(x: torch.Tensor, core: Any) -> torch.Tensor:
    """`core` (a 4D linear) on the rows of this rank's X·Y group, with AxoNN's non-expert transitions around
    it (module docstring); none for a one-GPU X·Y group (AxoNN PR #102)."""
    rt, a, b = core.rt, core.in_axis, core.out_axis
    if rt.comm.size(a) * rt.comm.size(b) == 1:
        return core(x)
    x = _Gatherv.apply(_GatherBatchScatterChannels.apply(x, rt, a), rt, b)
    return _Dropv.apply(_GatherChannelsScatterBatch.apply(core(x), rt, b), rt, a)


class HFPath(WholePath):
    """The hf path's injection into ``GPT``: the reference's whole parameters and data-parallel arithmetic,
    except that every linear is a 4D one with the transitions around it (``Linear`` with `transitions`)."""

    def __init__(self, rt: Runtime, recompute: bool) -> None:
        self.rt = rt
        self.recompute = "checkpoint" if recompute else "off"

    def linear(self, lay: LinearLayer, name: str, params: dict[str, torch.Tensor]) -> nn.Module:
        bias = self.param(params, f"{name}.bias") if f"{name}.bias" in params else None
        return self._linear(lay.name, lay.k_in, lay.n_out, lay.transposed, params, name, bias)

    def head(self, lay: LinearLayer, params: dict[str, torch.Tensor]) -> nn.Module:
        return self._linear(lay.name, lay.k_in, lay.n_out, False, params, "lm_head", None)

    def _linear(self, layer: str, k_in: int, n_out: int, transposed: bool, params: dict[str, torch.Tensor],
                name: str, bias: nn.Parameter | None) -> Linear:
        core = Linear4D(layer, k_in, n_out, transposed, self.rt, params[f"{name}.weight"])
        tag(core.weight, Reduction(f"{name}.weight", ("z", "data")))
        return Linear(core, bias, transitions)

    def moe(self, spec: ModelSpec, prefix: str, params: dict[str, torch.Tensor]) -> nn.Module:
        raise ValueError("the hf path's executor runs dense models")

    def recomputing(self) -> contextlib.AbstractContextManager[Any]:
        return self.rt.recomputing()


def hf_model(spec: ModelSpec, vocab: int, params: dict[str, torch.Tensor], rt: Runtime, recompute: bool) -> GPT:
    """This rank's model on the hf path (``HFPath``)."""
    if spec.tied_embeddings:
        raise ValueError("the hf path's executor runs untied models (the LM head is its own AxoNN linear)")
    return GPT(spec, vocab, params, HFPath(rt, recompute))
