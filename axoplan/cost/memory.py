"""Memory per GPU: training states, gathered weights, activations and logits, by framework.

Every figure is bytes per GPU for every candidate, from the framework's rules
(:class:`axoplan.inputs.framework.MemoryRules`, one YAML per framework):

* **States.** Per parameter of the GPU's shard (``k·n/(Gx·Gy·Gz)`` of each 4D-sharded layer,
  plus the norms and biases every GPU holds whole, or their ``1/(Gx·Gy·Gz)`` where the
  framework flattens them into its shards as FSDP does): ``weights``, ``gradients`` and
  ``optimizer`` bytes, divided by ``Gdata`` where data parallelism shards the state too (ZeRO
  stage 1, Megatron's distributed optimizer; Rajbhandari et al., SC'20, §5.1).
* **Gathered weights** (only where ``Gz > 1``): ``gathered_units`` Z-gathered bf16 units (a
  linear layer's ``k·n/(Gx·Gy)`` block for AxoNN, a whole transformer block for FSDP), plus one
  unit's full gradient before its reduce-scatter (bf16, and its fp32 copy where the reduction
  runs in fp32); every layer's blocks when weights are cached (FSDP ``SHARD_GRAD_OP``); the
  embeddings where the framework keeps them gathered (FSDP's root unit).
* **Activations** per layer and token (Korthikanti et al. 2022, eq. 2, without its dropout
  masks where the framework has no dropout): norm inputs and outputs ``8·H`` bytes and dropout
  masks ``2·H`` over X; Q, K, V ``2·(H + 2·kv·d)``, the attention output ``2·H`` and the MLP
  ``4·F`` (GeLU input and output; ``6·F`` for SwiGLU: the gate-and-up input and the product)
  over Y; unfused attention adds ``(2 + 3·dropout)·heads·S`` (softmax output, dropout mask and
  output). Flash attention keeps no ``S²`` scores (Dao et al. 2022). Under full recompute only
  each block's input (``2·H/Gx``) is kept, plus one block's working set.
* **Logits**: ``tokens·V/Gy·logits_bytes`` while the loss runs, over ``loss_chunks`` where the loss runs a chunk of
  the sequence at a time (torchtitan's ChunkedLossWrapper).
* **The Hugging Face path** (``docs/algorithm.md`` §4b): activations at full width on the GPU's own tokens,
  plus the gathered input every linear's ``AsyncLinear`` keeps for its dW (``tokens·k·G_out`` elements:
  its rows gathered over X·Y, its features split over its in-axis group); logits of the whole vocabulary;
  the token table sharded ``V·H/(Gy·Gz)`` where ``auto_parallelize`` uses AxoNN's Embedding (``Gx = 1``),
  else whole on every GPU (``axonn.md`` §8.2).
* **Mixtures of experts**: every expert's shard (``E`` copies of each expert linear), the router whole;
  activations of the ``top_k`` routed copies and the shared experts; the native module's grouped expert
  weights gathered over its FSDP group (``E·2I·H/expert_tp`` and their gradient).

Peak (:attr:`MemoryBreakdown.total`): the states plus gradients, activations and logits, except where the
framework frees its gradients each step and the step has one micro-step (:func:`gradients_apart`): then the
backward makes the gradients as it frees the activations, and the peak holds the larger of the two.

Capacity (:func:`memory_verdict`): a GPU needs the live bytes plus the reserve (runtime, the
framework's communicators, allocator fragmentation; ``axoplan.inputs.machine.Reserve``). Memory gets
an interval like time: the need within ``exp(±z·σ)`` (``MEMORY_MODEL_SIGMA``, ``z`` the normal
quantile of the central ``level`` interval). A candidate *fits* when the high end fits the HBM,
*does not fit* when even the low end exceeds it, and is *tight* between: ranked, and marked.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from axoplan.cost.compute import BYTES_BF16
from axoplan.cost.ledger import LedgerCost
from axoplan.inputs.framework import FrameworkProfile, StateBytes
from axoplan.inputs.machine import Machine
from axoplan.inputs.model import ModelSpec, padded_vocab
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import activation_split, sequences_per_micro_step

__all__ = ["MemoryBreakdown", "memory_per_gpu", "MemoryVerdict", "memory_verdict", "VERDICTS", "vocab_rows",
           "sharded_params", "replicated_params", "MEMORY_MODEL_SIGMA", "activation_bytes_per_token", "mlp_width",
           "hf_embedding_params", "hf_embedding_sharded"]

Floats = npt.NDArray[np.float64]

MEMORY_MODEL_SIGMA = 0.10
"""Relative one-sigma error of the live-memory model. Set at 10 % (the time model's default, docs/uncertainty.md)
before any peak was measured [decision]; since checked against the peaks of eight Hugging Face training steps
measured on CPU (data/measured/cpu-peak-memory/, benchmarks/measure_peak_memory.py): the root-mean-square of
log(predicted/measured) there is 0.044 (0.098 before the tracer stopped counting the parameters autograd keeps).
10 % is kept: the CPU sees the tensors only, not what a GPU's allocator and runtime add around them (the reserve,
itself uncertain), and no counted framework's peak has been measured (tests/test_peak_memory.py keeps the
measured spread within it) [decision, docs/decisions.md]."""

VERDICTS = ("fits", "tight", "does not fit")


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes per GPU, per category, for every candidate; ``gradients_apart`` where the gradients are never alive
    with the forward's activations (:func:`gradients_apart`): the peak then holds the larger of the two."""

    weights: Floats
    gradients: Floats
    optimizer: Floats
    gathered: Floats
    activations: Floats
    logits: Floats
    gradients_apart: npt.NDArray[np.bool_]

    CATEGORIES: ClassVar[tuple[str, ...]] = ("weights", "gradients", "optimizer", "gathered", "activations", "logits")

    @property
    def total(self) -> Floats:
        """The peak: the states, plus gradients and the backward's working set together, or the larger of the two
        where the gradients are made during the backward as the activations are freed (``gradients_apart``)."""
        working = self.activations + self.logits
        grads = np.where(self.gradients_apart, np.maximum(self.gradients, working), self.gradients + working)
        return self.weights + self.optimizer + self.gathered + grads

    def as_columns(self) -> dict[str, Floats]:
        return {f"mem_{k}_bytes": getattr(self, k) for k in self.CATEGORIES} | {"mem_total_bytes": self.total}


def vocab_rows(model: ModelSpec, c: Candidates) -> Floats:
    """Each candidate's padded vocabulary (:func:`axoplan.inputs.model.padded_vocab`), as floats."""
    return padded_vocab(model.vocab, c.gx, c.gy).astype(np.float64)


def mlp_width(model: ModelSpec) -> int:
    """Features of the MLP's activation per token: the FFN width, or the routed and shared experts' widths."""
    if model.moe is None:
        return model.ffn
    return (model.moe.top_k + model.moe.shared_experts) * model.moe.expert_ffn_hidden


def sharded_params(model: ModelSpec, c: Candidates, options: RunOptions | None = None) -> Floats:
    """Parameters one GPU holds of the 4D-sharded weights (blocks, LM head, embeddings; on the hf path the
    token table as :func:`hf_embedding_params` has it, and the LM head apart from it unless the framework keeps a
    tied head tied: AxoNN's ``auto_parallelize`` gives the head a Linear of its own, FSDP does not)."""
    gxy, gz = (c.gx * c.gy).astype(np.float64), c.gz.astype(np.float64)
    blocks = sum(np.ceil(lin.num_params / gxy / gz) for lin in model.block_linears())
    vocab = vocab_rows(model, c)
    heads = 1 if model.tied_embeddings else 2
    embed = np.ceil(heads * vocab * model.hidden / gxy / gz)
    if options is not None and options.hf_path:
        kept = model.tied_embeddings and _keeps_tied_head(model, options)
        head = 0.0 if kept else np.ceil(vocab * model.hidden / gxy / gz)
        embed = head + hf_embedding_params(model, c)
    positions = np.ceil(model.max_positions * model.hidden / gxy / gz)
    return model.num_layers * blocks + embed + positions


def _keeps_tied_head(model: ModelSpec, options: RunOptions) -> bool:
    """Whether the run's code keeps a tied LM head as the token table's weight (``memory.tied_head_kept``)."""
    return options.code_profile(model).memory.tied_head_kept


def hf_embedding_sharded(model: ModelSpec, c: Candidates) -> npt.NDArray[np.bool_]:
    """Where the hf path's token table is AxoNN's sharded ``Embedding``: ``auto_parallelize`` uses it where
    ``Gx = 1`` and ``H`` divides by Gy (``axonn/intra_layer/embedding.py``; ``axonn.md`` §8.2)."""
    return (c.gx == 1) & (model.hidden % c.gy == 0)


def hf_embedding_params(model: ModelSpec, c: Candidates) -> Floats:
    """The token table one GPU holds on the hf path: AxoNN's Embedding, ``V·H/Gy`` split over Z, where
    ``auto_parallelize`` uses it (``Gx = 1``, ``H`` divisible by Gy); else the whole ``V·H`` table
    (``axonn/intra_layer/embedding.py``; ``axonn.md`` §8.2)."""
    gy, gz = c.gy.astype(np.float64), c.gz.astype(np.float64)
    table = float(model.vocab * model.hidden)
    return np.where(hf_embedding_sharded(model, c), np.ceil(table / gy / gz), table)


def replicated_params(model: ModelSpec) -> float:
    """Norms and biases: whole on every GPU (unless the framework shards them, `MemoryRules`)."""
    final_norm = model.hidden * (2 if model.biases else 1)
    return float(model.num_layers * model.unsharded_params_per_block() + final_norm)


def memory_per_gpu(model: ModelSpec, options: RunOptions, c: Candidates,
                   profile: FrameworkProfile, ledger: LedgerCost | None = None) -> MemoryBreakdown:
    """Peak memory estimate per GPU for every candidate, under `profile`'s rules; with a priced op ledger its
    activations are what the ledger's saved tensors keep (:func:`_ledger_activation_bytes`)."""
    rules = profile.memory
    shard = (c.gx * c.gy * c.gz).astype(np.float64)
    params = sharded_params(model, c, options) + (replicated_params(model) / shard if rules.shards_replicated_params
                                                  else replicated_params(model))
    gdata = c.gdata.astype(np.float64)
    tokens = (c.micro_batch * options.seq_len).astype(np.float64)

    def state(s: StateBytes) -> Floats:
        return s.bytes_per_param * params / (gdata if s.sharded_over_data else 1.0)

    return MemoryBreakdown(
        weights=state(rules.weights),
        gradients=state(rules.gradients),
        optimizer=state(rules.optimizer),
        gathered=_gathered_bytes(model, options, c, profile),
        activations=(_activation_bytes(model, options, c, profile, tokens) if ledger is None
                     else _ledger_activation_bytes(model, options, c, profile, ledger, tokens)),
        logits=tokens * vocab_rows(model, c) / activation_split(c.gx, c.gy, options.hf_path)[1].astype(np.float64)
        * rules.logits_bytes / rules.loss_chunks,
        gradients_apart=gradients_apart(options, c, profile),
    )


def gradients_apart(options: RunOptions, c: Candidates, profile: FrameworkProfile) -> npt.NDArray[np.bool_]:
    """Where no gradient is alive while the forward's activations are: the framework frees the gradients after
    each optimizer step (``zero_grad(set_to_none=True)``, PyTorch's default since 2.0 [doc torch.optim.Optimizer.
    zero_grad]; Hugging Face's Trainer calls ``model.zero_grad()`` each step [code transformers Trainer]) and the
    step has one micro-step (with gradient accumulation the first micro-step's gradients are alive through the
    second's forward). The backward then makes each block's gradients as it frees that block's saved tensors, so
    the peak is the larger of the two ends: all activations with the loss's logits, or all gradients (measured
    on CPU: ``benchmarks/measure_peak_memory.py``, no gradient is alive at the peak)."""
    per_step = sequences_per_micro_step(c.gx, c.gy, c.gz, c.gdata, c.micro_batch, options.hf_path)
    one_micro_step = np.asarray(per_step) >= options.global_batch
    return np.asarray(one_micro_step & profile.memory.gradients_freed, dtype=np.bool_)


def _gathered_bytes(model: ModelSpec, options: RunOptions, c: Candidates, profile: FrameworkProfile) -> Floats:
    """Z-gathered weight units alive at once (``z_gather_bytes`` an element), one unit's full bf16 gradient before
    its reduce-scatter, and the embeddings where the framework keeps them gathered (only Gz > 1)."""
    rules = profile.memory
    gxy = (c.gx * c.gy).astype(np.float64)
    block = model.block_linears()
    native = model.moe is not None and options.moe_module == "native"
    linears = np.array([lin.num_params for lin in block], dtype=np.float64)
    per_unit = np.array([lin.params_per_copy for lin in block if not (native and lin.is_expert)], dtype=np.float64)
    unit = (linears.sum() if profile.z_gather_unit == "block" else per_unit.max()) / gxy
    grad_bytes = BYTES_BF16 + (options.grad_reduce_bytes if profile.z_reduce_scatter_in_grad_dtype
                         and options.grad_reduce_bytes != BYTES_BF16 else 0.0)
    weight = profile.z_gather_bytes
    cached = model.num_layers * linears.sum() / gxy * weight
    gathered = np.where(c.cache_weights, cached, rules.gathered_units * unit * weight) + unit * grad_bytes
    if rules.embedding_gathered:
        gathered = gathered + model.embedding_params() / gxy * (weight + grad_bytes)
    if native and model.moe is not None:  # the grouped experts gathered over the FSDP group, with their gradient
        experts = model.moe.num_experts * 2 * model.moe.expert_ffn_hidden * model.hidden / options.expert_tp
        gathered = gathered + np.where(c.gz > options.expert_tp, experts * 2.0 * BYTES_BF16, 0.0)
    return np.where(c.gz > 1, gathered, 0.0)


def activation_bytes_per_token(model: ModelSpec, options: RunOptions, profile: FrameworkProfile,
                               gx: Floats, gy: Floats) -> Floats:
    """Bytes one block keeps per token for its backward (the module docstring's terms)."""
    h, f, dropout = float(model.hidden), float(mlp_width(model)), float(profile.memory.dropout)
    x_part = (8.0 + 2.0 * dropout) * h
    heads = float(model.attention_width)  # H, unless a config sets head_dim apart (Qwen3)
    qkv = BYTES_BF16 * (heads + 2.0 * model.kv_heads * model.head_dim)
    mlp = (6.0 if model.ffn_kind == "swiglu" else 4.0) * f
    y_part = qkv + BYTES_BF16 * heads + mlp
    if options.attention == "unfused":
        y_part = y_part + (2.0 + 3.0 * dropout) * model.num_heads * options.seq_len
    return x_part / gx + y_part / gy


def _activation_bytes(model: ModelSpec, options: RunOptions, c: Candidates, profile: FrameworkProfile,
                      tokens: Floats) -> Floats:
    """Every block's tensors split as the path splits a block's activations (``activation_split``: over X and Y on
    Megatron-AxoNN's path, whole on the Hugging Face path), plus on the hf path each linear's gathered input kept
    for its dW (``k·G_out`` elements per own token and routed copy, G_out its out-axis group); under full recompute
    each block's input and one block's working set."""
    split_x, split_y = (np.asarray(g, dtype=np.float64) for g in activation_split(c.gx, c.gy, options.hf_path))
    per_token = activation_bytes_per_token(model, options, profile, split_x, split_y)
    if options.hf_path:
        sizes = {"x": c.gx.astype(np.float64), "y": c.gy.astype(np.float64)}
        kept = sum(lin.k_in * sizes[lin.out_axis] * lin.token_share * lin.experts for lin in model.block_linears())
        per_token = per_token + kept * BYTES_BF16
    per_layer = tokens * per_token
    checkpoint = tokens * model.hidden / split_x * BYTES_BF16
    return np.where(c.recompute, model.num_layers * checkpoint + per_layer, model.num_layers * per_layer)


def _ledger_activation_bytes(model: ModelSpec, options: RunOptions, c: Candidates, profile: FrameworkProfile,
                             ledger: LedgerCost, tokens: Floats) -> Floats:
    """What autograd keeps, from the ledger's saved tensors (traced with saved-tensor hooks, each storage once):
    every block's, and the rest of the forward's (embeddings, final norm, the LM head's weight copy, the loss's
    fp32 log-probabilities, of which a loss run in ``memory.loss_chunks`` chunks keeps one chunk's at a time). Under
    recompute a block keeps what its framework's checkpointing keeps, where the ledger traced it (torchtitan's
    selective policy: the block's input and the outputs of the matmuls and the attention it saves), else only its
    input (full recompute: the residual stream, in the dtype the forward runs the embedding in:
    ``memory.residual_bytes``, else the weights': fp32 under autocast; its hidden features split over X on
    Megatron-AxoNN's path, as the counted rule splits them), and one block's working set is alive at a time."""
    block, rest = ledger.saved_bytes.get("block_forward", 0.0 * tokens), ledger.saved_bytes.get("rest_forward", 0.0)
    rules = profile.memory
    per_logit = ledger.saved_bytes.get("rest_forward_logits", 0.0)
    rest = rest - per_logit * (1.0 - 1.0 / rules.loss_chunks)  # a chunked loss keeps one chunk's
    residual = rules.residual_bytes if rules.residual_bytes is not None else min(rules.weights.bytes_per_param, 4.0)
    split_x = np.asarray(activation_split(c.gx, c.gy, options.hf_path)[0], dtype=np.float64)
    checkpoint = ledger.saved_bytes.get("block_checkpointed", tokens * model.hidden / split_x * residual)
    full = model.num_layers * block + rest
    recomputed = model.num_layers * checkpoint + block + rest
    return np.where(c.recompute, recomputed, full)


@dataclass(frozen=True, slots=True)
class MemoryVerdict:
    """Per candidate: the memory a GPU needs (the reserve included), its interval, and the verdict."""

    need_bytes: Floats
    low_bytes: Floats
    high_bytes: Floats
    hbm_bytes: float
    usable_bytes: float  # HBM less the reserve: what live tensors may use
    verdict: npt.NDArray[np.uint8]  # index into VERDICTS

    @property
    def tight(self) -> npt.NDArray[np.bool_]:
        return self.verdict == 1

    @property
    def does_not_fit(self) -> npt.NDArray[np.bool_]:
        return self.verdict == 2


def memory_verdict(live_bytes: Floats, machine: Machine, profile: FrameworkProfile,
                   level: float = 0.8) -> MemoryVerdict:
    """Fits, tight or does not fit: the need's central `level` interval against the HBM."""
    hbm = machine.device.hbm_gb * 1e9
    reserve = machine.reserved_gb(profile.memory.communicators) * 1e9
    usable = machine.hbm_usable_bytes(profile.memory.communicators)
    z = NormalDist().inv_cdf(0.5 + level / 2.0) * MEMORY_MODEL_SIGMA
    need = live_bytes + reserve
    low, high = need * np.exp(-z), need * np.exp(z)
    verdict = np.where(high <= hbm, 0, np.where(low <= hbm, 1, 2)).astype(np.uint8)
    return MemoryVerdict(need, low, high, hbm, usable, verdict)
