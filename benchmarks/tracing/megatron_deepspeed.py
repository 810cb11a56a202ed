"""The ledger tracer's Megatron-DeepSpeed step (``benchmarks/derive_ledger.py --framework megatron-deepspeed --family
gpt2 --precision bf16``): the GPT that Megatron-DeepSpeed trains in vTrain's A100 runs (microsoft/Megatron-DeepSpeed
at 066632b: ``megatron/model/transformer.py`` ``ParallelTransformerLayer``, ``ParallelAttention`` on its unfused
path, ``ParallelMLP``; ``megatron/mpu/layers.py``, ``mappings.py``, ``random.py``; ``megatron/model/fused_softmax.py``
``FusedScaleMaskSoftmax``; ``gpt_model.py``, ``language_model.py``; ``pretrain_gpt.py``) under DeepSpeed's ZeRO
stage 1 (``deepspeed/runtime/zero/stage_1_and_2.py``), rebuilt op by op on one rank with every tensor-parallel group
of one. Megatron-DeepSpeed is not a package and needs apex and DeepSpeed's CUDA extensions, so its modules cannot be
imported: the module structure is ``benchmarks/host_replay.py``'s replica of the same layer
(``MegatronDeepSpeedBlock``, which times its Python), and every kernel a GPU runs is the op it runs here:

* apex's fused LayerNorm, the TorchScript bias-GeLU and bias-dropout-add: ``tracing.megatron``'s stand-ins, one op
  each way (as in the Megatron-AxoNN trace);
* the unfused attention core as Megatron's code runs it, in plain torch: the scores by ``torch.baddbmm`` into an
  uninitialised buffer (``beta=0``, ``alpha = 1/norm_factor``, ``apply_query_key_layer_scaling``: the layer number in
  both the norm factor and the softmax's scale), the context by ``torch.bmm``, the ``permute(2, 0, 1, 3)
  .contiguous()`` back to ``[s, b, h]``; autograd's backward of ``baddbmm`` (two ``bmm`` and their scaling by
  ``alpha``) and of ``bmm`` (two ``bmm``) as on a GPU;
* ``FusedScaleMaskSoftmax`` on its causal kernel (``scaled_upper_triang_masked_softmax_cuda``, which it takes for
  16-bit scores with ``16 < sk <= 2048``): one op each way, ``softmax.upper_triang`` (reads the scores, writes the
  probabilities, 16-bit) and ``softmax_backward_data.upper_triang`` (reads the gradient and the probabilities,
  writes the input's gradient). The kernel reads only the causal part of each row (row ``i``: its first ``i + 1``
  scores; ``scaled_upper_triang_masked_softmax_warp_forward`` and ``_backward`` load ``element_index <
  local_seq``, ``local_seq = blockIdx.x + 1``) and writes every score (the masked ones as zeros forward), so its
  reads are recorded as half its inputs (``S(S+1)/2`` of ``S²``, within ``1/S``: :func:`_reads_causal_half`)
  [code Megatron csrc/megatron/scaled_upper_triang_masked_softmax.h];
* the attention dropout under the RNG tracker's fork (host work only, ``host_replay``) and the hidden dropouts:
  CUDA's ``native_dropout`` (``tracing.megatron._native_dropout``);
* Megatron's ``ColumnParallelLinear`` (the QKV's bias added by ``F.linear``; the MLP's up projection with
  ``skip_bias_add``, its bias to the bias-GeLU) and ``RowParallelLinear`` (``skip_bias_add``: the bias to the
  bias-dropout-add): ``F.linear`` forward, its input's and weight's gradient GEMMs and the bias's sum backward, the
  weight gradient accumulated into the 16-bit ``.grad`` by autograd (the traced micro-batch adds into the gradients
  the one before it left: gradient accumulation, as DeepSpeed's engine runs it between optimizer steps);
* the two MoE placeholders ``ParallelTransformerLayer.forward`` makes, ``torch.tensor(0.0, device=...)`` (a
  host-to-device copy each on a GPU): one one-element copy each here;
* the embedding, final LayerNorm, tied logits and ``vocab_parallel_cross_entropy`` on the fp32 logits and
  ``pretrain_gpt.py``'s ``loss_func``: Megatron-AxoNN's GPT of the same lineage (``tracing.megatron_axonn.AxonnGPT``,
  ``_loss``) with this block;
* the optimizer: DeepSpeed ZeRO stage 1 without ``overlap_comm`` (``stage_1_and_2.py``: no gradient hooks; at the
  step every gradient is copied into the contiguous bucket and divided by the data-parallel size before its
  reduction, every rank over every parameter); on the rank's ``1/d`` partition: the partition flattened to fp32,
  the overflow check (``float(x.float().sum())``: a host sync), the gradient norm (one pass, read back), the
  unscale-and-clip multiplication, Adam on the fp32 partition (apex ``FusedAdam``: torch's ``_fused_adamw_`` stands
  in) and the fp32 partition copied into the 16-bit parameters; the gradients dropped (``set_to_none``).

Left out, as in the other traces: collectives (priced by the cost model: the tensor-parallel all-reduces, the
gradient reduction, the partitions' all-gather), the RNG tracker's state save and restore and the checkpoint's
bookkeeping (host work: ``host_replay``). The block is traced without its checkpoint (the cost model reruns its
forward under ``--recompute``, as ``mpu.checkpoint`` does). vTrain's runs were 16-bit (fp16 or bf16: the same bytes);
the trace runs bf16.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from .megatron import _BiasDropoutAdd, _BiasGeLU, _native_dropout
from .megatron_axonn import AxonnGPT, _LayerNorm, _loss, gpt_batch, record_step
from .recorder import Recorder

DROPOUT = 0.1
"""Megatron's ``--hidden-dropout`` and ``--attention-dropout`` defaults."""

LAYER_NUMBER = 1
"""The traced block's ``layer_number`` (``apply_query_key_layer_scaling``: it scales the scores down and the softmax
back up; its value changes no op)."""

_LIBS: list[Any] = []


@cache
def _softmax_library() -> Any:
    """``scaled_upper_triang_masked_softmax_cuda`` as two stand-in ops (``torch.ops.axoplan_trace``): forward reads the
    16-bit scores and writes the probabilities; backward reads the gradient and the probabilities and writes the
    scores' gradient (in place of the gradient on the GPU: the same bytes)."""
    lib = torch.library.Library("axoplan_trace", "FRAGMENT")
    lib.define("softmax.upper_triang(Tensor x, float scale) -> Tensor")
    lib.define("softmax_backward_data.upper_triang(Tensor dy, Tensor probs, float scale) -> Tensor")
    lib.impl("softmax.upper_triang", _causal_softmax, "CPU")
    lib.impl("softmax_backward_data.upper_triang", _causal_softmax_backward, "CPU")
    _LIBS.append(lib)
    return torch.ops.axoplan_trace


def _causal_softmax(x: torch.Tensor, scale: float) -> torch.Tensor:
    causal = torch.ones(x.shape[-2], x.shape[-1], dtype=torch.bool).tril()
    return torch.softmax((x.float() * scale).masked_fill(~causal, float("-inf")), -1).to(x.dtype)


def _causal_softmax_backward(dy: torch.Tensor, probs: torch.Tensor, scale: float) -> torch.Tensor:
    p, g = probs.float(), dy.float()
    return (scale * p * (g - (g * p).sum(-1, keepdim=True))).to(dy.dtype)


def _reads_causal_half(recording: list[Recorder]) -> None:
    """The op just recorded (the causal softmax's, forward or backward) reads half its inputs' elements: the causal
    part of each row (the module docstring)."""
    if recording:
        rec = recording[0]
        entry = rec.ops[rec.scope][-1]
        assert entry["op"].startswith("softmax"), entry["op"]
        entry["in"] = [(n // 2, size) for n, size in entry["in"]]


class _ScaledUpperTriangSoftmax(torch.autograd.Function):
    """``ScaledUpperTriangMaskedSoftmax``: one kernel forward, one backward; saves the probabilities."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float, recording: list[Recorder]) -> torch.Tensor:
        probs = _softmax_library().softmax.upper_triang(x, scale)
        _reads_causal_half(recording)
        ctx.save_for_backward(probs)
        ctx.scale, ctx.recording = scale, recording
        return probs

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (probs,) = ctx.saved_tensors
        grad = _softmax_library().softmax_backward_data.upper_triang(dy, probs, ctx.scale)
        _reads_causal_half(ctx.recording)
        return grad, None, None


class _Linear(torch.nn.Module):
    """Megatron's ``ColumnParallelLinear``/``RowParallelLinear`` on one rank: ``F.linear`` with the bias inside, or
    returned (``skip_bias_add``)."""

    def __init__(self, n_in: int, n_out: int, skip_bias_add: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_out, n_in) / math.sqrt(n_in))
        self.bias = torch.nn.Parameter(torch.zeros(n_out))
        self.skip_bias_add = skip_bias_add

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.skip_bias_add:
            return F.linear(x, self.weight), self.bias
        return F.linear(x, self.weight, self.bias), None


class _Attention(torch.nn.Module):
    """``ParallelAttention.forward`` (self-attention, causal, no KV cache) on its unfused path, as
    ``host_replay._Attention`` replays it: the QKV output viewed per head, split, the scores by ``baddbmm``, the fused
    causal softmax, dropout, the context by ``bmm``, back to ``[s, b, h]``, the output projection."""

    def __init__(self, hidden: int, heads: int, recording: list[Recorder]) -> None:
        super().__init__()
        self.heads, self.head_dim, self.hidden = heads, hidden // heads, hidden
        self.recording = recording
        self.query_key_value = _Linear(hidden, 3 * hidden, skip_bias_add=False)
        self.dense = _Linear(hidden, hidden, skip_bias_add=True)
        self.norm_factor = math.sqrt(self.head_dim) * LAYER_NUMBER
        self.attention_dropout = torch.nn.Dropout(DROPOUT)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        mixed, _ = self.query_key_value(x)
        mixed = mixed.view(*mixed.size()[:-1], self.heads, 3 * self.head_dim)
        query, key, value = torch.split(mixed, self.head_dim, dim=3)
        b, n, sq, sk = query.size(1), query.size(2), query.size(0), key.size(0)
        query = query.reshape(sq, b * n, -1)  # a view of the strided split on a GPU too (Megatron's .view)
        key = key.reshape(sk, b * n, -1)
        buffer = torch.empty(b * n, sq, sk, dtype=query.dtype)
        scores = torch.baddbmm(buffer, query.transpose(0, 1), key.transpose(0, 1).transpose(1, 2), beta=0.0,
                               alpha=1.0 / self.norm_factor)
        probs = _ScaledUpperTriangSoftmax.apply(scores, float(LAYER_NUMBER), self.recording).view(b, n, sq, sk)
        probs = self.attention_dropout(probs)
        value = value.reshape(sk, b * n, -1)
        context = torch.bmm(probs.view(b * n, sq, sk), value.transpose(0, 1)).view(b, n, sq, self.head_dim)
        context = context.permute(2, 0, 1, 3).contiguous()
        return self.dense(context.view(sq, b, self.hidden))


class _MLP(torch.nn.Module):
    """``ParallelMLP.forward`` with ``bias_gelu_fusion``: the up projection's bias to the fused bias-GeLU."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.dense_h_to_4h = _Linear(hidden, ffn, skip_bias_add=True)
        self.dense_4h_to_h = _Linear(ffn, hidden, skip_bias_add=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        inter, bias = self.dense_h_to_4h(x)
        return self.dense_4h_to_h(_BiasGeLU.apply(inter, bias))


class DeepSpeedBlock(torch.nn.Module):
    """``ParallelTransformerLayer.forward`` (066632b): LayerNorm, unfused attention, bias-dropout-add, LayerNorm, the
    two MoE placeholder scalars, MLP, bias-dropout-add."""

    def __init__(self, dims: dict[str, int], recording: list[Recorder]) -> None:
        super().__init__()
        hidden = dims["H"]
        self.input_layernorm = _LayerNorm(hidden)
        self.self_attention = _Attention(hidden, dims["NH"], recording)
        self.post_attention_layernorm = _LayerNorm(hidden)
        self.mlp = _MLP(hidden, dims["F"])

    def forward(self, hidden_states: torch.Tensor, freqs: torch.Tensor | None = None) -> torch.Tensor:
        attn, attn_bias = self.self_attention(self.input_layernorm(hidden_states))
        assert attn_bias is not None
        ln_input = _BiasDropoutAdd.apply(attn, attn_bias.expand_as(hidden_states), hidden_states, DROPOUT)
        out = self.post_attention_layernorm(ln_input)
        for _ in range(2):  # moe_loss and mlp_bias placeholders: torch.tensor(0.0, device=cuda), a copy to the device
            torch.tensor(0.0).to(out.dtype)
        mlp_out, mlp_bias = self.mlp(out)
        assert mlp_bias is not None
        return _BiasDropoutAdd.apply(mlp_out, mlp_bias.expand_as(ln_input), ln_input, DROPOUT)


def _zero1_step(params: list[torch.nn.Parameter], master: torch.Tensor, states: dict[str, list[torch.Tensor]],
                rec: Recorder | None) -> None:
    """DeepSpeed ZeRO stage 1's step (the module docstring). The ops on every parameter are recorded in the scope
    ``step``, those on the rank's partition (here all of it: one rank) in ``step_shard``."""
    def scope(name: str) -> None:
        if rec is not None:
            rec.scope = name
    scope("step")
    bucket = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype)
    for piece, p in zip(torch.split(bucket, [p.numel() for p in params]), params, strict=True):
        piece.copy_(p.grad.view(-1))  # the contiguous gradient bucket
    bucket.div_(2)  # average_tensor: divided by the data-parallel size (two, so that it runs) before the reduction
    scope("step_shard")
    grads32 = bucket.float()  # the partition's flat gradient in the fp32 master's dtype
    float(grads32.sum())  # has_overflow: _has_inf_or_nan's float(x.float().sum()), a host sync
    norm = torch.linalg.vector_norm(grads32) ** 2.0
    norm.item()
    grads32.mul_(1.0)  # unscale_and_clip_grads: grad.data.mul_(1. / combined_scale)
    torch._fused_adamw_([master], [grads32], states["exp_avg"], states["exp_avg_sq"], [], states["step"], lr=1e-4,
                        beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False)
    with torch.no_grad():
        flat16 = torch.empty_like(bucket)
        flat16.copy_(master)  # bit16_partitions[partition_id].data.copy_(fp32_partition.data)
    for p in params:
        p.grad = None  # zero_grad(set_to_none=True)


def trace_deepspeed_step(family: str, dims: dict[str, int], precision: str) -> tuple[
        dict[str, list[dict[str, Any]]], dict[str, list[tuple[int, int]]], int]:
    """Megatron-DeepSpeed's training step of a one-block GPT on one rank: a micro-batch's forward and loss and its
    backward (adding into the gradients the micro-batch before it left), then ZeRO stage 1's step. The second step is
    traced."""
    assert family == "gpt2" and precision == "bf16", "Megatron-DeepSpeed's GPT in 16-bit"
    torch.manual_seed(0)
    model = AxonnGPT(dims)
    recording: list[Recorder] = []
    model.block = DeepSpeedBlock(dims, recording)
    model = model.to(torch.bfloat16).train()
    for dropout in [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]:
        dropout.forward = _native_dropout(dropout)  # type: ignore[method-assign]
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    master = torch.cat([p.detach().view(-1).float() for p in params])  # the fp32 partition (here: all of it)
    states = {"exp_avg": [torch.zeros(n)], "exp_avg_sq": [torch.zeros(n)], "step": [torch.tensor(1.0)]}
    batch = gpt_batch(dims)
    _loss(model, *batch).backward()  # one step untraced
    _zero1_step(params, master, states, None)
    _loss(model, *batch).backward()  # the micro-batch before the traced one

    rec = Recorder(linear_gemms_only=True)
    recording.append(rec)
    saved = record_step(rec, model, batch, lambda: _zero1_step(params, master, states, rec))
    return dict(rec.ops), saved, n
