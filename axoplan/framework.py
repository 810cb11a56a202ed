"""Framework profiles: what one transformer block costs the host and the device in kernel launches.

An eager framework (PyTorch without graphs) issues every operation from Python: the host
spends ``host.op_us`` (machine YAML) per op and ``host.launch_us`` per kernel it launches,
so a micro-batch never takes less than ``ops × op_us + kernels × launch_us`` however small
its kernels are, and every kernel costs the device ``device.kernel_gap_us`` besides its work.
A profile's ``host_ops`` are op-equivalents: the framework's host time in units of one op of
`axoplan probe`'s chain on the same core, measured by replaying the framework's Python
(``benchmarks/host_replay.py``) or, where no replay exists, counted from its code (which
misses module calls, Python autograd functions and other host work that is not an op).
How many ops and kernels one block issues depends on the framework (which ops it fuses,
whether it checkpoints), not on the machine: a profile in ``frameworks/<name>.yaml`` gives
the counts, each line with where it was counted or measured. A run's framework is a run
option (``RunOptions.framework``); the measured-run CSV names it in a ``framework`` column.

    >>> load_framework("megatron-deepspeed").block.forward.kernels
    10
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from pydantic import Field, NonNegativeInt, ValidationError

from axoplan.errors import AxoplanError, closest_hint
from axoplan.schema import Frozen, describe_validation_error, load_yaml_mapping

__all__ = ["PhaseCounts", "BlockCounts", "FrameworkProfile", "load_framework", "shipped_frameworks",
           "frameworks_dir", "DEFAULT_FRAMEWORK"]

DEFAULT_FRAMEWORK = "axonn"
"""The framework `rank` plans for: Megatron-AxoNN (AxoNN's own training code)."""


class PhaseCounts(Frozen):
    """One block's work in one phase for one micro-batch, collectives excluded (they are
    counted from the cost model's collective calls)."""

    host_ops: NonNegativeInt = Field(description="Host work in op-equivalents (each costs host.op_us): measured "
                                     "by a replay, or counted ops.")
    kernels: NonNegativeInt = Field(description="Device kernels launched that are not GEMMs or attention "
                                    "(each costs device.kernel_gap_us on the device).")
    gemm_kernels: NonNegativeInt = Field(description="GEMM and attention kernels launched (their time is "
                                         "modelled from flops; counted here for their launch gap).")


class BlockCounts(Frozen):
    """Per block and micro-batch: forward (again under recompute), backward, and the extra host
    bookkeeping a recomputed block costs (checkpoint function, RNG state save and restore)."""

    forward: PhaseCounts
    backward: PhaseCounts
    recompute_extra_host_ops: NonNegativeInt = 0


class FrameworkProfile(Frozen):
    """A training framework as the cost model needs it (see the module docstring)."""

    name: str
    description: str = ""
    block: BlockCounts
    head: BlockCounts = Field(description="The final norm, LM head and vocabulary-parallel loss, per micro-batch.")
    grad_reduce_overlaps_backward: bool = Field(
        False, description="true: the data-parallel gradient all-reduce is bucketed per layer and launched during "
        "the last micro-batch's backward (DDP-style), so each layer's bucket hides behind the next layer's "
        "backward; false: it runs after the backward, exposed (AxoNN's sync_gradients, Megatron-DeepSpeed without "
        "gradient buckets).")

    @property
    def kernels_per_block(self) -> tuple[int, int]:
        """All kernels of one block's (forward, backward)."""
        f, b = self.block.forward, self.block.backward
        return f.kernels + f.gemm_kernels, b.kernels + b.gemm_kernels


def frameworks_dir() -> Path:
    """Folder of shipped framework profiles (inside the wheel, or the source checkout)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "frameworks", here.parent / "frameworks"):
        if candidate.is_dir():
            return candidate
    raise AxoplanError("the shipped frameworks/ folder is missing; reinstall axoplan")


def shipped_frameworks() -> list[str]:
    """Names of the framework profiles that ship with axoplan."""
    return sorted(p.stem for p in frameworks_dir().glob("*.yaml"))


@cache
def load_framework(name: str) -> FrameworkProfile:
    """The shipped profile `name` (profiles are immutable data, so one load per process)."""
    path = frameworks_dir() / f"{name}.yaml"
    if not path.is_file():
        known = shipped_frameworks()
        raise AxoplanError(f"unknown framework {name!r}{closest_hint(name, known)}; known: {', '.join(known)}")
    try:
        return FrameworkProfile.model_validate(load_yaml_mapping(path))
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, str(path), FrameworkProfile)) from None
