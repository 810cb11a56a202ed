"""How fast is ranking? Prints the figures recorded in README.md (section "Speed").

    python benchmarks/rank_speed.py            # full run (about a minute on 2 cores)
    python benchmarks/rank_speed.py --quick    # fewer repetitions
    python benchmarks/rank_speed.py --glibc-defaults   # without the `axoplan` command's allocator setting

Measures, for 320B on Frontier:
1. the vectorised cost model over the whole search space (layouts x micro-batch x recompute
   x caching) for 32,768 and 1,048,576 GPUs, cold (fresh machine object) and warm;
2. a plain per-layout Python loop over the same formulas (the same `predict` called on one
   candidate at a time) on a random sample, extrapolated to the whole space;
3. the prediction intervals and P(best) added by `rank` (issue 10) alone, warm;
4. the start-up-included wall time (intervals included) of `axoplan rank --model 320B --gpus 32768 --machine frontier`;
5. the same for Mixtral 8x22B on 4,096 Frontier GCDs (issue 24: an MoE model, native module and hf path);
6. with the op ledger priced for every candidate (issue 29): Llama 3.1 70B on 4,096 H100s under hf-transformers,
   the model warm and the command's wall time.

"model warm" is `predict` (compile and price, issue 32); "price" is a compiled plan priced again with one machine
number moved (`inter_node.efficiency`), what a sensitivity, a calibration step or a what-if plot pays.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from axoplan.cost.model import compile_plan, predict, price
from axoplan.inputs.machine import Machine, load_machine
from axoplan.inputs.machine_params import with_values
from axoplan.inputs.model import load_model
from axoplan.inputs.options import RunOptions
from axoplan.search.ranking import rank
from axoplan.space.candidates import Candidates


def _best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _frontier_unbounded() -> Machine:
    """Frontier without its size (9,472 nodes), so the 2^20-GPU case times the model, not the refusal."""
    return load_machine("frontier").model_copy(update={"nodes": None})


def vectorised(world: int, repeats: int) -> tuple[int, float, float, float]:
    """Candidates, rank cold, model warm (predict) and a compiled plan's price with a moved number, seconds."""
    model, opts = load_model("320B"), RunOptions()
    cands = Candidates.enumerate(world, opts)
    cold = _best_of(lambda: rank(model, _frontier_unbounded(), opts, world), repeats)
    machine = _frontier_unbounded()
    warm = _best_of(lambda: predict(model, machine, opts, cands), repeats)
    plan, moved = compile_plan(model, machine, opts, cands), with_values(machine, {"inter_node.efficiency": 0.7})
    priced = _best_of(lambda: price(plan, moved), repeats)
    return len(cands), cold, warm, priced


LEDGER_ARGS = ("--model", "llama3.1-70B", "--gpus", "4096", "--machine", "dgx-h100", "--framework", "hf-transformers",
               "--global-batch", "8192")


def ledger_warm(repeats: int) -> tuple[int, float]:
    """Candidates and the model warm (predict) with the op ledger priced for every one (LEDGER_ARGS)."""
    model, opts = load_model("llama3.1-70B"), RunOptions(framework="hf-transformers", global_batch=8192)
    cands, machine = Candidates.enumerate(4096, opts), load_machine("dgx-h100")
    return len(cands), _best_of(lambda: predict(model, machine, opts, cands), repeats)


def loop(world: int, sample: int) -> float:
    """Seconds per candidate when the same formulas run one candidate at a time."""
    model, opts, machine = load_model("320B"), RunOptions(), _frontier_unbounded()
    cands = Candidates.enumerate(world, opts)
    idx = np.random.default_rng(0).choice(len(cands), size=min(sample, len(cands)), replace=False)
    singles = [cands.take(np.array([i])) for i in idx]
    t0 = time.perf_counter()
    for c in singles:
        predict(model, machine, opts, c)
    return (time.perf_counter() - t0) / len(singles)


def intervals_ms(repeats: int) -> tuple[int, float]:
    """Contenders sampled and the warm time of `with_intervals` on the 32,768-GPU ranking."""
    from axoplan.uncertainty.intervals import with_intervals

    r = rank(load_model("320B"), load_machine("frontier"), RunOptions(), 32768)
    n = int((with_intervals(r).prediction.columns["t_low_s"] > 0).sum())
    return n, _best_of(lambda: with_intervals(r), repeats) * 1e3


README_ARGS = ("--model", "320B", "--gpus", "32768", "--machine", "frontier")
MIXTRAL_ARGS = ("--model", "mixtral-8x22B", "--gpus", "4096", "--machine", "frontier", "--global-batch", "4096")


def cli_wall(repeats: int, args: tuple[str, ...] = README_ARGS) -> float:
    exe = Path(sys.executable).parent / "axoplan"
    cmd = [str(exe), "rank", *args]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--glibc-defaults", action="store_true",
                        help="leave glibc's mmap/trim thresholds alone (the command raises them: axoplan/allocator.py)")
    args = parser.parse_args()
    if not args.glibc_defaults:
        from axoplan.allocator import keep_freed_memory

        print(f"allocator thresholds raised as the axoplan command does: {keep_freed_memory()}")
    repeats, sample = (3, 200) if args.quick else (10, 1000)
    print(f"{'GPUs':>9} {'candidates':>10} {'rank cold ms':>12} {'model warm ms':>13} {'cand/s':>12} "
          f"{'price ms':>9} {'loop us/cand':>12} {'loop total s':>12} {'speed-up':>9}")
    for world in (32768, 1 << 20):
        n, cold, warm, priced = vectorised(world, repeats)
        per = loop(world, sample)
        print(f"{world:>9} {n:>10} {cold * 1e3:>12.1f} {warm * 1e3:>13.1f} {n / warm:>12.3g} {priced * 1e3:>9.1f} "
              f"{per * 1e6:>12.0f} {per * n:>12.1f} {per * n / warm:>8.0f}x")
    n, warm = ledger_warm(repeats)
    print(f"with the op ledger ({' '.join(LEDGER_ARGS)}): {n} candidates, model warm {warm * 1e3:.1f} ms, "
          f"{n / warm:.3g} cand/s")
    n, ms = intervals_ms(repeats)
    print(f"\nintervals + P(best) for 32768 GPUs: {ms:.1f} ms warm ({n} contenders sampled)")
    print(f"axoplan rank --model 320B --gpus 32768 --machine frontier: {cli_wall(5 if args.quick else 9):.2f} s "
          "wall (median, start-up included)")
    for extra in ((), ("--axonn-path", "hf")):
        wall = cli_wall(5 if args.quick else 9, (*MIXTRAL_ARGS, *extra))
        print(f"axoplan rank {' '.join((*MIXTRAL_ARGS, *extra))}: {wall:.2f} s wall (median, start-up included)")
    wall = cli_wall(5 if args.quick else 9, LEDGER_ARGS)
    print(f"axoplan rank {' '.join(LEDGER_ARGS)}: {wall:.2f} s wall (median, start-up included)")


if __name__ == "__main__":
    main()
