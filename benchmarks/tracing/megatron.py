"""The ledger tracer's Megatron-LM step (``benchmarks/derive_ledger.py --framework megatron``): megatron-core 0.16.1's
own ``GPTModel`` built from its local layer spec (``get_gpt_layer_local_spec``: no TransformerEngine, which needs
CUDA), wrapped in its own ``DistributedDataParallel`` (fp32 ``main_grad`` buffer), traced on CPU in a world of one
(gloo) with its fused CUDA kernels replaced by stand-ins of the same inputs and outputs, one op each way.

What Megatron-LM runs on a GPU (``frameworks/megatron-lm.yaml``: ``--bf16``, the distributed optimizer, flash
attention, ``--overlap-grad-reduce``) and what stands in for it here (each fused path's file is in megatron-core):

* fused LayerNorm (``megatron/core/fusions/fused_layer_norm.py``: apex ``FusedLayerNormAffineFunction`` or the
  persistent ``FastLayerNormFN``): one ``fused_layer_norm`` op forward (reads x, weight, bias; writes y and the fp32
  mean and inverse deviation) and one backward; without apex the local spec's ``WrappedTorchNorm``
  (``megatron/core/transformer/torch_norm.py``) would run torch's LayerNorm;
* fused bias-GeLU (``megatron/core/fusions/fused_bias_gelu.py``: ``bias_gelu``/``bias_gelu_back`` under
  ``jit_fuser``, which is ``torch.compile`` on torch >= 2.2, ``megatron/core/jit.py``): one ``gelu.bias`` op forward,
  one ``gelu_backward.bias`` backward (the bias gradient is autograd's sum, as on the GPU);
* fused bias-dropout-add (``megatron/core/fusions/fused_bias_dropout.py``: ``bias_dropout_add_fused_train`` under
  ``jit_fuser``): one ``bias_dropout_add`` op forward (reads x, bias, residual; writes the output and a one-byte
  dropout mask) and one ``bias_dropout_add_backward`` (reads the gradient and the mask, writes x's gradient);
* flash attention (TransformerEngine's ``TEDotProductAttention``, ``megatron/core/extensions/transformer_engine.py``,
  the ``--use-flash-attn``/TE path; the local spec's ``DotProductAttention`` is the unfused one and hard-codes a CUDA
  causal mask): one ``flash_attention`` op forward (reads q, k, v; writes the output and the fp32 log-sum-exp) and one
  ``flash_attention_backward`` (reads q, k, v, the output, its gradient and the log-sum-exp; writes dq, dk, dv);
  grouped key-value heads are read as they are (the kernel indexes them);
* the wgrad GEMM with ``gradient_accumulation_fusion`` (``megatron/core/tensor_parallel/layers.py``
  ``LinearWithGradAccumulationAndAsyncCommunication.backward``: apex's
  ``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32``): one ``addmm.wgrad_fp32`` GEMM that reads the input and
  the output's gradient and accumulates into the fp32 ``main_grad`` (read and written) — the real backward runs
  with ``gradient_accumulation_fusion=True``, only the extension's kernel stands in;
* CUDA's ``native_dropout`` for ``torch.nn.Dropout`` (:func:`_native_dropout`);
* the Llama-style block (``--family llama``): RMSNorm (the local spec's ``torch.nn.RMSNorm``,
  ``megatron/core/transformer/torch_norm.py``, which CUDA runs as ``_fused_rms_norm``: the torchtitan trace's
  stand-in), fused SwiGLU (``megatron/core/fusions/fused_bias_swiglu.py`` under ``jit_fuser``): one ``silu.swiglu`` op
  forward, one ``silu_backward.swiglu`` backward; its fused QKV linear runs as two (:func:`_split_qkv`).

CUDA calls patched for the trace (:func:`cpu_world`): ``torch.cuda.current_device`` returns "cpu" (the grad
buffers', the global memory buffer's and DDP's device); ``use_cpu_initialization=True`` (no ``.cuda()``, no CUDA RNG
tracker in the initialisation); parallel_state is a world of one on gloo (``initialize_model_parallel(1, 1)``), so
every tensor-parallel all-reduce is over one rank: a collective, priced by the collective model and left out of the
ledger (``c10d`` ops are not recorded). The optimizer step is written out from the distributed optimizer's code
(:func:`_distributed_optimizer_step`), whose type checks name CUDA tensor types.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from typing import Any
from unittest import mock

import torch

from .recorder import Recorder, op_class, saved_bytes

_LIBS: list[Any] = []


@cache
def _library() -> Any:
    """The stand-in ops (``torch.ops.axoplan_trace``): each one op with the inputs and outputs of the fused CUDA kernel
    it stands for (the module docstring); the CPU implementations compute the same values, below the recorder."""
    lib = torch.library.Library("axoplan_trace", "FRAGMENT")
    lib.define("fused_layer_norm(Tensor x, Tensor w, Tensor b, float eps) -> (Tensor, Tensor, Tensor)")
    lib.define("fused_layer_norm_backward(Tensor dy, Tensor x, Tensor mean, Tensor rstd, Tensor w) "
               "-> (Tensor, Tensor, Tensor)")
    lib.define("gelu.bias(Tensor x, Tensor bias) -> Tensor")
    lib.define("gelu_backward.bias(Tensor dy, Tensor x, Tensor bias) -> Tensor")
    lib.define("silu.swiglu(Tensor x) -> Tensor")
    lib.define("silu_backward.swiglu(Tensor dy, Tensor x) -> Tensor")
    lib.define("bias_dropout_add(Tensor x, Tensor bias, Tensor residual, float p) -> (Tensor, Tensor)")
    lib.define("bias_dropout_add_backward(Tensor dy, Tensor mask, float p) -> Tensor")
    lib.define("flash_attention(Tensor q, Tensor k, Tensor v) -> (Tensor, Tensor)")
    lib.define("flash_attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse) "
               "-> (Tensor, Tensor, Tensor)")
    lib.define("addmm.wgrad_fp32(Tensor x, Tensor dy, Tensor(a!) main_grad) -> ()")
    for name, fn in _IMPLS.items():
        lib.impl(name, fn, "CPU")
    _LIBS.append(lib)
    return torch.ops.axoplan_trace


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    xf = x.float()
    mean = xf.mean(-1)
    rstd = torch.rsqrt(xf.var(-1, unbiased=False) + eps)
    y = (xf - mean[..., None]) * rstd[..., None] * w.float() + b.float()
    return y.to(x.dtype), mean, rstd


def _layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                         w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    xhat = (x.float() - mean[..., None]) * rstd[..., None]
    g = dy.float() * w.float()
    dx = rstd[..., None] * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    flat = x.shape[-1]
    dw = (dy.float() * xhat).reshape(-1, flat).sum(0)
    db = dy.float().reshape(-1, flat).sum(0)
    return dx.to(x.dtype), dw.to(w.dtype), db.to(w.dtype)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def _bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return _gelu_tanh(x.float() + bias.float()).to(x.dtype)


def _bias_gelu_backward(dy: torch.Tensor, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``bias_gelu_back`` of ``megatron/core/fusions/fused_bias_gelu.py`` (a kernel's body runs below autograd)."""
    xb = x.float() + bias.float()
    tanh_out = torch.tanh(0.79788456 * xb * (1 + 0.044715 * xb * xb))
    ff = 0.5 * xb * ((1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * xb * xb)) + 0.5 * (1 + tanh_out)
    return (ff * dy.float()).to(x.dtype)


def _swiglu(x: torch.Tensor) -> torch.Tensor:
    a, b = torch.chunk(x.float(), 2, dim=-1)
    return (a * torch.sigmoid(a) * b).to(x.dtype)


def _swiglu_backward(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``swiglu_back`` of ``megatron/core/fusions/fused_bias_swiglu.py``."""
    a, b = torch.chunk(x.float(), 2, dim=-1)
    sig = torch.sigmoid(a)
    g = dy.float()
    return torch.cat((g * sig * (1 + a * (1 - sig)) * b, g * sig * a), -1).to(x.dtype)


def _bias_dropout_add(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                      p: float) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.rand(x.shape) >= p
    return (residual.float() + (x.float() + bias.float()) * mask / (1.0 - p)).to(x.dtype), mask


def _bias_dropout_add_backward(dy: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    return (dy.float() * mask / (1.0 - p)).to(dy.dtype)


def _attention_probs(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal softmax of q·kᵀ/√d in fp32; grouped key-value heads indexed as the kernel reads them."""
    k = k.float().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q.float() @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)


def _sbhd(t: torch.Tensor) -> torch.Tensor:
    """A (B, heads, S, head) tensor stored as Megatron's (S, B, heads, head), seen as (B, heads, S, head)."""
    return t.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k, v: (B, heads, S, head) views of Megatron's (S, B, heads, head) tensors; the output is written in that
    layout, the log-sum-exp in fp32 (B, heads, S)."""
    group = q.shape[1] // k.shape[1]
    probs = _attention_probs(q, k)
    out = probs @ v.float().repeat_interleave(group, dim=1)
    lse = torch.zeros(q.shape[:3], dtype=torch.float32)  # its values are not needed below
    return _sbhd(out.to(q.dtype)), lse


def _flash_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor) -> tuple[torch.Tensor, ...]:
    group = q.shape[1] // k.shape[1]
    probs = _attention_probs(q, k)
    do = dout.float()
    dv = probs.transpose(-1, -2) @ do
    dprobs = do @ v.float().repeat_interleave(group, dim=1).transpose(-1, -2)
    dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdim=True)) / q.shape[-1] ** 0.5
    dq = dscores @ k.float().repeat_interleave(group, dim=1)
    dk = dscores.transpose(-1, -2) @ q.float()
    b, heads, s, d = k.shape
    dk, dv = (g.reshape(b, heads, group, s, d).sum(2) for g in (dk, dv))
    return tuple(_sbhd(g.to(q.dtype)) for g in (dq, dk, dv))


def _wgrad(x: torch.Tensor, dy: torch.Tensor, main_grad: torch.Tensor) -> None:
    main_grad.add_(dy.float().t() @ x.float())


_IMPLS = {"fused_layer_norm": _layer_norm, "fused_layer_norm_backward": _layer_norm_backward,
          "gelu.bias": _bias_gelu, "gelu_backward.bias": _bias_gelu_backward,
          "silu.swiglu": _swiglu, "silu_backward.swiglu": _swiglu_backward,
          "bias_dropout_add": _bias_dropout_add,
          "bias_dropout_add_backward": _bias_dropout_add_backward, "flash_attention": _flash,
          "flash_attention_backward": _flash_backward, "addmm.wgrad_fp32": _wgrad}


class _FusedLayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
        y, mean, rstd = _library().fused_layer_norm(x, w, b, eps)
        ctx.save_for_backward(x, w, mean, rstd)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = _library().fused_layer_norm_backward(dy, x, mean, rstd, w)
        return dx, dw, db, None


class _BiasGeLU(torch.autograd.Function):
    """``megatron/core/fusions/fused_bias_gelu.py`` ``GeLUFunction``: saves the input and the bias, returns the input's
    gradient for both (autograd sums it to the bias's shape)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, bias)
        return _library().gelu.bias(x, bias)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, bias = ctx.saved_tensors
        grad = _library().gelu_backward.bias(dy, x, bias)
        return grad, grad


class _SwiGLU(torch.autograd.Function):
    """``megatron/core/fusions/fused_bias_swiglu.py`` ``SwiGLUFunction`` (no bias): saves its input."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return _library().silu.swiglu(x)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return _library().silu_backward.swiglu(dy, x)


def _bias_swiglu(x: torch.Tensor, bias: torch.Tensor | None, *_: Any) -> torch.Tensor:
    """``bias_swiglu_impl`` as ``transformer/mlp.py`` calls it for the Llama-style block (no bias)."""
    assert bias is None, "the Llama-style block has no biases (add_bias_linear=False)"
    return _SwiGLU.apply(x)


class _BiasDropoutAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, p: float) -> torch.Tensor:
        out, mask = _library().bias_dropout_add(x, bias, residual, p)
        ctx.save_for_backward(mask)
        ctx.p = p
        return out

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        (mask,) = ctx.saved_tensors
        dx = _library().bias_dropout_add_backward(dy, mask, ctx.p)
        return dx, dx, dy, None


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, lse = _library().flash_attention(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        return tuple(_library().flash_attention_backward(dout, q, k, v, out, lse))


def _bias_dropout_add_fused_train(x_with_bias: tuple[torch.Tensor, torch.Tensor | None], residual: torch.Tensor,
                                  prob: float) -> torch.Tensor:
    """``bias_dropout_add_fused_train``: the GPT block's (its row-parallel linears return their bias,
    ``skip_bias_add``; dropout 0.1) one fused op each way; the Llama-style block's (no bias, no dropout: the compiled
    function is ``residual + x``) one add forward, none backward."""
    x, bias = x_with_bias
    if bias is None:
        assert prob == 0.0, "the Llama-style block is traced without dropout"
        return residual + x
    return _BiasDropoutAdd.apply(x, bias, residual, prob)


class _FlashCoreAttention(torch.nn.Module):
    """Stands for TransformerEngine's flash attention in place of the local spec's ``DotProductAttention``: takes
    Megatron's (S, B, heads, head) query, key and value (grouped key-value heads repeated as TE's kernel reads them:
    not at all, it indexes them), returns (S, B, heads·head)."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *_: Any, **__: Any) -> torch.Tensor:
        s, b, heads, head = query.shape
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = _FlashAttention.apply(q, k, v)
        return out.permute(2, 0, 1, 3).reshape(s, b, heads * head)


def _no_collective(*_: Any, **__: Any) -> None:
    """The gradient buffer's reduce-scatter (``dist_reduce_scatter_func``): a collective, which gloo runs as a copy in a
    world of one; the trace leaves it out, as every collective (:data:`COLLECTIVES`)."""


@contextlib.contextmanager
def cpu_world() -> Iterator[None]:
    """A world of one on gloo with megatron-core's CUDA calls and fused kernels patched for the trace (the module
    docstring): ``torch.cuda.current_device``, the wgrad extension of ``tensor_parallel/layers.py``, the gradient
    buffer's reduce-scatter (``distributed/param_and_grad_buffer.py``), the ``jit_fuser`` function of
    ``fusions/fused_bias_dropout.py``, and the bias-GeLU and SwiGLU ``transformer/mlp.py`` imports from
    ``fusions/fused_bias_gelu.py`` and ``fusions/fused_bias_swiglu.py``."""
    import types

    import megatron.core.distributed.param_and_grad_buffer as buffers
    import megatron.core.fusions.fused_bias_dropout as bda
    import megatron.core.tensor_parallel.layers as layers
    import megatron.core.transformer.mlp as mlp
    import torch.distributed as dist
    from megatron.core import parallel_state

    wgrad = types.SimpleNamespace(wgrad_gemm_accum_fp32=_library().addmm.wgrad_fp32)
    with contextlib.ExitStack() as stack:
        for target, name, value in ((torch.cuda, "current_device", lambda: "cpu"),
                                    (layers, "fused_weight_gradient_mlp_cuda", wgrad),
                                    (layers, "_grad_accum_fusion_available", True),
                                    (buffers, "dist_reduce_scatter_func", _no_collective),
                                    (bda, "bias_dropout_add_fused_train", _bias_dropout_add_fused_train),
                                    (mlp, "bias_gelu_impl", _BiasGeLU.apply),
                                    (mlp, "bias_swiglu_impl", _bias_swiglu)):
            stack.enter_context(mock.patch.object(target, name, value, create=True))
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(1, 1)
        yield


def build_megatron(family: str, dims: dict[str, int]) -> Any:
    """A one-block megatron-core ``GPTModel`` (``megatron/core/models/gpt/gpt_model.py``) of the local layer spec, as
    Megatron-LM's ``pretrain_gpt.py`` builds it with ``--bf16`` (bf16 parameters), the fusions on
    (``bias_activation_fusion``, ``bias_dropout_fusion``, ``gradient_accumulation_fusion``), wrapped in megatron-core's
    ``DistributedDataParallel`` (``use_distributed_optimizer``, an fp32 ``main_grad`` buffer: ``grad_reduce_in_fp32``,
    which Megatron-LM's ``--bf16`` sets by ``--accumulate-allreduce-grads-in-fp32``, and its default
    ``--check-for-nan-in-loss-and-grad``). ``gpt2``: Megatron-LM's GPT defaults (learned absolute positions,
    LayerNorm, bias-GeLU MLP of ``ffn_hidden_size``, biases, hidden and attention dropout 0.1, the output layer tied to
    the word embeddings). ``llama``: a Llama-style block as Megatron-LM's Llama recipes set it (``--normalization
    RMSNorm --swiglu --disable-bias-linear --group-query-attention --position-embedding-type rope
    --untie-embeddings-and-output-weights``, no dropout), its fused QKV linear split in two (:func:`_split_qkv`). The
    norms and the core attention are the stand-ins of the module docstring."""
    import torch.nn.functional as F
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    llama = family == "llama"
    style: dict[str, Any] = (
        {"normalization": "RMSNorm", "gated_linear_unit": True, "activation_func": F.silu, "add_bias_linear": False,
         "num_query_groups": dims["KV"], "hidden_dropout": 0.0, "attention_dropout": 0.0} if llama else
        {"hidden_dropout": 0.1, "attention_dropout": 0.1})
    cfg = TransformerConfig(num_layers=1, hidden_size=dims["H"], num_attention_heads=dims["NH"],
                            ffn_hidden_size=dims["F"], use_cpu_initialization=True, bf16=True,
                            params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, bias_activation_fusion=True,
                            bias_dropout_fusion=True, gradient_accumulation_fusion=True, **style)
    torch.manual_seed(0)
    model = GPTModel(cfg, get_gpt_layer_local_spec(normalization="RMSNorm" if llama else None),
                     vocab_size=dims["V"], max_sequence_length=dims["S"],
                     position_embedding_type="rope" if llama else "learned_absolute",
                     share_embeddings_and_output_weights=not llama)
    for layer in model.decoder.layers:
        layer.self_attention.core_attention = _FlashCoreAttention()
        if llama:
            _split_qkv(layer.self_attention, cfg)
    for norm in [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm | torch.nn.RMSNorm)]:
        norm.forward = _fused_norm_of(norm)  # type: ignore[method-assign]
    model = model.to(torch.bfloat16)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=True, overlap_grad_reduce=False,
        overlap_param_gather=False, check_for_nan_in_grad=True), model)
    ddp.train()
    return ddp


def _split_qkv(attention: Any, cfg: Any) -> None:
    """Megatron's ``linear_qkv`` is one GEMM of ``H·(NH + 2·KV)·H/NH`` weights, which is no monomial under
    grouped-query attention: the trace runs it as two of megatron-core's own ``ColumnParallelLinear`` (the queries'
    ``H·H`` and the keys' and values' ``2·H·KV·H/NH``: the same bytes and flops, one more GEMM kernel forward and two
    backward than the fused code), as the torchtitan trace does. ``SelfAttention.get_query_key_value_tensors``
    (``transformer/attention.py``) reshapes the query out of the grouped layout, a copy where a group holds two or
    more query heads; the split keeps that copy (``clone``)."""
    column = type(attention.linear_qkv)
    heads, groups, head_dim = (attention.num_attention_heads_per_partition, attention.num_query_groups_per_partition,
                               attention.hidden_size_per_attention_head)
    hidden = cfg.hidden_size
    attention.linear_q = column(hidden, heads * head_dim, config=cfg, init_method=cfg.init_method, bias=False)
    attention.linear_kv = column(hidden, 2 * groups * head_dim, config=cfg, init_method=cfg.init_method, bias=False)
    del attention.linear_qkv

    def query_key_value(hidden_states: torch.Tensor, *_: Any, **__: Any) -> tuple[torch.Tensor, ...]:
        s, b = hidden_states.shape[:2]
        query = attention.linear_q(hidden_states)[0].view(s, b, heads, head_dim)
        kv = attention.linear_kv(hidden_states)[0].view(s, b, groups, 2 * head_dim)
        key, value = torch.split(kv, [head_dim, head_dim], dim=3)
        return (query.clone() if heads > groups else query), key, value

    attention.get_query_key_value_tensors = query_key_value


def _fused_norm_of(norm: torch.nn.Module) -> Any:
    """apex's fused LayerNorm, or CUDA's fused RMSNorm (the local spec's ``torch.nn.RMSNorm``,
    ``transformer/torch_norm.py``, which CUDA runs as ``_fused_rms_norm``: the torchtitan trace's stand-in)."""
    if isinstance(norm, torch.nn.RMSNorm):
        from .torchtitan import _fused_rms_norm_of

        return _fused_rms_norm_of(norm)
    return _fused_layer_norm_of(norm)  # type: ignore[arg-type]


def _fused_layer_norm_of(norm: torch.nn.LayerNorm) -> Any:
    return lambda x: _FusedLayerNorm.apply(x, norm.weight, norm.bias, norm.eps)



COLLECTIVES = {"allreduce_", "allreduce_coalesced_", "allgather_", "_allgather_base_",
               "allgather_into_tensor_coalesced_", "reduce_scatter_", "_reduce_scatter_base_",
               "reduce_scatter_tensor_coalesced_", "broadcast_", "barrier"}
"""torch.distributed's ``c10d`` ops: Megatron's tensor- and data-parallel collectives, priced by axoplan's collective
model (``axoplan/cost/collectives.py``), not ledger entries; in a world of one they move nothing."""


def _without_collectives(ops: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    return {scope: [o for o in entries if o["op"].split(".")[0] not in COLLECTIVES] for scope, entries in ops.items()}


def _follow(rec: Recorder, block: torch.nn.Module) -> None:
    """Scope hooks on Megatron's ``TransformerLayer``, whose input megatron-core passes by keyword and whose output is
    made viewless (``make_viewless_tensor``), which module backward hooks do not see: the backward scopes switch on
    gradient hooks of the layer's output (its backward starts) and input (its backward is done)."""
    def enter(_: Any, args: Any, kwargs: dict[str, Any]) -> None:
        rec.scope = "block_forward"
        x = kwargs.get("hidden_states", args[0] if args else None)
        if isinstance(x, torch.Tensor) and x.requires_grad:
            x.register_hook(lambda _: setattr(rec, "scope", "rest_backward"))

    def leave(_: Any, __: Any, out: Any) -> None:
        rec.scope = "rest_forward"
        y = out[0] if isinstance(out, tuple) else out
        y.register_hook(lambda _: setattr(rec, "scope", "block_backward"))

    block.register_forward_pre_hook(enter, with_kwargs=True)
    block.register_forward_hook(leave)


def _native_dropout(module: torch.nn.Dropout) -> Any:
    """``torch.nn.Dropout`` as CUDA runs it: ``at::dropout`` takes ``native_dropout`` on a CUDA tensor (one kernel that
    writes the output and a one-byte mask; ``native_dropout_backward`` reads the gradient and the mask), on a CPU one
    a bernoulli, a division and a multiplication (``aten/src/ATen/native/Dropout.cpp``: ``is_fused_kernel_acceptable``
    is CUDA only). The aten op CUDA calls stands in."""
    return lambda x: torch.native_dropout(x, module.p, module.training)[0] if module.training and module.p > 0 else x


def _loss(model: Any, ids: torch.Tensor, position_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """One micro-batch's loss as Megatron-LM's step computes it: ``pretrain_gpt.py`` ``forward_step`` and ``loss_func``
    (not in the megatron-core package: written out from Megatron-LM's source), with its
    ``--check-for-nan-in-loss-and-grad`` (on by default) checks by megatron-core's rerun state machine, then
    ``megatron/core/pipeline_parallel/schedules.py`` ``forward_step_calc_loss`` (divided by the tokens and the
    micro-batches) and ``backward_step``'s ``grad_scale_func`` (the optimizer's ``scale_loss``: ``_scale_one`` times
    the loss under bf16, ``megatron/core/optimizer/optimizer.py``)."""
    from megatron.core.rerun_state_machine import get_rerun_state_machine

    output = model(ids, position_ids, None, labels=ids, loss_mask=loss_mask)
    losses = output.view(-1).float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])  # the reported 'lm loss'
    machine = get_rerun_state_machine()
    for reject in (torch.isnan, torch.isinf):
        machine.validate_result(result=loss, rejection_func=reject, message="loss", tolerance=0.0, fatal=True)
    loss = loss / torch.clamp(num_tokens, min=1)
    loss = loss / 1  # num_microbatches: one micro-batch per traced step
    return torch.ones(1) * loss


def _distributed_optimizer_step(ddp: Any, shards: list[tuple[torch.nn.Parameter, torch.Tensor]],
                                states: dict[str, list[torch.Tensor]], rec: Recorder | None = None) -> None:
    """The step after the last micro-batch's backward as Megatron-LM runs it with ``--use-distributed-optimizer`` and
    ``--bf16`` (no loss scaler), written out from megatron-core's code in a world of one (every shard the whole):

    1. ``ddp.finish_grad_sync()`` (``megatron/core/distributed/param_and_grad_buffer.py`` ``start_grad_sync``): each
       bucket's gradient norm checked for NaN and Inf (``check_grads``, host syncs), the fp32 buffer scaled by
       ``1/d`` (``gradient_scaling_factor``, set here to a two-rank world's 1/2 so that it runs), the
       reduce-scatter (a collective);
    2. ``DistributedOptimizer._copy_model_grads_to_main_grads``: each fp32 main parameter's ``.grad`` is its shard of
       ``main_grad`` (a view: ``.float()`` of fp32);
    3. ``clip_grad_norm`` (``--clip-grad 1.0``, ``megatron/core/optimizer/clip_grads.py``): the fp32 gradients' norm,
       one multi-tensor ``multi_tensor_l2norm`` pass (one norm over the buffer stands in), squared, all-reduced, read
       back (``.item()``); the gradients are scaled only where the norm exceeds ``--clip-grad`` (``clip_coeff < 1``):
       not counted (docs/decisions.md);
    4. Adam on the fp32 main parameters (TransformerEngine's or apex's ``FusedAdam``: one multi-tensor kernel that
       reads parameter, gradient and both moments and writes parameter and moments; torch's ``_fused_adamw_`` stands
       in);
    5. ``_copy_main_params_to_model_params``: each shard copied into the bf16 parameter (one ``copy_`` per parameter);
       the all-gather of the parameters (``--overlap-param-gather``: in the next forward) is a collective;
    6. Megatron-LM's ``train_step`` zeroes the gradient buffer (``ddp.zero_grad_buffer()``: the fp32 ``grad_data``
       ``zero_()``) and the optimizer's main gradients (``.grad = None``).

    Steps 1 and 6 run on the whole gradient buffer on every data-parallel rank; steps 3 to 5 on the rank's ``1/d``
    shard of the main parameters (``distrib_optimizer.py``: each rank's ``shard_main_param_groups``): with `rec`
    given they are recorded in the scope ``step_shard``, the rest in ``step``."""
    for group in ddp.bucket_groups:
        for bucket in group.buckets:
            bucket.gradient_scaling_factor = 0.5
    ddp.finish_grad_sync()
    grads = [p.main_grad.view(-1) for p, _ in shards]
    for (_, main), grad in zip(shards, grads, strict=True):
        main.grad = grad
    if rec is not None:
        rec.scope = "step_shard"
    torch.zeros(1, dtype=torch.int)  # multi_tensor_applier's overflow flag
    norm = torch.linalg.vector_norm(ddp.buffers[0].grad_data) ** 2.0
    norm.item()
    mains = [m for _, m in shards]
    torch._fused_adamw_(mains, grads, states["exp_avg"], states["exp_avg_sq"], [], states["step"], lr=1e-4, beta1=0.9,
                        beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False)
    with torch.no_grad():
        for p, main in shards:
            p.data.view(-1).copy_(main)
    if rec is not None:
        rec.scope = "step"
    ddp.zero_grad_buffer()
    for main in mains:
        main.grad = None


SPLIT_QKV_GEMMS = {"block_forward": (1,), "block_backward": (8, 9)}
"""Where :func:`_split_qkv`'s extra GEMMs fall in a block's GEMM order: forward Q, KV (the second is the extra one),
attention out, FC1, FC2; backward FC2, FC1, attention out, each dgrad then wgrad, then KV's two, then Q's two (the
extra ones)."""


def _fused_qkv_regions(ops: dict[str, list[dict[str, Any]]], saved: dict[str, list[tuple[int, int]]]) -> None:
    """Each op's region (the GEMMs before it in its scope, which gives its activation axis) as the fused ``linear_qkv``
    has it: the split's extra GEMMs are not counted, an op between the two halves sits before the fused GEMM."""
    def fused(region: int, extra: tuple[int, ...]) -> int:
        return region - sum(1 for e in extra if e <= region)

    for scope, extra in SPLIT_QKV_GEMMS.items():
        gemms = [op for op in ops[scope] if op_class(op["op"]) == "gemm"]
        assert len(gemms) == 4 * (1 if scope == "block_forward" else 2) + len(extra), f"{scope}: {len(gemms)} GEMMs"
        for op in ops[scope]:
            op["region"] = fused(op["region"], extra)
    saved["block_forward"] = [(n, fused(r, SPLIT_QKV_GEMMS["block_forward"])) for n, r in saved["block_forward"]]


def trace_megatron_step(family: str, dims: dict[str, int], precision: str) -> tuple[
        dict[str, list[dict[str, Any]]], dict[str, list[tuple[int, int]]], int]:
    """Megatron-LM's training step of a one-block ``GPTModel`` (:func:`build_megatron`) on one rank: the forward and the
    loss (:func:`_loss`), the backward (the fused wgrad GEMMs accumulate into ``main_grad``; DDP's gradient hooks add
    the other gradients into it), then the distributed optimizer's step (:func:`_distributed_optimizer_step`). The
    second step is traced (the first creates the optimizer's states)."""
    with cpu_world():
        ddp = build_megatron(family, dims)
        for dropout in [m for m in ddp.modules() if isinstance(m, torch.nn.Dropout)]:
            dropout.forward = _native_dropout(dropout)  # type: ignore[method-assign]
        ids = torch.randint(0, dims["V"], (dims["B"], dims["S"]))
        position_ids = torch.arange(dims["S"])[None].expand(dims["B"], -1)
        loss_mask = torch.ones(dims["B"], dims["S"])
        params = list(ddp.module.parameters())
        shards = [(p, p.detach().view(-1).clone().float()) for p in params]  # distrib_optimizer.py: main params
        states = {"exp_avg": [torch.zeros_like(m) for _, m in shards],
                  "exp_avg_sq": [torch.zeros_like(m) for _, m in shards],
                  "step": [torch.tensor(1.0) for _ in shards]}
        ddp.zero_grad_buffer()
        _loss(ddp, ids, position_ids, loss_mask).backward()  # one step untraced
        _distributed_optimizer_step(ddp, shards, states)

        rec = Recorder()
        saved: dict[str, list[tuple[int, int]]] = defaultdict(list)
        _follow(rec, ddp.module.decoder.layers[0])
        skip = {p.untyped_storage().data_ptr() for p in params}
        with rec, saved_bytes(rec, saved, skip):
            rec.scope = "rest_forward"
            loss = _loss(ddp, ids, position_ids, loss_mask)
        with rec:
            rec.scope = "rest_backward"
            loss.backward()
            rec.scope = "step"
            _distributed_optimizer_step(ddp, shards, states, rec)
    ops = dict(rec.ops)
    if family == "llama":
        _fused_qkv_regions(ops, saved)
    return _without_collectives(ops), dict(saved), sum(p.numel() for p in params)
