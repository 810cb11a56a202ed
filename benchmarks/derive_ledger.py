"""Derive a framework's op ledger by tracing its real training step on CPU (no GPU needed).

    python benchmarks/derive_ledger.py --family gpt2 --precision autocast  # writes frameworks/ledgers/hf-<...>.json

What it does (``docs/algorithm.md`` §4e):

1. Builds a tiny model of the family with Hugging Face transformers (fp32 weights, or bf16 weights with
   ``--precision bf16``), runs one training step as ``Trainer(bf16=True)`` runs it: forward under
   ``torch.autocast(bfloat16)``, the loss of ``labels=input_ids``, backward, fused AdamW, zero_grad.
2. CUDA autocast is emulated on CPU: CPU autocast leaves ops in bf16 that CUDA autocast runs in fp32
   (``pow``, ``layer_norm``, ``softmax``, ``log_softmax``, ``sum``, ``exp``, ``rsqrt``...; the CUDA lists
   are PyTorch's ``aten/src/ATen/autocast_mode.cpp``), so an ``AutocastCPU`` kernel is registered for each
   of those that casts its floating inputs to fp32 first, exactly as CUDA's does (the casts are real ops
   that autograd records).
3. A ``TorchDispatchMode`` records every aten op below autograd (what reaches a kernel), with each
   tensor's shape and dtype, tagged by scope: a block's forward and backward (module hooks), the rest of
   the forward and backward (embeddings, final norm, LM head, loss), and the optimizer step. Saved-tensor
   hooks record what autograd keeps for the backward, per scope.
4. It traces again with each dimension doubled (batch, sequence, hidden, heads, KV heads, FFN width,
   vocabulary) and reads each tensor's element count as a monomial ``c · B^b · S^s · H^h ...`` from the
   ratios (every exponent must come out an integer, or the derivation stops).

The result is data: ``frameworks/ledgers/<profile>-<family>.json`` with the tool and versions that made
it. axoplan reads it without transformers or torch (``axoplan.cost.ledger``).

The code: ``benchmarks/tracing/`` (``recorder``: the op recorder; ``autocast``: CUDA autocast on CPU; ``fit``: the
monomial fit and the step tracers by framework; ``hf``, ``executor``, ``torchtitan``, ``llm_foundry``: each
framework's step).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import torch

if __package__:  # imported as benchmarks.derive_ledger
    from .tracing.autocast import cuda_autocast_on_cpu
    from .tracing.recorder import SYMBOLS, Recorder, activation_axis, is_view, op_class, saved_bytes
else:  # run as a script: its folder, benchmarks/, is sys.path[0]
    from tracing.autocast import cuda_autocast_on_cpu
    from tracing.recorder import SYMBOLS, Recorder, activation_axis, is_view, op_class, saved_bytes


def build(family: str, dims: dict[str, int], precision: str) -> Any:
    """A one-block model of `family` at `dims` (fp32 weights, or bf16 with precision 'bf16')."""
    import transformers as tr

    h, nh, kv, f, v, s = dims["H"], dims["NH"], dims["KV"], dims["F"], dims["V"], dims["S"]
    if family == "gpt2":
        cfg = tr.GPT2Config(n_embd=h, n_layer=1, n_head=nh, n_inner=f, n_positions=s, vocab_size=v,
                            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            bos_token_id=0, eos_token_id=0)
        cls: Any = tr.GPT2LMHeadModel
    elif family == "llama":
        cfg = tr.LlamaConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=nh, num_key_value_heads=kv,
                             intermediate_size=f, vocab_size=v, max_position_embeddings=s, tie_word_embeddings=False,
                             bos_token_id=0, eos_token_id=0, pad_token_id=None)
        cls = tr.LlamaForCausalLM
    elif family == "gpt-neox":
        cfg = tr.GPTNeoXConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=nh, intermediate_size=f,
                               vocab_size=v, max_position_embeddings=s, rotary_pct=0.25, use_parallel_residual=True,
                               hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=0, eos_token_id=0)
        cls = tr.GPTNeoXForCausalLM
    elif family == "mixtral":
        cfg = tr.MixtralConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=nh, num_key_value_heads=kv,
                               intermediate_size=f, vocab_size=v, max_position_embeddings=s, num_local_experts=EXPERTS,
                               num_experts_per_tok=TOP_K, tie_word_embeddings=False, router_aux_loss_coef=0.0,
                               output_router_logits=False, bos_token_id=0, eos_token_id=0, pad_token_id=None)
        cls = tr.MixtralForCausalLM
    else:
        raise SystemExit(f"unknown family {family!r}; known: gpt2, llama, gpt-neox, mixtral")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = cls(cfg)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    return model


GQA_FAMILIES = ("llama", "mixtral")
"""Families whose key-value heads are their own dimension (grouped-query attention)."""

EXPERTS, TOP_K = 8, 2
"""Mixtral's experts and experts per token (Mixtral 8x7B and 8x22B; the 2026-11-26 Mixtral profile): a mixture's op
list depends on them, so they are fixed in its ledger, not symbols."""


@contextmanager
def balanced_routing(model: Any) -> Iterator[None]:
    """Route token t to experts ``(t·k + j) mod E``: every expert gets exactly ``T·k/E`` tokens (Switch Transformer's
    balanced router as the planning case, ``docs/algorithm.md`` §4c), so every size stays a monomial. The router
    still computes its logits, softmax and top-k as transformers does; only the indices chosen are replaced."""
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    originals = [r.forward for r in routers]

    def routed(router: Any, forward: Callable[..., Any]) -> Callable[..., Any]:
        def run(hidden: torch.Tensor) -> Any:
            logits, scores, _ = forward(hidden)
            t = torch.arange(logits.shape[0], device=logits.device)[:, None] * TOP_K + torch.arange(TOP_K)
            return logits, scores, t % router.num_experts
        return run

    for r, f in zip(routers, originals, strict=True):
        r.forward = routed(r, f)
    try:
        yield
    finally:
        for r, f in zip(routers, originals, strict=True):
            r.forward = f


def blocks_of(model: Any) -> list[torch.nn.Module]:
    for path in ("transformer.h", "model.layers", "gpt_neox.layers"):
        obj: Any = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return list(obj)
    raise SystemExit("no transformer blocks found")


def trace_step(family: str, dims: dict[str, int], precision: str) -> tuple[dict[str, list[dict[str, Any]]],
                                                                              dict[str, list[tuple[int, int]]], int]:
    """The second training step of a one-block model (the first creates the optimizer's states): (ops per scope,
    saved storages per scope, parameters)."""
    model = build(family, dims, precision)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, dims["V"], (dims["B"], dims["S"]))
    rec = Recorder()
    saved: dict[str, list[tuple[int, int]]] = defaultdict(list)
    block = blocks_of(model)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16), balanced_routing(model):  # one step untraced: states exist
        model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

    rec.follow(block)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}  # kept anyway: the weights' memory
    with cuda_autocast_on_cpu(), rec, balanced_routing(model):
        with torch.autocast("cpu", dtype=torch.bfloat16), saved_bytes(rec, saved, params):
            loss = model(input_ids=ids, labels=ids).loss
        rec.scope = "rest_backward"
        loss.backward()
        rec.scope = "step"
        opt.step()
        opt.zero_grad(set_to_none=True)
    return dict(rec.ops), dict(saved), sum(p.numel() for p in model.parameters())


def trace_executor_step(family: str, dims: dict[str, int], precision: str) -> tuple[
        dict[str, list[dict[str, Any]]], dict[str, list[tuple[int, int]]], int]:
    """The same for axoplan's own executor (``axoplan/executor``) on one rank (gloo, CPU, bf16 as it runs on a GPU):
    one block, one micro-batch, the second step (its optimizer's master copies and moments exist)."""
    import torch.distributed as dist

    from axoplan.executor import train
    from axoplan.executor.layers import megatron_model
    from axoplan.executor.spec import ExecSettings
    from axoplan.executor.timing import PhaseTimer
    from axoplan.inputs.model import ModelSpec
    from axoplan.inputs.options import RunOptions
    from axoplan.records.plan import LaunchConfig
    from axoplan.space.layout import Layout

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)
    llama = family == "llama"
    spec = ModelSpec(name="trace", num_layers=1, hidden=dims["H"], num_heads=dims["NH"],
                     num_kv_heads=dims["KV"] if llama else None, ffn_hidden=dims["F"], vocab=dims["V"],
                     max_positions=dims["S"], ffn_kind="swiglu" if llama else "gelu", biases=not llama)
    options = RunOptions(global_batch=dims["B"], seq_len=dims["S"], micro_batches=(dims["B"],), recompute="off",
                         cache_weights="off", framework="axoplan-executor")
    plan = LaunchConfig.build(machine="dgx-h100", devices_per_node=8, model=spec, options=options,
                              layout=Layout(1, 1, 1, 1), micro_batch=dims["B"], recompute=False, cache_weights=False)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    settings = ExecSettings(device="cpu", dtype="bfloat16" if precision == "bf16" else "float32")
    device = torch.device("cpu")
    groups = train.build_groups(plan.layout.to_layout(), "cpu", 60.0)
    rt = train._runtime(plan, groups, PhaseTimer(device, True))
    vocab = train.plan_vocab(plan)
    torch.manual_seed(0)
    params = {k: v.to(device, dtype) for k, v in train._initial_params(plan, settings, groups, vocab).items()}
    model = megatron_model(plan.model, vocab, params, rt, plan.recompute)
    batches = train.local_batches(plan, train.synthetic_tokens(plan, 0), groups.coords, device, groups.rank)
    optimizer = train._optimizer(model, settings)
    train._step(model, rt, batches, optimizer, 1.0, False)
    rec = Recorder()
    saved: dict[str, list[tuple[int, int]]] = defaultdict(list)

    block = model.blocks[0]
    rec.follow(block)
    model.register_forward_hook(rec.setter("rest_backward"))  # the loss's scaling and backward follow the forward
    step = optimizer.step

    def traced_step() -> None:
        rec.scope = "step"
        step()

    optimizer.step = traced_step  # type: ignore[method-assign]
    with rec, saved_bytes(rec, saved):
        rec.scope = "rest_forward"
        train._step(model, rt, batches, optimizer, 1.0, False)
    return dict(rec.ops), dict(saved), sum(p.numel() for p in model.parameters())


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
    return dict(rec.ops), dict(saved), sum(p.numel() for p in model.parameters())


def _import_llm_foundry_mpt() -> Any:
    """llm-foundry's MPT modeling module without its package ``__init__`` (which imports Composer, a training stack
    that is not needed to run the model): its sub-packages are entered by path, Composer's two names the modeling
    file imports (``HuggingFaceModel``, ``dist``) are stand-ins, never called by the model's forward or backward."""
    import types
    from importlib.util import find_spec

    if "llmfoundry.models.mpt.modeling_mpt" in sys.modules:
        return sys.modules["llmfoundry.models.mpt.modeling_mpt"]
    spec = find_spec("llmfoundry")
    assert spec is not None and spec.submodule_search_locations is not None
    root = Path(list(spec.submodule_search_locations)[0])
    for name in ("llmfoundry", "llmfoundry.utils", "llmfoundry.models", "llmfoundry.models.layers",
                 "llmfoundry.models.utils", "llmfoundry.models.mpt"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = package
    for name, attrs in (("composer", {}), ("composer.models", {"HuggingFaceModel": object}),
                        ("composer.utils", {"dist": types.SimpleNamespace(get_local_rank=lambda: 0)})):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__dict__.update(attrs)
            sys.modules[name] = module
    import llmfoundry.models.mpt.modeling_mpt as mpt

    return mpt


def build_mpt(dims: dict[str, int]) -> Any:
    """A one-block MPT (llm-foundry 0.22.0 ``MPTForCausalLM``) as llm-foundry's benchmarks configure it
    (``scripts/train/benchmarking``; the A100 runs in ``data/measured/llm-foundry/``): learned positions, biases, tied
    embeddings, GeLU MLP of ``expansion_ratio·d_model``, ``low_precision_layernorm``, no dropout, in bf16 (FSDP's
    ``MixedPrecision`` PURE: bf16 parameters for the compute). Its Triton/flash attention kernel, one kernel each
    way, does not run on CPU: an SDPA call on the same (B, heads, S, head) tensors stands in (one attention op each
    way); the S x S causal bias of ``attn_impl: torch`` is not built (the flash and Triton kernels take none)."""
    mpt = _import_llm_foundry_mpt()
    h, nh, f, v, s = dims["H"], dims["NH"], dims["F"], dims["V"], dims["S"]
    cfg = mpt.MPTConfig(d_model=h, n_heads=nh, n_layers=1, expansion_ratio=f / h, max_seq_len=s, vocab_size=v,
                        resid_pdrop=0.0, emb_pdrop=0.0, learned_pos_emb=True, no_bias=False,
                        norm_type="low_precision_layernorm", attn_config={"attn_impl": "torch", "attn_pdrop": 0.0},
                        init_device="cpu", tie_word_embeddings=True, pad_token_id=None)
    torch.manual_seed(0)
    model = mpt.MPTForCausalLM(cfg)

    def attn_fn(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, n_heads: int, kv_n_heads: int,
                **kwargs: Any) -> tuple[torch.Tensor, None, Any]:
        b, sq, head_dim = query.shape[0], query.shape[1], query.shape[-1] // n_heads
        q, k, v_ = (t.view(b, sq, -1, head_dim).transpose(1, 2) for t in (query, key, value))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v_, is_causal=True,
                                                               scale=kwargs.get("softmax_scale"))
        return out.transpose(1, 2).reshape(b, sq, -1), None, kwargs.get("past_key_value")

    for block in model.transformer.blocks:
        block.attn.attn_fn = attn_fn
    model.transformer._attn_bias = lambda *_, **kw: (None, kw.get("attention_mask"))
    model = model.to(torch.bfloat16)
    model.train()
    return model


@cache
def _fused_cross_entropy_function() -> Any:
    """flash-attn's fused cross-entropy (``flash_attn/ops/triton/cross_entropy.py``; llm-foundry's default
    ``loss_fn: fused_crossentropy``): one kernel forward (reads the bf16 logits, writes each token's loss and
    log-sum-exp in fp32) and one backward (reads the logits and log-sum-exp, writes the bf16 gradient). Two library
    ops with those inputs and outputs stand for the two kernels (class loss)."""
    lib = torch.library.Library("axoplan_trace", "FRAGMENT")
    lib.define("fused_cross_entropy(Tensor logits, Tensor labels) -> (Tensor, Tensor)")
    lib.define("fused_cross_entropy_backward(Tensor dloss, Tensor logits, Tensor lse, Tensor labels) -> Tensor")

    def forward(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lse = torch.logsumexp(logits.float(), -1)
        return lse - logits.float().gather(-1, labels[:, None])[:, 0], lse

    def backward(dloss: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        grad = torch.exp(logits.float() - lse[:, None])
        grad[torch.arange(len(labels)), labels] -= 1.0
        return (grad * dloss[:, None]).to(logits.dtype)

    lib.impl("fused_cross_entropy", forward, "CPU")
    lib.impl("fused_cross_entropy_backward", backward, "CPU")
    _LIBS.append(lib)
    fwd, bwd = torch.ops.axoplan_trace.fused_cross_entropy.default, \
        torch.ops.axoplan_trace.fused_cross_entropy_backward.default

    class FusedCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            loss, lse = fwd(logits, labels)
            ctx.save_for_backward(logits, lse, labels)
            return loss

        @staticmethod
        def backward(ctx: Any, dloss: torch.Tensor) -> tuple[torch.Tensor, None]:
            logits, lse, labels = ctx.saved_tensors
            return bwd(dloss, logits, lse, labels), None

    return FusedCrossEntropy


def trace_llm_foundry_step(family: str, dims: dict[str, int], precision: str) -> tuple[
        dict[str, list[dict[str, Any]]], dict[str, list[tuple[int, int]]], int]:
    """llm-foundry's training step of a one-block MPT as Composer runs its benchmarks: FSDP (FSDP1) FULL_SHARD with
    ``MixedPrecision`` PURE (bf16 parameters, gradients reduced in bf16: ``composer/distributed/mosaic_fsdp.py``
    ``get_mixed_precision``) under ``precision: amp_bf16`` (``torch.autocast(bfloat16)``, CUDA's fp32 list emulated),
    the model's loss ``ComposerMPTCausalLM.loss`` (targets shifted by ``torch.roll``, the fused cross-entropy, mean
    over tokens), and Composer's ``DecoupledAdamW`` (a loop over the flat parameters with in-place element-wise ops;
    ``torch.optim.AdamW(foreach=False)`` runs the same passes) on the fp32 sharded flat parameters. FSDP1's unsharded
    parameters are views into one flat bf16 parameter per unit, so the forward copies nothing out; the backward's
    gradients land in one flat gradient per unit (the split's backward: one concatenation of the unit's gradients,
    recorded here as ``cat``). What scales as 1/Gz (the shard's casts) is left out, as for torchtitan."""
    model = build_mpt(dims)
    block = model.transformer.blocks[0]
    block_names = {n for n, _ in model.named_parameters() if ".blocks." in n}
    master = {n: p.detach().float().clone().requires_grad_(True) for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(list(master.values()), lr=1e-4, foreach=False, fused=False)
    ids = torch.randint(0, dims["V"], (dims["B"], dims["S"]))
    loss_fn = _fused_cross_entropy_function()

    def loss_of() -> torch.Tensor:
        logits = model(input_ids=ids).logits
        targets = torch.roll(ids, shifts=-1)
        targets[:, -1] = 0  # llm-foundry's -100 (ignored) on the last position; the fused kernel masks it
        return loss_fn.apply(logits.view(-1, logits.size(-1)), targets.view(-1)).mean()

    def flat_gradients(names: set[str]) -> None:  # the flat parameter's gradient: the unit's gradients in one buffer
        torch.cat([p.grad.reshape(-1) for n, p in model.named_parameters() if n in names and p.grad is not None])

    def shard_gradients() -> None:  # the 1/Gz shard's cast to fp32 for the optimizer: left out (untraced)
        for n, p in model.named_parameters():
            if p.grad is not None:
                master[n].grad = p.grad.detach().float()

    rest_names = {n for n, _ in model.named_parameters()} - block_names
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_of()
    loss.backward()
    shard_gradients()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.zero_grad(set_to_none=True)
    rec = Recorder()
    saved: dict[str, list[tuple[int, int]]] = defaultdict(list)

    rec.follow(block)
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with cuda_autocast_on_cpu(), rec:
        with torch.autocast("cpu", dtype=torch.bfloat16), saved_bytes(rec, saved, skip):
            rec.scope = "rest_forward"
            loss = loss_of()
        rec.scope = "rest_backward"
        loss.backward()
        rec.scope = "block_backward"
        flat_gradients(block_names)
        rec.scope = "rest_backward"
        flat_gradients(rest_names)
    shard_gradients()
    with rec:
        rec.scope = "step"
        opt.step()
        opt.zero_grad(set_to_none=True)
    return dict(rec.ops), dict(saved), sum(p.numel() for p in model.parameters())


def _exponents(base: int, varied: dict[str, int], where: str) -> dict[str, int]:
    exps: dict[str, int] = {}
    for sym, n in varied.items():
        r = math.log2(n / base) if base and n else 0.0
        if abs(r - round(r)) > 0.1:  # labels padded by one position (S + 1) read as S: within 0.1
            raise SystemExit(f"{where}: element count {base} -> {n} when {sym} doubles is not a power of two")
        if round(r):
            exps[sym] = round(r)
    return exps


def _monomial(count: int, exps: dict[str, int], dims: dict[str, int]) -> tuple[float, dict[str, int]]:
    scale = math.prod(dims[s] ** e for s, e in exps.items())
    return count / scale, exps


def derive(family: str, precision: str, base: dict[str, int], framework: str = "hf") -> dict[str, Any]:
    """Trace at `base` and with each symbol doubled; return the ledger as data."""
    trace = {"executor": trace_executor_step, "torchtitan": trace_torchtitan_step,
             "llm-foundry": trace_llm_foundry_step}.get(framework, trace_step)
    runs = {"base": trace(family, base, precision)}
    for sym in SYMBOLS:
        if sym == "KV" and family not in GQA_FAMILIES:
            continue
        dims = dict(base)
        dims[sym] *= 2
        if sym == "NH" and family not in GQA_FAMILIES:
            dims["KV"] = dims["NH"]
        runs[sym] = trace(family, dims, precision)
    varied = [s for s in runs if s != "base"]
    ops0, saved0, params0 = runs["base"]
    scopes: dict[str, list[dict[str, Any]]] = {}
    for scope, ops in ops0.items():
        if scope == "step":
            continue
        entries = []
        for i, op in enumerate(ops):
            for sym in varied:
                other = runs[sym][0][scope]
                if len(other) != len(ops) or other[i]["op"] != op["op"]:
                    raise SystemExit(f"{scope}: the op list changes when {sym} doubles (op {i}, {op['op']})")
            entries.append(_entry(op, i, scope, runs, varied, base))
        scopes[scope] = _compact(entries)
    step_bytes: dict[str, float] = defaultdict(float)
    # a scalar read in the step is the optimizer's step count, which torch.optim keeps on the host (not capturable,
    # not fused: torch/optim/adamw.py): no kernel and no device sync there
    step_ops = [op for op in ops0.get("step", []) if not is_view(op["op"]) and not op.get("sync")]
    for op in step_ops:
        step_bytes[op_class(op["op"])] += sum(n * b for n, b in op["in"] + op["out"]) / params0
    step_kernels = len(step_ops)
    saved = {scope: _saved_terms(scope, runs, varied, base) for scope in saved0}
    return {"scopes": scopes, "saved": saved,
            "optimizer": {"bytes_per_param": {k: round(v, 4) for k, v in sorted(step_bytes.items())},
                          "ops": step_kernels,
                          "ops_names": sorted({op["op"] for op in ops0.get("step", [])})}}


def _entry(op: dict[str, Any], i: int, scope: str, runs: dict[str, Any], varied: list[str],
           base: dict[str, int]) -> dict[str, Any]:
    def terms(side: str) -> list[list[Any]]:
        if is_view(op["op"]):
            return []  # a view moves no bytes
        if side == "out" and op["op"].split(".")[0] in ("cat", "_cat", "stack") and len(op["out"]) == 1:
            size = op["out"][0][1]  # a concatenation writes what it reads, in its own dtype
            return [[c * size / op["in"][j][1], e] for j, (c, e) in enumerate(terms("in"))]
        out = []
        for j, (n, size) in enumerate(op[side]):
            exps = _exponents(n, {s: runs[s][0][scope][i][side][j][0] for s in varied}, f"{scope} {op['op']}")
            coef, e = _monomial(n, exps, base)
            out.append([round(coef * size, 6), e])
        return out

    entry = {"op": op["op"], "class": "host_sync" if op.get("sync") else op_class(op["op"]), "read": terms("in"),
             "write": terms("out")}
    if scope.startswith("block"):
        entry["axis"] = activation_axis(scope, op["region"])
    if entry["class"] in {"gemm", "attention"}:
        entry["flops"] = _flops_terms(op, i, scope, runs, varied, base)
        entry["dtype"] = "fp32" if op["in"] and op["in"][0][1] == 4 else "bf16"
    if is_view(op["op"]):
        entry["class"] = "view"
    return entry


def _flops_terms(op: dict[str, Any], i: int, scope: str, runs: dict[str, Any], varied: list[str],
                 base: dict[str, int]) -> list[list[Any]]:
    def flops(o: dict[str, Any]) -> int:
        shapes = o["shapes"]
        name = o["op"].split(".")[0]
        if "scaled_dot_product" in name or "flash" in name:
            q, k = shapes[0], shapes[1]
            if name.endswith("backward"):
                q, k = shapes[1], shapes[2]  # grad_out, query, key, ...
            b, nh, s, d = q
            return 4 * b * nh * s * k[2] * d * (5 if name.endswith("backward") else 2) // 2
        if name.lstrip("_") == "grouped_mm":  # E groups: 2·M·K·N summed over groups = 2·sqrt(|A|·|B|·|C| / E)
            a, b, offs = shapes[0], shapes[1], shapes[2]
            return round(2 * math.sqrt(math.prod(a) * math.prod(b) * o["out"][0][0] / math.prod(offs)))
        dims = [s for s in shapes if len(s) >= 2][-2:]
        if len(dims) < 2:
            return 0
        a, w = dims
        batch = math.prod(a[:-2]) if len(a) > 2 else 1
        return 2 * batch * a[-2] * a[-1] * w[-1]

    n = flops(op)
    exps = _exponents(n, {s: flops(runs[s][0][scope][i]) for s in varied}, f"{scope} {op['op']} flops")
    coef, e = _monomial(n, exps, base)
    return [[round(coef, 6), e]]


def _compact(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Equal entries (op, class, terms) merged with a count, in first-seen order."""
    merged: dict[str, dict[str, Any]] = {}
    for e in entries:
        key = json.dumps(e, sort_keys=True)
        if key in merged:
            merged[key]["count"] += 1
        else:
            merged[key] = {**e, "count": 1}
    return list(merged.values())


def _saved_terms(scope: str, runs: dict[str, Any], varied: list[str], base: dict[str, int]) -> list[list[Any]]:
    sizes = runs["base"][1][scope]
    out: list[list[Any]] = []
    for j, (n, region) in enumerate(sizes):
        other = {s: runs[s][1][scope][j][0] for s in varied if j < len(runs[s][1].get(scope, []))}
        exps = _exponents(n, other, f"saved {scope}")
        coef, e = _monomial(n, exps, base)
        out.append([round(coef, 6), e, activation_axis("block_forward", region)] if scope.startswith("block")
                   else [round(coef, 6), e])
    return out


BASE = {"B": 2, "S": 16, "H": 32, "NH": 4, "KV": 2, "F": 48, "V": 40}


TRACED_VERSIONS = {"transformers": "transformers==5.17.0", "torchtitan": "torchtitan==0.3.0 (pip --no-deps, plus "
                   "spmd_types, tyro, docstring_parser and triton, which its model modules import)",
                   "llmfoundry": "llm-foundry==0.22.0 (pip --no-deps, plus catalogue, einops and tabulate, which its "
                   "MPT modules import) and transformers==5.17.0"}
"""The traced code's package and how the shipped ledgers' version of it was installed."""


def code_package(framework: str) -> str:
    """The package whose code `framework` traces (the executor is axoplan's own; its ledger records transformers')."""
    return {"torchtitan": "torchtitan", "llm-foundry": "llmfoundry"}.get(framework, "transformers")


def code_version(framework: str) -> dict[str, str]:
    """The traced code's packages and versions (llm-foundry's MPT is a transformers ``PreTrainedModel``)."""
    from importlib.metadata import version

    package = code_package(framework)
    distributions = {"llmfoundry": ("llm-foundry", "transformers")}.get(package, (package,))
    return {d: version(d) for d in distributions}


TRACED = {
    "torchtitan": "torchtitan 0.3.0's own Llama 3 modules (torchtitan/models/llama3, models/common) and FSDP2's own "
                  "copy ops (torch.ops.fsdp); stand-ins: SDPA for its flex/varlen attention, unfused QKVLinear for "
                  "the fused wqkv, one op each way for CUDA's fused RMSNorm (derive_ledger.build_torchtitan)",
    "llm-foundry": "llm-foundry 0.22.0's own MPT modules (llmfoundry/models/mpt/modeling_mpt.py, models/layers), "
                   "imported without the package __init__ (Composer's two imported names stubbed, never called); "
                   "stand-ins: SDPA for its Triton/flash attention, one op each way for flash-attn's fused "
                   "cross-entropy (derive_ledger.build_mpt)",
}
"""What a trace ran of the framework's own code, and what stood in for kernels that do not run on a CPU."""

ATTENTION = {"torchtitan": "flash", "llm-foundry": "run"}
"""The attention kernel a framework's code runs, where it is not SDPA's pick on the device (``Ledger.attention``):
torchtitan's FlexAttention has no measured curve of its own and takes FlashAttention-2's (its paper: 90 % of
FlashAttention-2 forward, 85 % backward [assumed]); llm-foundry takes it from the run (``attn_config.attn_impl``:
``flash`` or ``triton``, the run's ``--attention``)."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", required=True, choices=["gpt2", "llama", "gpt-neox", "mixtral", "mpt"])
    ap.add_argument("--precision", default="autocast", choices=["autocast", "bf16", "fp32"],
                    help="autocast: fp32 weights under bf16 autocast (Trainer(bf16=True)); "
                    "bf16: bf16 weights and states; fp32: float32 throughout (the executor on a CPU)")
    ap.add_argument("--framework", default="hf", choices=["hf", "executor", "torchtitan", "llm-foundry"],
                    help="hf: Hugging Face transformers' model; executor: axoplan's own (axoplan/executor); "
                    "torchtitan: its Llama 3 under FSDP2 mixed precision (--family llama --precision bf16); "
                    "llm-foundry: its MPT under Composer's FSDP, PURE bf16 (--family mpt --precision bf16)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.framework == "torchtitan" and (args.family, args.precision) != ("llama", "bf16"):
        raise SystemExit("--framework torchtitan traces its Llama 3 with bf16 compute: --family llama --precision bf16")
    if args.framework == "llm-foundry" and (args.family, args.precision) != ("mpt", "bf16"):
        raise SystemExit("--framework llm-foundry traces its MPT in bf16 (FSDP PURE): --family mpt --precision bf16")
    if args.family == "mpt" and args.framework != "llm-foundry":
        raise SystemExit("--family mpt is llm-foundry's model: --framework llm-foundry")
    package = code_package(args.framework)
    if importlib.util.find_spec(package) is None:
        raise SystemExit(f"--framework {args.framework} traces {package}'s own code, which is not installed here: "
                         f"install {TRACED_VERSIONS[package]} in a development venv (never a dependency of axoplan)")

    base = dict(BASE)
    if args.family not in ("llama", "mixtral"):
        base["KV"] = base["NH"]
    else:  # two query heads per KV head at every doubling (one would change the executor's op list)
        base.update(NH=8, H=64)
    if args.family == "gpt-neox":  # rotary on a quarter of each head: whole even dimensions at every doubling
        base.update(H=64)
    ledger = derive(args.family, args.precision, base, args.framework)
    if args.precision == "fp32" and args.framework != "executor":
        raise SystemExit("--precision fp32 is the executor's CPU dtype; Hugging Face steps are autocast or bf16")
    name = {"executor": "executor" + ("-fp32" if args.precision == "fp32" else ""), "torchtitan": "torchtitan",
            "llm-foundry": "llm-foundry"}.get(args.framework, f"hf-{args.precision}")
    doc = {
        "profile": name, "family": args.family,
        "made_by": "python benchmarks/derive_ledger.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "versions": {"torch": torch.__version__, **code_version(args.framework)},
        **({"traced": TRACED[args.framework]} if args.framework in TRACED else {}),
        **({"attention": ATTENTION[args.framework]} if args.framework in ATTENTION else {}),
        "symbols": {"B": "micro-batch sequences", "S": "sequence length", "H": "hidden size", "NH": "attention heads",
                    "KV": "key-value heads", "F": "FFN width", "V": "vocabulary"},
        "base_dims": base,
        **({"moe": {"experts": EXPERTS, "top_k": TOP_K}} if args.family == "mixtral" else {}),
        **ledger,
    }
    ledgers = Path(__file__).resolve().parents[1] / "frameworks" / "ledgers"
    out = args.out or ledgers / f"{name}-{args.family}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    n = sum(e["count"] for ops in ledger["scopes"].values() for e in ops)
    print(f"wrote {out}: {n} ops in {len(ledger['scopes'])} scopes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
