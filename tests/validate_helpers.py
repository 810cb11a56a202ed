"""Shared by the validate/calibrate tests: synthetic plans and runs made with the cost model."""

from __future__ import annotations

from pathlib import Path

from axoplan.inputs.machine import Machine, load_machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.records.plan import LaunchConfig
from axoplan.records.runs import MeasuredRun, append_run
from axoplan.space.layout import Layout, ordered_factorizations
from axoplan.validate.compare import Predictor
from axoplan.validate.records import Measured

SMALL = ModelSpec(name="small", num_layers=4, hidden=1024, num_heads=16, vocab=8192, max_positions=1024)

TRUE_VALUES = {
    "gemm.max_efficiency": 0.6, "gemm.half_efficiency_dim": 200.0, "attention_efficiency": 0.35,
    "memory_efficiency": 0.5, "intra_node.efficiency": 0.6, "intra_node.latency_us": 20.0,
    "inter_node.efficiency": 0.5, "inter_node.latency_us": 40.0,
}
"""Known parameters the synthetic runs are generated with (the calibration must find them)."""


def theory_machine() -> Machine:
    """Perlmutter (4 GPUs per node) without its measured bandwidth table, with the smooth GEMM
    curve instead of tiles (so ``gemm.half_efficiency_dim`` is a parameter the runs see), and without its op
    classes (derived from the H100's), so the executor's ledger prices every memory-bound op at
    ``memory_efficiency``, a parameter the runs see."""
    machine = load_machine("perlmutter")
    return machine.model_copy(update={"measured_bandwidth": (), "kernels": None,
                                      "gemm": machine.gemm.model_copy(update={"tiles": ()})})


def small_plans(worlds: tuple[int, ...] = (2, 4, 8, 16), micro_batches: tuple[int, ...] = (1, 2, 4),
                recompute: tuple[bool, ...] = (False, True), machine: str = "perlmutter",
                global_batch: int = 64) -> list[LaunchConfig]:
    """Every layout of each world size crossed with micro-batches and recompute (one model, one batch)."""
    out = []
    for world in worlds:
        for gx, gy, gz, gd in zip(*ordered_factorizations(world), strict=True):
            for mb in micro_batches:
                if global_batch % (int(gd) * int(gz) * mb):
                    continue
                opts = RunOptions(global_batch=global_batch, seq_len=1024, micro_batches=(mb,),
                                  framework="axoplan-executor")  # what a record of `axoplan run` is read as
                for rec in recompute:
                    out.append(LaunchConfig.build(
                        machine=machine, devices_per_node=4, model=SMALL, options=opts,
                        layout=Layout(int(gx), int(gy), int(gz), int(gd)), micro_batch=mb, recompute=rec,
                        cache_weights=False))
    return out


def synthetic_runs(plans: list[LaunchConfig], machine: Machine, factors: list[float] | None = None) -> list[Measured]:
    """Runs whose measured time is the prediction on `machine`, times an optional factor per plan."""
    times = Predictor(plans).step_s(machine)
    factors = factors or [1.0] * len(plans)
    return [Measured(p, float(t * f), f"synthetic:{i + 1}") for i, (p, t, f) in
            enumerate(zip(plans, times, factors, strict=True))]


def write_jsonl(path: Path, runs: list[Measured]) -> Path:
    """Write `runs` as executor-style measured-run records."""
    for run in runs:
        append_run(path, MeasuredRun(plan_id=run.plan.plan_id, plan=run.plan, measured_at="2026-01-01T00:00:00Z",
                                     t_step_s=run.t_step_s, t_step_std_s=0.0, iterations=5, warmup=1,
                                     phase_s=dict(run.phase_s), world_size=run.plan.world_size,
                                     nodes=run.plan.nodes, backend="synthetic"))
    return path
