"""What reduces each parameter's gradient: one tag, set on the parameter when its path makes it.

AxoNN marks its weights the same way (``intra_layer/fully_connected.py``: ``is_tensor_parallel``,
``needs_depth_parallel_gradient_sync``, set on the ``Parameter``), so whatever reduces or saves gradients
asks the parameter, not its module's class or its name. A tag says:

* `name`: the parameter's name in the reference model and in every state dict (``reference.param_shapes``),
  whatever module holds it (AxoNN's ``Linear`` holds its own weight);
* `over`: the axes its gradient is summed over, in order: a 4D shard ``("z", "data")`` (its layer
  reduce-scatters over Z, the step all-reduces over data), a native-MoE expert shard ``("z_fsdp", "data")``,
  a whole parameter (norms, biases, positions, the router, the hf path's token table) ``("world",)``;
* `redundant`: for a whole parameter, the axes along which its gradient is a repeated copy (the step counts
  only the member at coordinate 0 of each: ``Groups.is_owner``).

``train.sync_gradients`` reduces by the tags' last axis, the snapshot and the checkpoint key by their names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from torch import nn

__all__ = ["Reduction", "tag", "tagged"]

_ATTR = "axoplan_reduction"


@dataclass(frozen=True)
class Reduction:
    """What reduces one parameter's gradient (module docstring)."""

    name: str
    over: tuple[str, ...]
    redundant: tuple[str, ...] = ()

    @property
    def step_axis(self) -> str:
        """The axis the training step reduces it over (the layer's own reductions come before)."""
        return self.over[-1]


def tag(param: nn.Parameter, reduction: Reduction) -> nn.Parameter:
    """Mark `param` with `reduction`; returns it."""
    setattr(param, _ATTR, reduction)
    return param


def tagged(model: nn.Module) -> Iterator[tuple[Reduction, nn.Parameter]]:
    """Every parameter of `model` with its tag, in ``model.parameters()`` order."""
    for name, param in model.named_parameters():
        reduction = getattr(param, _ATTR, None)
        if reduction is None:
            raise RuntimeError(f"parameter {name} has no reduction tag (made outside its path)")
        yield reduction, param
