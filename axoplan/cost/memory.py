"""Memory per GPU: weights, gradients, optimizer state, gathered buffers, activations.

Bytes per parameter of the local shard: 2 (bf16 weight) + 4 (fp32 gradient) + 12
(fp32 master weight and Adam's two moments) — mixed-precision Adam as in ZeRO
(Rajbhandari et al., SC'20, §3.1), with gradients accumulated in fp32.
Activations per layer and micro-batch follow Korthikanti et al. (2022, eq. 2) with flash
attention (no ``5·a·S²`` term): ``tokens·H·(10 + 24)`` bytes, where the 10 (residual,
norms) are split over X in the 4D layout and the 24 (QKV, attention, MLP) over Y;
the MLP share scales with ``F / 4H``. Under full recompute only each block's input is
kept, plus one block's working set during its recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from axoplan.candidates import Candidates
from axoplan.model import ModelSpec
from axoplan.options import RunOptions

__all__ = ["MemoryBreakdown", "memory_per_gpu"]

Floats = npt.NDArray[np.float64]

BYTES_WEIGHT = 2.0
BYTES_GRAD = 4.0
BYTES_OPTIMIZER = 12.0


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes per GPU, per category, for every candidate."""

    weights: Floats
    gradients: Floats
    optimizer: Floats
    gathered: Floats
    activations: Floats
    logits: Floats

    @property
    def total(self) -> Floats:
        return self.weights + self.gradients + self.optimizer + self.gathered + self.activations + self.logits

    def as_columns(self) -> dict[str, Floats]:
        return {f"mem_{k}_bytes": getattr(self, k) for k in self.__slots__} | {"mem_total_bytes": self.total}


def padded_vocab(model: ModelSpec, c: Candidates) -> Floats:
    """Vocabulary padded to a multiple of Gx·Gy, as Megatron pads for tensor parallelism."""
    g = (c.gx * c.gy).astype(np.float64)
    return np.ceil(model.vocab / g) * g


def sharded_params(model: ModelSpec, c: Candidates) -> Floats:
    """Parameters in the 4D-sharded shard of one GPU (blocks, LM head, embeddings)."""
    gxy, gz = (c.gx * c.gy).astype(np.float64), c.gz.astype(np.float64)
    blocks = sum(np.ceil(lin.num_params / gxy / gz) for lin in model.block_linears())
    vocab = padded_vocab(model, c)
    heads = 1 if model.tied_embeddings else 2
    embed = np.ceil(heads * vocab * model.hidden / gxy / gz)
    positions = np.ceil(model.max_positions * model.hidden / gxy / gz)
    return model.num_layers * blocks + embed + positions


def replicated_params(model: ModelSpec) -> float:
    """Norms and biases: whole on every GPU."""
    final_norm = model.hidden * (2 if model.biases else 1)
    return float(model.num_layers * model.unsharded_params_per_block() + final_norm)


def memory_per_gpu(model: ModelSpec, options: RunOptions, c: Candidates) -> MemoryBreakdown:
    """Peak memory estimate per GPU for every candidate."""
    params = sharded_params(model, c) + replicated_params(model)
    tokens = (c.micro_batch * options.seq_len).astype(np.float64)
    gx, gy = c.gx.astype(np.float64), c.gy.astype(np.float64)
    return MemoryBreakdown(
        weights=BYTES_WEIGHT * params,
        gradients=BYTES_GRAD * params,
        optimizer=BYTES_OPTIMIZER * params,
        gathered=_gathered_bytes(model, options, c),
        activations=_activation_bytes(model, c, tokens, gx, gy),
        logits=tokens * padded_vocab(model, c) / gy * (2.0 + 4.0),
    )


def _gathered_bytes(model: ModelSpec, options: RunOptions, c: Candidates) -> Floats:
    """Z-gathered weight blocks alive at once, plus one full-block gradient for the reduce-scatter."""
    gxy = (c.gx * c.gy).astype(np.float64)
    blocks = np.array([lin.num_params for lin in model.block_linears()], dtype=np.float64)
    largest = blocks.max() / gxy * BYTES_WEIGHT
    depth = 2.0 if options.overlap_all_gather else 1.0  # current layer + one prefetched
    cached = model.num_layers * blocks.sum() / gxy * BYTES_WEIGHT
    gathered = np.where(c.cache_weights, cached + largest, depth * largest)
    return np.where(c.gz > 1, gathered + largest, 0.0)


def _activation_bytes(model: ModelSpec, c: Candidates, tokens: Floats, gx: Floats, gy: Floats) -> Floats:
    mlp_scale = model.ffn / (4.0 * model.hidden)
    per_layer = tokens * model.hidden * (10.0 / gx + (5.0 + 19.0 * mlp_scale) / gy)
    checkpoint = tokens * model.hidden / gx * BYTES_WEIGHT
    full = model.num_layers * per_layer
    recomputed = model.num_layers * checkpoint + per_layer
    return np.where(c.recompute, recomputed, full)
