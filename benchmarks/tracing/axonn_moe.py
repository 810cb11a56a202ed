"""The traced work of AxoNN's native MoE layer (``DroplessMoEMLP``) beyond the dense MLP it replaces, the numbers of
``axoplan.cost.moe.native_routing_counts``::

    python -m benchmarks.tracing.axonn_moe        # prints the fitted counts and the traces they come from

AxoNN's MoE modules (``axonn/intra_layer/moe/``: ``layer.py``, ``linear.py`` and ``communication.py`` @0e02dbf,
``routing.py`` @13f402d) are not a released package, so they are rebuilt here from their code, op by op, on one rank
in a world of one (every ``Gather``, ``Drop``, ``_gather`` and ``_reduce_scatter`` of a group of one returns its
input; the collectives are priced by the cost model), in bf16 as Megatron-AxoNN's ``--bf16`` runs, and traced with
the ledger tracer's recorder (``tracing.recorder``). What stands in for what a GPU runs:

* ``grouped_gemm``'s ``backend.gmm`` (one CUTLASS grouped GEMM, its per-expert row counts on the host): one op,
  ``grouped_mm``, the same inputs and output;
* ``per_expert_token_counts.cpu()``, which on a CPU tensor dispatches nothing: one op, ``to_host``, a host sync (the
  device-to-host copy the host waits for);
* ``.cuda()`` on a CUDA tensor returns it (no op), as here.

The same is traced for the dense MLP the counted ``axonn`` block holds (Megatron-AxoNN's ``ParallelMLP``:
MLP-up, fused bias-GeLU, MLP-down; ``tracing.megatron_axonn._MLP``), and the counts are the MoE layer's less the
MLP's: host ops (every op that reaches the dispatcher, views too), kernels (every op but a view) and host syncs,
forward and backward, each linear in the experts ``E`` and experts per token ``k`` (``a + b·k + c·E``, from traces at
``(E, k)`` = (4, 1), (8, 1) and (4, 2); a fourth trace checks the fit).
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from .megatron_axonn import _MLP
from .recorder import Recorder, is_view

_LIBS: list[Any] = []


@cache
def _library() -> Any:
    """``grouped_mm``: ``grouped_gemm``'s ``gmm(a, b, batch_sizes, trans_a, trans_b)``; ``to_host``: a tensor copied to
    the host. The CPU implementations compute the values, below the recorder."""
    lib = torch.library.Library("axoplan_moe", "FRAGMENT")
    lib.define("grouped_mm(Tensor a, Tensor b, Tensor batch_sizes, bool trans_a, bool trans_b) -> Tensor")
    lib.define("to_host(Tensor t) -> Tensor")
    lib.impl("grouped_mm", _gmm, "CPU")
    lib.impl("to_host", lambda t: t.clone(), "CPU")
    _LIBS.append(lib)
    return torch.ops.axoplan_moe


def _gmm(a: torch.Tensor, b: torch.Tensor, batch_sizes: torch.Tensor, trans_a: bool, trans_b: bool) -> torch.Tensor:
    """grouped_gemm's semantics: ``trans_a``: ``a`` and ``b`` both ``[rows, ·]`` split by ``batch_sizes``, one
    ``aᵢᵀ·bᵢ`` per expert, stacked; else ``a`` split by rows against ``b[i]`` (``[E, n, k]`` with ``trans_b``)."""
    sizes = [int(n) for n in batch_sizes]
    if trans_a:
        return torch.stack([x.t() @ y for x, y in zip(a.split(sizes), b.split(sizes), strict=True)])
    return torch.cat([x @ (w.t() if trans_b else w) for x, w in zip(a.split(sizes), b, strict=True)])


class _SimpleFSDPLinear(torch.autograd.Function):
    """``linear.py``'s ``SimpleFSDPLinear``: the gathered weight (``_gather`` of one: the shard) reshaped, one grouped
    GEMM forward; backward the weight again, the weight gradient's grouped GEMM flattened (then ``_reduce_scatter``),
    the input gradient's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor,
                shape: tuple[int, int, int]) -> torch.Tensor:
        gathered = w.reshape(shape)
        y = _library().grouped_mm(x.to(torch.bfloat16), gathered.to(torch.bfloat16), counts, False, True).to(x.dtype)
        ctx.shape = shape
        ctx.save_for_backward(w, x, counts)
        return y

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        w, x, counts = ctx.saved_tensors
        gathered = w.reshape(ctx.shape)
        grad_w = _library().grouped_mm(grad_out.to(torch.bfloat16), x.to(torch.bfloat16), counts, True,
                                       False).reshape(-1).to(x.dtype)
        grad_x = _library().grouped_mm(grad_out.to(torch.bfloat16), gathered.to(torch.bfloat16), counts, False,
                                       False).to(x.dtype)
        return grad_x, grad_w, None, None


def _gather_and_permute(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    return x[indices]  # Gather.apply over a group of one returns x


def _unpermute_and_drop(x: torch.Tensor, indices: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """``communication.py``'s unpermutation: a zero tensor, ``scatter_add_`` of the rows by the expanded indices
    (``.cuda()`` of a device tensor: itself), an empty output and ``dist.reduce_scatter_tensor`` into it (a group of
    one: the copy a reduce-scatter of one rank makes is the collective's, not recorded, so the input stands for it)."""
    out = torch.zeros(shape, dtype=x.dtype)
    out.scatter_add_(0, indices.unsqueeze(1).expand(-1, shape[1]), x)
    torch.empty(shape, dtype=out.dtype)
    return out


class _GatherAndPermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        ctx.shape = list(x.shape)
        ctx.save_for_backward(indices)
        return _gather_and_permute(x, indices)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        indices, = ctx.saved_tensors
        return _unpermute_and_drop(grad, indices, ctx.shape), None


class _UnpermuteAndScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, indices: torch.Tensor, shape: list[int]) -> torch.Tensor:
        ctx.save_for_backward(indices)
        return _unpermute_and_drop(x, indices, shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        indices, = ctx.saved_tensors
        return _gather_and_permute(grad, indices), None, None


class DroplessMoEMLP(torch.nn.Module):
    """``layer.py``'s ``DroplessMoEMLP`` with ``routing.py``'s ``DroplessMoERouting`` (the router a bias-carrying
    ``nn.Linear(H, E)``), tensor-parallel size 1, `top_k` experts a token (AxoNN passes 1)."""

    def __init__(self, experts: int, hidden: int, width: int, top_k: int) -> None:
        super().__init__()
        self.experts, self.top_k = experts, top_k
        self.gate = torch.nn.Linear(hidden, experts)
        self.fc = torch.nn.Parameter(torch.randn(experts * 2 * width * hidden) / math.sqrt(hidden))
        self.proj = torch.nn.Parameter(torch.randn(experts * hidden * width) / math.sqrt(width))
        self.fc_shape, self.proj_shape = (experts, 2 * width, hidden), (experts, hidden, width)

    def _route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch = x.shape[0]
        probs = F.softmax(self.gate(x), dim=-1)
        top_probs, top_idx = torch.topk(probs, self.top_k, dim=-1)
        top_probs / (top_probs.sum(dim=-1, keepdim=True) + 1e-8)  # returned by the router, unused by the layer
        routing_map = torch.zeros(batch, self.experts, dtype=torch.bool)
        for i in range(self.top_k):
            routing_map[torch.arange(batch), top_idx[:, i]] = True
        with torch.no_grad():  # create_permutation_indices
            by_expert = routing_map.bool().T.contiguous()
            indices = torch.cat([torch.where(by_expert[e])[0] for e in range(self.experts)], dim=0)
            counts = by_expert.sum(dim=1)
        return _GatherAndPermute.apply(x, indices), indices, _library().to_host(counts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, x.shape[-1])
        permuted, indices, counts = self._route(x)
        y = _SimpleFSDPLinear.apply(permuted, self.fc, counts, self.fc_shape)
        y = F.silu(y[..., ::2]) * y[..., 1::2]
        y = _SimpleFSDPLinear.apply(y, self.proj, counts, self.proj_shape)
        y = _UnpermuteAndScatter.apply(y, indices, list(x.shape))
        return y.reshape(*shape[:-1], y.shape[-1])


def _counts(module: torch.nn.Module, x: torch.Tensor, dense: bool) -> dict[str, float]:
    """Host ops, kernels and host syncs of one forward and one backward of `module` on `x` (the second call: the
    first is untraced), without the gradients' accumulation (the block's own, counted with it)."""
    for _ in range(2):
        module.zero_grad(set_to_none=True)  # no accumulation into earlier gradients: the block's own hooks do that
        x.grad = None
        rec = Recorder()
        with rec:
            rec.scope = "forward"
            outs = module(x) if dense else (module(x),)  # the dense MLP's bias goes on to the bias-dropout-add
            rec.scope = "gradients"  # the backward's seeds, not the module's
            grads = tuple(torch.ones_like(t) for t in outs)
            rec.scope = "backward"
            torch.autograd.backward(outs, grads)
    result = {}
    for scope in ("forward", "backward"):
        ops = rec.ops[scope]
        result[f"{scope}_ops"] = float(len(ops))
        result[f"{scope}_kernels"] = float(sum(not is_view(o["op"]) for o in ops))
        result[f"{scope}_syncs"] = float(sum(o["sync"] or o["op"].startswith("to_host") for o in ops))
    return result


def traced(experts: int, top_k: int, tokens: int = 16, hidden: int = 32, width: int = 24) -> dict[str, float]:
    """The native layer's counts less the dense MLP's, at `experts` and `top_k`."""
    torch.manual_seed(0)
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    moe = _counts(DroplessMoEMLP(experts, hidden, width, top_k).to(torch.bfloat16), x, dense=False)
    mlp = _counts(_MLP(hidden, 4 * hidden, swiglu=False).to(torch.bfloat16), x, dense=True)
    return {k: moe[k] - mlp[k] for k in moe}


def fitted() -> dict[str, tuple[float, float, float]]:
    """Each count as ``(a, b, c)`` of ``a + b·k + c·E``, from traces at (4, 1), (8, 1) and (4, 2), checked at (8, 2)."""
    base, more_e, more_k, both = traced(4, 1), traced(8, 1), traced(4, 2), traced(8, 2)
    out = {}
    for key in base:
        c = (more_e[key] - base[key]) / 4.0
        b = more_k[key] - base[key]
        a = base[key] - b - 4.0 * c
        if a + 2.0 * b + 8.0 * c != both[key]:
            raise SystemExit(f"{key}: not linear in k and E ({both[key]} traced at E=8, k=2)")
        out[key] = (a, b, c)
    return out


def main() -> None:
    print(f"torch {torch.__version__}")
    for key, (a, b, c) in fitted().items():
        print(f"{key:18s} {a:+.0f} {b:+.0f}·k {c:+.0f}·E")


if __name__ == "__main__":
    main()
