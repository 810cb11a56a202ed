"""Which candidates can run: one set of rules for the planner and the executor.

``rank`` checks every candidate at once; ``run`` checks its plan as a one-row candidate
table, so a layout the planner calls feasible is one the executor starts, and a refusal
reads the same in both (``docs/decisions.md``, issue 14). Rules, in the order their
reasons are reported (the first that fails names the candidate's reason):

* ``positions``: the sequence fits the model's learned position embeddings;
* ``dims-x`` / ``dims-y``: every feature dimension split over X (resp. Y) divides by Gx
  (Gy); a layer whose output is several parts (SwiGLU's gate and up) splits each part;
* ``heads``: Gy divides the attention heads and the KV heads (heads are split over Y; not on the
  Hugging Face path, whose attention runs every head on the GPU's own tokens);
* ``batch``: Gdata·Gz·micro-batch divides the global batch (gradient accumulation); on the Hugging
  Face path every GPU holds its own sequences, so G·micro-batch must divide it;
* ``moe``: the MoE module can run the layout: AxoNN's native ``DroplessMoEMLP`` builds its
  tensor-parallel and FSDP groups inside Z (``Gx = Gy = 1``, ``expert_tp`` dividing Gz and the
  expert width; ``axonn/intra_layer/moe/linear.py``); the Mixtral patch's linears need the hf path;
* ``recompute``: the framework's code runs only with full activation recompute (its profile's
  ``recompute_required``: Megatron-AxoNN at f6df7ae raises otherwise), on its Megatron path; the
  executor, which runs its own code, does not ask for it;
* ``zblock``: only for AxoNN's own linears, which do not pad: Gz divides each layer's
  X·Y weight block (the native executor zero-pads the last Z shard);
* ``memory``: the memory the layout needs does not fit the HBM even at the low end of its
  interval (``axoplan.cost.memory.memory_verdict``; a layout whose interval straddles the HBM
  is *tight*: feasible, and marked in the tables). Planner only: the executor cannot know
  before it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from axoplan.cost.memory import MemoryVerdict
from axoplan.inputs.axes import label
from axoplan.inputs.framework import load_framework
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.space.candidates import Candidates
from axoplan.space.layout import sequences_per_micro_step

__all__ = ["REASONS", "Feasibility", "check", "heads_not_divided", "recompute_required"]

REASONS = ("", "positions", "dims-x", "dims-y", "heads", "batch", "moe", "recompute", "zblock", "memory")

Bools = npt.NDArray[np.bool_]
Floats = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Feasibility:
    """Which rule each candidate fails, and why in words."""

    model: ModelSpec
    options: RunOptions
    candidates: Candidates
    fails: dict[str, Bools]  # one mask per entry of REASONS[1:]
    memory: MemoryVerdict | None = None

    @property
    def reason(self) -> npt.NDArray[np.uint8]:
        """Index into REASONS of the first rule each candidate fails (0: feasible)."""
        out = np.zeros(len(self.candidates), dtype=np.uint8)
        for code in range(len(REASONS) - 1, 0, -1):
            out[self.fails[REASONS[code]]] = code
        return out

    def failed(self, i: int) -> list[str]:
        """Every rule candidate i fails, in REASONS order."""
        return [code for code in REASONS[1:] if self.fails[code][i]]

    def text(self, i: int, code: str | None = None) -> str:
        """Why candidate i fails rule `code` (default: its first failing rule), in words."""
        if code is None:
            failed = self.failed(i)
            if not failed:
                return ""
            code = failed[0]
        return _TEXT[code](self, i)

    def texts(self, i: int) -> list[str]:
        return [self.text(i, code) for code in self.failed(i)]


def check(model: ModelSpec, options: RunOptions, c: Candidates, engine: str = "native",
          memory: MemoryVerdict | None = None, framework_code: bool = True) -> Feasibility:
    """Every rule for every candidate (vectorised); memory only when its verdict is given; the framework's own
    code's rules (``recompute``) only for a plan its code runs (`framework_code`; not the executor's)."""
    n = len(c)
    sizes = c.sizes()
    dims = {axis: np.zeros(n, dtype=bool) for axis in ("x", "y")}
    zblock = np.zeros(n, dtype=bool)
    for lin in model.block_linears():
        dims[lin.in_axis] |= lin.k_in % sizes[lin.in_axis] != 0
        dims[lin.out_axis] |= (lin.n_out // lin.out_chunks) % sizes[lin.out_axis] != 0
        if engine == "axonn":
            zblock |= (lin.params_per_copy // (c.gx * c.gy)) % c.gz != 0
    too_long = bool(model.max_positions) and options.seq_len > model.max_positions
    heads = (model.num_heads % c.gy != 0) | (model.kv_heads % c.gy != 0)
    fails = {
        "positions": np.full(n, too_long),
        "dims-x": dims["x"],
        "dims-y": dims["y"],
        "heads": heads & (not options.hf_path),
        "batch": options.global_batch % sequences_per_micro_step(c.gx, c.gy, c.gz, c.gdata, c.micro_batch,
                                                                  options.hf_path) != 0,
        "moe": _moe_fails(model, options, c),
        "recompute": ~c.recompute & (framework_code and recompute_required(options)),
        "zblock": zblock,
        "memory": memory.does_not_fit if memory is not None else np.zeros(n, dtype=bool),
    }
    return Feasibility(model, options, c, fails, memory)


def recompute_required(options: RunOptions) -> bool:
    """Whether the run's framework runs its blocks only under full recompute (its Megatron path)."""
    return load_framework(options.framework).recompute_required and not options.hf_path


def _recompute(f: Feasibility, i: int) -> str:
    return (f"--framework {f.options.framework} runs its blocks only with full activation recompute (its code raises "
            f"otherwise; frameworks/{f.options.framework}.yaml): use --recompute on or search")


def _moe_fails(model: ModelSpec, options: RunOptions, c: Candidates) -> npt.NDArray[np.bool_]:
    """Where the model's MoE module cannot run the layout (module docstring)."""
    if model.moe is None:
        return np.zeros(len(c), dtype=bool)
    if options.moe_module == "hf-mixtral":
        return np.full(len(c), not options.hf_path)
    if options.moe_module == "transformers":
        return c.gx * c.gy * c.gz != 1
    tp, width = options.expert_tp, model.moe.expert_ffn_hidden
    return (c.gx * c.gy != 1) | (c.gz % tp != 0) | (width % tp != 0)


def _moe(f: Feasibility, i: int) -> str:
    c, o = f.candidates, f.options
    if o.moe_module == "hf-mixtral":
        return "AxoNN's Mixtral patch runs its expert linears on the hf path (--axonn-path hf)"
    if o.moe_module == "transformers":
        # a framework that runs transformers' own model runs its experts (its ledger prices them); AxoNN's may swap
        fix = "--framework axonn" if load_framework(o.framework).axonn_path == "hf" else "--moe-impl native"
        return (f"transformers' grouped experts are not nn.Linear modules, so AxoNN shards none of them: they run "
                f"only with Gx=Gy=Gz=1 (layout {c.layout(i)}); for AxoNN's own MoE module, which shards them over Z, "
                f"use {fix}")
    return (f"AxoNN's native MoE module builds its groups inside Z: it needs Gx=Gy=1 and --expert-tp {o.expert_tp} "
            f"dividing Gz={c.gz[i]} and the expert width (layout {c.layout(i)})")


def _positions(f: Feasibility, i: int) -> str:
    return f"sequence length {f.options.seq_len} exceeds the {f.model.max_positions} learned positions"


def _dims(axis: str) -> Callable[[Feasibility, int], str]:
    def text(f: Feasibility, i: int) -> str:
        m, size = f.model, int(f.candidates.sizes()[axis][i])
        return (f"{label(axis)}={size} does not divide every layer dimension sharded over {axis.upper()} "
                f"(hidden {m.hidden}, FFN {m.ffn})")
    return text


def _heads(f: Feasibility, i: int) -> str:
    """Names the heads Gy does not divide: with grouped-query attention the KV heads are the limit
    where Gy divides the query heads (Llama 3.1 70B's 64 query heads and 8 KV heads at Gy=16)."""
    return f"Gy={f.candidates.gy[i]} {heads_not_divided(f.model, int(f.candidates.gy[i]))}"


def heads_not_divided(model: ModelSpec, gy: int) -> str:
    """'does not divide the 8 KV heads (...)', 'does not divide the 56 heads' or 'divides neither ...'."""
    q, kv = model.num_heads, model.kv_heads
    if kv == q:
        return f"does not divide the {q} heads"
    if q % gy == 0:
        return (f"does not divide the {kv} KV heads (grouped-query attention: it divides the {q} query heads, "
                f"but the KV heads are split over Y too)")
    if kv % gy == 0:
        return f"does not divide the {q} query heads"
    return f"divides neither the {q} query heads nor the {kv} KV heads"


def _batch(f: Feasibility, i: int) -> str:
    c = f.candidates
    per = int(sequences_per_micro_step(c.gx[i], c.gy[i], c.gz[i], c.gdata[i], c.micro_batch[i], f.options.hf_path))
    if f.options.hf_path:
        return (f"global batch {f.options.global_batch} is not divisible by GPUs*micro-batch = {per} (on the hf path "
                "every GPU holds its own sequences)")
    return f"global batch {f.options.global_batch} is not divisible by Gdata*Gz*micro-batch = {per}"


def _zblock(f: Feasibility, i: int) -> str:
    c = f.candidates
    gxy, gz = int(c.gx[i] * c.gy[i]), int(c.gz[i])
    lin = next(lin for lin in f.model.block_linears() if (lin.num_params // gxy) % gz)
    return f"{lin.name} weight block {lin.num_params // gxy} not divisible by Gz={gz} (AxoNN's linears do not pad)"


def _memory(f: Feasibility, i: int) -> str:
    m = f.memory
    assert m is not None
    return (f"needs {m.need_bytes[i] / 1e9:.1f} GB per GPU (at least {m.low_bytes[i] / 1e9:.1f}) with the reserve, "
            f"more than the {m.hbm_bytes / 1e9:.0f} GB of HBM")


_TEXT: dict[str, Callable[[Feasibility, int], str]] = {
    "positions": _positions, "dims-x": _dims("x"), "dims-y": _dims("y"), "heads": _heads, "batch": _batch,
    "moe": _moe, "recompute": _recompute, "zblock": _zblock, "memory": _memory,
}
