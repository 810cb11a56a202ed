"""The ledger tracer's monomial fit (``benchmarks/derive_ledger.py``, ``docs/algorithm.md`` §4e).

It traces a framework's step again with each dimension doubled (batch, sequence, hidden, heads, KV heads, FFN
width, vocabulary) and reads each tensor's element count as a monomial ``c · B^b · S^s · H^h ...`` from the
ratios (every exponent must come out an integer, or the derivation stops). A framework's step tracer is looked up
by name in :data:`STEP_TRACERS` (the command's ``--framework`` choices are its names): adding a framework is one
module of this package and one line there.
"""

from __future__ import annotations

import importlib
import json
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from .hf import GQA_FAMILIES
from .recorder import activation_axis, is_batched_gemm, is_view, op_class

StepTrace = tuple[dict[str, list[dict[str, Any]]], dict[str, list[tuple[int, int]]], int]
"""What a step tracer returns: (ops per scope, saved storages per scope, parameters)."""

STEP_TRACERS = {"hf": "hf:trace_step", "executor": "executor:trace_executor_step",
                "torchtitan": "torchtitan:trace_torchtitan_step", "llm-foundry": "llm_foundry:trace_llm_foundry_step",
                "megatron": "megatron:trace_megatron_step", "axonn": "megatron_axonn:trace_axonn_step",
                "megatron-deepspeed": "megatron_deepspeed:trace_deepspeed_step"}
"""Each ``--framework``'s step tracer, ``module:function`` in this package (imported when that framework is traced;
its arguments are the family, the dimensions and the precision)."""


def step_tracer(framework: str) -> Callable[[str, dict[str, int], str], StepTrace]:
    """The step tracer of `framework` (Hugging Face's, ``hf``, for a name not in :data:`STEP_TRACERS`)."""
    module, _, function = STEP_TRACERS.get(framework, STEP_TRACERS["hf"]).partition(":")
    tracer: Callable[[str, dict[str, int], str], StepTrace] = getattr(
        importlib.import_module(f".{module}", __package__), function)
    return tracer


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
    """Trace at `base` and with each of its symbols doubled (the model's dimensions, and a family's experts, top-k or
    heads' width where `base` has them); return the ledger as data."""
    trace = step_tracer(framework)
    runs = {"base": trace(family, base, precision)}
    for sym in base:
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
        if scope in STEP_SCOPES:
            continue
        entries = []
        for i, op in enumerate(ops):
            for sym in varied:
                other = runs[sym][0][scope]
                if len(other) != len(ops) or other[i]["op"] != op["op"]:
                    raise SystemExit(f"{scope}: the op list changes when {sym} doubles (op {i}, {op['op']})")
            entries.append(_entry(op, i, scope, runs, varied, base))
        scopes[scope] = _compact(entries)
    # a scalar read in the step is the optimizer's step count, which torch.optim keeps on the host (not capturable,
    # not fused: torch/optim/adamw.py): no kernel and no device sync there
    step_ops = {scope: [op for op in ops0.get(scope, []) if not is_view(op["op"]) and not op.get("sync")]
                for scope in STEP_SCOPES}
    step_bytes = {scope: _bytes_per_param(ops, params0) for scope, ops in step_ops.items()}
    every = {k: step_bytes["step"].get(k, 0.0) + step_bytes["step_shard"].get(k, 0.0)
             for k in sorted(set(step_bytes["step"]) | set(step_bytes["step_shard"]))}
    saved = {scope: _saved_terms(scope, runs, varied, base) for scope in saved0}
    shard = {"data_shard_bytes_per_param": {k: round(v, 4) for k, v in sorted(step_bytes["step_shard"].items())}}
    return {"scopes": scopes, "saved": saved,
            "optimizer": {"bytes_per_param": {k: round(v, 4) for k, v in every.items()},
                          **(shard if step_ops["step_shard"] else {}),
                          "ops": sum(len(ops) for ops in step_ops.values()),
                          "ops_names": sorted({op["op"] for scope in STEP_SCOPES for op in ops0.get(scope, [])})}}


STEP_SCOPES = ("step", "step_shard")
"""The optimizer step's scopes: ``step_shard`` what runs on a data-parallel rank's ``1/d`` shard of the optimizer
states (Megatron's distributed optimizer), ``step`` the rest."""


def _bytes_per_param(ops: list[dict[str, Any]], params: int) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for op in ops:
        out[op_class(op["op"])] += sum(n * b for n, b in op["in"] + op["out"]) / params
    return dict(out)


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

    entry = {"op": op["op"], "class": "host_sync" if op.get("sync") else op_class(op["op"]), "read": terms("in"),
             "write": terms("out")}
    if scope.startswith("block"):
        entry["axis"] = op.get("axis") or activation_axis(scope, op["region"])
    if entry["class"] in {"gemm", "attention"}:
        entry["flops"] = _flops_terms(op, i, scope, runs, varied, base)
        entry["dtype"] = "fp32" if op["in"] and op["in"][0][1] == 4 else "bf16"
    if entry["class"] == "gemm" and is_batched_gemm(op["op"]):
        entry["tile"] = _tile_terms(op, i, scope, runs, varied, base)
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


def _batched_shape(o: dict[str, Any]) -> dict[str, int]:
    """A batched GEMM's ``[b × m × k]·[b × k × n]`` as the tile model takes it: ``rows = b·m`` (the batch's matrices
    stacked: the same tiles as b GEMMs of m rows), ``n`` and ``k``."""
    a, w = [s for s in o["shapes"] if len(s) == 3][-2:]
    return {"rows": a[0] * a[1], "n": w[2], "k": a[2]}


def _tile_terms(op: dict[str, Any], i: int, scope: str, runs: dict[str, Any], varied: list[str],
                base: dict[str, int]) -> dict[str, list[list[Any]]]:
    """A batched GEMM's rows, ``n`` and ``k``, each a monomial (:func:`_batched_shape`)."""
    out = {}
    for side, n in _batched_shape(op).items():
        other = {s: _batched_shape(runs[s][0][scope][i])[side] for s in varied}
        coef, e = _monomial(n, _exponents(n, other, f"{scope} {op['op']} {side}"), base)
        out[side] = [[round(coef, 6), e]]
    return out


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
