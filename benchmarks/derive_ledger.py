"""Derive a framework's op ledger by tracing its real training step on CPU (no GPU needed).

    python benchmarks/derive_ledger.py --family gpt2 --precision autocast  # writes frameworks/ledgers/hf-<...>.json

What it does (``docs/algorithm.md`` §4e):

1. Builds a tiny model of the family with Hugging Face transformers (fp32 weights, or bf16 weights with
   ``--precision bf16``), runs one training step as ``Trainer(bf16=True)`` runs it: forward under
   ``torch.autocast(bfloat16)``, the loss of ``labels=input_ids``, backward, fused AdamW, zero_grad.
2. CUDA autocast is emulated on CPU: CPU autocast leaves ops in bf16 that CUDA autocast runs in fp32
   (``pow``, ``layer_norm``, ``softmax``, ``log_softmax``, ``sum``, ``exp``, ``rsqrt``...; the CUDA lists
   are PyTorch's ``aten/src/ATen/autocast_mode.cpp``), so an ``AutocastCPU`` kernel is registered for each
   of those that casts its floating inputs to fp32 first, exactly as CUDA's does (the casts are real ops
   that autograd records).
3. A ``TorchDispatchMode`` records every aten op below autograd (what reaches a kernel), with each
   tensor's shape and dtype, tagged by scope: a block's forward and backward (module hooks), the rest of
   the forward and backward (embeddings, final norm, LM head, loss), and the optimizer step. Saved-tensor
   hooks record what autograd keeps for the backward, per scope.
4. It traces again with each dimension doubled (batch, sequence, hidden, heads, KV heads, FFN width,
   vocabulary) and reads each tensor's element count as a monomial ``c · B^b · S^s · H^h ...`` from the
   ratios (every exponent must come out an integer, or the derivation stops).

The result is data: ``frameworks/ledgers/<profile>-<family>.json`` with the tool and versions that made
it. axoplan reads it without transformers or torch (``axoplan.cost.ledger``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

SYMBOLS = ("B", "S", "H", "NH", "KV", "F", "V")

# CUDA autocast's fp32 ops (aten/src/ATen/autocast_mode.cpp, KERNEL_CUDA(..., fp32) and fp32_set_opt_dtype)
# that CPU autocast does not upcast; the set ones take dtype=float32 when none is given.
CUDA_FP32 = ("pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "exp", "log", "log1p", "expm1", "rsqrt",
             "reciprocal", "layer_norm", "group_norm", "nll_loss", "mse_loss", "binary_cross_entropy_with_logits",
             "logsumexp", "norm.Scalar")
CUDA_FP32_SET_DTYPE = ("softmax.int", "log_softmax.int", "sum", "sum.dim_IntList", "cumsum", "prod")

VIEW_OPS = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "slice", "select", "unsqueeze", "squeeze",
            "split", "split_with_sizes", "alias", "detach", "as_strided", "unbind", "reshape", "lift_fresh",
            "_reshape_alias", "chunk", "narrow", "diagonal", "unflatten", "flatten", "view_as", "movedim",
            "expand_as", "_to_copy_view", "lift_fresh_copy", "_local_scalar_dense", "is_same_size", "sym_size",
            "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "arange", "scalar_tensor",
            "_has_compatible_shallow_copy_type", "set_", "resize_"}


def op_class(name: str) -> str:
    """The ledger class of an aten op (``axoplan.cost.ledger.OP_CLASSES``)."""
    base = name.split(".")[0].lstrip("_")
    if base in {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addbmm", "grouped_mm"}:
        return "gemm"
    if "scaled_dot_product" in base or "flash_attention" in base or "efficient_attention" in base:
        return "attention"
    if "layer_norm" in base or "rms_norm" in base or "group_norm" in base:
        return "norm"
    if base in {"log_softmax", "log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward",
                "nll_loss2d_forward", "nll_loss2d_backward"}:
        return "loss"
    if "fused_adam" in base or "fused_sgd" in base:
        return "optimizer"  # one multi-tensor kernel per chunk of tensors; foreach ops are element-wise kernels
    if base in {"to_copy", "copy", "copy_", "clone", "cat", "stack", "contiguous", "constant_pad_nd", "index_select",
                "embedding", "gather", "index", "masked_fill"}:
        return "copy_cast"
    if base in {"sum", "mean", "amax", "max", "min", "argmax", "topk", "sort", "softmax", "softmax_backward_data",
                "norm", "linalg_vector_norm", "any", "all", "cumsum", "var_mean"}:
        return "reduction"
    if base in {"gelu", "gelu_backward", "silu", "silu_backward", "tanh_backward", "sigmoid_backward", "relu",
                "threshold_backward"}:
        return "activation"
    if base in {"embedding_dense_backward", "index_add", "index_put", "scatter_add", "scatter", "index_add_",
                "new_zeros", "zeros", "zeros_like", "fill", "fill_", "zero_", "ones_like", "full", "full_like"}:
        return "memset" if base in {"new_zeros", "zeros", "zeros_like", "fill", "fill_", "zero_", "full",
                                     "full_like", "ones_like"} else "copy_cast"
    return "elementwise"


def activation_axis(scope: str, gemms_before: int) -> str:
    """The axis a block op's activations are split over on AxoNN's Megatron path (``docs/algorithm.md`` §1), from
    where it sits among the block's four linears: between QKV and attention-out, and between MLP-up and
    MLP-down, the heads and the FFN width are split over Y; elsewhere (norms, residual adds) the hidden
    features over X. The forward meets one GEMM per linear, the backward two (dX and dW), in reverse order."""
    linears_before = gemms_before if scope.endswith("forward") else gemms_before // 2
    return "y" if linears_before % 2 else "x"


def is_view(name: str) -> bool:
    return name.split(".")[0] in VIEW_OPS


@contextmanager
def cuda_autocast_on_cpu() -> Iterator[None]:
    """Register ``AutocastCPU`` kernels that upcast as CUDA autocast does (see the module docstring)."""
    warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")  # where CPU autocast has a kernel already
    lib = torch.library.Library("aten", "IMPL")
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def upcast(a: Any) -> Any:
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float32:
            return a.float()
        if isinstance(a, list | tuple) and a and isinstance(a[0], torch.Tensor):
            return type(a)(upcast(x) for x in a)
        return a

    def fp32_kernel(op: Any) -> Callable[..., Any]:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(exclude):
                return op(*[upcast(a) for a in args], **{k: upcast(v) for k, v in kwargs.items()})
        return kernel

    def set_dtype_kernel(op: Any) -> Callable[..., Any]:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(exclude):
                x = args[0]
                if isinstance(x, torch.Tensor) and x.is_floating_point() and kwargs.get("dtype") is None:
                    positional_dtype = any(isinstance(a, torch.dtype) for a in args[1:])
                    if not positional_dtype:
                        kwargs = {**kwargs, "dtype": torch.float32}
                return op(*args, **kwargs)
        return kernel

    for names, maker in ((CUDA_FP32, fp32_kernel), (CUDA_FP32_SET_DTYPE, set_dtype_kernel)):
        for qual in names:
            name, _, overload = qual.partition(".")
            packet = getattr(torch.ops.aten, name)
            op = getattr(packet, overload or "default")
            with contextlib.suppress(RuntimeError):  # overriding CPU autocast's own kernel only warns
                lib.impl(qual, maker(op), "AutocastCPU")
    try:
        yield
    finally:
        del lib


class Recorder(TorchDispatchMode):
    """Every aten op below autograd, with its tensors, tagged by the scope set on `self.scope`."""

    def __init__(self) -> None:
        super().__init__()
        self._scope = "rest_forward"
        self.gemms_seen = 0
        self.ops: dict[str, list[dict[str, Any]]] = defaultdict(list)

    @property
    def scope(self) -> str:
        return self._scope

    @scope.setter
    def scope(self, value: str) -> None:
        self._scope, self.gemms_seen = value, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = f"{func._schema.name.split('::')[-1]}.{func._overloadname}"
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = _unique([t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)] + _mutated(func, args, kwargs))
        self.ops[self.scope].append({
            "op": name,
            "in": [(t.numel(), t.element_size()) for t in ins],
            "out": [(t.numel(), t.element_size()) for t in outs],
            "shapes": [tuple(t.shape) for t in ins],
            "region": self.gemms_seen,
        })
        if op_class(name) == "gemm":
            self.gemms_seen += 1
        return out


def _mutated(func: Any, args: Any, kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors an in-place op writes (its schema's ``Tensor(a!)`` arguments): they count as written."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            out += [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
    return out


def _unique(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor once (an in-place op returns the tensor it wrote), in order."""
    return list({id(t): t for t in tensors}.values())


@contextmanager
def saved_bytes(recorder: Recorder, saved: dict[str, list[tuple[int, int]]]) -> Iterator[None]:
    """What autograd keeps for the backward, per scope, each storage once (its bytes, and how many GEMMs of the
    scope came before it: its activation axis)."""
    seen: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in seen and t.untyped_storage().nbytes() > 0:
            seen.add(key)
            saved[recorder.scope].append((t.untyped_storage().nbytes(), recorder.gemms_seen))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def build(family: str, dims: dict[str, int], precision: str) -> Any:
    """A one-block model of `family` at `dims` (fp32 weights, or bf16 with precision 'bf16')."""
    import transformers as tr

    h, nh, kv, f, v, s = dims["H"], dims["NH"], dims["KV"], dims["F"], dims["V"], dims["S"]
    if family == "gpt2":
        cfg = tr.GPT2Config(n_embd=h, n_layer=1, n_head=nh, n_inner=f, n_positions=s, vocab_size=v,
                            activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            bos_token_id=0, eos_token_id=0)
        cls: Any = tr.GPT2LMHeadModel
    elif family == "llama":
        cfg = tr.LlamaConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=nh, num_key_value_heads=kv,
                             intermediate_size=f, vocab_size=v, max_position_embeddings=s, tie_word_embeddings=False,
                             bos_token_id=0, eos_token_id=0, pad_token_id=None)
        cls = tr.LlamaForCausalLM
    elif family == "gpt-neox":
        cfg = tr.GPTNeoXConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=nh, intermediate_size=f,
                               vocab_size=v, max_position_embeddings=s, rotary_pct=0.25, use_parallel_residual=True,
                               hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=0, eos_token_id=0)
        cls = tr.GPTNeoXForCausalLM
    elif family == "mixtral":
        cfg = tr.MixtralConfig(hidden_size=h, num_hidden_layers=1, num_attention_heads=nh, num_key_value_heads=kv,
                               intermediate_size=f, vocab_size=v, max_position_embeddings=s, num_local_experts=EXPERTS,
                               num_experts_per_tok=TOP_K, tie_word_embeddings=False, router_aux_loss_coef=0.0,
                               output_router_logits=False, bos_token_id=0, eos_token_id=0, pad_token_id=None)
        cls = tr.MixtralForCausalLM
    else:
        raise SystemExit(f"unknown family {family!r}; known: gpt2, llama, gpt-neox, mixtral")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = cls(cfg)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    return model


GQA_FAMILIES = ("llama", "mixtral")
"""Families whose key-value heads are their own dimension (grouped-query attention)."""

EXPERTS, TOP_K = 8, 2
"""Mixtral's experts and experts per token (Mixtral 8x7B and 8x22B; the 2026-11-26 Mixtral profile): a mixture's op
list depends on them, so they are fixed in its ledger, not symbols."""


@contextmanager
def balanced_routing(model: Any) -> Iterator[None]:
    """Route token t to experts ``(t·k + j) mod E``: every expert gets exactly ``T·k/E`` tokens (Switch Transformer's
    balanced router as the planning case, ``docs/algorithm.md`` §4c), so every size stays a monomial. The router
    still computes its logits, softmax and top-k as transformers does; only the indices chosen are replaced."""
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    originals = [r.forward for r in routers]

    def routed(router: Any, forward: Callable[..., Any]) -> Callable[..., Any]:
        def run(hidden: torch.Tensor) -> Any:
            logits, scores, _ = forward(hidden)
            t = torch.arange(logits.shape[0], device=logits.device)[:, None] * TOP_K + torch.arange(TOP_K)
            return logits, scores, t % router.num_experts
        return run

    for r, f in zip(routers, originals, strict=True):
        r.forward = routed(r, f)
    try:
        yield
    finally:
        for r, f in zip(routers, originals, strict=True):
            r.forward = f


def blocks_of(model: Any) -> list[torch.nn.Module]:
    for path in ("transformer.h", "model.layers", "gpt_neox.layers"):
        obj: Any = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return list(obj)
    raise SystemExit("no transformer blocks found")


def trace_step(family: str, dims: dict[str, int], precision: str) -> tuple[dict[str, list[dict[str, Any]]],
                                                                              dict[str, list[tuple[int, int]]], int]:
    """The second training step of a one-block model (the first creates the optimizer's states): (ops per scope,
    saved storages per scope, parameters)."""
    model = build(family, dims, precision)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, dims["V"], (dims["B"], dims["S"]))
    rec = Recorder()
    saved: dict[str, list[tuple[int, int]]] = defaultdict(list)
    block = blocks_of(model)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16), balanced_routing(model):  # one step untraced: states exist
        model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

    def setter(scope: str) -> Callable[..., None]:
        def hook(*_: Any, **__: Any) -> None:
            rec.scope = scope
        return hook

    block.register_forward_pre_hook(setter("block_forward"))
    block.register_forward_hook(setter("rest_forward"))
    block.register_full_backward_pre_hook(setter("block_backward"))
    block.register_full_backward_hook(setter("rest_backward"))
    with cuda_autocast_on_cpu(), rec, balanced_routing(model):
        with torch.autocast("cpu", dtype=torch.bfloat16), saved_bytes(rec, saved):
            loss = model(input_ids=ids, labels=ids).loss
        rec.scope = "rest_backward"
        loss.backward()
        rec.scope = "step"
        opt.step()
        opt.zero_grad(set_to_none=True)
    return dict(rec.ops), dict(saved), sum(p.numel() for p in model.parameters())


def trace_executor_step(family: str, dims: dict[str, int], precision: str) -> tuple[
        dict[str, list[dict[str, Any]]], dict[str, list[tuple[int, int]]], int]:
    """The same for axoplan's own executor (``axoplan/executor``) on one rank (gloo, CPU, bf16 as it runs on a GPU):
    one block, one micro-batch, the second step (its optimizer's master copies and moments exist)."""
    import torch.distributed as dist

    from axoplan.executor import train
    from axoplan.executor.layers import megatron_model
    from axoplan.executor.spec import ExecSettings
    from axoplan.executor.timing import PhaseTimer
    from axoplan.inputs.model import ModelSpec
    from axoplan.inputs.options import RunOptions
    from axoplan.records.plan import LaunchConfig
    from axoplan.space.layout import Layout

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)
    llama = family == "llama"
    spec = ModelSpec(name="trace", num_layers=1, hidden=dims["H"], num_heads=dims["NH"],
                     num_kv_heads=dims["KV"] if llama else None, ffn_hidden=dims["F"], vocab=dims["V"],
                     max_positions=dims["S"], ffn_kind="swiglu" if llama else "gelu", biases=not llama)
    options = RunOptions(global_batch=dims["B"], seq_len=dims["S"], micro_batches=(dims["B"],), recompute="off",
                         cache_weights="off", framework="axoplan-executor")
    plan = LaunchConfig.build(machine="dgx-h100", devices_per_node=8, model=spec, options=options,
                              layout=Layout(1, 1, 1, 1), micro_batch=dims["B"], recompute=False, cache_weights=False)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    settings = ExecSettings(device="cpu", dtype="bfloat16" if precision == "bf16" else "float32")
    device = torch.device("cpu")
    groups = train.build_groups(plan.layout.to_layout(), "cpu", 60.0)
    rt = train._runtime(plan, groups, PhaseTimer(device, True))
    vocab = train.plan_vocab(plan)
    torch.manual_seed(0)
    params = {k: v.to(device, dtype) for k, v in train._initial_params(plan, settings, groups, vocab).items()}
    model = megatron_model(plan.model, vocab, params, rt, plan.recompute)
    batches = train.local_batches(plan, train.synthetic_tokens(plan, 0), groups.coords, device, groups.rank)
    optimizer = train._optimizer(model, settings)
    train._step(model, rt, batches, optimizer, 1.0, False)
    rec = Recorder()
    saved: dict[str, list[tuple[int, int]]] = defaultdict(list)

    def setter(scope: str) -> Callable[..., None]:
        def hook(*_: Any, **__: Any) -> None:
            rec.scope = scope
        return hook

    block = model.blocks[0]
    block.register_forward_pre_hook(setter("block_forward"))
    block.register_forward_hook(setter("rest_forward"))
    block.register_full_backward_pre_hook(setter("block_backward"))
    block.register_full_backward_hook(setter("rest_backward"))
    model.register_forward_hook(setter("rest_backward"))  # the loss's scaling and backward follow the forward
    step = optimizer.step

    def traced_step() -> None:
        rec.scope = "step"
        step()

    optimizer.step = traced_step  # type: ignore[method-assign]
    with rec, saved_bytes(rec, saved):
        rec.scope = "rest_forward"
        train._step(model, rt, batches, optimizer, 1.0, False)
    return dict(rec.ops), dict(saved), sum(p.numel() for p in model.parameters())


def _exponents(base: int, varied: dict[str, int], where: str) -> dict[str, int]:
    exps: dict[str, int] = {}
    for sym, n in varied.items():
        r = math.log2(n / base) if base and n else 0.0
        if abs(r - round(r)) > 0.1:  # labels padded by one position (S + 1) read as S: within 0.1
            raise SystemExit(f"{where}: element count {base} -> {n} when {sym} doubles is not a power of two")
        if round(r):
            exps[sym] = round(r)
    return exps


def _monomial(count: int, exps: dict[str, int], dims: dict[str, int]) -> tuple[float, dict[str, int]]:
    scale = math.prod(dims[s] ** e for s, e in exps.items())
    return count / scale, exps


def derive(family: str, precision: str, base: dict[str, int], framework: str = "hf") -> dict[str, Any]:
    """Trace at `base` and with each symbol doubled; return the ledger as data."""
    trace = trace_executor_step if framework == "executor" else trace_step
    runs = {"base": trace(family, base, precision)}
    for sym in SYMBOLS:
        if sym == "KV" and family not in GQA_FAMILIES:
            continue
        dims = dict(base)
        dims[sym] *= 2
        if sym == "NH" and family not in GQA_FAMILIES:
            dims["KV"] = dims["NH"]
        runs[sym] = trace(family, dims, precision)
    varied = [s for s in runs if s != "base"]
    ops0, saved0, params0 = runs["base"]
    scopes: dict[str, list[dict[str, Any]]] = {}
    for scope, ops in ops0.items():
        if scope == "step":
            continue
        entries = []
        for i, op in enumerate(ops):
            for sym in varied:
                other = runs[sym][0][scope]
                if len(other) != len(ops) or other[i]["op"] != op["op"]:
                    raise SystemExit(f"{scope}: the op list changes when {sym} doubles (op {i}, {op['op']})")
            entries.append(_entry(op, i, scope, runs, varied, base))
        scopes[scope] = _compact(entries)
    step_bytes: dict[str, float] = defaultdict(float)
    for op in ops0.get("step", []):
        if not is_view(op["op"]):
            step_bytes[op_class(op["op"])] += sum(n * b for n, b in op["in"] + op["out"]) / params0
    step_kernels = sum(1 for op in ops0.get("step", []) if not is_view(op["op"]))
    saved = {scope: _saved_terms(scope, runs, varied, base) for scope in saved0}
    return {"scopes": scopes, "saved": saved,
            "optimizer": {"bytes_per_param": {k: round(v, 4) for k, v in sorted(step_bytes.items())},
                          "ops": step_kernels,
                          "ops_names": sorted({op["op"] for op in ops0.get("step", [])})}}


def _entry(op: dict[str, Any], i: int, scope: str, runs: dict[str, Any], varied: list[str],
           base: dict[str, int]) -> dict[str, Any]:
    def terms(side: str) -> list[list[Any]]:
        if is_view(op["op"]):
            return []  # a view moves no bytes
        if side == "out" and op["op"].split(".")[0] in ("cat", "_cat", "stack") and len(op["out"]) == 1:
            size = op["out"][0][1]  # a concatenation writes what it reads, in its own dtype
            return [[c * size / op["in"][j][1], e] for j, (c, e) in enumerate(terms("in"))]
        out = []
        for j, (n, size) in enumerate(op[side]):
            exps = _exponents(n, {s: runs[s][0][scope][i][side][j][0] for s in varied}, f"{scope} {op['op']}")
            coef, e = _monomial(n, exps, base)
            out.append([round(coef * size, 6), e])
        return out

    entry = {"op": op["op"], "class": op_class(op["op"]), "read": terms("in"), "write": terms("out")}
    if scope.startswith("block"):
        entry["axis"] = activation_axis(scope, op["region"])
    if entry["class"] in {"gemm", "attention"}:
        entry["flops"] = _flops_terms(op, i, scope, runs, varied, base)
        entry["dtype"] = "fp32" if op["in"] and op["in"][0][1] == 4 else "bf16"
    if is_view(op["op"]):
        entry["class"] = "view"
    return entry


def _flops_terms(op: dict[str, Any], i: int, scope: str, runs: dict[str, Any], varied: list[str],
                 base: dict[str, int]) -> list[list[Any]]:
    def flops(o: dict[str, Any]) -> int:
        shapes = o["shapes"]
        name = o["op"].split(".")[0]
        if "scaled_dot_product" in name or "flash" in name:
            q, k = shapes[0], shapes[1]
            if name.endswith("backward"):
                q, k = shapes[1], shapes[2]  # grad_out, query, key, ...
            b, nh, s, d = q
            return 4 * b * nh * s * k[2] * d * (5 if name.endswith("backward") else 2) // 2
        if name.lstrip("_") == "grouped_mm":  # E groups: 2·M·K·N summed over groups = 2·sqrt(|A|·|B|·|C| / E)
            a, b, offs = shapes[0], shapes[1], shapes[2]
            return round(2 * math.sqrt(math.prod(a) * math.prod(b) * o["out"][0][0] / math.prod(offs)))
        dims = [s for s in shapes if len(s) >= 2][-2:]
        if len(dims) < 2:
            return 0
        a, w = dims
        batch = math.prod(a[:-2]) if len(a) > 2 else 1
        return 2 * batch * a[-2] * a[-1] * w[-1]

    n = flops(op)
    exps = _exponents(n, {s: flops(runs[s][0][scope][i]) for s in varied}, f"{scope} {op['op']} flops")
    coef, e = _monomial(n, exps, base)
    return [[round(coef, 6), e]]


def _compact(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Equal entries (op, class, terms) merged with a count, in first-seen order."""
    merged: dict[str, dict[str, Any]] = {}
    for e in entries:
        key = json.dumps(e, sort_keys=True)
        if key in merged:
            merged[key]["count"] += 1
        else:
            merged[key] = {**e, "count": 1}
    return list(merged.values())


def _saved_terms(scope: str, runs: dict[str, Any], varied: list[str], base: dict[str, int]) -> list[list[Any]]:
    sizes = runs["base"][1][scope]
    out: list[list[Any]] = []
    for j, (n, region) in enumerate(sizes):
        other = {s: runs[s][1][scope][j][0] for s in varied if j < len(runs[s][1].get(scope, []))}
        exps = _exponents(n, other, f"saved {scope}")
        coef, e = _monomial(n, exps, base)
        out.append([round(coef, 6), e, activation_axis("block_forward", region)] if scope.startswith("block")
                   else [round(coef, 6), e])
    return out


BASE = {"B": 2, "S": 16, "H": 32, "NH": 4, "KV": 2, "F": 48, "V": 40}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", required=True, choices=["gpt2", "llama", "gpt-neox", "mixtral"])
    ap.add_argument("--precision", default="autocast", choices=["autocast", "bf16", "fp32"],
                    help="autocast: fp32 weights under bf16 autocast (Trainer(bf16=True)); "
                    "bf16: bf16 weights and states; fp32: float32 throughout (the executor on a CPU)")
    ap.add_argument("--framework", default="hf", choices=["hf", "executor"],
                    help="hf: Hugging Face transformers' model; executor: axoplan's own (axoplan/executor)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import transformers

    base = dict(BASE)
    if args.family not in ("llama", "mixtral"):
        base["KV"] = base["NH"]
    else:  # two query heads per KV head at every doubling (one would change the executor's op list)
        base.update(NH=8, H=64)
    if args.family == "gpt-neox":  # rotary on a quarter of each head: whole even dimensions at every doubling
        base.update(H=64)
    ledger = derive(args.family, args.precision, base, args.framework)
    if args.precision == "fp32" and args.framework != "executor":
        raise SystemExit("--precision fp32 is the executor's CPU dtype; Hugging Face steps are autocast or bf16")
    name = ("executor" + ("-fp32" if args.precision == "fp32" else "")) if args.framework == "executor" \
        else f"hf-{args.precision}"
    doc = {
        "profile": name, "family": args.family,
        "made_by": "python benchmarks/derive_ledger.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "symbols": {"B": "micro-batch sequences", "S": "sequence length", "H": "hidden size", "NH": "attention heads",
                    "KV": "key-value heads", "F": "FFN width", "V": "vocabulary"},
        "base_dims": base,
        **({"moe": {"experts": EXPERTS, "top_k": TOP_K}} if args.family == "mixtral" else {}),
        **ledger,
    }
    ledgers = Path(__file__).resolve().parents[1] / "frameworks" / "ledgers"
    out = args.out or ledgers / f"{name}-{args.family}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    n = sum(e["count"] for ops in ledger["scopes"].values() for e in ops)
    print(f"wrote {out}: {n} ops in {len(ledger['scopes'])} scopes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
