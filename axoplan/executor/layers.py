"""The non-linear pieces of the 4D model, each exact over its group.

* **LayerNorm over X**: the residual stream is ``[m_l, H/Gx]`` (split over X, repeated
  over Y), so each token's statistics need the X group: one all-reduce of three numbers
  per token forward (local mean, its square, local sum of squared deviations: Chan et al.
  1979's pairwise update, no cancellation) and one of two numbers backward.
* **Embedding over Y**: the token table is the LM head's 4D-sharded weight (or an untied
  copy): rows (vocabulary) over Y, columns over X. Each Y member looks up the tokens in
  its vocabulary block, the others add zeros, and an all-reduce over Y completes
  ``[m_l, H/Gx]`` (Megatron's vocabulary-parallel embedding).
* **Cross-entropy over Y**: logits are ``[m_l, V/Gy]``; the maximum, the sum of
  exponentials and the target logit are reduced over Y (Megatron's vocab-parallel loss).

The statistics all-reduces are charged to ``stats_all_reduce_<axis>``; they are not in
the cost model (a few numbers per token).

``MegatronPath`` injects these, the 4D linears (``Linear`` around a ``Linear4D`` core, or AxoNN's) and the
native MoE module into ``model.GPT``. Parameters that every rank holds whole (norms, biases, positions, the
router) are used by several members on the same data: each is tagged with the axes along which its gradient
is a repeated copy (a linear's bias: its layer's input axis, whose members all add it to the same output;
the rest: Y, over which the residual stream repeats), so the world all-reduce counts each copy once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from axoplan.executor.linear4d import Linear, Linear4D, Runtime
from axoplan.executor.model import GPT, LN_EPS
from axoplan.executor.moe import EXPERT_WEIGHTS, ExpertComm, NativeMoE
from axoplan.executor.reference import weight_kind
from axoplan.executor.tags import Reduction, tag
from axoplan.inputs.model import LinearLayer, ModelSpec, layer_axes

__all__ = ["layer_norm_x", "embedding_y", "cross_entropy_y", "MegatronPath", "megatron_model"]


def layer_norm_x(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, hidden: int,
                 rt: Runtime, eps: float = LN_EPS) -> torch.Tensor:
    """LayerNorm of ``[m, H/Gx]`` rows whose other columns live on the X group."""
    b = bias if bias is not None else torch.zeros_like(weight)
    return _LayerNormX.apply(x, weight, b, hidden, rt, eps)


class _LayerNormX(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, hidden: int, rt: Runtime,
                eps: float) -> torch.Tensor:
        xf = x.float()
        local_n, parts = xf.shape[-1], rt.comm.size("x")
        mu = xf.mean(-1)
        stats = torch.stack([mu, mu * mu, ((xf - mu[:, None]) ** 2).sum(-1)])
        rt.comm.all_reduce(stats, "x", phase="stats_all_reduce_x")
        mean = stats[0] / parts
        m2 = stats[2] + local_n * (stats[1] - parts * mean * mean)
        rstd = torch.rsqrt(m2 / hidden + eps)
        xhat = (xf - mean[:, None]) * rstd[:, None]
        ctx.save_for_backward(xhat, rstd, weight)
        ctx.hidden, ctx.rt = hidden, rt
        return (xhat * weight.float() + bias.float()).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        xhat, rstd, weight = ctx.saved_tensors
        dyf = dy.float()
        dxhat = dyf * weight.float()
        sums = torch.stack([dxhat.sum(-1), (dxhat * xhat).sum(-1)])
        ctx.rt.comm.all_reduce(sums, "x", phase="stats_all_reduce_x")
        dx = rstd[:, None] * (dxhat - sums[0][:, None] / ctx.hidden - xhat * sums[1][:, None] / ctx.hidden)
        dweight = (dyf * xhat).sum(0).to(weight.dtype)
        dbias = dyf.sum(0).to(weight.dtype)
        return dx.to(dy.dtype), dweight, dbias, None, None, None


def embedding_y(ids: torch.Tensor, table: Linear4D) -> torch.Tensor:
    """``[m]`` token ids -> ``[m, H/Gx]`` rows of the vocabulary-parallel `table`."""
    return _EmbeddingY.apply(ids, table.weight, table)


def _local_ids(ids: torch.Tensor, table: Linear4D) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices into this rank's vocabulary block, and which ids fall in it."""
    start = table.rt.groups.coords["y"] * table.n_loc
    local = ids - start
    inside = (local >= 0) & (local < table.n_loc)
    return torch.where(inside, local, torch.zeros_like(local)), inside


class _EmbeddingY(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, ids: torch.Tensor, shard: torch.Tensor, table: Linear4D) -> torch.Tensor:
        w = table.gathered()
        local, inside = _local_ids(ids, table)
        out = w[local] * inside[:, None].to(w.dtype)
        table.rt.comm.all_reduce(out, "y")
        ctx.save_for_backward(local, inside)
        ctx.table = table
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[None, torch.Tensor | None, None]:
        local, inside = ctx.saved_tensors
        table: Linear4D = ctx.table
        grad = torch.zeros(table.n_loc, table.k_loc, dtype=dout.dtype, device=dout.device)
        grad.index_add_(0, local[inside], dout[inside])
        return None, table.reduce_grad(grad), None


def cross_entropy_y(logits: torch.Tensor, targets: torch.Tensor, head: Linear4D) -> torch.Tensor:
    """Per-token loss ``[m]`` of logits ``[m, V/Gy]`` split over Y (block of `head`)."""
    return _CrossEntropyY.apply(logits, targets, head)


class _CrossEntropyY(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, head: Linear4D) -> torch.Tensor:
        comm = head.rt.comm
        lf = logits.float()
        top = lf.max(-1).values
        comm.all_reduce(top, "y", phase="stats_all_reduce_y", op=dist.ReduceOp.MAX)
        shifted = lf - top[:, None]
        exp = shifted.exp()
        local, inside = _local_ids(targets, head)
        rows = torch.arange(lf.shape[0], device=lf.device)
        sums = torch.stack([exp.sum(-1), shifted[rows, local] * inside.to(lf.dtype)])
        comm.all_reduce(sums, "y", phase="stats_all_reduce_y")
        ctx.save_for_backward(exp / sums[0][:, None], local, inside)
        ctx.dtype = logits.dtype
        return sums[0].log() - sums[1]

    @staticmethod
    def backward(ctx: Any, dloss: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        softmax, local, inside = ctx.saved_tensors
        grad = softmax.clone()
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows[inside], local[inside]] -= 1.0
        return (grad * dloss[:, None]).to(ctx.dtype), None, None


class MegatronPath:
    """The Megatron path's injection into ``GPT`` (AxoNN's expert mode; module docstring). `core` makes the
    block linears' cores (``Linear4D``, or AxoNN's ``Linear`` through ``axonn_backend``); the embedding and LM
    head are always ``Linear4D``. `reentrant`: recompute with the reentrant checkpoint (AxoNN's engine)."""

    loss_redundant: tuple[str, ...] = ("x", "y")  # the X·Y members of a Z coordinate hold the same tokens

    def __init__(self, rt: Runtime, recompute: bool, core: Callable[..., nn.Module] = Linear4D,
                 reentrant: bool = False) -> None:
        self.rt, self.core = rt, core
        self.heads_split = rt.groups.size("y")
        self.recompute = ("reentrant" if reentrant else "checkpoint") if recompute else "off"

    def param(self, params: dict[str, torch.Tensor], name: str) -> nn.Parameter:
        """A whole parameter: all-reduced over the world, each repeated copy once (module docstring)."""
        return tag(nn.Parameter(params[name]), Reduction(name, ("world",), _repeated_along(name)))

    def linear(self, lay: LinearLayer, name: str, params: dict[str, torch.Tensor]) -> nn.Module:
        core: Any = self.core(lay.name, lay.k_in, lay.n_out, lay.transposed, self.rt, params[f"{name}.weight"])
        tag(core.weight, Reduction(f"{name}.weight", ("z", "data")))
        return Linear(core, self.param(params, f"{name}.bias") if f"{name}.bias" in params else None)

    def head(self, lay: LinearLayer, params: dict[str, torch.Tensor]) -> nn.Module:
        return self._sharded("lm_head", lay.k_in, lay.n_out, lay.transposed, params)

    def table(self, spec: ModelSpec, vocab: int, params: dict[str, torch.Tensor]) -> nn.Module:
        return self._sharded("embed", spec.hidden, vocab, False, params)

    def _sharded(self, name: str, k_in: int, n_out: int, transposed: bool,
                 params: dict[str, torch.Tensor]) -> Linear4D:
        layer = Linear4D(name, k_in, n_out, transposed, self.rt, params[f"{name}.weight"])
        tag(layer.weight, Reduction(f"{name}.weight", ("z", "data")))
        return layer

    def moe(self, spec: ModelSpec, prefix: str, params: dict[str, torch.Tensor]) -> nn.Module:
        """AxoNN's native DroplessMoEMLP (``moe.NativeMoE``); Gx = Gy = 1."""
        m = spec.moe
        assert m is not None
        router = self.param(params, f"{prefix}.router.weight")
        fc, proj = (tag(nn.Parameter(params[f"{prefix}.{w}.weight"]),
                        Reduction(f"{prefix}.{w}.weight", ("z_fsdp", "data"))) for w in EXPERT_WEIGHTS)
        return NativeMoE(m.num_experts, spec.hidden, m.expert_ffn_hidden, m.top_k, router, fc, proj,
                         ExpertComm(self.rt.groups, self.rt.timer))

    def layer_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """This rank normalises its X block of features with its block of the whole weight and bias."""
        hidden = weight.numel()
        part = self.rt.part("x", hidden)
        local_bias = bias[part] if bias is not None else None
        return layer_norm_x(x, weight[part], local_bias, hidden, self.rt)

    def embed(self, ids: torch.Tensor, table: nn.Module) -> torch.Tensor:
        return embedding_y(ids, table)  # type: ignore[arg-type]  # a Linear4D (table or tied head)

    def x_part(self, n: int) -> slice:
        return self.rt.part("x", n)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, head: nn.Module) -> torch.Tensor:
        return cross_entropy_y(logits, targets, head).mean()  # type: ignore[arg-type]  # the Linear4D head

    def attention_span(self) -> contextlib.AbstractContextManager[Any]:
        return self.rt.timer.span("attention")

    def recomputing(self) -> contextlib.AbstractContextManager[Any]:
        return self.rt.recomputing()


def _repeated_along(name: str) -> tuple[str, ...]:
    """The axes along which a whole parameter's gradient repeats on the Megatron path (module docstring)."""
    if name.endswith(".bias"):
        kind = weight_kind(name.removesuffix("bias") + "weight")
        if kind in ("plain", "transposed"):
            return (layer_axes(kind == "transposed")[0],)
    return ("y",)


def megatron_model(spec: ModelSpec, vocab: int, params: dict[str, torch.Tensor], rt: Runtime, recompute: bool,
                   core: Callable[..., nn.Module] = Linear4D, reentrant: bool = False) -> GPT:
    """This rank's model on the Megatron path (``MegatronPath``)."""
    return GPT(spec, vocab, params, MegatronPath(rt, recompute, core, reentrant))
