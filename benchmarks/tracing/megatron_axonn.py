"""The ledger tracer's Megatron-AxoNN step (``benchmarks/derive_ledger.py --framework axonn --family gpt2``): the
GPT that Megatron-AxoNN trains (axonn-ai/Megatron-AxoNN at f6df7ae: ``megatron/model/transformer.py``,
``language_model.py``, ``gpt_model.py``, ``pretrain_gpt.py``; AxoNN 0.2.0's ``axonn.intra_layer.Linear``) rebuilt
from its code op by op, on one rank, every tensor-parallel group of size one, with ``--bf16``, flash attention and
dropout 0.1 as ``frameworks/axonn.yaml`` describes it. Megatron-AxoNN is not a package, so its modules cannot be
imported: the module and function structure is ``benchmarks/host_replay.py``'s replica of the same layer
(``MegatronAxonnBlock``, which times its Python), and every kernel a GPU runs is the op it runs here:

* the block: apex's fused LayerNorm, the TorchScript bias-GeLU (``fused_bias_gelu.py`` ``GeLUFunction``) and
  bias-dropout-add (nvfuser fuses each into one kernel each way on a GPU), and flash attention are the stand-ins of
  ``tracing.megatron`` (one op each way with the kernel's inputs and outputs); flash-attn's varlen function reads
  ``(b·s, heads, head)`` tensors and writes its output in that layout (:func:`_flash_bshd`), so the einops
  rearranges ``s b -> b s`` of q, k and v and ``b s -> s b`` of the output are copies (``.contiguous()``), as on a
  GPU; the key and value ``repeat_interleave`` of a factor of one (no grouped-query attention) copies them too;
* AxoNN's ``Linear`` (``intra_layer/fully_connected.py``, ``skip_bias_add``: the bias returned to the
  bias-GeLU or bias-dropout-add): its flat weight shard reshaped (a view), one GEMM forward, the input's and the
  weight's gradient GEMMs backward in bf16 (AxoNN makes the weight gradient in the weight's dtype, then reduce-scatters
  it over Z: a collective); the QKV bias is dropped (``mixed_x_layer, _ = ...``), as Megatron-AxoNN's code does;
* Megatron's ``DistributedDataParallel`` with ``accumulate_allreduce_grads_in_fp32`` (set by ``--bf16``): a
  gradient hook per parameter adds its bf16 ``.grad`` into the fp32 ``main_grad`` buffer (``main_grad.add_``) and
  drops it; before the step the buffer is divided by the data-parallel size (``Bucket.communicate``: ``data /= d``)
  and all-reduced (a collective);
* the embedding (word plus learned position, transposed to ``[s, b, h]``, dropout 0.1 under the RNG fork), the final
  LayerNorm, the logits (the tied word embedding's GEMM, ``parallel_lm_logits``) and
  ``vocab_parallel_cross_entropy`` on the fp32 logits, written out from Megatron-LM's code of the same generation
  (``megatron/core/tensor_parallel/cross_entropy.py``), then ``pretrain_gpt.py``'s ``loss_func``;
* the optimizer: Megatron's ``Float16OptimizerWithFloat16Params`` without ``--use-distributed-optimizer`` (the
  profile's memory rule, 18 bytes per parameter): the fp32 main gradient handed to the fp32 main parameter (a view),
  the gradient norm for ``--clip-grad 1.0`` (``multi_tensor_l2norm``: one norm pass, read back with ``.item()``),
  Adam on the fp32 main parameters (apex's ``FusedAdam``: torch's ``_fused_adamw_`` stands in), the fp32 main
  parameters copied into the bf16 model parameters (``_multi_tensor_copy_this_to_that``), the gradient buffer zeroed.

What is left out, as in the other traces: collectives (priced by the cost model), the RNG state save and restore
of the tracker's fork (host work: ``host_replay``), NVTX ranges. The block is traced without its checkpoint (the
cost model reruns its forward under ``--recompute``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812

from .megatron import _attention_probs, _BiasDropoutAdd, _BiasGeLU, _fused_qkv_regions, _FusedLayerNorm, _native_dropout
from .recorder import Recorder, saved_bytes

DROPOUT = 0.1
"""Megatron's ``--hidden-dropout`` and ``--attention-dropout`` defaults, which Megatron-AxoNN's scripts keep."""

_LIBS: list[Any] = []


@cache
def _varlen_library() -> Any:
    """flash-attn's varlen kernels as two stand-in ops (recorded as ``flash_attention.bshd`` and its backward: class
    attention): q, k, v read as ``(b, heads, s, head)`` views of ``(b, s, heads, head)`` tensors (the flops rule of
    ``tracing.fit`` reads that shape); the output, the fp32 log-sum-exp and the gradients written in flash-attn's
    ``(b·s, heads, head)`` layout."""
    lib = torch.library.Library("axoplan_trace", "FRAGMENT")
    lib.define("flash_attention.bshd(Tensor q, Tensor k, Tensor v) -> (Tensor, Tensor)")
    lib.define("flash_attention_backward.bshd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse) "
               "-> (Tensor, Tensor, Tensor)")
    lib.impl("flash_attention.bshd", _flash_bshd, "CPU")
    lib.impl("flash_attention_backward.bshd", _flash_bshd_backward, "CPU")
    _LIBS.append(lib)
    return torch.ops.axoplan_trace


def _bshd(t: torch.Tensor) -> torch.Tensor:
    """A ``(b, heads, s, head)`` result stored as ``(b, s, heads, head)``, seen as ``(b, heads, s, head)``."""
    return t.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


def _flash_bshd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = _attention_probs(q, k) @ v.float()
    return _bshd(out.to(q.dtype)), torch.zeros(q.shape[:3], dtype=torch.float32)


def _flash_bshd_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                         lse: torch.Tensor) -> tuple[torch.Tensor, ...]:
    probs = _attention_probs(q, k)
    do = dout.float()
    dv = probs.transpose(-1, -2) @ do
    dprobs = do @ v.float().transpose(-1, -2)
    dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdim=True)) / q.shape[-1] ** 0.5
    dq, dk = dscores @ k.float(), dscores.transpose(-1, -2) @ q.float()
    return tuple(_bshd(g.to(q.dtype)) for g in (dq, dk, dv))


class _FlashVarlen(torch.autograd.Function):
    """``flash_attn_varlen_func`` (``FlashAttnVarlenFunc``): one kernel forward, one backward; saves q, k, v, the
    output and the log-sum-exp."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, lse = _varlen_library().flash_attention.bshd(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        return tuple(_varlen_library().flash_attention_backward.bshd(dout, q, k, v, out, lse))


class _AxonnLinearFn(torch.autograd.Function):
    """AxoNN's linear on one GPU of every group: ``x · Wᵀ`` forward; ``dX = dY · W`` and ``dW = dYᵀ · X`` (bf16, the
    weight's dtype) backward, returned flat as the shard is stored."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, flat: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        ctx.save_for_backward(x, flat)
        ctx.shape = shape
        return x.matmul(flat.view(shape).t())

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, flat = ctx.saved_tensors
        dx = dy.matmul(flat.view(ctx.shape))
        dw = dy.reshape(-1, dy.shape[-1]).t().mm(x.reshape(-1, x.shape[-1]))
        return dx, dw.view(-1), None


class _AxonnLinear(torch.nn.Module):
    """``axonn.intra_layer.Linear(..., skip_bias_add=True)``: the weight a flat bf16 shard, the bias returned."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.shape = (n_out, n_in)
        self.weight = torch.nn.Parameter((torch.randn(n_out, n_in) / math.sqrt(n_in)).view(-1))
        self.bias = torch.nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _AxonnLinearFn.apply(x, self.weight, self.shape), self.bias


class _LayerNorm(torch.nn.Module):
    """apex ``MixedFusedLayerNorm`` (``get_norm``), one fused kernel each way (``tracing.megatron``'s stand-in)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.bias = torch.nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FusedLayerNorm.apply(x, self.weight, self.bias, 1e-5)


class _RMSNorm(torch.nn.Module):
    """Megatron's ``RMSNorm`` (``megatron/model/rms_norm.py``), which ``get_norm`` builds for ``--normalization
    RMSNorm``: eager, no fused kernel: ``x.float()``, its square, mean, ``+ eps``, ``rsqrt``, the product, the cast
    back (``type_as``), times the weight."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _apply_rotary(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """``apply_rotary_pos_emb`` (``megatron/core/models/common/rotary_pos_embedding.py``) over the whole head: the
    cosine and sine of the ``[s, 1, 1, head]`` frequencies, ``t·cos + rotate_half(t)·sin``, the pass-through part
    (empty here) concatenated back."""
    rot = freqs.shape[-1]
    t, t_pass = t[..., :rot], t[..., rot:]
    cos, sin = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    t = (t * cos) + (_rotate_half(t) * sin)
    return torch.cat((t, t_pass), dim=-1)


class _Attention(torch.nn.Module):
    """``ParallelAttention.forward`` on the flash path (self-attention, causal, no KV cache): the QKV output viewed
    in query groups, split, the key and value repeated to every query head (``repeat_interleave`` of ``heads/groups``,
    a copy even of one), rotary on the query and the repeated key where the model has it; grouped-query attention's
    query, which no view can ungroup from the fused layout, is reshaped (a copy, as the fused layout forces on a
    GPU)."""

    def __init__(self, hidden: int, heads: int, groups: int, split_qkv: bool) -> None:
        super().__init__()
        self.heads, self.groups, self.head_dim = heads, groups, hidden // heads
        self.split_qkv = split_qkv
        if split_qkv:
            self.query = _AxonnLinear(hidden, hidden)
            self.key_value = _AxonnLinear(hidden, 2 * groups * self.head_dim)
        else:
            self.query_key_value = _AxonnLinear(hidden, 3 * hidden)
        self.dense = _AxonnLinear(hidden, hidden)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The fused QKV linear and its split into query groups; under grouped-query attention its ``H·(NH + 2·KV)/NH``
        outputs are no monomial, so it runs as two linears (queries ``H``, keys and values ``2·KV·H/NH``: the same
        bytes and flops, one more GEMM forward and two backward, their regions as the fused one's:
        ``tracing.megatron._fused_qkv_regions``), the query's reshape out of the grouped layout kept as a copy."""
        per_group = self.heads // self.groups
        if not self.split_qkv:
            mixed, _ = self.query_key_value(x)  # Megatron-AxoNN drops the QKV bias
            mixed = mixed.view(*mixed.shape[:-1], self.groups, (per_group + 2) * self.head_dim)
            query, key, value = torch.split(mixed, [per_group * self.head_dim, self.head_dim, self.head_dim], dim=3)
            return query.reshape(query.size(0), query.size(1), -1, self.head_dim), key, value
        query = self.query(x)[0].view(x.size(0), x.size(1), self.heads, self.head_dim)
        kv = self.key_value(x)[0].view(x.size(0), x.size(1), self.groups, 2 * self.head_dim)
        key, value = torch.split(kv, [self.head_dim, self.head_dim], dim=3)
        return (query.clone() if per_group > 1 else query), key, value

    def forward(self, x: torch.Tensor, freqs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        query, key, value = self._qkv(x)
        per_group = self.heads // self.groups
        key, value = key.repeat_interleave(per_group, dim=2), value.repeat_interleave(per_group, dim=2)
        if freqs is not None:
            query, key = _apply_rotary(query, freqs), _apply_rotary(key, freqs)
        q, k, v = (t.transpose(0, 1).contiguous() for t in (query, key, value))  # rearrange 's b ... -> b s ...'
        s = q.shape[1]
        torch.arange(0, (q.shape[0] + 1) * s, step=s, dtype=torch.int32)  # cu_seqlens
        out = _FlashVarlen.apply(*(t.permute(0, 2, 1, 3) for t in (q, k, v))).permute(0, 2, 1, 3)
        context = out.transpose(0, 1).contiguous()  # rearrange 'b s h d -> s b (h d)'
        return self.dense(context.view(*context.shape[:2], -1))


class _MLP(torch.nn.Module):
    """``ParallelMLP.forward``: with ``bias_gelu_fusion`` the fused bias-GeLU; with ``--swiglu`` the up projection
    twice as wide, its bias added (AxoNN's linears always have one: Megatron-AxoNN passes no ``bias=``), then
    ``F.silu(x[0]) * x[1]`` of its two halves, eager."""

    def __init__(self, hidden: int, ffn: int, swiglu: bool) -> None:
        super().__init__()
        self.swiglu = swiglu
        self.dense_h_to_4h = _AxonnLinear(hidden, 2 * ffn if swiglu else ffn)
        self.dense_4h_to_h = _AxonnLinear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inter, bias = self.dense_h_to_4h(x)
        if not self.swiglu:
            return self.dense_4h_to_h(_BiasGeLU.apply(inter, bias))
        gate, up = torch.chunk(inter + bias, 2, dim=-1)
        return self.dense_4h_to_h(F.silu(gate) * up)


class AxonnBlock(torch.nn.Module):
    """``ParallelTransformerLayer.forward`` (encoder layer, pre-norm, ``bias_dropout_fusion``): norm, attention,
    bias-dropout-add, norm, MLP, bias-dropout-add; ``make_viewless_tensor`` returns its input (not a view). `llama`:
    the Llama recipe's ``--normalization RMSNorm --swiglu --use-rotary-position-embeddings --group-query-attention``
    (``examples/run_axonn_amd_tinyllama.sh``)."""

    def __init__(self, dims: dict[str, int], llama: bool) -> None:
        super().__init__()
        hidden = dims["H"]
        norm = _RMSNorm if llama else _LayerNorm
        self.input_norm = norm(hidden)
        self.self_attention = _Attention(hidden, dims["NH"], dims["KV"], split_qkv=llama)
        self.post_attention_norm = norm(hidden)
        self.mlp = _MLP(hidden, dims["F"], swiglu=llama)

    def forward(self, hidden_states: torch.Tensor, freqs: torch.Tensor | None = None) -> torch.Tensor:
        attn, attn_bias = self.self_attention(self.input_norm(hidden_states), freqs)
        norm_input = _BiasDropoutAdd.apply(attn, attn_bias.expand_as(hidden_states), hidden_states, DROPOUT)
        mlp_out, mlp_bias = self.mlp(self.post_attention_norm(norm_input))
        return _BiasDropoutAdd.apply(mlp_out, mlp_bias.expand_as(norm_input), norm_input, DROPOUT)


class AxonnGPT(torch.nn.Module):
    """``GPTModel`` of one block: ``Embedding`` (word and learned position embeddings, their sum transposed to
    ``[s, b, h]``, embedding dropout), the block, the final LayerNorm, ``parallel_lm_logits`` with the tied word
    embedding (``[s, b, V]``) and ``vocab_parallel_cross_entropy`` on ``output.float()`` (``fp16_lm_cross_entropy``
    off), the per-token losses transposed back to ``[b, s]``."""

    def __init__(self, dims: dict[str, int], llama: bool = False) -> None:
        super().__init__()
        hidden = dims["H"]
        self.llama = llama
        self.word_embeddings = torch.nn.Parameter(torch.randn(dims["V"], hidden) * 0.02)
        if not llama:  # learned absolute positions; the Llama recipe's are rotary
            self.position_embeddings = torch.nn.Parameter(torch.randn(dims["S"], hidden) * 0.02)
        if llama:  # rotary's inverse frequencies (a buffer: the model's bf16 conversion makes it bf16)
            head = hidden // dims["NH"]
            self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, head, 2).float() / head))
        self.embedding_dropout = torch.nn.Dropout(DROPOUT)
        self.block = AxonnBlock(dims, llama)
        self.final_norm = (_RMSNorm if llama else _LayerNorm)(hidden)

    def _rotary_freqs(self, seq: int) -> torch.Tensor:
        """``RotaryEmbedding.forward``: the positions' outer product with the inverse frequencies (a buffer the
        model's bf16 conversion made bf16), doubled, ``[s, 1, 1, head]``."""
        freqs = torch.outer(torch.arange(seq, dtype=self.inv_freq.dtype), self.inv_freq)
        return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]

    def forward(self, ids: torch.Tensor, position_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        embeddings = F.embedding(ids, self.word_embeddings)
        if not self.llama:
            embeddings = embeddings + F.embedding(position_ids, self.position_embeddings)
        hidden = self.embedding_dropout(embeddings.transpose(0, 1).contiguous())
        freqs = self._rotary_freqs(ids.shape[1]) if self.llama else None
        hidden = self.final_norm(self.block(hidden, freqs))
        logits = hidden.matmul(self.word_embeddings.t())
        losses = _VocabParallelCrossEntropy.apply(logits.float(), labels.transpose(0, 1).contiguous())
        return losses.transpose(0, 1).contiguous()


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """``vocab_parallel_cross_entropy`` of a vocabulary partition that is the whole vocabulary (the all-reduces of the
    maximum, the target logit and the sum of exponentials are collectives over Y): the maximum subtracted, the target
    logit gathered, exponentials in place, their sum, ``log(sum) - target``, the softmax kept in place; backward the
    softmax minus one at the target, times the incoming gradient."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits_max = torch.max(logits, dim=-1)[0]
        logits = logits - logits_max.unsqueeze(dim=-1)
        start, end = 0, logits.size(-1)
        target_mask = (target < start) | (target >= end)
        masked_target = target.clone() - start
        masked_target[target_mask] = 0
        logits_2d = logits.view(-1, end)
        masked_target_1d = masked_target.view(-1)
        arange_1d = torch.arange(start=0, end=logits_2d.size()[0])
        predicted = logits_2d[arange_1d, masked_target_1d].clone().contiguous().view_as(target)
        predicted[target_mask] = 0.0
        exp_logits = logits
        torch.exp(logits, out=exp_logits)
        sum_exp = exp_logits.sum(dim=-1)
        loss = torch.log(sum_exp) - predicted
        exp_logits.div_(sum_exp.unsqueeze(dim=-1))
        ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        softmax, target_mask, masked_target_1d = ctx.saved_tensors
        grad_input = softmax
        grad_2d = grad_input.view(-1, softmax.size()[-1])
        arange_1d = torch.arange(start=0, end=grad_2d.size()[0])
        grad_2d[arange_1d, masked_target_1d] -= 1.0 - target_mask.view(-1).float()
        grad_input.mul_(grad.unsqueeze(dim=-1))
        return grad_input, None


def _loss(model: AxonnGPT, ids: torch.Tensor, position_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``pretrain_gpt.py``'s ``loss_func`` (the masked mean of the per-token losses; the reported loss averaged over
    data-parallel ranks: a detached copy and an all-reduce), then the schedule's ``output_tensor / num_microbatches``
    and the bf16 optimizer's ``scale_loss`` (times ``_scale_one``, no loss scaler under ``--bf16``)."""
    losses = model(ids, position_ids, ids).float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses.view(-1) * mask) / mask.sum()
    torch.cat([loss.clone().detach().view(1)])  # average_losses_across_data_parallel_group
    return (loss / 1) * torch.ones(1)


def _main_grad_hooks(model: torch.nn.Module, buffers: dict[torch.nn.Parameter, torch.Tensor],
                     recording: list[Recorder]) -> None:
    """Megatron's ``DistributedDataParallel`` gradient hook on each parameter: the bf16 gradient added into its fp32
    ``main_grad`` and dropped (``param.main_grad.add_(param.grad.data); param.grad = None``). A linear's weight
    gradient arrives reduce-scattered over Z, so its addition runs on the GPU's ``1/(Gx·Gy·Gz)`` shard: the op is
    marked with the axis ``z`` in the recorder of `recording` (where one records)."""
    sharded = {id(m.weight) for m in model.modules() if isinstance(m, _AxonnLinear)}
    for p in model.parameters():
        def hook(param: torch.Tensor, main: torch.Tensor = buffers[p]) -> None:
            main.add_(param.grad.data)
            param.grad = None
            if recording and id(param) in sharded:
                rec = recording[0]
                rec.ops[rec.scope][-1]["axis"] = "z"
        p.register_post_accumulate_grad_hook(hook)


def _optimizer_step(buffer: torch.Tensor, shards: list[tuple[torch.nn.Parameter, torch.Tensor, torch.Tensor]],
                    states: dict[str, list[torch.Tensor]]) -> None:
    """``Bucket.communicate``'s division of the fp32 buffer by the data-parallel size (two ranks, so that it runs)
    before its all-reduce; ``Float16OptimizerWithFloat16Params.step`` (the module docstring); the buffer zeroed for
    the next step (``zero_grad_buffer``)."""
    buffer /= 2
    mains = [m for _, m, _ in shards]
    grads = [g for _, _, g in shards]
    for main, grad in zip(mains, grads, strict=True):
        main.grad = grad  # _copy_model_grads_to_main_grads: main_grad.float() of an fp32 buffer is the buffer
    torch.zeros(1, dtype=torch.int)  # multi_tensor_applier's overflow flag
    norm = torch.linalg.vector_norm(buffer) ** 2.0
    norm.item()
    torch._fused_adamw_(mains, grads, states["exp_avg"], states["exp_avg_sq"], [], states["step"], lr=1e-4, beta1=0.9,
                        beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False)
    with torch.no_grad():
        for p, main, _ in shards:
            p.data.view(-1).copy_(main)
    buffer.zero_()
    for main in mains:
        main.grad = None


def _follow(rec: Recorder, block: torch.nn.Module) -> None:
    """Scope hooks on the block: its forward by module hooks; its backward from a gradient hook on its output (its
    backward starts) to one on its input (its backward is done)."""
    def enter(_: Any, args: Any) -> None:
        rec.scope = "block_forward"
        if args[0].requires_grad:
            args[0].register_hook(lambda _: setattr(rec, "scope", "rest_backward"))

    def leave(_: Any, __: Any, out: torch.Tensor) -> None:
        rec.scope = "rest_forward"
        out.register_hook(lambda _: setattr(rec, "scope", "block_backward"))

    block.register_forward_pre_hook(enter)
    block.register_forward_hook(leave)


def trace_axonn_step(family: str, dims: dict[str, int], precision: str) -> tuple[
        dict[str, list[dict[str, Any]]], dict[str, list[tuple[int, int]]], int]:
    """Megatron-AxoNN's training step of a one-block GPT (:class:`AxonnGPT`) on one rank: forward and loss, backward
    (the gradient hooks fill the fp32 ``main_grad`` buffer), the optimizer step. The second step is traced."""
    assert family in ("gpt2", "llama") and precision == "bf16", "Megatron-AxoNN's GPT or Llama recipe in bf16"
    torch.manual_seed(0)
    model = AxonnGPT(dims, llama=family == "llama").to(torch.bfloat16).train()
    for dropout in [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]:
        dropout.forward = _native_dropout(dropout)  # type: ignore[method-assign]
    params = list(model.parameters())
    buffer = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32)
    views = dict(zip(params, torch.split(buffer, [p.numel() for p in params]), strict=True))
    buffers = {p: v.view(p.shape) for p, v in views.items()}
    recording: list[Recorder] = []
    _main_grad_hooks(model, buffers, recording)
    shards = [(p, p.detach().view(-1).float().clone(), views[p]) for p in params]
    states = {"exp_avg": [torch.zeros_like(m) for _, m, _ in shards],
              "exp_avg_sq": [torch.zeros_like(m) for _, m, _ in shards],
              "step": [torch.tensor(1.0) for _ in shards]}
    batch = gpt_batch(dims)
    _loss(model, *batch).backward()  # one step untraced
    _optimizer_step(buffer, shards, states)

    rec = Recorder()
    recording.append(rec)

    def step() -> None:
        rec.scope = "step"
        _optimizer_step(buffer, shards, states)
    saved = record_step(rec, model, batch, step)
    ops = dict(rec.ops)
    if family == "llama":
        _fused_qkv_regions(ops, saved)
    return ops, saved, len(buffer)


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def gpt_batch(dims: dict[str, int]) -> Batch:
    """A micro-batch of random token ids, their positions and a loss mask of ones (``get_batch``'s three)."""
    ids = torch.randint(0, dims["V"], (dims["B"], dims["S"]))
    return ids, torch.arange(dims["S"])[None].expand(dims["B"], -1), torch.ones(dims["B"], dims["S"])


def record_step(rec: Recorder, model: AxonnGPT, batch: Batch,
                step: Callable[[], None]) -> dict[str, list[tuple[int, int]]]:
    """One micro-batch's forward and loss (with what autograd keeps, the parameters' storages left out), its
    backward and `step` (the optimizer's, which sets its own scopes), recorded by `rec` with the block's scopes
    followed; returns the saved storages per scope."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[str, list[tuple[int, int]]] = defaultdict(list)
    _follow(rec, model.block)
    with rec, saved_bytes(rec, saved, params, where_made=True):
        rec.scope = "rest_forward"
        loss = _loss(model, *batch)
    with rec:
        rec.scope = "rest_backward"
        loss.backward()
        step()
    return dict(saved)
