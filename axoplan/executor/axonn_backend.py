"""Optional AxoNN 0.2.0 backend: the plan drives ``axonn.init`` and AxoNN's expert-mode linears.

    pip install 'axoplan[axonn]'            # axonn==0.2.0 (pure Python; needs torch and numpy)
    torchrun --nproc-per-node 8 -m axoplan run plan.json --engine axonn

What it maps (``executor.md`` §1, §6):

* ``axonn.init(**plan.axonn_init, gpus_per_node=...)``: Gx -> ``G_intra_c`` (inner,
  column), Gy -> ``G_intra_r`` (outer, row), Gz -> ``G_intra_d`` (depth), Gdata -> ``G_data``,
  ``G_inter = 1``. AxoNN's groups are then checked member by member against
  ``Layout.groups`` (the same rank order as the DeviceMesh of the native engine).
* The four block linears become ``axonn.intra_layer.Linear(..., transpose=...,
  expert_mode=True, bias=False)`` (expert mode only: AxoNN 0.2.0's automatic mode gets
  bias gradients wrong when Gx·Gy > 1); the biases, LayerNorms, attention, embedding, LM
  head, loss and gradient reductions stay axoplan's.
* The plan's OAR / ORS / OAG flags become ``optimize_communication(...)`` around each
  micro-batch, weight caching becomes ``cache_weights_in_all_gather``, and a recomputed
  block runs inside ``overlap_all_gathers_for_checkpointed_forward``.

AxoNN 0.2.0 needs CUDA and NCCL (hard-coded ``torch.cuda`` calls and ``backend="nccl"``);
on CPU only the argument mapping and the groups are tested, through a shim in the tests.
AxoNN's own GEMMs and collectives are not seen by axoplan's phase timers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from axoplan.errors import AxoplanError
from axoplan.inputs.model import layer_axes
from axoplan.records.plan import LaunchConfig
from axoplan.space.layout import Layout

__all__ = ["axonn_init_kwargs", "init_axonn", "axonn_groups", "check_axonn_groups", "axonn_linear_class",
           "micro_batch_context", "recompute_context"]

# AxoNN's name for each axis's group in its communication handle
_GROUP_ATTR = {"x": "inner_intra_layer_parallel_group", "y": "outer_intra_layer_parallel_group",
               "z": "depth_intra_layer_parallel_group", "data": "data_parallel_group"}


def _axonn() -> Any:
    try:
        import axonn
        import axonn.intra_layer
    except ImportError as exc:
        raise AxoplanError(f"--engine axonn needs AxoNN 0.2.0 ({exc}); install it with "
                           f"pip install 'axoplan[axonn]'") from None
    return axonn


def axonn_init_kwargs(plan: LaunchConfig, gpus_per_node: int | None = None) -> dict[str, int]:
    """Keyword arguments of ``axonn.init`` for `plan` (the layout's map, plus GPUs per node)."""
    return {**plan.layout.to_layout().to_axonn_init(), "gpus_per_node": gpus_per_node or plan.devices_per_node}


def init_axonn(plan: LaunchConfig, gpus_per_node: int | None = None) -> None:
    """``axonn.init`` on an initialised default process group, then check its groups."""
    from axonn import axonn as ax

    _axonn()
    ax.init(**axonn_init_kwargs(plan, gpus_per_node))
    check_axonn_groups(plan.layout.to_layout())


def axonn_groups() -> dict[str, list[int]]:
    """Members of this rank's AxoNN group along each axis."""
    from axonn import axonn as ax

    return {axis: dist.get_process_group_ranks(getattr(ax.comm_handle, attr)) for axis, attr in _GROUP_ATTR.items()}


def check_axonn_groups(layout: Layout) -> dict[str, list[int]]:
    """AxoNN's groups must be the planner's (``Layout.groups``); returns them."""
    got = axonn_groups()
    rank = dist.get_rank()
    for axis, members in got.items():
        want = next([int(r) for r in row] for row in layout.groups(axis) if rank in row)
        if sorted(members) != want:
            raise RuntimeError(f"AxoNN's {axis} group of rank {rank} is {members}, the planner's is {want}")
    return got


def axonn_linear_class() -> type:
    """A subclass of AxoNN's Linear that takes axoplan's shard (so AxoNN's OAG finds it)."""
    linear = _axonn().intra_layer.Linear

    class AxonnLinear4D(linear):  # type: ignore[misc, valid-type]
        def __init__(self, name: str, k_in: int, n_out: int, transposed: bool, rt: Any, shard: torch.Tensor,
                     cache: bool = False) -> None:
            super().__init__(k_in, n_out, transpose=transposed, bias=False, expert_mode=True,
                             init_method=torch.nn.init.zeros_)
            self.name, self.transposed, self.rt, self.cache = name, transposed, rt, cache
            self.in_axis, self.out_axis = layer_axes(transposed)
            self.k_loc, self.n_loc = self.local_in_features, self.local_out_features
            if shard.numel() != self.weight.numel():
                raise ValueError(f"{name}: axoplan's shard has {shard.numel()} elements, AxoNN's "
                                 f"{self.weight.numel()}")
            self.weight.data = shard.clone()  # same Parameter object: AxoNN's attributes stay

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x, cache_weights_in_all_gather=self.cache)

    return AxonnLinear4D


def micro_batch_context(plan: LaunchConfig, model: torch.nn.Module) -> Callable[[], Any]:
    """``optimize_communication`` with the plan's overlap flags, for one micro-batch."""
    opts = plan.options
    optimize = _axonn().intra_layer.optimize_communication
    return lambda: optimize(overlap_all_reduce=opts.overlap_all_reduce,
                            overlap_reduce_scatter=opts.overlap_reduce_scatter,
                            overlap_all_gather=opts.overlap_all_gather,
                            model_object_for_overlapping_allgathers=model)


def recompute_context(plan: LaunchConfig, model: torch.nn.Module) -> Callable[[], Any]:
    """AxoNN's all-gather prefetch for a recomputed block (a no-op without OAG)."""
    if not plan.options.overlap_all_gather:
        return contextlib.nullcontext
    overlap = _axonn().intra_layer.overlap_all_gathers_for_checkpointed_forward
    return lambda: overlap(model)
