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

A profile also says how the framework holds memory (:class:`MemoryRules`: bytes per parameter
of each training state and whether data parallelism shards it, what a micro-batch keeps for the
backward, the loss's logits) and how it moves weights over Z (per linear layer as AxoNN, or per
wrapped block as FSDP). Every number names its source in the YAML.

    >>> load_framework("megatron-deepspeed").block.forward.kernels
    10
    >>> load_framework("pytorch-fsdp").memory.optimizer.bytes_per_param
    8.0
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from axoplan.errors import AxoplanError, closest_hint
from axoplan.inputs.schema import Frozen, describe_validation_error, load_yaml_mapping, shipped_folder

__all__ = ["PhaseCounts", "BlockCounts", "HostReplay", "StateBytes", "MemoryRules", "FrameworkProfile",
           "load_framework", "shipped_frameworks", "frameworks_dir", "DEFAULT_FRAMEWORK"]

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


class HostReplay(Frozen):
    """Host op-equivalents of one block per micro-batch (each costs ``host.op_us``), measured by replaying the
    framework's own Python on a CPU (``benchmarks/host_replay.py``). Where a ledger's profile gives them they price
    the host's time of the blocks in place of the ledger's count of dispatched aten ops, which leaves out what is
    not an op: module calls, Python autograd Functions, wrappers and hooks (docs/decisions.md, issue 29)."""

    forward: NonNegativeFloat = Field(description="One block's forward (again under recompute).")
    backward: NonNegativeFloat = Field(description="Its backward: autograd nodes, gradient accumulation, hooks.")
    recompute_extra: NonNegativeFloat = Field(
        0.0, description="What a recomputed block costs beyond a second forward (checkpoint function, RNG states).")


class StateBytes(Frozen):
    """One training state of a parameter: bytes per parameter of the GPU's 4D shard, and whether
    data parallelism shards it further (ZeRO stage 1, Megatron's distributed optimizer)."""

    bytes_per_param: NonNegativeFloat
    sharded_over_data: bool = False


class MemoryRules(Frozen):
    """How a framework holds memory on one GPU (``axoplan/cost/memory.py`` has the formulas).

    ``weights``, ``gradients`` and ``optimizer`` are the persistent states per parameter. A
    micro-batch keeps, per layer and token, ``8 + 2·dropout`` bytes per hidden unit outside
    the attention core and MLP (norm inputs and outputs, dropout masks: Korthikanti et al. 2022,
    eq. 2) and the Q/K/V, attention output and MLP activations; ``logits_bytes`` per logit
    while the loss runs; ``gathered_units`` Z-gathered weight units at once (the one in use
    and the prefetched one) plus one unit's full gradient before its reduce-scatter.
    """

    weights: StateBytes = Field(description="The weights the forward reads (bf16 copy, or the fp32 shard "
                                "FSDP casts from).")
    gradients: StateBytes = Field(description="Accumulated gradients.")
    optimizer: StateBytes = Field(description="fp32 master weights (where separate) and Adam's two moments.")
    shards_replicated_params: bool = Field(
        False, description="true: norms and biases are flattened into the sharded parameters (FSDP); false: every "
        "GPU holds them whole (AxoNN, Megatron).")
    dropout: bool = Field(True, description="Dropout after attention and MLP keeps a 1-byte mask per element.")
    logits_bytes: PositiveInt = Field(
        6, description="Bytes per logit alive at the loss's peak: bf16 logits plus the loss's copies.")
    loss_chunks: PositiveInt = Field(
        1, description="The loss runs over the sequence in this many chunks, each chunk's LM head, loss and backward "
        "before the next (torchtitan's ChunkedLossWrapper), so 1/chunks of the logits and of the loss's saved copies "
        "are alive at once.")
    gathered_units: PositiveInt = Field(
        2, description="Z-gathered weight units alive at once (the current one and one prefetched).")
    communicators: NonNegativeInt = Field(
        5, description="Collective communicators a rank keeps (each holds buffers, device.reserve).")
    embedding_gathered: bool = Field(
        False, description="true: the embeddings stay Z-gathered from forward to backward (FSDP's root unit).")
    tied_head_kept: bool = Field(
        False, description="true: a tied LM head stays the token table's weight, one copy (FSDP wraps the model as it "
        "is); false: on the hf path AxoNN's auto_parallelize gives the head a Linear of its own, untying it "
        "(axonn/intra_layer/automatic_parallelism.py).")
    residual_bytes: PositiveInt | None = Field(
        None, description="Bytes per element of the residual stream between blocks, what a checkpointed block keeps: "
        "the dtype the embedding's output is in (fp32 under autocast with fp32 weights; bf16 where FSDP's "
        "param_dtype casts the weights before the forward). None: the weights' bytes, at most 4.")
    gradients_freed: bool = Field(
        False, description="true: the gradients are freed after each optimizer step (zero_grad(set_to_none=True)) "
        "and made again in the backward, so with one micro-step per step they are never alive with the forward's "
        "activations (axoplan/cost/memory.py: gradients_apart); false: a persistent gradient buffer (Megatron's "
        "main_grad, DDP's buckets).")


class FrameworkProfile(Frozen):
    """A training framework as the cost model needs it (see the module docstring)."""

    name: str
    description: str = ""
    ledger: str | None = Field(
        None, description="The op ledger this framework runs (frameworks/ledgers/<ledger>-<family>.json, traced from "
        "its code): every op's class, bytes, flops and saved tensors, priced by axoplan.cost.ledger; its host ops, "
        "kernels, non-GEMM time, optimizer and activation memory replace block, head and the memory rules' "
        "activation terms.")
    cpu_ledger: str | None = Field(
        None, description="The ledger on a CPU 'device', where the code runs another dtype (axoplan's executor: "
        "float32 on a CPU, bf16 on a GPU); None: `ledger` everywhere.")
    measured_on: tuple[str, ...] = Field(
        (), description="Devices (machine YAMLs' device.name) on which measured steps of this framework's code were "
        "held against the model (data/measured/): there a counted profile's error is the one measured, and its "
        "interval does not widen for reach (axoplan.uncertainty.reach).")
    axonn_path: Literal["megatron", "hf"] | None = Field(
        None, description="The AxoNN path this framework's code is (hf: Hugging Face's eager model, which AxoNN's "
        "Hugging Face path runs; a run under it is priced on that path); None: whichever --axonn-path says.")
    hf_path_code: str | None = Field(
        None, description="The profile of the code this framework's Hugging Face path runs, which prices a dense "
        "model on that path (RunOptions.code_profile): AxoNN's path wraps Hugging Face's eager model, so "
        "`hf-transformers`; None: this profile on either path.")
    recompute_required: bool = Field(
        False, description="true: the framework's code runs its blocks only with full activation recompute (on its "
        "Megatron path), so a layout without recompute cannot run under it (the feasibility rule 'recompute').")
    block: BlockCounts | None = Field(
        None, description="Host ops and kernels of one block (a profile without a ledger).")
    host_replay: HostReplay | None = Field(
        None, description="A ledger profile's measured host op-equivalents per block (benchmarks/host_replay.py): "
        "the host's time of the blocks from them, not from the ledger's aten op count.")
    head: BlockCounts | None = Field(
        None, description="The final norm, LM head and vocabulary-parallel loss, per micro-batch (without a ledger).")
    memory: MemoryRules = Field(description="How the framework holds memory.")
    z_gather_unit: Literal["linear", "block"] = Field(
        "linear", description="What one Z all-gather (and reduce-scatter) moves: one linear layer's weight block "
        "(AxoNN) or a whole transformer block's flat parameter (FSDP wraps each block).")
    loss_traffic_bytes: NonNegativeFloat = Field(
        30.0, description="HBM bytes the loss moves per logit over its forward and backward (the unfused "
        "softmax cross-entropy on an fp32 copy: about 30; a fused cross-entropy kernel: a read forward, a "
        "read and a write backward, 6).")
    z_gather_bytes: PositiveFloat = Field(
        2.0, description="Bytes per weight element a Z all-gather moves and its gathered copy holds: 2 where the "
        "gathered weight is bf16 (bf16 parameters; FSDP's param_dtype); 4 where fp32 parameters are gathered as "
        "they are stored (AxoNN's _gather under autocast).")
    native_moe_top_k: PositiveInt | None = Field(
        None, description="Experts per token the framework's native MoE module routes whatever the model says "
        "(AxoNN's DroplessMoEMLP builds its router with top_k=1); None: the model's top_k.")
    z_reduce_scatter_in_grad_dtype: bool = Field(
        False, description="true: the Z reduce-scatter of gradients runs in the run's grad_reduce_dtype (FSDP's "
        "reduce_dtype); false: in bf16 (AxoNN's REDUCE_SCATTER_DTYPE).")
    grad_reduce_overlaps_backward: bool = Field(
        False, description="true: the data-parallel gradient all-reduce is bucketed per layer and launched during "
        "the last micro-batch's backward (DDP-style), so each layer's bucket hides behind the next layer's "
        "backward; false: it runs after the backward, exposed (AxoNN's sync_gradients, Megatron-DeepSpeed without "
        "gradient buckets).")

    @model_validator(mode="after")
    def _counts_or_ledger(self) -> FrameworkProfile:
        if self.ledger is None and (self.block is None or self.head is None):
            raise ValueError("a profile without a ledger gives block and head counts")
        if self.ledger is None and self.host_replay is not None:
            raise ValueError("host_replay replaces a ledger's host op count: a profile without a ledger gives its "
                             "measured op-equivalents as block.forward.host_ops and block.backward.host_ops")
        return self

    def ledger_for(self, device_kind: str) -> str | None:
        """The op ledger this framework runs on a device of `device_kind` ('gpu' or 'cpu')."""
        return self.cpu_ledger if device_kind == "cpu" and self.cpu_ledger else self.ledger

    @property
    def kernels_per_block(self) -> tuple[int, int]:
        """All kernels of one block's (forward, backward)."""
        assert self.block is not None, "a ledger profile's kernels are its ledger's"
        f, b = self.block.forward, self.block.backward
        return f.kernels + f.gemm_kernels, b.kernels + b.gemm_kernels


def frameworks_dir() -> Path:
    """Folder of shipped framework profiles (inside the wheel, or the source checkout)."""
    return shipped_folder("frameworks")


def shipped_frameworks() -> list[str]:
    """Names of the framework profiles that ship with axoplan."""
    return sorted(p.stem for p in frameworks_dir().glob("*.yaml"))


@cache
def load_framework(name: str) -> FrameworkProfile:
    """The shipped profile `name` (profiles are immutable data, so one load per process)."""
    path = frameworks_dir() / f"{name}.yaml"
    try:
        return FrameworkProfile.model_validate(_profile_mapping(name))
    except ValidationError as err:
        raise AxoplanError(describe_validation_error(err, str(path), FrameworkProfile)) from None


def _profile_mapping(name: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """Profile `name`'s YAML as a mapping; one that ``extends: <base>`` is its base's mapping with its own keys
    merged in (a mapping key by key, anything else replaced), so that a variant of a framework states only what it
    changes and every other fact stays written once, in the base."""
    path = frameworks_dir() / f"{name}.yaml"
    if not path.is_file():
        known = shipped_frameworks()
        raise AxoplanError(f"unknown framework {name!r}{closest_hint(name, known)}; known: {', '.join(known)}")
    own = load_yaml_mapping(path)
    base = own.pop("extends", None)
    if base is None:
        return own
    if not isinstance(base, str) or base in (*seen, name):
        raise AxoplanError(f"{path}: extends must name another framework profile, not {base!r}")
    return _merged(_profile_mapping(base, (*seen, name)), own)


def _merged(base: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in own.items():
        old = out.get(key)
        out[key] = _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out
