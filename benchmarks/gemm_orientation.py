"""How much operand layout (GEMM orientation) matters on this machine, and what AxoNN's tuner gains.

    python benchmarks/gemm_orientation.py [--dtype float32|bfloat16] [--threads 1] [--hidden 1024]

For the three GEMMs of a transformer's linears (tokens ``m``, one rank, layers of width
``hidden``: QKV ``h→3h``, MLP-up ``h→4h``, MLP-down ``4h→h``), per phase (forward ``x @ W.T``,
dX ``dY @ W``, dW ``dY.T @ x``):

* each orientation (``nn``, ``nt``, ``tn``, ``tt``) of the same product with operands already
  laid out (no copy), as achieved GFLOP/s and relative to ``nn``: what
  ``gemm.orientation_efficiency`` in a machine YAML describes;
* the phase as torch calls it, and the fastest of AxoNN's tuner candidates (formulation ×
  variant, re-layout copies included, ``axoplan.executor.tuned_matmul``): the tuner's gain;
* the noise floor: the variant that re-lays nothing (the call's own orientation) against
  ``default``, the same computation timed twice.

Times are medians of `--repeats` runs of `--inner` calls each, after warm-up.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable, Hashable
from typing import TypeVar

import torch

from axoplan.executor.tuned_matmul import FORMULATIONS, VARIANTS, run_variant

ORIENTATIONS = ("nn", "nt", "tn", "tt")
K = TypeVar("K", bound=Hashable)
NATURAL = {"forward": "nt", "dx": "nn", "dw": "tn"}


def _seconds(fns: dict[K, Callable[[], object]], repeats: int, inner: int) -> dict[K, float]:
    """Median seconds per call of each function, timed in interleaved rounds (so load from
    other processes on a shared machine falls on every candidate alike)."""
    for fn in fns.values():
        for _ in range(2):
            fn()
    times: dict[K, list[float]] = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times[key].append((time.perf_counter() - t0) / inner)
    return {key: statistics.median(t) for key, t in times.items()}


def _operand(rows: int, cols: int, layout: str, dtype: torch.dtype) -> torch.Tensor:
    """A [rows × cols] operand, row-major (n) or a transposed view of row-major memory (t)."""
    return torch.randn(rows, cols, dtype=dtype) if layout == "n" else torch.randn(cols, rows, dtype=dtype).t()


def shapes(hidden: int, tokens: int) -> list[tuple[str, str, int, int, int]]:
    """(layer, phase, m, n, k) of the linears' GEMMs, as ``axoplan.cost.model`` writes them."""
    out = []
    for layer, k, n in (("qkv", hidden, 3 * hidden), ("mlp_up", hidden, 4 * hidden), ("mlp_down", 4 * hidden, hidden)):
        out += [(layer, "forward", tokens, n, k), (layer, "dx", tokens, k, n), (layer, "dw", n, k, tokens)]
    return out


def measure(hidden: int, tokens: int, dtype: torch.dtype, repeats: int, inner: int) -> list[dict[str, object]]:
    rows = []
    for layer, phase, m, n, k in shapes(hidden, tokens):
        flops = 2.0 * m * n * k
        operands = {o: (_operand(m, k, o[0], dtype), _operand(k, n, o[1], dtype)) for o in ORIENTATIONS}
        per = _seconds({o: functools.partial(torch.matmul, *ab) for o, ab in operands.items()}, repeats, inner)
        natural = NATURAL[phase]
        a, b = operands[natural]
        tuned = _seconds({(f, v): functools.partial(run_variant, a, b, f, v)
                          for f in FORMULATIONS for v in VARIANTS}, repeats, inner)
        best = min(tuned, key=lambda c: tuned[c])
        rows.append({"layer": layer, "phase": phase, "m": m, "n": n, "k": k, "natural": natural,
                     "gflops": {o: flops / s / 1e9 for o, s in per.items()},
                     "relative": {o: per["nn"] / s for o, s in per.items()},
                     "as_called_s": tuned["ab", "default"], "tuned_s": tuned[best], "choice": best,
                     "twin": tuned["ab", natural] / tuned["ab", "default"]})
    return rows


def report(rows: list[dict[str, object]]) -> str:
    head = ("| layer | phase | m×n×k | as called | GFLOP/s nn / nt / tn / tt | relative to nn: nt / tn / tt "
            "| tuner's pick | tuned ÷ as called | noise: twin ÷ as called |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        g, rel = r["gflops"], r["relative"]
        assert isinstance(g, dict) and isinstance(rel, dict)
        gains = float(r["tuned_s"]) / float(r["as_called_s"])  # type: ignore[arg-type]
        lines.append(f"| {r['layer']} | {r['phase']} | {r['m']}×{r['n']}×{r['k']} | {r['natural']} "
                     f"| {' / '.join(f'{g[o]:.1f}' for o in ORIENTATIONS)} "
                     f"| {' / '.join(f'{rel[o]:.2f}' for o in ORIENTATIONS[1:])} "
                     f"| {'/'.join(r['choice'])} | {gains:.2f} | {r['twin']:.2f} |")  # type: ignore[arg-type]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--inner", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = measure(args.hidden, args.tokens, getattr(torch, args.dtype), args.repeats, args.inner)
    print(f"# torch {torch.__version__}, {args.dtype}, {args.threads} thread(s), hidden {args.hidden}, "
          f"{args.tokens} tokens")
    print(report(rows))


if __name__ == "__main__":
    main()
