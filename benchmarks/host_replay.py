"""Host cost of one transformer block of a framework, measured by replaying its Python.

    python benchmarks/host_replay.py [--framework megatron-deepspeed|axonn] [--repeats 40] [--layers 8]
    PYTHONPATH=. python benchmarks/host_replay.py --framework megatron-core  # in a venv with megatron-core 0.16.1
    python benchmarks/host_replay.py --framework axoplan-executor  # axoplan's own executor

A framework profile (`frameworks/<name>.yaml`) prices the host side of a block in
*op-equivalents*: the block's host time divided by the host time of one op of `axoplan
probe`'s chain (a tiny linear, view, transpose or GeLU, forward or backward, measured the same
way on the same core: ``axoplan.executor.probe.host_op_us_measured``). A machine's
``host.op_us`` is that one op on its own host (measured by `axoplan probe`, or assumed), so
``op-equivalents × host.op_us`` is the block's host time there; kernel launches are priced
apart (``host.launch_us``). The ratio, unlike a time, carries from the core it was measured on
to another.

Counting the ops by reading the code misses what is not an op: module calls, Python
``autograd.Function`` objects in forward and backward, TorchScript calls, the RNG tracker's
fork around dropout, the checkpoint's state save and restore. So this script *replays* the
block: the module and function structure of the framework's transformer layer, written by us
from its code, on tensors so small (8 tokens, hidden 32) that the arithmetic is negligible and
the host's cost is what is timed. vTrain does the same: it profiles a re-implementation of
the GPT block rather than Megatron's code (``VIA-Research/vTrain``, ``src/model/gpt_modeling.py``).

* ``megatron-deepspeed``: ``ParallelTransformerLayer`` at Megatron-DeepSpeed commit 066632b
  (``megatron/model/transformer.py``, ``megatron/mpu/layers.py``, ``mappings.py``,
  ``random.py``; apex ``FusedLayerNormAffineFunction``; ``FusedScaleMaskSoftmax`` on its causal
  kernel; unfused attention; the two MoE placeholder scalars).
* ``axonn``: ``ParallelTransformerLayer`` of Megatron-AxoNN (axonn-ai/Megatron-AxoNN f6df7ae,
  a middle layer): AxoNN 0.2.0's ``Linear`` (``AsyncLinear``) for the four linears, flash
  attention (``FlashSelfAttention`` and flash-attn's varlen function), the same fused LayerNorm,
  bias-GeLU and bias-dropout-add, ``make_viewless_tensor``.

* ``megatron-core``: not a replica but megatron-core 0.16.1's own code (Megatron-LM's
  ``frameworks/megatron-lm.yaml``): the ``TransformerBlock`` of GPT ``TransformerLayer``s of the
  ``GPTModel`` that ``benchmarks/tracing/megatron.py``'s ``build_megatron`` builds (local spec,
  bf16 parameters, the three fusions on), inside its ``DistributedDataParallel`` (fp32
  ``main_grad``, its gradient hooks), under the tracer's ``cpu_world`` (a world of one on gloo,
  ``torch.cuda.current_device`` patched, ``use_cpu_initialization``); its final norm removed; the
  full recompute of Megatron-LM's ``--recompute-granularity full --recompute-method uniform
  --recompute-num-layers 1`` (``tensor_parallel.random.checkpoint``) switched on by the config.
  Where a GPU runs a different Python path, the CPU runs the GPU's: the local spec's norm is
  megatron-core's ``FusedLayerNorm`` (what it picks where apex is installed; its non-persistent
  path, as the builder's config has ``persist_layer_norm`` off) over apex's
  ``FusedLayerNormAffineFunction``'s Python (:class:`_ApexLayerNormFunction`). Each call the GPU
  makes as one kernel call is one tiny op of the right shape here: apex's layer-norm extension
  (``native_layer_norm`` and its backward), the ``torch.compile``'d ``bias_gelu`` and
  ``bias_gelu_back`` inside megatron-core's own ``GeLUFunction``, the compiled
  ``bias_dropout_add_fused_train`` (an autograd Function of one op each way, as AOTAutograd wraps
  it), flash attention in place of the local spec's unfused ``DotProductAttention`` (one op each
  way; TransformerEngine's own Python around its kernel is not replayed, so this part is a lower
  bound), apex's ``wgrad_gemm_accum_fp32`` (one in-place op on ``main_grad``), CUDA's
  ``native_dropout``. The CUDA RNG state that the checkpoint saves and restores is the CPU's.
  DDP runs without ``overlap_grad_reduce`` (the builder's choice): its hook's
  ``register_grad_ready`` is not timed. Everything else is megatron-core's Python as it runs.

* ``axoplan-executor``: not a replica but axoplan's own executor (``frameworks/axoplan-executor.yaml``): the blocks
  of the ``GPT`` that ``axoplan.executor.train.build_model`` builds for a ``1x1x1x1`` plan on ``layers.MegatronPath``
  (native engine, OAR/ORS/OAG on as in the H100 records' plans), in a world of one on gloo, float32, run through
  ``GPT._run_block`` (plain, or its non-reentrant checkpoint). Where a GPU runs a different Python path, the CPU
  runs the GPU's: the ``PhaseTimer`` is made for a CUDA device (a pair of events around each span, kept for the
  iteration's ``collect``, in place of ``time.perf_counter``), its ``torch.cuda.Event`` a Python object whose
  ``record`` is empty (the driver call is not replayed: a lower bound). In float32 the layer norm's ``.float()``
  and ``.to(x.dtype)`` return their input, where bf16 on a GPU copies (ops the ledger counts, lower here). The
  timer's reset and ``zero_grad`` run once per step, untimed. Recompute exists (the path's checkpoint with
  ``Runtime.recomputing``), so its extra is measured.

The replicas run on the CPU, so what only a GPU does is left out, not estimated: the CUDA
launch (priced per kernel by ``host.launch_us``), NVTX ranges, einops' pattern handling (its
rearranges are transposes here), the CPU's 5 kB RNG state against CUDA's 16 bytes, and
``torch.tensor(0.0, device=cuda)`` as a host-to-device copy. Tensor-parallel mappings and
AxoNN's collectives are identities here, as on one GPU; the cost model counts each collective
call separately.

Prints the CPU (and GPU) it ran on (``axoplan.executor.hardware``), then the three figures of
the profile and the times behind them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import statistics
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

TOKENS, BATCH, HIDDEN, HEADS = 8, 1, 32, 4


class _Mapping(torch.autograd.Function):
    """mpu.mappings._CopyToModelParallelRegion (identity forward, all-reduce of the gradient) and
    _ReduceFromModelParallelRegion (all-reduce forward, identity backward): on one rank both are
    a Python autograd Function that passes its tensor through, which is all the host pays."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad


class _FusedLayerNorm(torch.autograd.Function):
    """apex FusedLayerNormAffineFunction: contiguous() of the three inputs, one kernel each way."""

    @staticmethod
    def forward(ctx, x, weight, bias, shape, eps):  # type: ignore[no-untyped-def]
        x_, w_, b_ = x.contiguous(), weight.contiguous(), bias.contiguous()
        out, mean, rstd = torch.native_layer_norm(x_, shape, w_, b_, eps)
        ctx.save_for_backward(x_, w_, b_, mean, rstd)
        ctx.shape = shape
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        x_, w_, b_, mean, rstd = ctx.saved_tensors
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(
            grad.contiguous(), x_, ctx.shape, mean, rstd, w_, b_, [True, True, True])
        return dx, dw, db, None, None


class _CausalSoftmax(torch.autograd.Function):
    """ScaledUpperTriangMaskedSoftmax: one fused kernel forward, one backward."""

    @staticmethod
    def forward(ctx, x, scale):  # type: ignore[no-untyped-def]
        probs = torch.softmax(x * scale, dim=-1)
        ctx.save_for_backward(probs)
        ctx.scale = scale
        return probs

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        (probs,) = ctx.saved_tensors
        return torch._softmax_backward_data(grad, probs, -1, probs.dtype) * ctx.scale, None


@torch.jit.script
def _bias_gelu(bias: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = bias + y
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


@torch.jit.script
def _bias_gelu_back(g: torch.Tensor, y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    x = bias + y
    t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    return t * 0.5 * g * ((1 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * g * (1 + t)


class _GeLU(torch.autograd.Function):
    """megatron.model.fused_bias_gelu.GeLUFunction: TorchScript forward and backward."""

    @staticmethod
    def forward(ctx, x, bias):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x, bias)
        return _bias_gelu(bias, x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        x, bias = ctx.saved_tensors
        tmp = _bias_gelu_back(grad, x, bias)
        return tmp, tmp


def _bias_dropout_add(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, prob: float,
                      training: bool) -> torch.Tensor:
    return residual + F.dropout(x + bias, p=prob, training=training)


@torch.jit.script
def _bias_dropout_add_train(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                            prob: float) -> torch.Tensor:
    return _bias_dropout_add(x, bias, residual, prob, True)


class _RngTracker:
    """mpu.random.CudaRNGStatesTracker: one named state, forked around dropout."""

    def __init__(self) -> None:
        self.state = torch.get_rng_state()

    @contextlib.contextmanager
    def fork(self) -> Iterator[None]:
        orig = torch.get_rng_state()
        torch.set_rng_state(self.state)
        try:
            yield
        finally:
            self.state = torch.get_rng_state()
            torch.set_rng_state(orig)


class _LayerNorm(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.shape = [hidden]
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.bias = torch.nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FusedLayerNorm.apply(x, self.weight, self.bias, self.shape, 1e-5)


class _ColumnParallel(torch.nn.Module):
    def __init__(self, n_in: int, n_out: int, skip_bias_add: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_out, n_in) / math.sqrt(n_in))
        self.bias = torch.nn.Parameter(torch.zeros(n_out))
        self.skip_bias_add = skip_bias_add

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        bias = None if self.skip_bias_add else self.bias
        out = F.linear(_Mapping.apply(x), self.weight, bias)
        return out, (self.bias if self.skip_bias_add else None)


class _RowParallel(torch.nn.Module):
    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_out, n_in) / math.sqrt(n_in))
        self.bias = torch.nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _Mapping.apply(F.linear(x, self.weight)), self.bias


class _ScaleMaskSoftmax(torch.nn.Module):
    """FusedScaleMaskSoftmax on the causal fused path: view to 3-D, the kernel, view back."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, sq, sk = x.size()
        probs = _CausalSoftmax.apply(x.view(-1, sq, sk), self.scale)
        return probs.view(b, n, sq, sk)


class _Attention(torch.nn.Module):
    """ParallelAttention.forward (self-attention, no KV cache), unfused."""

    def __init__(self, hidden: int, heads: int, layer_number: int, tracker: _RngTracker) -> None:
        super().__init__()
        self.qkv = _ColumnParallel(hidden, 3 * hidden, skip_bias_add=False)
        self.dense = _RowParallel(hidden, hidden)
        self.heads, self.head_dim, self.hidden = heads, hidden // heads, hidden
        self.norm_factor = math.sqrt(self.head_dim) * layer_number
        self.softmax = _ScaleMaskSoftmax(float(layer_number))
        self.dropout = torch.nn.Dropout(0.1)
        self.tracker = tracker

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mixed, _ = self.qkv(x)
        mixed = mixed.view(*mixed.size()[:-1], self.heads, 3 * self.head_dim)
        query, key, value = torch.split(mixed, mixed.size()[-1] // 3, dim=mixed.dim() - 1)
        size = (query.size(1), query.size(2), query.size(0), key.size(0))
        query = query.view(size[2], size[0] * size[1], -1)
        key = key.view(size[3], size[0] * size[1], -1)
        scores = torch.empty(size[0] * size[1], size[2], size[3], dtype=query.dtype)
        scores = torch.baddbmm(scores, query.transpose(0, 1), key.transpose(0, 1).transpose(1, 2),
                               beta=0.0, alpha=1.0 / self.norm_factor)
        probs = self.softmax(scores.view(*size))
        with self.tracker.fork():
            probs = self.dropout(probs)
        size = (value.size(1), value.size(2), query.size(0), value.size(3))
        value = value.view(value.size(0), size[0] * size[1], -1)
        probs = probs.view(size[0] * size[1], size[2], -1)
        context = torch.bmm(probs, value.transpose(0, 1)).view(*size)
        context = context.permute(2, 0, 1, 3).contiguous()
        context = context.view(*context.size()[:-2], self.hidden)
        return self.dense(context)


class _MLP(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up = _ColumnParallel(hidden, 4 * hidden, skip_bias_add=True)
        self.down = _RowParallel(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inter, bias = self.up(x)
        return self.down(_GeLU.apply(inter, bias))


class MegatronDeepSpeedBlock(torch.nn.Module):
    """ParallelTransformerLayer.forward (Megatron-DeepSpeed 066632b): LN, unfused attention,
    bias-dropout-add, LN, the two MoE placeholder scalars, MLP, bias-dropout-add."""

    def __init__(self, hidden: int, heads: int, layer_number: int, tracker: _RngTracker) -> None:
        super().__init__()
        self.input_layernorm = _LayerNorm(hidden)
        self.attention = _Attention(hidden, heads, layer_number, tracker)
        self.post_attention_layernorm = _LayerNorm(hidden)
        self.mlp = _MLP(hidden)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.input_layernorm(hidden_states)
        attn, attn_bias = self.attention(out)
        with torch.enable_grad():
            ln_input = _bias_dropout_add_train(attn, attn_bias.expand_as(hidden_states), hidden_states, 0.1)
        out = self.post_attention_layernorm(ln_input)
        moe_loss = torch.tensor(0.0, dtype=out.dtype)
        mlp_bias = torch.tensor(0.0, dtype=out.dtype)
        mlp_out, mlp_bias = self.mlp(out)
        with torch.enable_grad():
            output = _bias_dropout_add_train(mlp_out, mlp_bias.expand_as(ln_input), ln_input, 0.1)
        return output, moe_loss


class _AsyncLinear(torch.autograd.Function):
    """axonn.intra_layer.fully_connected.AsyncLinear (0.2.0): gather the weight over Z (a group of
    one here, so the weight as it is), reshape, matmul; backward: dX, dW, reshape. The
    all-reduces and reduce-scatter are the cost model's collective calls, not replayed."""

    @staticmethod
    def forward(ctx, x, weight, shape):  # type: ignore[no-untyped-def]
        full = weight.reshape(shape)
        ctx.save_for_backward(x, weight)
        ctx.shape = shape
        return x.matmul(full.t())

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        x, weight = ctx.saved_tensors
        full = weight.reshape(ctx.shape)
        grad_x = grad.matmul(full)
        grad_w = grad.reshape(-1, grad.shape[-1]).t().mm(x.view(-1, x.shape[-1])).reshape(-1)
        return grad_x, grad_w, None


class _AxonnLinear(torch.nn.Module):
    """axonn.intra_layer.Linear in expert mode with skip_bias_add, as Megatron-AxoNN builds its
    four block linears: the weight a flat shard, reshape in, AsyncLinear, reshape out."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter((torch.randn(n_out, n_in) / math.sqrt(n_in)).reshape(-1))
        self.bias = torch.nn.Parameter(torch.zeros(n_out))
        self.shape = (n_out, n_in)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = x.shape
        out = _AsyncLinear.apply(x.reshape(-1, x.shape[-1]), self.weight, self.shape)
        return out.reshape(*shape[:-1], out.shape[-1]), self.bias


class _FlashFunction(torch.autograd.Function):
    """flash-attn's FlashAttnVarlenFunc: one kernel forward, three output buffers and one kernel
    backward. A single element-wise op stands in for each kernel (the host cost is the point)."""

    @staticmethod
    def forward(ctx, q, k, v):  # type: ignore[no-untyped-def]
        q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))
        out = torch.addcmul(q, k, v)
        ctx.save_for_backward(q, k, v, out)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        q, k, v, _ = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dq.copy_(grad)
        torch.mul(grad, v, out=dk)
        torch.mul(grad, k, out=dv)
        return dq, dk, dv


class _FlashSelfAttention(torch.nn.Module):
    """megatron FlashSelfAttention.forward, causal, training: flatten batch and sequence, the
    cumulative sequence offsets, the flash call, unflatten."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert all(t.dtype == q.dtype for t in (q, k, v))
        b, sq = q.shape[0], q.shape[1]
        q, k, v = (t.reshape(b * sq, *t.shape[2:]) for t in (q, k, v))
        torch.arange(0, (b + 1) * sq, step=sq, dtype=torch.int32)  # cu_seqlens
        out = _FlashFunction.apply(q, k, v)
        return out.reshape(b, sq, *out.shape[1:])


class _AxonnAttention(torch.nn.Module):
    """Megatron-AxoNN ParallelAttention.forward, flash path, no rotary, no GQA (the KV repeat of
    factor 1 still runs), einops rearranges as transposes (einops' own parsing is left out)."""

    def __init__(self, hidden: int, heads: int, tracker: _RngTracker) -> None:
        super().__init__()
        self.qkv = _AxonnLinear(hidden, 3 * hidden)
        self.dense = _AxonnLinear(hidden, hidden)
        self.core = _FlashSelfAttention()
        self.heads, self.head_dim = heads, hidden // heads
        self.tracker = tracker

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mixed, _ = self.qkv(x)  # Megatron-AxoNN drops the QKV bias
        mixed = mixed.view(*mixed.size()[:-1], self.heads, 3 * self.head_dim)
        query, key, value = torch.split(mixed, self.head_dim, dim=3)
        query = query.view(query.size(0), query.size(1), -1, self.head_dim)
        key, value = key.repeat_interleave(1, dim=2), value.repeat_interleave(1, dim=2)
        query, key, value = (t.transpose(0, 1).contiguous() for t in (query, key, value))
        with self.tracker.fork():
            context = self.core(query, key, value)
        context = context.transpose(0, 1).contiguous()
        context = context.view(*context.shape[:2], -1)
        return self.dense(context)


class _AxonnMLP(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up = _AxonnLinear(hidden, 4 * hidden)
        self.down = _AxonnLinear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inter, bias = self.up(x)
        return self.down(_GeLU.apply(inter, bias))


def _make_viewless(t: torch.Tensor) -> torch.Tensor:
    """megatron.core.utils.make_viewless_tensor: the tensor itself unless it is a view."""
    return t if t._base is None else t.detach().clone()


class MegatronAxonnBlock(torch.nn.Module):
    """Megatron-AxoNN ParallelTransformerLayer.forward (axonn-ai/Megatron-AxoNN f6df7ae, a middle
    layer): LN, flash attention with AxoNN's linears, bias-dropout-add, LN, MLP,
    bias-dropout-add, make_viewless_tensor. NVTX ranges are left out (no CUDA here)."""

    def __init__(self, hidden: int, heads: int, layer_number: int, tracker: _RngTracker) -> None:
        super().__init__()
        self.input_norm = _LayerNorm(hidden)
        self.self_attention = _AxonnAttention(hidden, heads, tracker)
        self.post_attention_norm = _LayerNorm(hidden)
        self.mlp = _AxonnMLP(hidden)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor]:
        out = self.input_norm(hidden_states)
        attn, attn_bias = self.self_attention(out)
        with contextlib.nullcontext():
            norm_input = _bias_dropout_add_train(attn, attn_bias.expand_as(hidden_states), hidden_states, 0.1)
        out = self.post_attention_norm(norm_input)
        mlp_out, mlp_bias = self.mlp(out)
        with contextlib.nullcontext():
            output = _bias_dropout_add_train(mlp_out, mlp_bias.expand_as(norm_input), norm_input, 0.1)
        return (_make_viewless(output),)


BLOCKS: dict[str, type[torch.nn.Module]] = {"megatron-deepspeed": MegatronDeepSpeedBlock, "axonn": MegatronAxonnBlock}
"""Replayed blocks by framework profile name (frameworks/<name>.yaml)."""


class _Checkpoint(torch.autograd.Function):
    """mpu.random.CheckpointFunction: save RNG states, run without grad; in backward restore
    them, recompute with grad, backward through the recomputation, put the states back."""

    @staticmethod
    def forward(ctx, run, tracker, *args):  # type: ignore[no-untyped-def]
        ctx.run, ctx.tracker = run, tracker
        ctx.cpu_state, ctx.device_state, ctx.tracker_state = torch.get_rng_state(), torch.get_rng_state(), tracker.state
        with torch.no_grad():
            outputs = run(*args)
        ctx.save_for_backward(*args)
        return outputs

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[no-untyped-def]
        inputs = ctx.saved_tensors
        cpu_state, device_state, tracker_state = torch.get_rng_state(), torch.get_rng_state(), ctx.tracker.state
        torch.set_rng_state(ctx.cpu_state)
        torch.set_rng_state(ctx.device_state)
        ctx.tracker.state = ctx.tracker_state
        detached = []
        for inp in inputs:
            d = inp.detach()
            d.requires_grad = inp.requires_grad
            detached.append(d)
        with torch.enable_grad():
            outputs = ctx.run(*detached)
        outputs = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
        torch.set_rng_state(cpu_state)
        torch.set_rng_state(device_state)
        ctx.tracker.state = tracker_state
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None, *(d.grad for d in detached))


@dataclass(frozen=True)
class Stack:
    """`layers` replica blocks and their input, run plain or checkpointed per block."""

    blocks: tuple[torch.nn.Module, ...]
    tracker: _RngTracker
    x: torch.Tensor

    @classmethod
    def build(cls, layers: int, seed: int = 0, framework: str = "megatron-deepspeed") -> Stack:
        torch.manual_seed(seed)
        tracker = _RngTracker()
        blocks = tuple(BLOCKS[framework](HIDDEN, HEADS, i + 1, tracker) for i in range(layers))
        return cls(blocks, tracker, torch.randn(TOKENS, BATCH, HIDDEN, requires_grad=True))

    def forward(self, checkpointed: bool) -> torch.Tensor:
        """The blocks return the hidden state first (Megatron-DeepSpeed adds its MoE loss)."""
        x = self.x
        for block in self.blocks:
            x = (_Checkpoint.apply(block, self.tracker, x) if checkpointed else block(x))[0]
        return x

    def step(self, checkpointed: bool) -> None:
        self.forward(checkpointed).sum().backward()


class _ApexLayerNormFunction(torch.autograd.Function):
    """apex's ``FusedLayerNormAffineFunction`` (``apex/normalization/fused_layer_norm.py``) as megatron-core's
    ``FusedLayerNorm`` calls it: its Python (contiguous() of the three inputs, the context's fields, the saved
    tensors), with ``fused_layer_norm_cuda.forward_affine`` and ``backward_affine`` (one extension call each) as one
    aten call each: ``native_layer_norm``, which also returns the output, mean and inverse deviation."""

    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps, memory_efficient=False):  # type: ignore[no-untyped-def]  # noqa: A002
        ctx.normalized_shape, ctx.eps, ctx.memory_efficient = normalized_shape, eps, memory_efficient
        input_, weight_, bias_ = input.contiguous(), weight.contiguous(), bias.contiguous()
        output, mean, invvar = torch.native_layer_norm(input_, ctx.normalized_shape, weight_, bias_, ctx.eps)
        ctx.save_for_backward(input_, weight_, bias_, mean, invvar)
        return output

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[no-untyped-def]
        input_, weight_, bias_, mean, invvar = ctx.saved_tensors
        grad_input, grad_weight, grad_bias = torch.ops.aten.native_layer_norm_backward(
            grad_output.contiguous(), input_, ctx.normalized_shape, mean, invvar, weight_, bias_, [True, True, True])
        return grad_input, grad_weight, grad_bias, None, None, None


def _one_op_bias_gelu(bias: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``fused_bias_gelu.bias_gelu`` (``torch.compile``'d: one kernel on a GPU) as one op of its output's shape."""
    return torch.add(bias, y)


def _one_op_bias_gelu_back(g: torch.Tensor, bias: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``fused_bias_gelu.bias_gelu_back`` (``torch.compile``'d) as one op of its output's shape."""
    return torch.mul(g, y)


class _OneOpBiasDropoutAdd(torch.autograd.Function):
    """The compiled ``bias_dropout_add_fused_train`` (AOTAutograd's autograd Function around one kernel each way):
    one op forward, one op backward; autograd sums the bias's gradient to its shape."""

    @staticmethod
    def forward(ctx, x, bias, residual):  # type: ignore[no-untyped-def]
        return torch.add(x, residual)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        dx = torch.mul(grad, 0.9)
        return dx, dx, grad


def _one_op_bias_dropout_add_train(x_with_bias: tuple[torch.Tensor, torch.Tensor | None], residual: torch.Tensor,
                                   prob: float) -> torch.Tensor:
    """Stands for ``fusions/fused_bias_dropout.py`` ``bias_dropout_add_fused_train`` (the GPT block's biases)."""
    x, bias = x_with_bias
    assert bias is not None, "the GPT block's row-parallel linears return their bias (skip_bias_add)"
    return _OneOpBiasDropoutAdd.apply(x, bias, residual)


class _OneOpFlash(torch.autograd.Function):
    """Flash attention's kernel call (TransformerEngine's ``TEDotProductAttention`` on a GPU): one op forward, the
    (S, B, heads·head) output; one op backward, the gradient seen as each of q, k and v."""

    @staticmethod
    def forward(ctx, q, k, v):  # type: ignore[no-untyped-def]
        ctx.shape = q.shape
        return q.new_zeros((*q.shape[:2], q.shape[2] * q.shape[3]))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        g = grad.view(ctx.shape)
        return g, g, g


class _OneOpCoreAttention(torch.nn.Module):
    """In place of the local spec's ``DotProductAttention`` (unfused, a CUDA causal mask), as in
    ``benchmarks/tracing/megatron.py``; TransformerEngine's own Python around its kernel is not replayed."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *_: object,
                **__: object) -> torch.Tensor:
        return _OneOpFlash.apply(query, key, value)


def _one_op_wgrad(total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor) -> None:
    """apex's ``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32`` (one extension call that accumulates the
    weight's gradient into the fp32 ``main_grad``): one in-place op on ``main_grad``."""
    main_grad.add_(0.0)


@contextlib.contextmanager
def _megatron_core_on_cpu(layers: int) -> Iterator[None]:
    """``benchmarks/tracing/megatron.py``'s ``cpu_world`` (a world of one on gloo, ``torch.cuda.current_device``, the
    reduce-scatter), then the host stand-ins of this module for the fused calls, megatron-core's ``FusedLayerNorm``
    (the local spec's norm where apex is installed, ``models/backends.py`` ``LNImpl``), the CUDA RNG state as the
    CPU's (``tensor_parallel/random.py``; the checkpoint saves and restores it), and the builder's
    ``TransformerConfig`` with `layers` layers and Megatron-LM's full recompute (``--recompute-granularity full
    --recompute-method uniform --recompute-num-layers 1``)."""
    from unittest import mock

    import megatron.core.fusions.fused_bias_dropout as bda
    import megatron.core.fusions.fused_bias_gelu as gelu
    import megatron.core.fusions.fused_layer_norm as fln
    import megatron.core.models.backends as backends
    import megatron.core.tensor_parallel.layers as tp_layers
    import megatron.core.tensor_parallel.random as tp_random
    import megatron.core.transformer.mlp as mlp
    import megatron.core.transformer.transformer_config as tc

    tracing = _tracing_megatron()
    real_config = tc.TransformerConfig
    wgrad = types.SimpleNamespace(wgrad_gemm_accum_fp32=_one_op_wgrad)

    def config(**kwargs: object) -> object:
        return real_config(**{**kwargs, "num_layers": layers, "recompute_granularity": "full",
                              "recompute_method": "uniform", "recompute_num_layers": 1})

    with tracing.cpu_world(), contextlib.ExitStack() as stack:
        for target, name, value in (
                (tc, "TransformerConfig", config),
                (backends, "LNImpl", fln.FusedLayerNorm),
                (fln, "HAVE_FUSED_LAYER_NORM", True),
                (fln, "FusedLayerNormAffineFunction", _ApexLayerNormFunction),
                (gelu, "bias_gelu", _one_op_bias_gelu),
                (gelu, "bias_gelu_back", _one_op_bias_gelu_back),
                (mlp, "bias_gelu_impl", gelu.bias_gelu_impl),
                (bda, "bias_dropout_add_fused_train", _one_op_bias_dropout_add_train),
                (tp_layers, "fused_weight_gradient_mlp_cuda", wgrad),
                (tp_random, "_get_cuda_rng_state", lambda *_, **__: torch.get_rng_state()),
                (tp_random, "_set_cuda_rng_state", lambda state, *_, **__: torch.set_rng_state(state))):
            stack.enter_context(mock.patch.object(target, name, value, create=True))
        yield


def _tracing_megatron() -> types.ModuleType:
    """``benchmarks/tracing/megatron.py``, imported as the package or from this script's folder."""
    if __package__:
        from .tracing import megatron
    else:  # run as a script: its folder, benchmarks/, is sys.path[0]
        from tracing import megatron  # type: ignore[no-redef]
    return megatron


@dataclass
class MegatronCoreStack:
    """megatron-core 0.16.1's own ``TransformerBlock`` of `layers` GPT ``TransformerLayer``s (the decoder of the
    ``GPTModel`` that ``benchmarks/tracing/megatron.py``'s ``build_megatron`` builds, inside its
    ``DistributedDataParallel``), without its final norm; plain, or with the full recompute of its config. Runs and
    is timed inside :func:`_megatron_core_on_cpu`."""

    ddp: torch.nn.Module
    decoder: torch.nn.Module
    x: torch.Tensor

    @classmethod
    def build(cls, layers: int, seed: int = 0) -> MegatronCoreStack:
        tracing = _tracing_megatron()
        torch.manual_seed(seed)
        ddp = tracing.build_megatron("gpt2", {"H": HIDDEN, "NH": HEADS, "F": 4 * HIDDEN, "V": 64, "S": TOKENS})
        for dropout in [m for m in ddp.modules() if isinstance(m, torch.nn.Dropout)]:
            dropout.forward = tracing._native_dropout(dropout)  # type: ignore[method-assign]
        decoder = ddp.module.decoder
        for layer in decoder.layers:
            layer.self_attention.core_attention = _OneOpCoreAttention()
        decoder.final_layernorm = None
        x = torch.randn(TOKENS, BATCH, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
        return cls(ddp, decoder, x)

    def forward(self, checkpointed: bool) -> torch.Tensor:
        self.decoder.config.recompute_granularity = "full" if checkpointed else None
        return self.decoder(hidden_states=self.x, attention_mask=None)

    def step(self, checkpointed: bool) -> None:
        self.forward(checkpointed).sum().backward()


class _HostEvent:
    """``torch.cuda.Event`` as the executor's ``PhaseTimer`` uses it on a GPU (``axoplan/executor/timing.py``): made
    and recorded around every span. ``cudaEventRecord`` itself (a driver call, no aten op) is not replayed: an empty
    method stands for it, so the timer's part is a lower bound."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: object = None) -> None:
        """The driver call, not replayed (class docstring)."""


@contextlib.contextmanager
def _executor_on_cpu() -> Iterator[None]:
    """A world of one on gloo (as ``axoplan run`` starts a ``1x1x1x1`` plan on the CPU), and the GPU run's Python
    path for the executor's phase timing: ``build_model``'s ``PhaseTimer`` made for a CUDA device (a pair of events
    per span, kept for the iteration's ``collect``, not ``time.perf_counter``), its events :class:`_HostEvent`."""
    from unittest import mock

    import torch.distributed as dist

    import axoplan.executor.train as train
    from axoplan.executor.timing import PhaseTimer

    def gpu_timer(device: torch.device, enabled: bool = True) -> PhaseTimer:
        return PhaseTimer(torch.device("cuda"), enabled)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with mock.patch.object(train, "PhaseTimer", gpu_timer), mock.patch.object(torch.cuda, "Event", _HostEvent):
            yield
    finally:
        dist.destroy_process_group()


@dataclass
class ExecutorStack:
    """axoplan's own executor (``frameworks/axoplan-executor.yaml``): the ``GPT`` of ``layers.MegatronPath`` that
    ``axoplan.executor.train.build_model`` builds for a ``1x1x1x1`` plan (native engine; OAR, ORS and OAG on, as in
    the plans of data/measured/gpu-h100-h200/axoplan-measure-gpu-h100/runs.jsonl, so the backward takes the
    dW-first branch of ``_Linear4DFn``; float32 on the CPU), of which only the blocks run, through
    ``GPT._run_block`` (plain, or the path's non-reentrant checkpoint with ``Runtime.recomputing``), each linear a
    ``Linear`` around a ``Linear4D`` (``_Linear4DFn``, the weight gatherer, the timer's ``gemm`` span, the identity
    collectives of groups of one). Runs and is timed inside :func:`_executor_on_cpu`."""

    model: Any  # axoplan.executor.model.GPT
    rt: Any  # axoplan.executor.linear4d.Runtime
    x: torch.Tensor

    @classmethod
    def build(cls, layers: int, seed: int = 0) -> ExecutorStack:
        from axoplan.executor.spec import ExecSettings
        from axoplan.executor.train import build_model
        from axoplan.inputs.model import ModelSpec
        from axoplan.inputs.options import RunOptions
        from axoplan.records.plan import LaunchConfig
        from axoplan.space.layout import Layout

        spec = ModelSpec(name="replay", num_layers=layers, hidden=HIDDEN, num_heads=HEADS, vocab=64,
                         max_positions=TOKENS)
        options = RunOptions(global_batch=BATCH, seq_len=TOKENS, micro_batches=(BATCH,), overlap_all_reduce=True,
                             overlap_reduce_scatter=True, overlap_all_gather=True)  # as the H100 records' plans
        plan = LaunchConfig.build(machine="local-cpu", devices_per_node=1, model=spec, options=options,
                                  layout=Layout(1, 1, 1, 1), micro_batch=BATCH, recompute=False, cache_weights=False)
        settings = ExecSettings(device="cpu", dtype="float32", seed=seed)
        model, rt = build_model(plan, settings, torch.device("cpu"))
        torch.manual_seed(seed)
        return cls(model, rt, torch.randn(BATCH * TOKENS, HIDDEN, requires_grad=True))

    def forward(self, checkpointed: bool) -> torch.Tensor:
        """The blocks as ``GPT.forward`` runs them, on the forward's phase (``train._step``)."""
        model = self.model
        model.path.recompute = "checkpoint" if checkpointed else "off"
        self.rt.phase = "forward"
        h = self.x
        for block in model.blocks:
            h = model._run_block(block, h, BATCH, TOKENS)
        return h

    def step(self, checkpointed: bool) -> None:
        self.forward(checkpointed).sum().backward()

    def before_step(self) -> None:
        """Once per iteration in ``train.run_rank``/``_step``, untimed here: the timer's reset (its events) and the
        optimizer's ``zero_grad`` (gradients set to None, so the backward's first accumulation is no add)."""
        self.rt.timer.reset()
        for p in self.model.parameters():
            p.grad = None
        self.x.grad = None


def _per_call_us(fn: Callable[[], object], repeats: int, before: Callable[[], object] | None = None) -> float:
    """Median microseconds of `fn` after a warm-up (TorchScript specialises on the first calls); `before`, where
    given, runs ahead of each call untimed (what a training step does once per step, not per block)."""
    for _ in range(5):
        if before is not None:
            before()
        fn()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


@dataclass(frozen=True)
class Replay:
    """Host microseconds per block and micro-batch, and the probe's op on the same core."""

    op_us: float
    forward_us: float  # with autograd recording (a plain forward, or the recompute)
    plain_step_us: float  # forward + backward, no checkpointing
    checkpointed_step_us: float  # forward without grad + recompute + backward + the checkpoint's bookkeeping

    @property
    def backward_us(self) -> float:
        return self.plain_step_us - self.forward_us

    @property
    def recompute_extra_us(self) -> float:
        """What checkpointing adds beyond a second forward (negative: its no-grad forward is cheaper)."""
        return self.checkpointed_step_us - self.plain_step_us - self.forward_us

    def op_equivalents(self, us: float) -> int:
        return round(us / self.op_us)


MEGATRON_CORE = "megatron-core"
"""megatron-core's own block (:class:`MegatronCoreStack`), beside the replicas of :data:`BLOCKS`."""
EXECUTOR = "axoplan-executor"
"""axoplan's own executor's block (:class:`ExecutorStack`), its own code."""
OWN_CODE = (MEGATRON_CORE, EXECUTOR)
"""The frameworks replayed from their own code, whose figures are a ledger profile's ``host_replay``."""


def _stack(framework: str, layers: int) -> Stack | MegatronCoreStack | ExecutorStack:
    if framework == MEGATRON_CORE:
        return MegatronCoreStack.build(layers)
    if framework == EXECUTOR:
        return ExecutorStack.build(layers)
    return Stack.build(layers, framework=framework)


def _on_cpu(framework: str, layers: int) -> contextlib.AbstractContextManager[None]:
    if framework == MEGATRON_CORE:
        return _megatron_core_on_cpu(layers)
    if framework == EXECUTOR:
        return _executor_on_cpu()
    return contextlib.nullcontext()


def measure(layers: int, repeats: int, rounds: int = 5, framework: str = "megatron-deepspeed") -> Replay:
    """Time the block on this core (one thread) with the probe's chain beside it: `rounds`
    rounds of all four, each figure the median over rounds, so drift in the core's speed
    (a shared or virtual machine) moves the op and the block alike."""
    from axoplan.executor.probe import host_op_us_measured

    torch.set_num_threads(1)
    torch._C._jit_set_profiling_mode(False)  # as megatron/model/transformer.py sets at import
    torch._C._jit_set_profiling_executor(False)
    cpu = torch.device("cpu")
    samples: list[tuple[float, float, float, float]] = []
    with _on_cpu(framework, layers):
        stack = _stack(framework, layers)
        before = getattr(stack, "before_step", None)
        for _ in range(rounds):
            samples.append((
                host_op_us_measured(cpu, torch.float32, repeats),
                _per_call_us(lambda: stack.forward(False), repeats, before) / layers,
                _per_call_us(lambda: stack.step(False), repeats, before) / layers,
                _per_call_us(lambda: stack.step(True), repeats, before) / layers,
            ))
    op, fwd, plain, ckpt = (statistics.median(column) for column in zip(*samples, strict=True))
    return Replay(op, fwd, plain, ckpt)


def _refuse_without_megatron_core() -> None:
    if importlib.util.find_spec("megatron") is None:
        raise SystemExit("--framework megatron-core replays megatron-core's own code, which is not installed here: "
                         "install megatron-core==0.16.1 (without TransformerEngine or apex, which need CUDA)")


def _print_profile(framework: str, r: Replay) -> None:
    """The figures as the framework's profile takes them: a counted profile's ``block`` host ops (whole
    op-equivalents), or a ledger profile's ``host_replay`` (frameworks/megatron-lm.yaml)."""
    if framework in OWN_CODE:
        print(f"op-equivalents (frameworks/{'megatron-lm' if framework == MEGATRON_CORE else framework}.yaml):")
        print("  host_replay:")
        print(f"    forward: {r.forward_us / r.op_us:.1f}")
        print(f"    backward: {r.backward_us / r.op_us:.1f}")
        print(f"    recompute_extra: {r.recompute_extra_us / r.op_us:.1f}")
        return
    print(f"op-equivalents (frameworks/{framework}.yaml):")
    print(f"  block.forward.host_ops: {r.op_equivalents(r.forward_us)}")
    print(f"  block.backward.host_ops: {r.op_equivalents(r.backward_us)}")
    print(f"  block.recompute_extra_host_ops: {r.op_equivalents(r.recompute_extra_us)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--framework", choices=[*sorted(BLOCKS), *OWN_CODE], default="megatron-deepspeed")
    args = parser.parse_args()
    if args.framework == MEGATRON_CORE:
        _refuse_without_megatron_core()
    from axoplan.executor.hardware import environment, summary_lines

    print("\n".join(summary_lines(environment())))  # the core the times below belong to
    r = measure(args.layers, args.repeats, args.rounds, args.framework)
    print(f"probe op on this core:      {r.op_us:8.2f} us")
    print(f"block forward (grad on):    {r.forward_us:8.1f} us")
    print(f"block backward:             {r.backward_us:8.1f} us")
    print(f"block step, plain:          {r.plain_step_us:8.1f} us")
    print(f"block step, checkpointed:   {r.checkpointed_step_us:8.1f} us")
    print(f"checkpoint beyond 2nd fwd:  {r.recompute_extra_us:8.1f} us")
    _print_profile(args.framework, r)


if __name__ == "__main__":
    main()
