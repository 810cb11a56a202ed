"""The op-class constants of a machine YAML's ``kernels:`` section, from kernel micro-benchmark records (no torch).

One definition for both callers: ``benchmarks/kernel_constants.py`` over the JSON lines of the 2026-11-26 GPU
session (``data/measured/gpu-h100-h200/micro.py``, ``micro2.py``) and ``axoplan probe``'s own kernel sweep
(``axoplan.executor.kernel_sweep``), whose records have the same fields.

Each memory-bound class's efficiency is the bytes its kernel must move over the time it took, over the HBM
bandwidth (datasheet). The attention curves are the fused kernels' forward+backward TFLOP/s over peak (the
FlashAttention-2 convention, causal: forward ``4·b·s²·h·d/2``, backward 2.5× that), after taking off the
time the benchmark spent accumulating q, k and v's gradients into their leaf tensors (three bf16 adds of
``b·h·s·d`` elements, 6 bytes each, at the element-wise efficiency): the benchmark calls ``backward`` on leaf
tensors, so from the second call on autograd adds into ``.grad``. The loss's efficiency takes off its two
casts (12 bytes per logit at the cast's efficiency) and the same leaf accumulation (6 bytes per logit),
leaving the ledger's loss ops (``LOSS_BYTES_PER_LOGIT``).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

__all__ = ["LOSS_BYTES_PER_LOGIT", "ADAMW_BYTES_PER_PARAM", "CAST_BYTES_PER_ELEMENT", "TENSORS_MOVED",
           "read_records", "kernel_constants", "attention_curves", "CLASSES"]

LOSS_BYTES_PER_LOGIT = 32.0
"""Bytes the loss class moves per logit in the Hugging Face ledgers (``frameworks/ledgers/hf-*.json``):
``_log_softmax`` reads and writes fp32 (8), ``nll_loss_forward`` reads the log-probabilities (4),
``nll_loss_backward`` reads them and writes the gradient (8), ``_log_softmax_backward_data`` reads two and
writes one fp32 tensor (12)."""

ADAMW_BYTES_PER_PARAM = 32.0
"""Bytes fused fp32 AdamW moves per parameter as the ledgers count an op (every input read, every tensor its
schema marks written): parameter, gradient and both moments read (16) and written (16; ``_fused_adamw_``'s
schema marks the gradients written too, for its optional unscaling)."""

CAST_BYTES_PER_ELEMENT = 6.0
"""An fp32 -> bf16 cast reads 4 bytes and writes 2 per element."""

TENSORS_MOVED = {"add": 3, "layer_norm": 2, "rms_norm": 2, "silu_mul": 3, "sum_rows": 1}
"""Tensors of the input's size each memory-bound benchmark is counted as moving (``micro.py``'s conventions):
``x + y`` reads two and writes one; a norm reads one and writes one (its weights are one row); ``silu(x)·y``
as one fused op reads two and writes one; a sum over rows reads one (its output is one row, counted apart)."""

CLASSES = ("elementwise", "norm", "activation", "copy_cast", "reduction", "loss", "optimizer", "memset")
"""The memory-bound classes of ``axoplan.inputs.machine.KernelModel``, in the order the probe writes them."""


def read_records(paths: list[Path]) -> list[dict[str, Any]]:
    """Every JSON line of `paths` (blank lines skipped)."""
    return [json.loads(line) for p in paths for line in p.read_text().splitlines() if line.strip()]


def kernel_constants(recs: list[dict[str, Any]], hbm_gbs: float, peak_tflops: float) -> dict[str, Any]:
    """Each class the records measure, as a share of `hbm_gbs` (memory-bound) or of `peak_tflops` (attention).

    Classes without records are left out. Values are as measured: above 1 where a benchmark beat the datasheet
    (a cache-resident CPU tensor), ``inf`` where taking off the loss's casts leaves no time; the probe's
    fragment caps them (``axoplan.executor.kernel_yaml``).
    """
    bw = hbm_gbs * 1e9
    ok = [r for r in recs if "error" not in r]
    out: dict[str, Any] = {}
    ew = [r for r in ok if r["kind"] == "elementwise"]
    if ew:
        out["elementwise"] = statistics.median(r["add_gbs"] * 1e9 / bw for r in ew)
        out["norm"] = statistics.median(r["layer_norm_gbs"] * 1e9 / bw for r in ew)
        out["activation"] = statistics.median(r["silu_mul_gbs"] * 1e9 / bw for r in ew)
    casts = [r for r in ok if r["kind"] == "cast"]
    if casts:
        out["copy_cast"] = statistics.median(CAST_BYTES_PER_ELEMENT * r["elements"] / r["fp32_to_bf16_s"] / bw
                                             for r in casts)
    fused = [r for r in ok if r["kind"] == "optimizer" and r["impl"] == "AdamW fused fp32"]
    if fused:
        out["optimizer"] = statistics.median(ADAMW_BYTES_PER_PARAM * r["params"] / r["step_s"] / bw for r in fused)
    losses = [r for r in ok if r["kind"] == "loss"]
    if losses and "copy_cast" in out and "elementwise" in out:
        out["loss"] = statistics.median(_loss_efficiency(r, out["copy_cast"], out["elementwise"], bw) for r in losses)
    sums = [r for r in ok if r["kind"] == "reduction"]
    if sums:
        out["reduction"] = statistics.median(r["sum_rows_gbs"] * 1e9 / bw for r in sums)
    fills = [r for r in ok if r["kind"] == "memset"]
    if fills:
        out["memset"] = statistics.median(r["bytes"] / r["zero_s"] / bw for r in fills)
    unaligned = [r for r in ok if r["kind"] == "gemm_unaligned"]
    if unaligned:  # flop rate of the unaligned shape over the aligned one's
        out["unaligned_gemm_efficiency"] = statistics.median(
            r["n"] * r["aligned_s"] / (r["n_aligned"] * r["unaligned_s"]) for r in unaligned)
    if ew:  # the leaf-gradient adds are taken off at the element-wise efficiency
        out["attention"] = attention_curves(ok, bw, peak_tflops, out["elementwise"])
    defaults = [r["backend"] for r in ok if r["kind"] == "attention_default"]
    if defaults:
        out["default_attention"] = defaults[0]
    return out


def _loss_efficiency(r: dict[str, Any], cast_eff: float, ew_eff: float, bw: float) -> float:
    logits = r["tokens"] * r["vocab"]
    other = logits * (12.0 / cast_eff + 6.0 / ew_eff) / bw
    rest = r["upcast_fwd_bwd_s"] - other
    return LOSS_BYTES_PER_LOGIT * logits / rest / bw if rest > 0 else math.inf


def attention_curves(recs: list[dict[str, Any]], bw: float, peak_tflops: float, ew_eff: float) -> dict[str, Any]:
    """Per backend, the median over head counts of forward+backward efficiency at each sequence length."""
    curves: dict[str, dict[int, list[float]]] = {}
    for r in recs:
        if r["kind"] != "attention" or "error" in r:
            continue
        fwd_flops = 4.0 * r["batch"] * r["heads"] * r["seq"] ** 2 * r["head_dim"] / 2.0
        accumulate = 3.0 * 6.0 * r["batch"] * r["heads"] * r["seq"] * r["head_dim"] / (bw * ew_eff)
        rest = r["fwd_bwd_s"] - accumulate
        eff = 3.5 * fwd_flops / rest / (peak_tflops * 1e12) if rest > 0 else math.inf
        curves.setdefault(r["backend"], {}).setdefault(r["seq"], []).append(eff)
    return {name: {"seq": sorted(pts), "efficiency": [round(statistics.median(pts[s]), 3) for s in sorted(pts)]}
            for name, pts in curves.items()}
