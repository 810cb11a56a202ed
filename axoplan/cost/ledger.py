"""The op ledger: every op a framework's training step runs, and one routine that prices them all.

A ledger (``frameworks/ledgers/<profile>-<family>.json``) is data derived by tracing the framework's real
code on CPU (``benchmarks/derive_ledger.py``: the aten ops below autograd, with CUDA autocast's casts, as
``Trainer(bf16=True)`` runs a step). Each entry is one op of one scope (a block's forward or backward, the
rest of the forward or backward: embeddings, final norm, LM head and loss), with its class, how many times
the scope runs it, and the bytes it reads and writes as sums of monomials in the model's dimensions::

    bytes = Σ c · B^b · S^s · H^h · NH^n · KV^k · F^f · V^v · E^e · K^t · D^d

(``B`` sequences per micro-batch on this GPU, ``S`` sequence length, ``H`` hidden size, ``NH`` and ``KV``
query and key-value heads, ``F`` FFN width, ``V`` vocabulary; a mixture's ``E`` experts and ``K`` experts per
token; ``D`` the heads' width where the family sets it apart from H/NH). GEMM and attention entries carry their flops
the same way; what autograd keeps for the backward (saved-tensor hooks) is a list of monomials per scope.

:func:`price_ledger` prices every entry for every candidate at once (Calculon's per-op ledger priced by one
routine, ``shared/design/house-style.md`` §7):

* a memory-bound entry (element-wise, activation, norm, copy/cast, reduction, loss, memset) by its bytes over
  HBM bandwidth times its class's efficiency (``Machine.kernels``, measured per class);
* an attention entry by its flops (the causal half, the FlashAttention-2 convention) at its kernel's
  measured curve in sequence length (SDPA's pick on the device, the kernel the framework's code names, or the
  run's ``--attention`` where its code takes it from the run's configuration);
* a GEMM entry is counted (kernels, host ops) but priced by the tile model with the 4D linear it belongs to
  (``axoplan.cost.layers``), where its collectives overlap with it, except the GEMMs no 4D linear holds, which the
  ledger prices: a mixture's grouped expert GEMM (at the fp32 CUDA-core peak where it runs in fp32), and a batched
  GEMM of the unfused attention core (``bmm``, ``baddbmm``: the scores and the context over a GPU's heads), by the
  tile model from its traced shape (its ``tile``: the batch's rows stacked, ``n``, ``k``; the same rule as
  ``axoplan.cost.attention.unfused_attention_s``);
* a view costs the host an op and the device nothing;
* a host sync (an op whose CUDA kernel makes the host wait: ``.item()``, ``nonzero``, a boolean-mask index, the fp32
  ``_grouped_mm``'s copy of its offsets to the host) is a point where the device drains and then waits for the host
  to issue the next kernel (:func:`sync_stall_s`).

The ledger's work runs where AxoNN's Hugging Face path runs it (``docs/algorithm.md`` §4b): on the GPU's own
sequences at full width, so its symbols are the model's own dimensions; a parameter-shaped tensor (no ``B``
or ``S`` in its monomial: autocast's weight casts, gradient casts) is the GPU's ``1/(Gx·Gy)`` block.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, get_args

import numpy as np
import numpy.typing as npt

from axoplan.arrays import distinct_rows
from axoplan.cost.compute import gemm_s
from axoplan.errors import AxoplanError
from axoplan.inputs.machine import AttentionCurve, Machine
from axoplan.inputs.model import Family, ModelSpec
from axoplan.inputs.schema import shipped_folder
from axoplan.space.candidates import Candidates
from axoplan.space.layout import activation_split

__all__ = ["Term", "LedgerOp", "Ledger", "LedgerCost", "OP_CLASSES", "SCOPES", "load_ledger", "price_ledger",
           "evaluate_ledger", "EvaluatedLedger",
           "ledger_family", "attention_curve", "attention_efficiency", "ledger_class_columns", "shipped_family",
           "per_step_s", "traced_for", "traced_families", "sync_stall_s", "NOT_KERNELS", "OpRow", "op_rows"]

Floats = npt.NDArray[np.float64]

OP_CLASSES: tuple[str, ...] = ("gemm", "attention", "norm", "activation", "elementwise", "copy_cast", "reduction",
                               "loss", "memset", "optimizer", "view", "host_sync")
NOT_KERNELS = ("view", "host_sync")
"""Classes that launch no kernel: a view, and a host sync (a device-to-host copy or read-back, priced as a stall)."""
SCOPES = ("block_forward", "block_backward", "block_recompute", "rest_forward", "rest_backward")
"""A ledger's scopes. ``block_recompute``, where a ledger has it, is what the framework's own activation
checkpointing reruns of a block's forward in its backward (torchtitan's selective policy: every other matmul and
the element-wise ops, not the attention); a ledger without it reruns the whole ``block_forward`` (full recompute)."""


@dataclass(frozen=True, slots=True)
class Term:
    """``coef · Π symbol^exponent`` (bytes, or flops)."""

    coef: float
    exps: tuple[tuple[str, int], ...]
    axis: str | None = None  # a block's activation axis on the Megatron path (x: hidden features, y: heads, FFN);
    # z: a parameter's Z shard (a weight gradient added into the fp32 main gradient after AxoNN's reduce-scatter)

    @property
    def per_logit(self) -> bool:
        """Tokens times the vocabulary in it: the logits or the loss's copies of them."""
        names = {s for s, _ in self.exps}
        return {"B", "S", "V"} <= names

    @property
    def parameter_shaped(self) -> bool:
        """No tokens in it: a weight, a gradient or a bias (the GPU's block of a 4D-sharded one)."""
        return not any(s in ("B", "S") for s, _ in self.exps)


@dataclass(frozen=True, slots=True)
class LedgerOp:
    op: str
    op_class: str
    count: int
    read: tuple[Term, ...]
    write: tuple[Term, ...]
    flops: tuple[Term, ...] = ()
    axis: str | None = None
    dtype: str = "bf16"  # a GEMM's operands: bf16 on the tensor cores, fp32 on the CUDA cores
    tile: tuple[tuple[Term, ...], tuple[Term, ...], tuple[Term, ...]] | None = None  # a batched GEMM's rows, n, k

    @property
    def grouped(self) -> bool:
        """A grouped GEMM over a mixture's experts (transformers' ``_grouped_mm``): no 4D linear holds it, so the
        ledger prices it (at its dtype's peak)."""
        return self.op.lstrip("_").startswith("grouped_mm")

    @property
    def own_gemm(self) -> bool:
        """A GEMM no 4D linear holds, which the ledger prices itself: a grouped expert GEMM, or a batched GEMM with its
        traced shape (the unfused attention core's); every other GEMM is a linear's, priced by the tile model with
        its collectives (``axoplan.cost.layers``)."""
        return self.op_class == "gemm" and (self.grouped or self.tile is not None)


@dataclass(frozen=True, slots=True)
class Ledger:
    name: str
    family: str
    made_by: str
    versions: dict[str, str]
    scopes: dict[str, tuple[LedgerOp, ...]]
    saved: dict[str, tuple[Term, ...]]
    optimizer_bytes_per_param: dict[str, float]  # read and written, by op class (fused AdamW: 'optimizer')
    optimizer_kernels: int
    moe: bool = False  # traced for a mixture of experts: its experts and top-k are symbols (E, K)
    attention: str | None = None  # the kernel its code runs: None SDPA's pick on the device, "run" the run's option
    optimizer_shard_bytes_per_param: dict[str, float] | None = None  # of the optimizer's, run on a data rank's 1/d

    def attention_kernel(self, option: str) -> str | None:
        """The attention kernel this ledger's attention op runs for a run whose ``--attention`` is `option`: the one
        its code names, the run's where its code takes it from the run's configuration (llm-foundry's
        ``attn_config.attn_impl``), or None for SDPA's pick on the device. Its op list was traced with a fused kernel:
        ``unfused`` is refused in one line."""
        if self.attention != "run":
            return self.attention
        if option == "unfused":
            raise AxoplanError(f"op ledger {self.name}-{self.family} was traced with a fused attention kernel: use "
                               "--attention flash or flash-triton with it, or a framework without a ledger")
        return option

    def ops(self, scope: str) -> tuple[LedgerOp, ...]:
        return self.scopes.get(scope, ())

    def fully_recomputed(self) -> Ledger:
        """This ledger with a block's whole forward rerun under recompute and only its input kept (full recompute),
        whatever checkpointing its framework's trace recorded (``--recompute-policy full``)."""
        return replace(self, scopes={s: ops for s, ops in self.scopes.items() if s != "block_recompute"},
                       saved={s: t for s, t in self.saved.items() if s != "block_checkpointed"})

    @property
    def runs_shared_experts(self) -> bool:
        """Whether its op list runs a mixture's shared expert, sized by the symbol ``SE`` (Qwen2-MoE's)."""
        return any(s == "SE" for ops in self.scopes.values() for op in ops for t in op.read for s, _ in t.exps)

    @property
    def recompute_scope(self) -> str:
        """The scope a recomputed block reruns: its checkpointing's own op list where traced, else its forward."""
        return "block_recompute" if "block_recompute" in self.scopes else "block_forward"

    def recompute_share(self, op_class: str, model: ModelSpec, seq_len: int) -> float:
        """The share of a block's forward flops of `op_class` (``gemm``: the 4D linears' GEMMs; ``attention``) that a
        recompute reruns: 1 under full recompute; under a selective policy the traced recompute's flops over the
        forward's (torchtitan's: about a third of a Llama block's GEMM flops, no attention)."""
        dims = {"B": 1.0, **model_dims(model, seq_len)}

        def flops(scope: str) -> float:
            return sum(op.count * t.coef * math.prod(dims[s] ** e for s, e in t.exps)
                       for op in self.ops(scope) if op.op_class == op_class and not op.own_gemm for t in op.flops)
        forward = flops("block_forward")
        return 1.0 if self.recompute_scope == "block_forward" or forward == 0 else flops(self.recompute_scope) / forward

    def kernels_per_call(self, op: LedgerOp, experts: int = 1) -> int:
        """Kernels one call of `op` launches (each with its host dispatch) in a model of `experts` experts: none for
        a view or a host sync; one per expert for an fp32 grouped GEMM, which CUDA runs by PyTorch's fallback, one
        ``mm`` per group (the small Mixtral profile, profile-mixtral-s-h100.jsonl: 507 ``aten::mm`` calls per step
        = 48 fp32 grouped calls x 8 experts + 123 linear GEMMs); one for every other op (a bf16 grouped GEMM is one
        grouped kernel)."""
        if op.op_class in NOT_KERNELS:
            return 0
        return experts if op.grouped and op.dtype == "fp32" else 1


MOE_FAMILIES = ("mixtral", "qwen3-moe", "olmoe", "qwen2-moe")
"""Mixture families with their own traces; any other mixture runs Mixtral's op list (:func:`ledger_family`)."""


def ledger_family(model: ModelSpec) -> str:
    """The traced family whose op list `model` runs: a mixture's own where traced (Mixtral's, Qwen3-MoE's, OLMoE's,
    Qwen2-MoE's), else Mixtral's; a dense model's config family where known, else GPT-2's blocks for a GeLU MLP with
    biases and Llama's for a SwiGLU one."""
    if model.moe is not None:
        return str(model.family) if model.family in MOE_FAMILIES else "mixtral"
    if model.family in ("gpt2", "llama", "qwen2", "qwen3", "gpt-neox", "mpt"):  # a config's Mistral reads as llama
        return str(model.family)
    return "llama" if model.ffn_kind == "swiglu" else "gpt2"


def _terms(raw: list[list[Any]], axis: str | None = None) -> tuple[Term, ...]:
    """``[coef, {symbol: exponent}]`` or ``[coef, {...}, axis]`` entries as terms (`axis`: the op's, by default)."""
    return tuple(Term(float(t[0]), tuple(sorted((str(s), int(e)) for s, e in dict(t[1]).items())),
                      str(t[2]) if len(t) > 2 else axis) for t in raw)


def traced_for(name: str, model: ModelSpec) -> bool:
    """Whether ledger `name` was traced for `model`'s own family (a mixture: Mixtral's, Qwen3-MoE's or OLMoE's, any
    number of experts and any top-k, without shared experts, which their op lists do not run; Qwen2-MoE's, with its
    shared expert, which its op list runs; another mixture family, DeepSeek's, runs other ops around its experts)."""
    family = ledger_family(model)
    if shipped_family(name, family) != family:
        return False
    if model.moe is None:
        return True
    ledger = load_ledger(name, family)
    shared = model.moe.shared_experts > 0
    return ledger.moe and shared == ledger.runs_shared_experts and model.family in (None, family)


NEAREST_FAMILY = {"qwen2": "llama", "qwen3": "llama", "qwen3-moe": "mixtral", "olmoe": "mixtral",
                  "qwen2-moe": "mixtral"}
"""The traced family whose op list is nearest a family's where a framework traced none for it: Qwen2's and Qwen3's
blocks are Llama's plus their q/k/v biases or per-head norms; Qwen3-MoE's and OLMoE's are Mixtral's mixture plus
query and key norms, Qwen2-MoE's plus q/k/v biases and a shared expert."""


@cache
def traced_families(name: str) -> tuple[str, ...]:
    """The model families ledger `name` ships a trace of (``frameworks/ledgers/<name>-<family>.json``, a family of
    :data:`axoplan.inputs.model.Family`), in that list's order."""
    folder = shipped_folder("frameworks") / "ledgers"
    return tuple(f for f in get_args(Family) if (folder / f"{name}-{f}.json").is_file())


def shipped_family(name: str, family: str) -> str:
    """`family` where ledger `name` was traced for it, else its nearest traced family (:data:`NEAREST_FAMILY`),
    else GPT-2's blocks, else the first family it was traced for: a model family no trace covers is priced with the
    nearest traced op list, and its interval says so."""
    traced = traced_families(name)
    for candidate in (family, NEAREST_FAMILY.get(family), "gpt2"):
        if candidate in traced:
            return candidate
    return traced[0] if traced else family


@cache
def load_ledger(name: str, family: str) -> Ledger:
    """The shipped ledger `name` (a framework profile's ``ledger``) for `family`."""
    path = shipped_folder("frameworks") / "ledgers" / f"{name}-{family}.json"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.json"))
        raise AxoplanError(f"no op ledger {path.stem!r} (framework ledger {name!r}, model family {family!r}); "
                           f"shipped: {', '.join(known)}")
    doc = json.loads(path.read_text())
    scopes = {scope: tuple(LedgerOp(o["op"], o["class"], int(o["count"]), _terms(o["read"], o.get("axis")),
                                    _terms(o["write"], o.get("axis")), _terms(o.get("flops", []), o.get("axis")),
                                    o.get("axis"), o.get("dtype", "bf16"), _tile(o, o.get("axis"))) for o in ops)
              for scope, ops in doc["scopes"].items()}
    opt = doc["optimizer"]
    return Ledger(name, family, doc["made_by"], doc["versions"], scopes,
                  {k: _terms(v) for k, v in doc["saved"].items()},
                  {str(k): float(v) for k, v in opt["bytes_per_param"].items()}, int(opt["ops"]),
                  "moe" in doc, doc.get("attention"),
                  {str(k): float(v) for k, v in opt["data_shard_bytes_per_param"].items()}
                  if "data_shard_bytes_per_param" in opt else None)


def _tile(o: dict[str, Any], axis: str | None) -> tuple[tuple[Term, ...], tuple[Term, ...], tuple[Term, ...]] | None:
    """A batched GEMM's traced shape (``tile``: rows on the op's axis; ``n`` and ``k``, a head's width or the sequence,
    split over nothing), or None."""
    if "tile" not in o:
        return None
    t = o["tile"]
    return _terms(t["rows"], axis), _terms(t["n"]), _terms(t["k"])


@dataclass(frozen=True, slots=True)
class LedgerCost:
    """A priced ledger for every candidate, per micro-batch (the optimizer per step).

    ``seconds[(scope, class)]``: device seconds of that class in that scope (a block scope: one block);
    ``kernels`` and ``host_ops`` per scope (one block for the block scopes); ``saved_bytes`` per scope, and
    ``rest_forward_logits``: the part of the rest's that is per logit (tokens times the vocabulary);
    ``block_checkpointed``, where traced, what a block keeps under its framework's checkpointing.
    ``recompute_scope``: the scope a recomputed block reruns; ``recompute_gemm_share``: the share of the block's
    forward GEMM flops it reruns (:meth:`Ledger.recompute_share`)."""

    seconds: dict[tuple[str, str], Floats]
    kernels: dict[str, float]
    host_ops: dict[str, float]
    saved_bytes: dict[str, Floats]
    optimizer_bytes_per_param: dict[str, float]
    recompute_scope: str = "block_forward"
    recompute_gemm_share: float = 1.0
    optimizer_shard_bytes_per_param: dict[str, float] | None = None

    def optimizer_s(self, machine: Machine, params: Floats, data_shards: Floats | float = 1.0) -> Floats:
        """The optimizer step over `params` parameters: the traced step's bytes per parameter (read and written:
        fused AdamW's one kernel, or a foreach optimizer's element-wise passes), each class at its efficiency; the
        part its trace ran on a data-parallel rank's shard of the optimizer states
        (``optimizer_shard_bytes_per_param``: Megatron's distributed optimizer, whose Adam, gradient norm and copy
        into the bf16 weights run on ``1/d`` of them) over `data_shards`."""
        bw = machine.device.hbm_bandwidth_gbs * 1e9
        shard = self.optimizer_shard_bytes_per_param or {}
        per_param = sum((b - shard.get(c, 0.0) + shard.get(c, 0.0) / data_shards) / _efficiency(machine, c)
                        for c, b in self.optimizer_bytes_per_param.items())
        return params * per_param / bw

    def scope_s(self, scope: str, exclude: tuple[str, ...] = ()) -> Floats:
        parts = [v for (s, cls), v in self.seconds.items() if s == scope and cls not in exclude]
        return np.sum(parts, axis=0) if parts else np.float64(0.0)  # type: ignore[return-value]

    def class_s(self, op_class: str, scope: str) -> Floats:
        return self.seconds.get((scope, op_class), np.float64(0.0))  # type: ignore[arg-type]


def symbols(model: ModelSpec, seq_len: int, c: Candidates) -> dict[str, Floats]:
    """Each ledger symbol's value per candidate (``B``: the micro-batch's sequences on one GPU; ``E`` and ``K``: a
    mixture's experts and experts per token, 1 for a dense model, whose ledger has neither)."""
    one = np.ones(len(c), dtype=np.float64)
    return {"B": c.micro_batch.astype(np.float64), **{s: v * one for s, v in model_dims(model, seq_len).items()}}


def model_dims(model: ModelSpec, seq_len: int) -> dict[str, float]:
    """Every ledger symbol but ``B``: the model's dimensions (``D`` the heads' width, a symbol of the ledgers of
    families that set it apart from H/NH, Qwen3's; ``SE`` a mixture's shared experts in expert widths, Qwen2-MoE's)
    and the sequence length."""
    experts, top_k, shared = ((model.moe.num_experts, model.moe.top_k, model.moe.shared_experts)
                              if model.moe is not None else (1, 1, 0))
    return {"S": float(seq_len), "H": float(model.hidden), "NH": float(model.num_heads),
            "KV": float(model.kv_heads), "F": float(_ffn(model)), "V": float(model.vocab), "E": float(experts),
            "K": float(top_k), "D": float(model.head_dim), "SE": float(shared)}


def _ffn(model: ModelSpec) -> int:
    return model.ffn_hidden if model.ffn_hidden else 4 * model.hidden


@dataclass(frozen=True, slots=True)
class _Split:
    """How a tensor divides over a candidate's GPUs: a parameter-shaped one is the GPU's ``1/(Gx·Gy)`` block (the
    ``1/(Gx·Gy·Gz)`` shard where its axis is ``z``: a gradient accumulated after its reduce-scatter over Z); on the
    Megatron path an activation is split over its axis (a block op's recorded one; elsewhere the vocabulary over
    Y and the hidden features over X); on the Hugging Face path activations are whole (each GPU its own tokens)."""

    params: Floats
    x: Floats
    y: Floats
    shard: Floats  # the GPU's 1/(Gx·Gy·Gz) shard of a parameter

    def of(self, t: Term) -> Floats:
        if t.parameter_shaped:
            return self.shard if t.axis == "z" else self.params
        axis = t.axis or ("y" if any(s == "V" for s, _ in t.exps) else "x")
        return self.y if axis == "y" else self.x


def _tile_shape(op: LedgerOp, sym: dict[str, Floats], split: _Split,
                whole: _Split) -> tuple[Floats, Floats, Floats] | None:
    """A batched GEMM's rows (its heads split as its axis is: `split`), ``n`` and ``k`` (`whole`: divided by nothing)
    for every candidate."""
    if op.tile is None:
        return None
    rows, n, k = op.tile
    return _evaluate(rows, sym, split), _evaluate(n, sym, whole), _evaluate(k, sym, whole)


def _evaluate(terms: tuple[Term, ...], sym: dict[str, Floats], split: _Split) -> Floats:
    total = np.zeros_like(split.params)
    for t in terms:
        value = t.coef * np.prod([sym[s] ** e for s, e in t.exps], axis=0) if t.exps else t.coef + 0.0 * split.params
        total = total + value / split.of(t)
    return total


CURVE_OF_KERNEL = {"flash-triton": "triton"}
"""A ``--attention`` kernel's name among a machine's measured curves (``kernels.attention``), where it differs."""


def attention_curve(machine: Machine, backend: str | None) -> tuple[str, AttentionCurve] | None:
    """The measured curve (its name and points) `backend` runs on `machine`, or None where the machine measured
    none for it. `backend`: a ``--attention`` kernel or a curve's name; None: SDPA's pick on the device
    (``kernels.default_attention``)."""
    kernels = machine.kernels
    name = CURVE_OF_KERNEL.get(backend, backend) if backend else (kernels.default_attention if kernels else None)
    if kernels is None or name is None or name not in kernels.attention:
        return None
    return name, kernels.attention[name]


def attention_efficiency(machine: Machine, backend: str | None, seq_len: int) -> float:
    """The backend's measured fraction of peak at `seq_len` (log2-interpolated, flat beyond the ends,
    :func:`attention_curve`); without a measured curve, the machine's flat figure for it
    (``attention_triton_efficiency`` for ``flash-triton`` where given, else ``attention_efficiency``)."""
    found = attention_curve(machine, backend)
    if found is None:
        if backend == "flash-triton" and machine.attention_triton_efficiency is not None:
            return machine.attention_triton_efficiency
        return machine.attention_efficiency
    curve = found[1]
    return float(np.interp(math.log2(seq_len), np.log2(np.array(curve.seq, dtype=np.float64)), curve.efficiency))


def price_ledger(ledger: Ledger, machine: Machine, model: ModelSpec, seq_len: int, c: Candidates,
                 hf_path: bool = True, attention: str = "flash") -> LedgerCost:
    """Price every entry of `ledger` for every candidate (see the module docstring): :func:`evaluate_ledger`, then
    :meth:`EvaluatedLedger.price`. A mixture is refused in one line with a dense model's ledger (its op list runs no
    router or experts). `attention`: the run's ``--attention``, which sets the kernel only where the ledger's code
    takes it from the run (:meth:`Ledger.attention_kernel`)."""
    return evaluate_ledger(ledger, model, seq_len, c, hf_path, attention).price(machine)


@dataclass(frozen=True, slots=True)
class EvaluatedOp:
    """One ledger entry's machine-free numbers for every candidate: the bytes one call reads and writes, the flops
    it computes (empty terms: zero)."""

    scope: str
    op: LedgerOp
    nbytes: Floats
    flops: Floats
    tile: tuple[Floats, Floats, Floats] | None = None  # a batched GEMM's rows, n and k (LedgerOp.tile)


@dataclass(frozen=True, slots=True)
class EvaluatedLedger:
    """A ledger's monomials evaluated for a model, a sequence length and candidates: everything pricing needs that no
    machine number changes (bytes, flops, kernels and host ops per scope, saved bytes), so that a fit or a
    sensitivity that moves the machine's numbers prices it again without evaluating it again (``docs/algorithm.md``:
    compiled once per model and options, repriced per machine)."""

    ledger: Ledger
    ops: tuple[EvaluatedOp, ...]
    kernels: dict[str, float]
    host_ops: dict[str, float]
    saved_bytes: dict[str, Floats]
    zeros: Floats  # one 0 per distinct layout: an array for a number no layout changes (a host sync)
    attention_kernel: str | None
    seq_len: int
    recompute_gemm_share: float
    candidate_of: npt.NDArray[np.intp]  # each candidate's distinct layout (Gx, Gy, Gz, micro-batch): the arrays'
    # index; the monomials read nothing else of a candidate, so each distinct one is evaluated and priced once

    def attention_rate(self, machine: Machine) -> float:
        """Flop/s of the ledger's attention kernel on `machine` at its sequence length (attention_efficiency)."""
        return machine.peak_flops * attention_efficiency(machine, self.attention_kernel, self.seq_len)

    def price(self, machine: Machine) -> LedgerCost:
        """Every entry's device seconds on `machine` by the one routine (:meth:`seconds`), summed per scope and
        class."""
        attn_rate = self.attention_rate(machine)
        seconds: dict[tuple[str, str], Floats] = {}
        for e in self.ops:
            t = self.seconds(e, machine, attn_rate)
            if t is None:
                continue  # a view, or a 4D linear's GEMM: the tile model prices it with its collectives (cost.layers)
            key = (e.scope, e.op.op_class)
            seconds[key] = seconds.get(key, 0.0) + t
        ledger, each = self.ledger, self.candidate_of
        seconds = {key: t[each] for key, t in seconds.items()}
        saved = {scope: b[each] for scope, b in self.saved_bytes.items()}
        return LedgerCost(seconds, self.kernels, self.host_ops, saved, ledger.optimizer_bytes_per_param,
                          ledger.recompute_scope, self.recompute_gemm_share, ledger.optimizer_shard_bytes_per_param)

    def seconds(self, e: EvaluatedOp, machine: Machine, attn_rate: float) -> Floats | None:
        """Device seconds of the op's ``count`` calls per scope run; None for a view and for a 4D linear's GEMM (the
        tile model prices that one, with its collectives)."""
        op = e.op
        if op.op_class == "view" or (op.op_class == "gemm" and not op.own_gemm):
            return None
        if op.op_class == "host_sync":
            return op.count * sync_stall_s(machine) + self.zeros
        if e.tile is not None:  # the unfused attention core's batched GEMMs: the tile model, from their shapes
            return op.count * gemm_s(machine, *e.tile)
        if op.op_class == "gemm":  # transformers' grouped experts: no 4D linear holds them
            return op.count * e.flops / _gemm_rate(machine, op.dtype)
        if op.op_class == "attention":
            return op.count * 0.5 * e.flops / attn_rate  # the causal half
        bw = machine.device.hbm_bandwidth_gbs * 1e9
        return op.count * e.nbytes / (bw * _efficiency(machine, op.op_class))


def evaluate_ledger(ledger: Ledger, model: ModelSpec, seq_len: int, c: Candidates, hf_path: bool = True,
                    attention: str = "flash", views: bool = False) -> EvaluatedLedger:
    """`ledger`'s monomials for every candidate (:class:`EvaluatedLedger`); a mixture with a dense model's ledger is
    refused in one line. `views`: keep the views too (their bytes, which pricing never reads: ``op_rows``). The
    monomials are evaluated once per distinct (Gx, Gy, Gz, micro-batch), all they read of a candidate
    (``EvaluatedLedger.candidate_of``)."""
    if model.moe is not None and not ledger.moe:
        raise AxoplanError(f"op ledger {ledger.name}-{ledger.family} was traced for a dense model, not a mixture "
                           "of experts: trace one (benchmarks/derive_ledger.py --family mixtral) or use --framework "
                           "axonn")
    first, candidate_of = distinct_rows(np.stack([c.gx, c.gy, c.gz, c.micro_batch], axis=1))
    c = c.take(first)
    gx, gy = c.gx.astype(np.float64), c.gy.astype(np.float64)
    split_x, split_y = (np.asarray(g, dtype=np.float64) for g in activation_split(c.gx, c.gy, hf_path))
    shard = _Split(gx * gy, split_x, split_y, gx * gy * c.gz.astype(np.float64))  # hf path: activations whole
    whole = _Split(*(np.ones_like(gx) for _ in range(4)))  # a batched GEMM's n and k: split over nothing
    sym = symbols(model, seq_len, c)
    experts = model.moe.num_experts if model.moe is not None else 1
    ops: list[EvaluatedOp] = []
    kernels: dict[str, float] = {}
    host: dict[str, float] = {}
    for scope in SCOPES:
        kernels[scope], host[scope] = 0.0, 0.0
        for op in ledger.ops(scope):
            host[scope] += op.count * max(1, ledger.kernels_per_call(op, experts))
            kernels[scope] += op.count * ledger.kernels_per_call(op, experts)  # none for a view
            if op.op_class == "view" and not views:
                continue
            ops.append(EvaluatedOp(scope, op, _evaluate(op.read, sym, shard) + _evaluate(op.write, sym, shard),
                                   _evaluate(op.flops, sym, shard), _tile_shape(op, sym, shard, whole)))
    saved = {scope: _evaluate(terms, sym, shard) for scope, terms in ledger.saved.items()}
    saved["rest_forward_logits"] = _evaluate(tuple(t for t in ledger.saved.get("rest_forward", ()) if t.per_logit),
                                             sym, shard)  # the part a chunked loss keeps 1/chunks of
    return EvaluatedLedger(ledger, tuple(ops), kernels, host, saved, shard.params * 0.0,
                           ledger.attention_kernel(attention), seq_len, ledger.recompute_share("gemm", model, seq_len),
                           candidate_of)


@dataclass(frozen=True, slots=True)
class OpRow:
    """One ledger entry as one candidate runs it: ``seconds`` per run of its scope (None where the tile model prices
    it: a 4D linear's GEMM; 0 for a view)."""

    scope: str
    op: str
    op_class: str
    count: int
    bytes_per_call: float
    flops_per_call: float
    seconds: float | None


def op_rows(ledger: Ledger, machine: Machine, model: ModelSpec, seq_len: int, c: Candidates, i: int,
            hf_path: bool = True, attention: str = "flash") -> list[OpRow]:
    """Every entry of `ledger` for candidate `i`, priced by the same routine as :func:`price_ledger` (``explain
    --wide`` lists them, to hold against a profiler trace op by op)."""
    evaluated = evaluate_ledger(ledger, model, seq_len, c.take(np.array([i])), hf_path, attention, views=True)
    attn_rate = evaluated.attention_rate(machine)
    rows = []
    for e in evaluated.ops:
        op, t = e.op, evaluated.seconds(e, machine, attn_rate)
        seconds = 0.0 if op.op_class == "view" else (None if t is None else float(t[0]))
        rows.append(OpRow(e.scope, op.op, op.op_class, op.count, float(e.nbytes[0]),
                          float(e.flops[0]) if op.flops else 0.0, seconds))
    return rows


def sync_stall_s(machine: Machine) -> float:
    """Device seconds lost at one host sync: the device drains its queue, the host learns it and issues the next op,
    whose kernel then starts. Priced from the host model (``Machine.host``): one round trip between device and host,
    taken as one kernel launch's latency (``host.launch_us``: about 3 µs for an empty kernel, Boyer, "CUDA kernel
    overhead", U. Virginia; 5-20 µs CPU-side in PyTorch traces, Meta's HolisticTraceAnalysis docs) [assumed], plus
    the host's time to issue the one op that follows (``host.op_us + host.launch_us``); approximation: the device is
    busy again from the first kernel after the sync (the host keeps ahead of it from there, as it did before).
    A CPU 'device' is the host itself: nothing to wait for."""
    host = machine.host
    if not host.overlaps_device:
        return 0.0
    return (host.op_us + 2.0 * host.launch_us) * 1e-6


def _gemm_rate(machine: Machine, dtype: str) -> float:
    """Flop/s of a grouped GEMM in `dtype`: fp32 on the CUDA cores at ``gemm.fp32_efficiency`` of their peak (a SIMT
    kernel, not the tensor cores', so calibrating those does not move it), bf16 at ``gemm.max_efficiency``."""
    if dtype == "fp32":
        eff = machine.gemm.fp32_efficiency or machine.gemm.max_efficiency
        return machine.peak_fp32_flops * eff
    return machine.peak_flops * machine.gemm.max_efficiency


def _efficiency(machine: Machine, op_class: str) -> float:
    """The share of HBM bandwidth a memory-bound class reaches on `machine` (``memory_efficiency`` where the
    device's op classes were not measured)."""
    if machine.kernels is None:
        return machine.memory_efficiency
    return machine.kernels.of(op_class)  # type: ignore[arg-type]


def per_step_s(cost: LedgerCost, op_class: str, num_layers: int, recompute: npt.NDArray[np.bool_],
               n_micro: Floats) -> Floats:
    """Seconds per step of one class: a block's forward, under recompute what its checkpointing reruns
    (``LedgerCost.recompute_scope``), and its backward, times the layers; the rest once; per micro-batch times the
    micro-batches."""
    rec = recompute.astype(np.float64)
    block = (cost.class_s(op_class, "block_forward") + rec * cost.class_s(op_class, cost.recompute_scope)
             + cost.class_s(op_class, "block_backward"))
    rest = cost.class_s(op_class, "rest_forward") + cost.class_s(op_class, "rest_backward")
    return n_micro * (num_layers * block + rest)


def ledger_class_columns(cost: LedgerCost, num_layers: int, recompute: npt.NDArray[np.bool_], n_micro: Floats,
                         gemm_s: Floats) -> dict[str, Floats]:
    """Seconds per step of each op class (``t_class_<class>_s``): a block's ops times the layers (what its
    checkpointing reruns again under recompute), the rest once, per micro-batch times the micro-batches; GEMMs as
    the tile model priced them (`gemm_s`, already per step). What `explain` shows beside a profiler trace's split."""
    cols = {f"t_class_{cls}_s": per_step_s(cost, cls, num_layers, recompute, n_micro)
            for cls in sorted({cls for _, cls in cost.seconds}) if cls != "gemm"}
    cols["t_class_gemm_s"] = gemm_s  # the tile model's and the ledger's own (fp32) GEMMs: compute_columns's t_gemm_s
    return cols
