"""Make the CPU measured-run data set in data/measured/cpu-gloo/ (docs/validate.md).

    python benchmarks/measure_cpu_gloo.py --out data/measured/cpu-gloo/runs.jsonl

Every ordered layout Gx x Gy x Gz x Gdata of 4 and of 8 ranks (10 + 20 layouts) of one
small GPT model, each run with `axoplan run plan.json --local N` (gloo on this machine's
CPU cores), repeated --reps times. Repetitions go round the whole list of layouts, so a
slow minute on a shared machine spreads over layouts instead of hitting one. Each run
appends one measured-run record to --out; `axoplan validate` and `axoplan calibrate`
read that file. About 20 s per run on 2 cores (most of it starting 8 Python processes).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.records.plan import LaunchConfig
from axoplan.space.layout import Layout, ordered_factorizations

MACHINE = "local-cpu"
MODEL = ModelSpec(name="gpt-tiny", num_layers=2, hidden=256, num_heads=8, vocab=1024, max_positions=128,
                  source="benchmarks/measure_cpu_gloo.py: a model every layout of 8 ranks divides")
OPTIONS = RunOptions(global_batch=16, seq_len=128, micro_batches=(2,), recompute="off", cache_weights="off")
MICRO_BATCH = 2


def plans(world: int) -> list[LaunchConfig]:
    """One plan per ordered layout of `world` ranks (all divide MODEL and the batch)."""
    gx, gy, gz, gd = ordered_factorizations(world)
    return [LaunchConfig.build(machine=MACHINE, devices_per_node=8, model=MODEL, options=OPTIONS,
                               layout=Layout(int(a), int(b), int(c), int(d)), micro_batch=MICRO_BATCH,
                               recompute=False, cache_weights=False)
            for a, b, c, d in zip(gx, gy, gz, gd, strict=True)]


def run_one(plan: LaunchConfig, out: Path, iterations: int, warmup: int, folder: Path) -> float:
    """Run one plan; returns the wall time of the whole command."""
    path = folder / f"{plan.plan_id}.json"
    path.write_text(plan.to_json())
    cmd = [sys.executable, "-m", "axoplan", "run", str(path), "--local", str(plan.world_size),
           "--iterations", str(iterations), "--warmup", str(warmup), "--runs", str(out)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON-lines file the records are appended to")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--worlds", default="4,8", help="comma-separated rank counts")
    args = parser.parse_args()
    todo = [p for w in (int(v) for v in args.worlds.split(",")) for p in plans(w)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for i, plan in enumerate(todo, start=1):
                wall = run_one(plan, args.out, args.iterations, args.warmup, Path(tmp))
                print(f"rep {rep + 1}/{args.reps} run {i}/{len(todo)}: {plan.layout.to_layout()} on "
                      f"{plan.world_size} ranks, {wall:.1f} s", flush=True)


if __name__ == "__main__":
    main()
