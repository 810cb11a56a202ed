"""The executor's overhead against raw collectives and GEMMs of the same sizes.

    python benchmarks/executor_overhead.py                       # 4 local gloo ranks
    python benchmarks/executor_overhead.py --ranks 8 --out overhead.json

For each layout, `axoplan`'s executor runs a small GPT (phase timing on) and records the
op sequence of its last iteration (every GEMM shape; every collective's kind, group and
size). The same ranks then replay exactly that sequence with bare ``torch.mm`` and
``torch.distributed`` calls on the same groups, one after another (no overlap, no
autograd, no model). Reported per layout, medians over iterations, slowest rank:

* ``t_step``: the executor's seconds per iteration;
* ``raw``: the replay's seconds (GEMMs + collectives only), split into GEMM and collectives;
* ``gemm x`` and ``coll x``: the executor's GEMM phase and its collective phases (+ waits)
  over the raw ones (1.0 = no overhead on those ops);
* ``rest``: ``t_step - raw``: attention, element-wise work, the optimizer, Python and
  autograd: what the executor does besides the timed ops.

Results on a shared 2-core CPU box say little about GPUs; see docs/executor.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from axoplan.executor.launch import LocalCluster
from axoplan.executor.spec import ExecSettings
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.records.plan import LaunchConfig
from axoplan.space.layout import Layout

MODEL = ModelSpec(name="bench", num_layers=2, hidden=256, num_heads=8, vocab=1024, max_positions=128,
                  source="benchmarks/executor_overhead.py")
SEQ_LEN, MICRO_BATCH = 128, 2
LAYOUTS = {4: [(4, 1, 1, 1), (1, 4, 1, 1), (1, 1, 4, 1), (1, 1, 1, 4), (2, 1, 2, 1), (1, 2, 1, 2)],
           8: [(2, 2, 2, 1), (2, 1, 2, 2), (8, 1, 1, 1), (1, 1, 8, 1)]}


def plan_for(sizes: tuple[int, int, int, int]) -> LaunchConfig:
    layout = Layout(*sizes)
    batch = layout.gdata * layout.gz * MICRO_BATCH
    options = RunOptions(global_batch=batch, seq_len=SEQ_LEN, micro_batches=(MICRO_BATCH,))
    return LaunchConfig.build(machine="local-cpu", devices_per_node=8, model=MODEL, options=options, layout=layout,
                              micro_batch=MICRO_BATCH, recompute=False, cache_weights=False)


def ping_task() -> int:
    """Rank task: nothing (launch cost)."""
    import torch.distributed as dist

    return dist.get_rank()


def launch_costs(sizes: list[int]) -> list[tuple[int, float, float]]:
    """(ranks, seconds to a first finished task with a new cluster, seconds for the next task)."""
    rows = []
    for n in sizes:
        t0 = time.perf_counter()
        with LocalCluster(n, timeout_s=120, device="cpu") as cluster:
            cluster.run("executor_overhead:ping_task")
            t1 = time.perf_counter()
            cluster.run("executor_overhead:ping_task")
            rows.append((n, t1 - t0, time.perf_counter() - t1))
    return rows


def executor_task(plan_json: str, settings_json: str) -> dict[str, Any]:
    """Rank task: run the plan; the reduced timings and this rank's op trace."""
    import torch.distributed as dist

    from axoplan.executor.train import run_rank

    result = run_rank(LaunchConfig.from_json(plan_json), ExecSettings.model_validate_json(settings_json),
                      local_rank=dist.get_rank())
    return {"iter_s": result.iter_s, "phase_s": result.phase_s, "trace": result.trace}


def replay_task(sizes: tuple[int, int, int, int], traces: list[list[Any]], reps: int) -> dict[str, float]:
    """Rank task: replay this rank's trace `reps` times with bare torch calls; medians of the slowest rank."""
    import torch
    import torch.distributed as dist

    from axoplan.executor.groups import build_groups

    groups = build_groups(Layout(*sizes), "cpu", 60.0)
    trace = [(phase, tuple(detail)) for phase, detail in traces[dist.get_rank()]]
    ops = [_bind(detail, groups, torch, dist) for _, detail in trace if detail]
    totals: list[list[float]] = []
    for _ in range(reps + 1):  # the first replay warms up
        gemm = coll = 0.0
        dist.barrier()
        for kind, fn in ops:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            gemm, coll = (gemm + dt, coll) if kind == "gemm" else (gemm, coll + dt)
        totals.append([gemm + coll, gemm, coll])
    worst = torch.tensor(totals[1:], dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    raw, gemm_s, coll_s = (float(v) for v in worst.median(dim=0).values)
    return {"raw_s": raw, "raw_gemm_s": gemm_s, "raw_coll_s": coll_s}


def _bind(detail: tuple[Any, ...], groups: Any, torch: Any, dist: Any) -> tuple[str, Any]:
    """A closure running one traced op on preallocated tensors."""
    if detail[0] == "gemm":
        _, m, n, k = detail
        a, b = torch.randn(m, k), torch.randn(k, n)
        return "gemm", lambda: a @ b
    kind, axis, numel, _sync = detail
    group, size = groups.group[axis], groups.size(axis)
    full = torch.ones(numel)
    if kind == "all_reduce":
        return "coll", lambda: dist.all_reduce(full, group=group)
    part = torch.ones(numel // size)
    if kind == "all_gather":
        return "coll", lambda: dist.all_gather_single(full, part, group=group)
    return "coll", lambda: dist.reduce_scatter_single(part, full, group=group)


def measure(cluster: LocalCluster, sizes: tuple[int, int, int, int], iterations: int) -> dict[str, Any]:
    plan = plan_for(sizes)
    settings = ExecSettings(iterations=iterations, warmup=2, device="cpu", trace=True, timeout_s=120)
    runs = cluster.run("executor_overhead:executor_task", plan.to_json(), settings.model_dump_json())
    traces = [r["trace"] for r in runs]
    raw = cluster.run("executor_overhead:replay_task", sizes, traces, iterations)[0]
    phases = runs[0]["phase_s"]
    coll_phases = sum(v for k, v in phases.items() if k.startswith(("all_", "reduce_", "stats_")) or k == "wait")
    t_step = statistics.median(runs[0]["iter_s"])
    return {"layout": str(Layout(*sizes)), "t_step_s": t_step, **raw,
            "exec_gemm_s": phases["gemm"], "exec_coll_s": coll_phases, "exec_attention_s": phases["attention"],
            "exec_optimizer_s": phases["optimizer"], "rest_s": t_step - raw["raw_s"],
            "ops": sum(1 for _, d in traces[0] if d)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4, choices=sorted(LAYOUTS))
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out", help="also write the rows as JSON")
    args = parser.parse_args()
    print("launch: ranks, s to the first task's result (new cluster; the first includes the forkserver's "
          "imports), s for a second task")
    for n, first, again in launch_costs([2, 4, 8, 4]):
        print(f"  {n} ranks: {first:.2f} s, then {again:.3f} s")
    rows = []
    with LocalCluster(args.ranks, timeout_s=120, device="cpu") as cluster:
        for sizes in LAYOUTS[args.ranks]:
            rows.append(measure(cluster, sizes, args.iterations))
    head = f"{'layout':>9} {'ops':>4} {'t_step':>8} {'raw':>8} {'raw gemm':>9} {'raw coll':>9} {'gemm x':>7} " \
           f"{'coll x':>7} {'attn':>7} {'optim':>7} {'rest':>8}"
    print(f"model {MODEL.num_layers} layers x hidden {MODEL.hidden}, {SEQ_LEN} tokens x micro-batch {MICRO_BATCH}, "
          f"{args.ranks} gloo ranks, float32; seconds per iteration (median, slowest rank)")
    print(head)
    for r in rows:
        print(f"{r['layout']:>9} {r['ops']:>4} {r['t_step_s']:8.4f} {r['raw_s']:8.4f} {r['raw_gemm_s']:9.4f} "
              f"{r['raw_coll_s']:9.4f} {r['exec_gemm_s'] / r['raw_gemm_s']:7.2f} "
              f"{r['exec_coll_s'] / max(r['raw_coll_s'], 1e-9):7.2f} {r['exec_attention_s']:7.4f} "
              f"{r['exec_optimizer_s']:7.4f} {r['rest_s']:8.4f}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
