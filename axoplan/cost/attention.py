"""The attention core's time: fused (flash) kernels from their flops, unfused ones from GEMMs and HBM traffic.

**Fused attention** (``--attention flash``: FlashAttention-2; ``flash-triton``: the Triton
FlashAttention kernel) computes ``Q·Kᵀ`` and ``P·V`` tile by tile without writing the scores:
``4·S²·d`` flops per head and sequence in the forward, ``2.5×`` that in the backward (five
matmuls instead of two, ``S`` recomputed: Dao, "FlashAttention-2", 2023, §4.1). Under a
causal mask the kernels skip the tiles above the diagonal and compute the diagonal ones in
full: with ``n = ⌈S/B⌉`` row blocks of ``B = 128`` queries, ``n(n+1)/2`` of the ``n²`` tiles,
a fraction ``(n+1)/(2n)`` (½ for long sequences; FlashAttention's own benchmark counts ½,
``benchmarks/benchmark_flash_attention.py``). Time is those flops at the machine's fraction of
peak for the kernel (``attention_efficiency``, ``attention_triton_efficiency``).

**Unfused attention** (``--attention unfused``, Megatron's ``ParallelAttention`` without
flash) runs the score GEMMs through the tile model and streams every score through HBM; it
computes the masked half too.

Heads are split over Y, so the attention core of a micro-batch is ``mbs·heads/Gy`` heads of
``S`` tokens, repeated by the Gx members of an X group (``docs/algorithm.md`` §1).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from axoplan.cost.compute import gemm_s, memory_bound_s
from axoplan.inputs.machine import Machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates

__all__ = ["CAUSAL_BLOCK", "BACKWARD_FLOPS_RATIO", "causal_fraction", "fused_forward_flops", "fused_attention_s",
           "unfused_attention_s", "attention_s"]

Floats = npt.NDArray[np.float64]

CAUSAL_BLOCK = 128
"""Query rows per tile of FlashAttention-2's forward kernel on A100 and H100 (kBlockM = 128 for head
dimensions up to 128, ``flash_fwd_launch_template.h``) and of the Triton kernel (BLOCK_M = 128)."""

BACKWARD_FLOPS_RATIO = 2.5
"""Backward flops over forward flops of a fused attention kernel (FlashAttention-2 paper, §4.1)."""

UNFUSED_FWD_BYTES_PER_SCORE = 9.0  # softmax read + write, dropout read + write + mask [code Megatron-DeepSpeed]
UNFUSED_BWD_BYTES_PER_SCORE = 11.0  # dropout grad read + mask + write, softmax grad + output read + write


def causal_fraction(seq_len: int, block: int = CAUSAL_BLOCK) -> float:
    """Share of the ``S × S`` score tiles a causal fused kernel computes: ``(n+1)/(2n)``, ``n = ⌈S/block⌉``."""
    n = math.ceil(seq_len / block)
    return (n + 1) / (2 * n)


def fused_forward_flops(model: ModelSpec, options: RunOptions, c: Candidates) -> Floats:
    """Forward flops of one layer's fused attention per micro-batch on one GPU, as the kernel computes
    them under the causal mask: ``4·mbs·S²·H/Gy · (n+1)/(2n)``, H the heads' width (``ModelSpec.attention_width``)."""
    full = 4.0 * c.micro_batch * float(options.seq_len) ** 2 * model.attention_width / c.gy.astype(np.float64)
    return full * causal_fraction(options.seq_len)


def attention_s(machine: Machine, flops: Floats, kernel: str = "flash") -> Floats:
    """Seconds for fused-attention work of `flops` on one device with `kernel` (flash or flash-triton)."""
    eff = machine.attention_efficiency
    if kernel == "flash-triton" and machine.attention_triton_efficiency is not None:
        eff = machine.attention_triton_efficiency
    return flops / (machine.peak_flops * eff)


def fused_attention_s(model: ModelSpec, machine: Machine, options: RunOptions, c: Candidates) -> tuple[Floats, Floats]:
    """Forward and backward seconds of one layer's fused attention per micro-batch."""
    flops = fused_forward_flops(model, options, c)
    fwd = attention_s(machine, flops, options.attention)
    return fwd, BACKWARD_FLOPS_RATIO * fwd


def unfused_attention_s(
    model: ModelSpec, machine: Machine, options: RunOptions, c: Candidates
) -> tuple[Floats, Floats]:
    """Forward and backward seconds of unfused attention (Megatron's ``ParallelAttention``
    without flash, as in Megatron-DeepSpeed's ``transformer.py``): batched GEMMs over the
    ``b = mbs·heads/Gy`` heads, ``Q·Kᵀ`` (``[S×d]·[d×S]``, a baddbmm) and ``P·V`` (``[S×S]·[S×d]``),
    through the tile model; the backward runs four: ``dP = dO·Vᵀ`` and ``dS·K``, ``dSᵀ·Q``, ``Pᵀ·dO``.
    Between them, per score element (bf16, 2 bytes; the dropout mask 1 byte): the fused
    scale-mask-softmax reads and writes it (4 B) and dropout reads, writes and stores its mask
    (5 B) in the forward; in the backward dropout reads the gradient and mask and writes (5 B)
    and softmax reads the gradient and its output and writes (6 B)."""
    heads = c.micro_batch * (model.num_heads / c.gy.astype(np.float64))
    s, d = float(options.seq_len), float(model.head_dim)
    rows = heads * s  # the batch of S-row matrices stacked: the same tiles as `heads` separate GEMMs
    scores_qk = gemm_s(machine, rows, np.full_like(rows, s), np.full_like(rows, d))
    context = gemm_s(machine, rows, np.full_like(rows, d), np.full_like(rows, s))
    scores = heads * s * s
    fwd = scores_qk + context + memory_bound_s(machine, scores * UNFUSED_FWD_BYTES_PER_SCORE)
    bwd = scores_qk + 3.0 * context + memory_bound_s(machine, scores * UNFUSED_BWD_BYTES_PER_SCORE)
    return fwd, bwd
