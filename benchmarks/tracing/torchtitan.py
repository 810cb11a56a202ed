"""The ledger tracer's torchtitan step (``benchmarks/derive_ledger.py --framework torchtitan``): torchtitan 0.3.0's own
Llama 3 modules under FSDP2's mixed precision, on CPU, with the stand-ins stated on :func:`build_torchtitan` and
:func:`_fused_rms_norm_function` (``docs/algorithm.md`` §5e)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from .recorder import Recorder, saved_bytes


def build_torchtitan(dims: dict[str, int]) -> Any:
    """A one-block torchtitan Llama 3 (``torchtitan/models/llama3/__init__.py``: ``_build_llama3_layers`` with
    ComplexRoPE, RMSNorm, SwiGLU FFN; untied LM head as the 8B flavour), bf16 compute weights (FSDP2's
    ``MixedPrecisionPolicy(param_dtype=bf16)``: ``torchtitan/config/configs.py`` ``mixed_precision_param``).

    Two departures, both stated in the ledger's documentation (``docs/algorithm.md`` §5e): the flavours fuse Q, K and
    V into one ``wqkv`` (``fuse_qkv=True``), whose ``H·(NH + 2·KV)·H/NH`` elements are no monomial, so the block is
    traced with torchtitan's own unfused ``QKVLinear`` (``fuse_qkv=False``: the same bytes, two more GEMM kernels
    forward and four more backward than the fused code launches); and its language-model attention backends (flex,
    varlen: ``models/common/config_utils.py``), one fused kernel each way on a GPU, cannot run on CPU, so its own
    ``ScaledDotProductAttention`` module stands in (the same causal attention, one attention op each way)."""
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import (
        _EMBEDDING_INIT,
        _NORM_INIT,
        Llama3Model,
        _build_llama3_layers,
        _output_linear_init,
    )

    h, nh, kv, f, v, s = dims["H"], dims["NH"], dims["KV"], dims["F"], dims["V"], dims["S"]
    cfg = Llama3Model.Config(
        dim=h, vocab_size=v, tok_embeddings=Embedding.Config(num_embeddings=v, embedding_dim=h,
                                                             param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=h, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=h, out_features=v, param_init=_output_linear_init(h)),
        layers=_build_llama3_layers(fuse_qkv=False, n_layers=1, dim=h, n_heads=nh, n_kv_heads=kv, hidden_dim=f,
                                    rope=ComplexRoPE.Config(dim=h // nh, max_seq_len=s, theta=500000,
                                                            scaling="llama"), attn_backend="flex"))
    torch.manual_seed(0)
    model = cfg.build()
    for block in model.layers.values():
        block.attention.inner_attention = ScaledDotProductAttention(ScaledDotProductAttention.Config())
    for norm in [m for m in model.modules() if isinstance(m, RMSNorm)]:
        norm.forward = _fused_rms_norm_of(norm)  # type: ignore[method-assign]
    model = model.to(torch.bfloat16)
    model.train()
    return model


@cache
def _fused_rms_norm_function() -> Any:
    """``F.rms_norm`` as CUDA runs it: one ``_fused_rms_norm`` kernel forward and one ``_fused_rms_norm_backward``
    backward (``aten/src/ATen/native/layer_norm.cpp``: ``rms_norm_symint`` dispatches to ``_fused_rms_norm`` on every
    device but MPS; on CPU that op decomposes into eight element-wise ops, which the tracer would record). Two
    library ops with the same inputs and outputs stand for the two kernels (recorded as ``rms_norm``: class norm)."""
    lib = torch.library.Library("axoplan_trace", "FRAGMENT")
    lib.define("fused_rms_norm(Tensor x, Tensor w, float eps) -> (Tensor, Tensor)")
    lib.define("fused_rms_norm_backward(Tensor dy, Tensor x, Tensor rstd, Tensor w) -> (Tensor, Tensor)")

    def forward(x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        return (x.float() * rstd * w.float()).to(x.dtype), rstd

    def backward(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
        xhat, g = x.float() * rstd, dy.float() * w.float()
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        return dx.to(x.dtype), (dy.float() * xhat).reshape(-1, x.shape[-1]).sum(0).to(w.dtype)

    lib.impl("fused_rms_norm", forward, "CPU")
    lib.impl("fused_rms_norm_backward", backward, "CPU")
    _LIBS.append(lib)
    fwd, bwd = torch.ops.axoplan_trace.fused_rms_norm.default, torch.ops.axoplan_trace.fused_rms_norm_backward.default

    class FusedRMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
            y, rstd = fwd(x, w, eps)
            ctx.save_for_backward(x, rstd, w)
            return y

        @staticmethod
        def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
            x, rstd, w = ctx.saved_tensors
            dx, dw = bwd(dy, x, rstd, w)
            return dx, dw, None

    return FusedRMSNorm


_LIBS: list[Any] = []


def _fused_rms_norm_of(norm: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    fn = _fused_rms_norm_function()
    return lambda x: fn.apply(x, norm.weight, norm.eps)


def trace_torchtitan_step(family: str, dims: dict[str, int], precision: str) -> tuple[
        dict[str, list[dict[str, Any]]], dict[str, list[tuple[int, int]]], int]:
    """torchtitan's training step (``torchtitan/trainer.py``) of a one-block Llama 3 as FSDP2 runs it on one rank
    (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``): before a block's forward, and again before its
    backward (``reshard_after_forward``), the all-gathered bf16 shards are copied out into the unsharded parameters
    (``fsdp.split_with_sizes_copy``); after the backward each unit's bf16 gradients are copied into the fp32
    reduce-scatter buffer (``fsdp.chunk_cat``, ``reduce_dtype=float32``); fused AdamW (``components/optimizer``'s
    default ``implementation: fused``) steps the fp32 sharded parameters with the fp32 gradients. The loss is
    ``components/loss.py``'s ``cross_entropy_loss`` (the logits ``.float()``, then ``F.cross_entropy``, sum
    reduction) on the whole sequence (the 8B config's ``ChunkedLossWrapper`` runs the same ops per token in 8
    sequence chunks). The unsharded parameters FSDP2 frees after the forward are not activations: they are left out
    of the saved tensors (the profile's ``gathered_units`` counts them). What scales as 1/Gz (the shard's fp32 ->
    bf16 cast before the all-gather, the reduce-scattered shard) is left out: it vanishes with Z over all GPUs."""
    import torch.distributed.fsdp._fully_shard._fsdp_collectives  # noqa: F401  (registers torch.ops.fsdp)
    from torchtitan.components.loss import cross_entropy_loss

    model = build_torchtitan(dims)
    master = {n: p.detach().float().clone().requires_grad_(True) for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(list(master.values()), lr=3e-4, fused=True)
    ids = torch.randint(0, dims["V"], (dims["B"], dims["S"]))
    block = next(iter(model.layers.values()))
    block_names = {n for n, _ in model.named_parameters() if n.startswith("layers.")}

    flat = {}  # each unit's all-gather output (made before tracing: it stands for the collective's result)

    def gather(names: set[str]) -> None:  # foreach_all_gather_copy_out: all-gather output -> unsharded params
        params = [p for n, p in model.named_parameters() if n in names]
        key = min(names)
        if key not in flat:
            flat[key] = torch.cat([p.detach().reshape(-1) for p in params])[None]
        torch.ops.fsdp.split_with_sizes_copy(flat[key], [p.numel() for p in params], dim=1,
                                             out=[p.detach().view(1, -1) for p in params])

    def reduce(names: set[str]) -> None:  # foreach_reduce_scatter_copy_in: bf16 gradients -> fp32 buffer
        grads = [p.grad for n, p in model.named_parameters() if n in names and p.grad is not None]
        out = torch.empty(1, sum(g.numel() for g in grads), dtype=torch.float32)
        torch.ops.fsdp.chunk_cat(grads, 0, 1, out=out)
        offset = 0
        for n, p in model.named_parameters():
            if n in names and p.grad is not None:
                master[n].grad = out.view(-1)[offset:offset + p.numel()].view_as(master[n])
                offset += p.numel()

    def loss_of() -> torch.Tensor:
        logits = model(ids)
        return cross_entropy_loss(logits, ids)

    rest_names = {n for n, _ in model.named_parameters()} - block_names
    gather(block_names)
    gather(rest_names)
    loss_of().backward()  # one step untraced: the optimizer's states exist
    reduce(block_names)
    reduce(rest_names)
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.zero_grad(set_to_none=True)
    rec = Recorder()
    saved: dict[str, list[tuple[int, int]]] = defaultdict(list)

    def block_pre(*_: Any) -> None:
        rec.scope = "block_forward"
        gather(block_names)

    rec.follow(block, block_pre)
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with rec, saved_bytes(rec, saved, skip):
        rec.scope = "rest_forward"
        gather(rest_names)
        loss = loss_of()
    with rec:
        rec.scope = "rest_backward"
        loss.backward()
        rec.scope = "block_backward"
        gather(block_names)  # the backward's all-gather (reshard_after_forward), in the block's backward
        reduce(block_names)
        rec.scope = "rest_backward"
        reduce(rest_names)
        rec.scope = "step"
        opt.step()
        opt.zero_grad(set_to_none=True)
    ops, kept = dict(rec.ops), dict(saved)
    ops["block_recompute"], kept["block_checkpointed"] = trace_selective_recompute(dims)
    return ops, kept, sum(p.numel() for p in model.parameters())


def _fused_qkv_policy(policy: Callable[..., Any]) -> Callable[..., Any]:
    """torchtitan's SAC policy as it decides for the fused ``wqkv`` the flavours run: its every-second-``mm`` count
    (``distributed/activation_checkpoint.py``, ``SelectiveAC._wrap_block``) sees one matmul for Q, K and V together,
    so the traced block's unfused ``wk`` and ``wv`` take ``wq``'s decision without moving the count (the fused code
    saves ``wqkv``, ``w1``, ``w2`` and recomputes ``wo``, ``w3``)."""
    from torch.utils.checkpoint import CheckpointPolicy

    mm_ops = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)
    state: dict[str, Any] = {"seen": 0, "qkv": None}

    def decide(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if func == torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:
            return CheckpointPolicy.MUST_SAVE  # CPU's stand-in for the CUDA flash kernel, which the policy saves
        if func not in mm_ops:
            return policy(ctx, func, *args, **kwargs)
        state["seen"] += 1
        if state["seen"] in (2, 3):  # wk, wv: one GEMM with wq in the fused code
            return state["qkv"]
        decision = policy(ctx, func, *args, **kwargs)
        if state["seen"] == 1:
            state["qkv"] = decision
        return decision
    return decide


def trace_selective_recompute(dims: dict[str, int]) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
    """What torchtitan's selective activation checkpointing (``SelectiveAC``, the Llama 3 8B and 70B configs'
    ``activation_checkpoint``: ``models/llama3/config_registry.py``) reruns in a block's backward, and what a block
    keeps for it. The block is wrapped by torchtitan's own ``SelectiveAC._wrap_block`` (``ptd_checkpoint_wrapper``
    with ``create_selective_checkpoint_contexts``); its policy saves the outputs of PyTorch's compute-intensive ops
    (matmuls, the SDPA/flash attention kernels) and recomputes every second matmul and every other op
    (:func:`_fused_qkv_policy`: counted as the fused ``wqkv`` runs). The ops recorded while the backward reruns the
    block's forward are the recompute (the saved ops' outputs come from the cache and launch nothing); what the block
    keeps is its input (the checkpoint holds it) and the cached outputs (each storage once)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.distributed.activation_checkpoint import SelectiveAC

    model = build_torchtitan(dims)
    layer_id, block = next(iter(model.layers.named_children()))
    wrapper = SelectiveAC(SelectiveAC.Config())._wrap_block(block, base_fqn=f"layers.{layer_id}")
    context_fn = wrapper.checkpoint_fn.keywords["context_fn"]
    storages: list[Any] = []

    def fused_context() -> Any:
        caching, _ = context_fn()
        contexts = create_selective_checkpoint_contexts(_fused_qkv_policy(caching.policy_fn))
        storages.append(contexts[0].storage)
        return contexts

    wrapper.checkpoint_fn.keywords["context_fn"] = fused_context
    model.layers.register_module(layer_id, wrapper)
    ids = torch.randint(0, dims["V"], (dims["B"], dims["S"]))
    rec = Recorder()
    phase = {"backward": False}
    inputs: list[torch.Tensor] = []

    def block_pre(_: Any, args: Any) -> None:
        if phase["backward"]:
            rec.scope = "block_recompute"
        else:
            inputs.append(args[0])
            rec.scope = "block_forward"

    block.register_forward_pre_hook(block_pre)
    block.register_forward_hook(lambda *_: setattr(rec, "scope", "block_backward" if phase["backward"]
                                                   else "rest_forward"))
    with rec:
        loss = cross_entropy_loss(model(ids), ids)
        kept = _storage_bytes([inputs[0], *_cached_outputs(storages[0])])  # after the forward: the backward frees them
        phase["backward"] = True
        rec.scope = "rest_backward"
        loss.backward()
    return rec.ops["block_recompute"], [(n, 0) for n in kept]


def _cached_outputs(storage: dict[Any, dict[int, Any]]) -> list[torch.Tensor]:
    """The tensors a selective checkpoint's cache holds (its policy's saved outputs; an op marked for recompute
    holds none)."""
    from torch.utils.checkpoint import _RECOMPUTE  # type: ignore[attr-defined]

    leaves = [leaf for by_index in storage.values() for value in by_index.values() if value is not _RECOMPUTE
              for leaf in tree_flatten(value)[0]]
    return [t for t in (getattr(leaf, "val", leaf) for leaf in leaves) if isinstance(t, torch.Tensor)]


def _storage_bytes(tensors: list[torch.Tensor]) -> list[int]:
    """The bytes of each storage the tensors hold, each storage once, in order (empty ones left out)."""
    kept: dict[int, int] = {}
    for t in tensors:
        kept.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
    return [n for n in kept.values() if n > 0]
