"""The reference path is the model ``reference.py`` describes, checked against a forward written out here with plain
tensor ops (issue 32 item 4). The reference now shares its block and forward with the sharded paths
(``model.GPT``), so the equality tests check the sharding; this test keeps the block's arithmetic checked on its
own: pre-norm blocks, grouped QKV rows ``[q heads of the group; k; v]`` per KV head, causal softmax attention,
GeLU or SwiGLU over interleaved gate/up rows, residuals, final norm, tied or untied head, mean cross-entropy.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from axoplan.executor.reference import full_state, reference_model
from axoplan.inputs.model import ModelSpec

SPECS = [
    ModelSpec(num_layers=2, hidden=32, num_heads=4, vocab=64, max_positions=16),
    ModelSpec(num_layers=2, hidden=32, num_heads=4, num_kv_heads=2, ffn_kind="swiglu", ffn_hidden=48, biases=False,
              tied_embeddings=False, vocab=64),
]


def _norm(x: torch.Tensor, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + 1e-5) * p[f"{name}.weight"]
    return y + p[f"{name}.bias"] if f"{name}.bias" in p else y


def _linear(x: torch.Tensor, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    y = x @ p[f"{name}.weight"].T
    return y + p[f"{name}.bias"] if f"{name}.bias" in p else y


def _attention(qkv: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    b, s, _ = qkv.shape
    kv, d = spec.kv_heads, spec.head_dim
    g = spec.num_heads // kv
    t = qkv.view(b, s, kv, g + 2, d)
    q, k, v = t[:, :, :, :g], t[:, :, :, g], t[:, :, :, g + 1]
    scores = torch.einsum("bskgd,btkd->bkgst", q, k) / math.sqrt(d)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    return torch.einsum("bkgst,btkd->bskgd", weights, v).reshape(b, s, kv * g * d)


def _plain_loss(spec: ModelSpec, p: dict[str, torch.Tensor], ids: torch.Tensor, targets: torch.Tensor) -> float:
    s = ids.shape[1]
    h = (p["lm_head.weight"] if spec.tied_embeddings else p["embed.weight"])[ids]
    if spec.max_positions:
        h = h + p["pos.weight"][:s]
    for i in range(spec.num_layers):
        pre = f"blocks.{i}"
        h = h + _linear(_attention(_linear(_norm(h, p, f"{pre}.ln1"), p, f"{pre}.qkv"), spec), p, f"{pre}.attn_out")
        u = _linear(_norm(h, p, f"{pre}.ln2"), p, f"{pre}.mlp_up")
        gelu = 0.5 * u * (1 + torch.erf(u / 2**0.5))
        act = F.silu(u[..., 0::2]) * u[..., 1::2] if spec.ffn_kind == "swiglu" else gelu
        h = h + _linear(act, p, f"{pre}.mlp_down")
    logits = _norm(h, p, "ln_f") @ p["lm_head.weight"].T
    logp = logits.log_softmax(-1)
    return float(-logp.gather(-1, targets[..., None]).mean())


@pytest.mark.parametrize("spec", SPECS)
def test_the_reference_is_the_model_written_out(spec: ModelSpec) -> None:
    params = full_state(spec, 64, seed=5, std=0.3)  # weights large enough that every non-linearity bends
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = reference_model(spec, 64, {k: v.clone() for k, v in params.items()})(ids[:, :-1], ids[:, 1:]).item()
        want = _plain_loss(spec, params, ids[:, :-1], ids[:, 1:])
    assert got == pytest.approx(want, rel=1e-5)
    assert abs(want - math.log(64)) > 1e-3  # not the uniform loss a dead network would give
