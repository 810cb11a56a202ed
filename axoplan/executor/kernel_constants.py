"""The op-class constants of a machine YAML's ``kernels:`` section, from kernel micro-benchmark records (no torch).

One definition for both callers: ``benchmarks/kernel_constants.py`` over the JSON lines of the 2026-11-26 GPU
session (``data/measured/gpu-h100-h200/micro.py``, ``micro2.py``) and ``axoplan probe``'s own kernel sweep
(``axoplan.executor.kernel_sweep``), whose records have the same fields.

Each memory-bound class's efficiency is the bytes its kernel must move over the time it took, over the HBM
bandwidth (datasheet). The attention curves are the fused kernels' forward+backward TFLOP/s over peak (the
FlashAttention-2 convention, causal: forward ``4·b·s²·h·d/2``, backward 2.5× that), after taking off the
time the benchmark spent accumulating q, k and v's gradients into their leaf tensors (three adds of
``b·h·s·d`` elements, 6 bytes each in bf16, 12 in fp32, at the element-wise efficiency): the benchmark
calls ``backward`` on leaf tensors, so from the second call on autograd adds into ``.grad``. The loss's
efficiency takes off its two casts (12 bytes per logit at the cast's efficiency) and the same leaf
accumulation (6 bytes per logit), leaving the ledger's loss ops (``LOSS_BYTES_PER_LOGIT``).

``kernels_yaml`` writes the section the probe's fragment carries: each value capped to what the registry admits
for a share (``axoplan.inputs.parameters``: 0.001 to 1; a comment says where), with what was timed and how in
comments.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from axoplan.inputs.parameters import format_bound, machine_parameter

__all__ = ["LOSS_BYTES_PER_LOGIT", "ADAMW_BYTES_PER_PARAM", "CAST_BYTES_PER_ELEMENT", "TENSORS_MOVED",
           "read_records", "kernel_constants", "attention_curves", "CLASSES", "kernels_yaml"]

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
    fragment caps them (``kernels_yaml``).
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


_ITEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
"""Bytes per element of the dtypes attention is timed in (``micro.py``'s records have no dtype: bf16)."""


def attention_curves(recs: list[dict[str, Any]], bw: float, peak_tflops: float, ew_eff: float) -> dict[str, Any]:
    """Per backend, the median over head counts of forward+backward efficiency at each sequence length."""
    curves: dict[str, dict[int, list[float]]] = {}
    for r in recs:
        if r["kind"] != "attention" or "error" in r:
            continue
        fwd_flops = 4.0 * r["batch"] * r["heads"] * r["seq"] ** 2 * r["head_dim"] / 2.0
        add_bytes = 3.0 * _ITEM_BYTES.get(r.get("dtype", "bfloat16"), 2)  # read .grad and the new one, write
        accumulate = 3.0 * add_bytes * r["batch"] * r["heads"] * r["seq"] * r["head_dim"] / (bw * ew_eff)
        rest = r["fwd_bwd_s"] - accumulate
        eff = 3.5 * fwd_flops / rest / (peak_tflops * 1e12) if rest > 0 else math.inf
        curves.setdefault(r["backend"], {}).setdefault(r["seq"], []).append(eff)
    return {name: {"seq": sorted(pts), "efficiency": [round(statistics.median(pts[s]), 3) for s in sorted(pts)]}
            for name, pts in curves.items()}


def kernels_yaml(recs: list[dict[str, Any]], notes: list[str], hbm_gbs: float, peak_tflops: float,
                 machine: str) -> list[str]:
    """The ``kernels:`` lines of a machine-YAML fragment, or comments saying why there are none."""
    c = kernel_constants(recs, hbm_gbs, peak_tflops)
    skipped = [f"# {line}" for line in notes]
    missing = [k for k in CLASSES if k not in c and k != "memset"]  # memset has a default
    if missing:
        return [f"# no kernels: section: {', '.join(missing)} not measured (a machine's kernels: needs every "
                "memory-bound class)", *skipped]
    ok = [r for r in recs if "error" not in r]
    lines = [f"# kernels: shares of {hbm_gbs:g} GB/s (the HBM bandwidth of machine {machine}) by the bytes each "
             f"kernel must move; attention over {peak_tflops:g} TFLOP/s; derived by "
             "axoplan.executor.kernel_constants, as benchmarks/kernel_constants.py derives dgx-h100's", *skipped,
             "kernels:"]
    how = _how(ok)
    for name in CLASSES:
        if name in c:
            lines.append(f"  {name}: {_share(c[name])}  # {how[name]}{_capped(c[name])}")
    if "unaligned_gemm_efficiency" in c:
        lines.append(f"  unaligned_gemm_efficiency: {_share(c['unaligned_gemm_efficiency'])}  "
                     f"# {how['unaligned']}{_capped(c['unaligned_gemm_efficiency'])}")
    lines.append("  derived: []  # every class above measured on this device")
    curves = c.get("attention") or {}
    default = c.get("default_attention")
    if default in curves:
        lines.append(f"  default_attention: {default}  # the backend SDPA picks by itself for the causal shapes "
                     "timed (torch._fused_sdp_choice)")
    if curves:
        lines.append(f"  attention:  # {how['attention']}")
        for name, curve in curves.items():
            effs = ", ".join(_share(e) for e in curve["efficiency"])
            lines.append(f"    {name}: {{seq: [{', '.join(str(s) for s in curve['seq'])}], efficiency: [{effs}]}}")
    return lines


def _how(recs: list[dict[str, Any]]) -> dict[str, str]:
    """What was timed for each class, from the records."""
    def of(kind: str) -> list[dict[str, Any]]:
        return [r for r in recs if r["kind"] == kind]

    ew, red = of("elementwise"), of("reduction")
    shape = (f"{ew[0]['rows']} x {{{','.join(str(r['hidden']) for r in ew)}}} {ew[0].get('dtype', 'bfloat16')}"
             if ew else "")
    rms = statistics.median(r["rms_norm_gbs"] for r in ew) if ew and "rms_norm_gbs" in ew[0] else None
    fused = [r for r in of("optimizer") if r["impl"] == "AdamW fused fp32"]
    foreach = [r for r in of("optimizer") if r["impl"] == "AdamW foreach fp32"]
    loss, cast, fill, gemm = of("loss"), of("cast"), of("memset"), of("gemm_unaligned")
    att = of("attention")
    return {
        "elementwise": f"x + y on {shape}, 3 tensors moved, median over sizes",
        "norm": f"layer norm on {shape}, 2 tensors moved" + (f"; RMS norm reached {rms:.4g} GB/s" if rms else ""),
        "activation": f"silu(x) * y on {shape}, 3 tensors moved",
        "copy_cast": f"fp32 -> bf16 of {cast[0]['elements'] if cast else 0} elements in 16 tensors, 6 bytes each",
        "reduction": f"x.sum(dim=0) (a bias gradient) on {shape}" if red else "",
        "loss": f"cross-entropy of bf16 logits upcast to fp32, {loss[0]['tokens'] if loss else 0} tokens x vocabulary "
                f"{','.join(str(r['vocab']) for r in loss)}, forward+backward, its casts and leaf-gradient add "
                f"taken off, {LOSS_BYTES_PER_LOGIT:g} bytes per logit",
        "optimizer": f"fused AdamW fp32 over {fused[0]['params'] if fused else 0} parameters in 16 tensors, "
                     f"{ADAMW_BYTES_PER_PARAM:g} bytes per parameter"
                     + (f"; foreach took {foreach[0]['step_s'] / fused[0]['step_s']:.2f}x as long"
                        if fused and foreach else ""),
        "memset": f"zero_ of {shape}" if fill else "",
        "unaligned": (f"[{gemm[0]['m']} x {gemm[0]['k']}] x [{gemm[0]['k']} x {gemm[0]['n']}] against width "
                      f"{gemm[0]['n_aligned']}, flop rate ratio" if gemm else ""),
        "attention": (f"causal {att[0].get('dtype', 'bfloat16')} forward+backward over peak, FlashAttention-2 "
                      f"flops, head_dim {att[0]['head_dim']}, "
                      f"{{{','.join(str(h) for h in sorted({r['heads'] for r in att}))}}} heads (median), "
                      "leaf-gradient adds taken off" if att else ""),
    }


_LOW, _HIGH = machine_parameter("kernels.norm").hard  # what a machine YAML may hold for an op class's share


def _share(value: float) -> str:
    """A share YAML reads as a float the registry admits (0.001 to 1): capped at either end, 3 decimals."""
    return f"{min(_HIGH, max(_LOW, value)):.3f}"


def _capped(value: float) -> str:
    if value > _HIGH:
        return f" (measured {value:.3g}: above the datasheet, capped at {format_bound(_HIGH)})"
    return f" (measured {value:.2g}: floored at {format_bound(_LOW)})" if value < _LOW else ""
