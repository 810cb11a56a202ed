"""`axoplan probe`'s kernel sweep: every op class the ledger prices, timed on this rank's device.

The kernels are those of the 2026-11-26 GPU session (``data/measured/gpu-h100-h200/micro.py``, ``micro2.py``) and
each record has the fields of its records there, so one derivation (``axoplan.executor.kernel_constants``) reads
both: element-wise add, layer and RMS norm, SiLU·mul on ``[rows × hidden]`` tensors; an fp32 -> bf16 cast over
16 tensors; fused (and foreach) fp32 AdamW over 16 tensors; cross-entropy of bf16 logits upcast to fp32 over a
large vocabulary, forward and backward; causal attention forward and backward per SDPA backend
(``torch.nn.attention.sdpa_kernel``: flash, cudnn, efficient) over sequence lengths and head counts, and the
backend SDPA picks by itself. Added here: a sum over rows (a bias gradient), a fill (``zero_``), and a GEMM
whose output width is not a multiple of 8 beside the aligned one.

Timing: on a GPU, CUDA events around back-to-back calls after warm-up calls, the mean per call (as ``micro.py``);
on a CPU the wall clock likewise. Element-wise kernels run in the probe's dtype (bf16 on a GPU, fp32 on a
CPU, where bf16 arithmetic is emulated); attention in bf16 on a GPU, in the probe's dtype elsewhere, where
only SDPA's flash backend runs (the cudnn and efficient backends need CUDA: skipped with a note).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from axoplan.executor.kernel_constants import TENSORS_MOVED

__all__ = ["SweepSizes", "sweep_sizes", "kernel_sweep", "ATTENTION_BACKENDS"]

ATTENTION_BACKENDS = ("flash", "cudnn", "efficient")
"""SDPA's fused backends, by the names a machine's ``kernels.attention`` uses."""
CUDA_ONLY = ("cudnn", "efficient")
"""The backends without a CPU kernel (PyTorch has a CPU flash attention)."""

Record = dict[str, Any]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class SweepSizes:
    """The shapes one sweep times."""

    rows: int
    hiddens: tuple[int, ...]
    cast_elements: int
    adamw_params: int
    loss_tokens: int
    vocabs: tuple[int, ...]
    attention: tuple[tuple[int, int], ...]  # (sequence length, batch)
    heads: tuple[int, ...]
    head_dim: int
    unaligned: tuple[int, int, int, int]  # m, k, n (not a multiple of 8), n rounded up to a multiple of 64
    reps: int
    warmup: int


def sweep_sizes(gpu: bool, quick: bool) -> SweepSizes:
    """On a GPU ``micro.py``'s shapes (8192 rows, hidden 2048-8192, vocabularies 32,000-128,256, 1k-32k tokens
    at 16 and 32 heads of 128), fewer with `quick`; on a CPU tensors past its caches (2^21 to 2^22 elements)
    and few calls, so the sweep takes seconds."""
    if gpu:
        return SweepSizes(
            rows=8192, hiddens=(4096,) if quick else (2048, 4096, 8192), cast_elements=1 << (28 if quick else 30),
            adamw_params=1 << 28, loss_tokens=8192, vocabs=(50304,) if quick else (32000, 50304, 128256),
            attention=((1024, 16), (4096, 4), (16384, 1)) if quick else
            ((1024, 16), (2048, 8), (4096, 4), (8192, 2), (16384, 1), (32768, 1)),
            heads=(32,) if quick else (32, 16), head_dim=128, unaligned=(8192, 2048, 50257, 50304),
            reps=5 if quick else 10, warmup=2 if quick else 3)
    return SweepSizes(rows=1024, hiddens=(2048,) if quick else (2048, 4096), cast_elements=1 << 22,
                      adamw_params=1 << 21, loss_tokens=64, vocabs=(32000,),
                      attention=((256, 4),) if quick else ((256, 4), (1024, 1)), heads=(4,), head_dim=64,
                      unaligned=(256, 256, 4001, 4032), reps=3, warmup=1)


def kernel_sweep(device: torch.device, dtype: torch.dtype, quick: bool = False,
                 progress: Progress | None = None) -> tuple[list[Record], list[str]]:
    """Every op class timed on `device`; the records, and a line for each class or backend not measured."""
    say = progress or (lambda _line: None)
    sizes = sweep_sizes(device.type == "cuda", quick)
    records: list[Record] = []
    notes: list[str] = []
    stages: list[tuple[str, Callable[[], list[Record]]]] = [
        ("element-wise, norms, SiLU·mul, row sums, fills", lambda: _memory_bound(device, dtype, sizes)),
        ("fp32 -> bf16 cast", lambda: [_cast(device, sizes)]),
        ("AdamW fused and foreach", lambda: _adamw(device, sizes)),
        ("loss over the vocabulary", lambda: _losses(device, sizes)),
        ("unaligned GEMM", lambda: [_unaligned_gemm(device, dtype, sizes)]),
    ]
    for i, (what, run) in enumerate(stages, start=1):
        t0 = time.perf_counter()
        try:
            records += run()
        except (RuntimeError, NotImplementedError) as exc:  # an op this device or build lacks; OOM is a RuntimeError
            notes.append(f"{what}: not measured ({_first_line(exc)})")
        say(f"kernels {i}/{len(stages) + 1}: {what}, {time.perf_counter() - t0:.1f} s")
        _free(device)
    t0 = time.perf_counter()
    if device.type != "cuda":
        notes.append(f"attention: SDPA's {', '.join(CUDA_ONLY)} backends need CUDA; skipped on {device.type}")
    try:
        attention, skipped = _attention(device, torch.bfloat16 if device.type == "cuda" else dtype, sizes, say)
    except RuntimeError as exc:  # out of memory for the tensors themselves
        attention, skipped = [], [f"attention: not measured ({_first_line(exc)})"]
    records += attention
    notes += skipped
    say(f"kernels {len(stages) + 1}/{len(stages) + 1}: attention, {time.perf_counter() - t0:.1f} s")
    return records, notes


def _timed(fn: Callable[[], object], device: torch.device, reps: int, warmup: int) -> float:
    """Mean seconds per call of `reps` back-to-back calls after `warmup` ones."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize(device)
    return float(start.elapsed_time(end)) / reps / 1e3


def _memory_bound(device: torch.device, dtype: torch.dtype, s: SweepSizes) -> list[Record]:
    return [r for h in s.hiddens for r in _memory_bound_at(h, device, dtype, s)]


def _memory_bound_at(h: int, device: torch.device, dtype: torch.dtype, s: SweepSizes) -> list[Record]:
    """Element-wise add, the norms, SiLU·mul, a sum over rows and a fill on ``[rows × h]``."""
    x = torch.randn(s.rows, h, device=device, dtype=dtype)
    y = torch.randn_like(x)
    w = torch.ones(h, device=device, dtype=dtype)
    nbytes = x.numel() * x.element_size()
    calls: dict[str, Callable[[], object]] = {
        "add": lambda: x + y, "layer_norm": lambda: F.layer_norm(x, (h,), w, w),
        "rms_norm": lambda: F.rms_norm(x, (h,), w), "silu_mul": lambda: F.silu(x) * y,
        "sum_rows": lambda: x.sum(dim=0)}
    t = {k: _timed(fn, device, s.reps, s.warmup) for k, fn in calls.items()}
    timed = ("add", "layer_norm", "rms_norm", "silu_mul")
    row = h * x.element_size()  # the one row a sum over rows writes
    return [
        {"kind": "elementwise", "rows": s.rows, "hidden": h, "dtype": _name(dtype),
         **{f"{k}_s": t[k] for k in timed}, **{f"{k}_gbs": TENSORS_MOVED[k] * nbytes / t[k] / 1e9 for k in timed}},
        {"kind": "reduction", "rows": s.rows, "hidden": h, "dtype": _name(dtype), "sum_rows_s": t["sum_rows"],
         "sum_rows_gbs": (TENSORS_MOVED["sum_rows"] * nbytes + row) / t["sum_rows"] / 1e9},
        {"kind": "memset", "elements": x.numel(), "bytes": nbytes, "dtype": _name(dtype),
         "zero_s": _timed(x.zero_, device, s.reps, s.warmup)},
    ]


def _cast(device: torch.device, s: SweepSizes) -> Record:
    ps = [torch.zeros(s.cast_elements // 16, device=device, dtype=torch.float32) for _ in range(16)]
    seconds = _timed(lambda: [p.to(torch.bfloat16) for p in ps], device, s.reps, s.warmup)
    return {"kind": "cast", "elements": s.cast_elements, "fp32_to_bf16_s": seconds}


def _adamw(device: torch.device, s: SweepSizes) -> list[Record]:
    """``torch.optim.AdamW`` steps over 16 fp32 tensors with gradients, fused and foreach (as ``micro2.py``)."""
    from torch.optim import AdamW

    ps = [torch.zeros(s.adamw_params // 16, device=device, dtype=torch.float32, requires_grad=True)
          for _ in range(16)]
    for p in ps:
        p.grad = torch.zeros_like(p)
    out = []
    for impl in ("fused", "foreach"):
        opt = AdamW(ps, lr=1e-5, fused=impl == "fused" or None, foreach=impl == "foreach" or None)
        out.append({"kind": "optimizer", "impl": f"AdamW {impl} fp32", "params": s.adamw_params,
                    "step_s": _timed(opt.step, device, max(2, s.reps // 2), s.warmup)})
    return out


def _losses(device: torch.device, s: SweepSizes) -> list[Record]:
    return [_loss(vocab, device, s) for vocab in s.vocabs]


def _loss(vocab: int, device: torch.device, s: SweepSizes) -> Record:
    """Cross-entropy of bf16 logits upcast to fp32 (Hugging Face's ``logits.float()``), forward and backward."""
    logits = torch.randn(s.loss_tokens, vocab, device=device, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, vocab, (s.loss_tokens,), device=device)
    seconds = _timed(lambda: F.cross_entropy(logits.float(), target).backward(), device, s.reps, s.warmup)
    return {"kind": "loss", "tokens": s.loss_tokens, "vocab": vocab, "upcast_fwd_bwd_s": seconds}


def _unaligned_gemm(device: torch.device, dtype: torch.dtype, s: SweepSizes) -> Record:
    """``[m×k]·[k×n]`` forward with n not a multiple of 8 (GPT-2's vocabulary on a GPU), and with n rounded up."""
    m, k, n, aligned = s.unaligned
    x = torch.randn(m, k, device=device, dtype=dtype)
    t = {width: _linear_s(x, width, device, dtype, s) for width in (n, aligned)}
    return {"kind": "gemm_unaligned", "m": m, "k": k, "n": n, "n_aligned": aligned, "dtype": _name(dtype),
            "unaligned_s": t[n], "aligned_s": t[aligned]}


def _linear_s(x: torch.Tensor, width: int, device: torch.device, dtype: torch.dtype, s: SweepSizes) -> float:
    w = torch.randn(width, x.shape[1], device=device, dtype=dtype)
    return _timed(lambda: F.linear(x, w), device, s.reps, s.warmup)


def _attention(device: torch.device, dtype: torch.dtype, s: SweepSizes,
               say: Progress) -> tuple[list[Record], list[str]]:
    """Causal SDPA forward+backward on leaf q, k, v, per backend, sequence length and head count."""
    records: list[Record] = []
    skipped = dict.fromkeys(CUDA_ONLY, "needs CUDA") if device.type != "cuda" else {}
    failed = dict(skipped)
    for heads in s.heads:
        for seq, batch in s.attention:
            records += _attention_at(heads, seq, batch, device, dtype, s, failed, first=not records)
            say(f"  attention {heads} heads, {seq} tokens: "
                f"{', '.join(n for n in ATTENTION_BACKENDS if n not in failed) or 'no backend ran'}")
            _free(device)
    return records, [f"attention {name}: not measured ({why})" for name, why in failed.items() if name not in skipped]


def _attention_at(heads: int, seq: int, batch: int, device: torch.device, dtype: torch.dtype, s: SweepSizes,
                  failed: dict[str, str], first: bool) -> list[Record]:
    """One shape on every backend not yet `failed` (a backend that raises is noted there and not tried again)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    q = torch.randn(batch, heads, seq, s.head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn_like(q, requires_grad=True)
    v = torch.randn_like(q, requires_grad=True)
    go = torch.randn_like(q)
    default = _default_backend(q, k, v) if first else None
    records: list[Record] = [{"kind": "attention_default", "backend": default}] if default else []

    def fwd_bwd() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)

    for name, backend in backends.items():
        if name in failed:
            continue
        try:
            with sdpa_kernel(backend):
                seconds = _timed(fwd_bwd, device, s.reps, s.warmup)
        except RuntimeError as exc:  # a backend this build, device or shape lacks
            failed[name] = _first_line(exc)
            continue
        records.append({"kind": "attention", "backend": name, "batch": batch, "heads": heads,
                        "head_dim": s.head_dim, "seq": seq, "causal": True, "dtype": _name(dtype),
                        "fwd_bwd_s": seconds})
    return records


def _default_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """The backend SDPA picks by itself for these tensors (``torch._fused_sdp_choice``), where it is one we time."""
    from torch.nn.attention import SDPBackend

    names = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.CUDNN_ATTENTION: "cudnn",
             SDPBackend.EFFICIENT_ATTENTION: "efficient"}
    try:
        choice = torch._fused_sdp_choice(q, k, v, is_causal=True)
        return names.get(SDPBackend(int(choice)))
    except (AttributeError, RuntimeError, ValueError, TypeError):
        return None


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:160]
