"""Model and hardware flops per optimizer step (Narayanan et al., SC'21, §5.1).

Model flops: ``6 · params_in_GEMMs · tokens + 12 · L · S · H · tokens`` (three passes
of every GEMM; attention scores and values, ``4·S·H`` per token per layer forward).
Hardware flops add the recomputed forward under full activation recompute (the
96-coefficient count of Megatron-AxoNN ``get_flops``, versus the 72 of model flops).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from axoplan.model import ModelSpec
from axoplan.options import RunOptions

__all__ = ["model_flops", "hardware_flops"]


def _gemm_params(model: ModelSpec) -> int:
    per_block = sum(lin.num_params for lin in model.block_linears())
    return model.num_layers * per_block + model.vocab * model.hidden


def model_flops(model: ModelSpec, options: RunOptions) -> float:
    """Flops one step must do, whatever the layout."""
    attention = 12.0 * model.num_layers * options.seq_len * model.hidden
    return options.tokens * (6.0 * _gemm_params(model) + attention)


def hardware_flops(
    model: ModelSpec, options: RunOptions, recompute: npt.NDArray[np.bool_]
) -> npt.NDArray[np.float64]:
    """Flops actually executed: model flops plus one more forward of the blocks if recomputing."""
    per_block = sum(lin.num_params for lin in model.block_linears())
    extra = options.tokens * model.num_layers * (2.0 * per_block + 4.0 * options.seq_len * model.hidden)
    return model_flops(model, options) + np.where(recompute, extra, 0.0)
