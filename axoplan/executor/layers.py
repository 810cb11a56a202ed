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
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from axoplan.executor.linear4d import Linear4D, Runtime

__all__ = ["layer_norm_x", "embedding_y", "cross_entropy_y"]


def layer_norm_x(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, hidden: int,
                 rt: Runtime, eps: float = 1e-5) -> torch.Tensor:
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
