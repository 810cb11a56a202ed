"""The ledger tracer's llm-foundry step (``benchmarks/derive_ledger.py --framework llm-foundry``): llm-foundry
0.22.0's own MPT modules as Composer's FSDP runs them (PURE bf16), on CPU, with the stand-ins stated on
:func:`build_mpt` and :func:`_fused_cross_entropy_function`."""

from __future__ import annotations

import sys
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import torch

from .autocast import cuda_autocast_on_cpu
from .recorder import Recorder, saved_bytes


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


_LIBS: list[Any] = []
"""The library of the stand-in ops, kept alive (its ops go when it is collected)."""


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
