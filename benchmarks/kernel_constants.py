"""The op-class constants of a machine YAML's ``kernels:`` section, from kernel micro-benchmarks only.

    python benchmarks/kernel_constants.py data/measured/gpu-h100-h200/micro-h100.jsonl \
        data/measured/gpu-h100-h200/micro2-h100.jsonl --hbm-gbs 3350 --peak-tflops 989.4

Every figure is a kernel measurement (``micro.py``, ``micro2.py`` beside the data); no training step is read.
Each memory-bound class's efficiency is the bytes its kernel must move over the time it took, over the
HBM bandwidth (datasheet). The attention curves are the fused kernels' forward+backward TFLOP/s over peak
(the FlashAttention-2 convention, causal: forward ``4·b·s²·h·d/2``, backward 2.5× that), after taking off
the time the micro-benchmark spent accumulating q, k and v's gradients into their leaf tensors (three
bf16 adds of ``b·h·s·d`` elements, 6 bytes each, at the element-wise efficiency): ``micro.py`` calls
``backward`` on leaf tensors, so from the second call on autograd adds into ``.grad``. The loss's
efficiency takes off its two casts (12 bytes per logit at the cast's efficiency) and the same leaf
accumulation (6 bytes per logit), leaving the ledger's loss ops (``LOSS_BYTES_PER_LOGIT``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

LOSS_BYTES_PER_LOGIT = 32.0
"""Bytes the loss class moves per logit in the Hugging Face ledgers (``frameworks/ledgers/hf-*.json``):
``_log_softmax`` reads and writes fp32 (8), ``nll_loss_forward`` reads the log-probabilities (4),
``nll_loss_backward`` reads them and writes the gradient (8), ``_log_softmax_backward_data`` reads two and
writes one fp32 tensor (12)."""


def _records(paths: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for p in paths for line in p.read_text().splitlines() if line.strip()]


def constants(recs: list[dict[str, Any]], hbm_gbs: float, peak_tflops: float) -> dict[str, Any]:
    bw = hbm_gbs * 1e9
    ew = [r for r in recs if r["kind"] == "elementwise"]
    out: dict[str, Any] = {}
    out["elementwise"] = statistics.median(r["add_gbs"] * 1e9 / bw for r in ew)
    out["norm"] = statistics.median(r["layer_norm_gbs"] * 1e9 / bw for r in ew)
    out["activation"] = statistics.median(r["silu_mul_gbs"] * 1e9 / bw for r in ew)
    casts = [r for r in recs if r["kind"] == "cast"]
    if casts:
        out["copy_cast"] = statistics.median(6.0 * r["elements"] / r["fp32_to_bf16_s"] / bw for r in casts)
    fused = [r for r in recs if r["kind"] == "optimizer" and r["impl"] == "AdamW fused fp32"]
    if fused:  # reads parameter, gradient and both moments, writes parameter and moments: 28 bytes
        out["optimizer"] = statistics.median(28.0 * r["params"] / r["step_s"] / bw for r in fused)
    losses = [r for r in recs if r["kind"] == "loss"]
    if losses and "copy_cast" in out:
        effs = []
        for r in losses:
            logits = r["tokens"] * r["vocab"]
            other = logits * (12.0 / out["copy_cast"] + 6.0 / out["elementwise"]) / bw
            effs.append(LOSS_BYTES_PER_LOGIT * logits / (r["upcast_fwd_bwd_s"] - other) / bw)
        out["loss"] = statistics.median(effs)
    out["attention"] = _attention_curves(recs, bw, peak_tflops, out["elementwise"])
    return out


def _attention_curves(recs: list[dict[str, Any]], bw: float, peak_tflops: float, ew_eff: float) -> dict[str, Any]:
    curves: dict[str, dict[int, list[float]]] = {}
    for r in recs:
        if r["kind"] != "attention":
            continue
        fwd_flops = 4.0 * r["batch"] * r["heads"] * r["seq"] ** 2 * r["head_dim"] / 2.0
        accumulate = 3.0 * 6.0 * r["batch"] * r["heads"] * r["seq"] * r["head_dim"] / (bw * ew_eff)
        eff = 3.5 * fwd_flops / (r["fwd_bwd_s"] - accumulate) / (peak_tflops * 1e12)
        curves.setdefault(r["backend"], {}).setdefault(r["seq"], []).append(eff)
    return {name: {"seq": sorted(pts), "efficiency": [round(statistics.median(pts[s]), 3) for s in sorted(pts)]}
            for name, pts in curves.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--hbm-gbs", type=float, required=True)
    ap.add_argument("--peak-tflops", type=float, required=True)
    args = ap.parse_args(argv)
    c = constants(_records(args.files), args.hbm_gbs, args.peak_tflops)
    for k, v in c.items():
        print(f"{k}: {json.dumps(v) if isinstance(v, dict) else round(v, 3)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
