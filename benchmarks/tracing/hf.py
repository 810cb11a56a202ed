"""The ledger tracer's Hugging Face step (``benchmarks/derive_ledger.py --framework hf``, ``docs/algorithm.md`` §4e).

Builds a tiny model of the family with Hugging Face transformers (fp32 weights, or bf16 weights with
``--precision bf16``), runs one training step as ``Trainer(bf16=True)`` runs it: forward under
``torch.autocast(bfloat16)``, the loss of ``labels=input_ids``, backward, fused AdamW, zero_grad; CUDA autocast
emulated on CPU (``tracing.autocast``), every op recorded (``tracing.recorder``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from .autocast import cuda_autocast_on_cpu
from .recorder import Recorder, saved_bytes


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
                             head_dim=dims.get("D", h // nh), intermediate_size=f, vocab_size=v,
                             max_position_embeddings=s, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                             pad_token_id=None)
        cls = tr.LlamaForCausalLM
    elif family == "gpt-neox":
        cfg = tr.GPTNeoXConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=nh, intermediate_size=f,
                               vocab_size=v, max_position_embeddings=s, rotary_pct=0.25, use_parallel_residual=True,
                               hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=0, eos_token_id=0)
        cls = tr.GPTNeoXForCausalLM
    elif family == "qwen3":  # Llama's block with RMSNorms on q and k per head, and heads of their own width
        cfg = tr.Qwen3Config(hidden_size=h, num_hidden_layers=1, num_attention_heads=nh, num_key_value_heads=kv,
                             head_dim=dims["D"], intermediate_size=f, vocab_size=v, max_position_embeddings=s,
                             tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=None)
        cls = tr.Qwen3ForCausalLM
    elif family == "qwen2":  # Llama's block with biases on the query, key and value projections (Qwen2Attention)
        cfg = tr.Qwen2Config(hidden_size=h, num_hidden_layers=1, num_attention_heads=nh, num_key_value_heads=kv,
                             intermediate_size=f, vocab_size=v, max_position_embeddings=s,
                             use_sliding_window=False, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                             pad_token_id=None)
        cls = tr.Qwen2ForCausalLM
    elif family == "qwen3-moe":  # Qwen3's attention; every block's MLP a top-k mixture of SwiGLU experts
        cfg = tr.Qwen3MoeConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=nh, num_key_value_heads=kv,
                                head_dim=dims["D"], intermediate_size=f, moe_intermediate_size=f,
                                num_experts=dims.get("E", EXPERTS), num_experts_per_tok=dims.get("K", TOP_K),
                                norm_topk_prob=True, decoder_sparse_step=1, output_router_logits=False,
                                vocab_size=v, max_position_embeddings=s, tie_word_embeddings=False, bos_token_id=0,
                                eos_token_id=0, pad_token_id=None)
        cls = tr.Qwen3MoeForCausalLM
    elif family == "qwen2-moe":  # Qwen2's attention; routed experts plus a gated shared expert SE expert widths wide
        cfg = tr.Qwen2MoeConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=nh, num_key_value_heads=kv,
                                intermediate_size=f, moe_intermediate_size=f,
                                shared_expert_intermediate_size=dims["SE"] * f, num_experts=dims.get("E", EXPERTS),
                                num_experts_per_tok=dims.get("K", TOP_K), norm_topk_prob=False, qkv_bias=True,
                                decoder_sparse_step=1, use_sliding_window=False, output_router_logits=False,
                                vocab_size=v, max_position_embeddings=s, tie_word_embeddings=False, bos_token_id=0,
                                eos_token_id=0, pad_token_id=None)
        cls = tr.Qwen2MoeForCausalLM
    elif family == "olmoe":  # RMSNorms on the whole query and key projections; every block a top-k mixture
        cfg = tr.OlmoeConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=nh, num_key_value_heads=kv,
                             intermediate_size=f, num_experts=dims.get("E", EXPERTS),
                             num_experts_per_tok=dims.get("K", TOP_K), norm_topk_prob=False, clip_qkv=None,
                             output_router_logits=False, vocab_size=v, max_position_embeddings=s,
                             tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=None)
        cls = tr.OlmoeForCausalLM
    elif family == "mixtral":
        cfg = tr.MixtralConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=nh, num_key_value_heads=kv,
                               intermediate_size=f, vocab_size=v, max_position_embeddings=s,
                               num_local_experts=dims.get("E", EXPERTS), num_experts_per_tok=dims.get("K", TOP_K),
                               tie_word_embeddings=False, router_aux_loss_coef=0.0,
                               output_router_logits=False, bos_token_id=0, eos_token_id=0, pad_token_id=None)
        cls = tr.MixtralForCausalLM
    else:
        raise SystemExit(f"unknown family {family!r}; known: gpt2, llama, qwen2, qwen3, gpt-neox, mixtral, qwen3-moe, "
                         "olmoe, qwen2-moe")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = cls(cfg)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    return model


GQA_FAMILIES = ("llama", "qwen2", "qwen3", "mixtral", "qwen3-moe", "olmoe", "qwen2-moe")
"""Families whose key-value heads are their own dimension (grouped-query attention)."""

HEAD_DIM_FAMILIES = ("llama", "qwen3", "qwen3-moe")
"""Families whose heads' width is a dimension of its own in transformers' code (``head_dim``, the ledger symbol
``D``), not always H/NH (Qwen3's, Mistral-Nemo's)."""

MOE_FAMILIES = ("mixtral", "qwen3-moe", "olmoe", "qwen2-moe")
"""Families whose MLP is a mixture of experts, traced with the experts and experts per token as symbols."""

SHARED_EXPERT_FAMILIES = ("qwen2-moe",)
"""Mixtures with a shared expert every token runs, its width a whole number of expert widths: a symbol (``SE``)."""

EXPERTS, TOP_K = 8, 2
"""Mixtral's experts and experts per token (Mixtral 8x7B and 8x22B; the 2026-11-26 Mixtral profile): the base the
mixture's ledger is traced at. Its op list does not change with them (transformers' grouped experts: one routing
pass and one grouped GEMM each way for all experts), so they are symbols of the fit, ``E`` and ``K``, like the
model's dimensions."""


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
            k = router.top_k
            t = torch.arange(logits.shape[0], device=logits.device)[:, None] * k + torch.arange(k)
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
