"""Model and hardware flops per optimizer step, and the conventions behind MFU and HFU.

**Model flops** (MFU's numerator): ``6 · params_in_GEMMs · tokens + 12 · L · S · H · tokens``:
three passes of every GEMM, and attention's scores and values at ``4·S·H`` per token and layer
forward as if no mask skipped anything, without recompute (Narayanan et al., SC'21, §5.1). This
is Megatron-LM's, llm-foundry's (its ``mfu``: ``3·flops_per_seq + 3·attn_flops_per_seq``) and
torchtitan's count (``6·N + 12·L·H·Q·T`` per token), so axoplan's MFU compares with theirs; it
counts the GEMM parameters (blocks and the LM head), not norms, biases or position embeddings
(llm-foundry's ``n_params`` counts all, a difference under 1 % for these models); a mixture of experts counts
the parameters a token runs through (its ``top_k`` experts). MaxText's count
halves causal attention, so its MFU reads lower than these for the same run.

**Hardware flops** (HFU's numerator, ``pct_peak``): the flops the kernels execute. GEMMs three
times, and the forward again under full recompute; fused attention on the causal tiles the
kernel computes (``axoplan.cost.attention.causal_fraction``) forward, 2.5 times that backward
(FlashAttention recomputes the scores), and the forward again under recompute; unfused attention
on every score, twice forward's work backward.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from axoplan.cost.attention import BACKWARD_FLOPS_RATIO, causal_fraction
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions

__all__ = ["model_flops", "hardware_flops"]


def _active_block_params(model: ModelSpec) -> float:
    """GEMM parameters of one block a token runs through: a mixture of experts' ``top_k`` experts, not all
    ``E`` (Mixtral's "active parameters"); every linear of a dense block."""
    return sum(lin.num_params * lin.token_share for lin in model.block_linears())


def _gemm_params(model: ModelSpec) -> float:
    return model.num_layers * _active_block_params(model) + model.vocab * model.hidden


def model_flops(model: ModelSpec, options: RunOptions) -> float:
    """Flops one step must do, whatever the layout."""
    attention = 12.0 * model.num_layers * options.seq_len * model.attention_width  # H unless a config's head_dim
    return options.tokens * (6.0 * _gemm_params(model) + attention)


def hardware_flops(
    model: ModelSpec, options: RunOptions, recompute: npt.NDArray[np.bool_],
    recompute_share: tuple[float, float] = (1.0, 1.0),
) -> npt.NDArray[np.float64]:
    """Flops the kernels execute in one step (the module docstring's count). `recompute_share`: the shares of a
    block's forward GEMM and attention flops a recompute reruns (full recompute: all of both; a selective policy
    traced in the framework's ledger: ``axoplan.cost.ledger.Ledger.recompute_share``)."""
    per_block = _active_block_params(model)
    rec_gemm, rec_attention = (recompute.astype(np.float64) * share for share in recompute_share)
    gemm = options.tokens * (6.0 * _gemm_params(model) + rec_gemm * 2.0 * model.num_layers * per_block)
    attention_fwd = 4.0 * options.tokens * model.num_layers * options.seq_len * model.attention_width
    if options.attention == "unfused":
        attention = attention_fwd * (3.0 + rec_attention)
    else:
        attention = attention_fwd * causal_fraction(options.seq_len) * (1.0 + BACKWARD_FLOPS_RATIO + rec_attention)
    return gemm + attention
