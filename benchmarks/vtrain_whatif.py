"""What-if: two cost-model terms the vTrain A100 runs ask for (docs/validate.md, "Known gaps").

    python benchmarks/vtrain_whatif.py

NOT part of axoplan's model. It post-processes axoplan's own predictions of the vTrain
plans with two terms the cost model lacks, fits them with the machine parameters on the
same 70 % of the plans as `axoplan calibrate --holdout 0.3 --seed 0`, and prints the
held-out error, so a proposed change to axoplan/cost can be judged by its numbers first:

1. a host-side floor per layer and micro-batch: a pass over a layer cannot take less than
   ``c_layer`` seconds of kernel launches, so the per-micro-batch time is
   ``max(device time, layers · c_layer)`` (small micro-batches are launch-bound);
2. unfused attention: the scores are materialised, so attention costs memory traffic per
   score element, ``micro_batch · heads/Gy · S²`` per pass, instead of flash-attention
   flops that grow with the hidden size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from axoplan.cost.compute import attention_s
from axoplan.machine import load_machine
from axoplan.validate import metrics
from axoplan.validate.calibrate import split_holdout, with_values
from axoplan.validate.compare import Predictor, aggregate
from axoplan.validate.records import load_runs

PASSES = 4.0  # forward, recomputed forward, backward (twice the forward's work) per layer and micro-batch
FITTED = ["gemm.max_efficiency", "gemm.half_efficiency_dim", "memory_efficiency", "intra_node.efficiency",
          "intra_node.latency_us"]


def main() -> None:
    path = Path(__file__).resolve().parent.parent / "data/measured/vtrain_a100_single_node_pp1.csv"
    plans = aggregate(load_runs([path]))
    predictor = Predictor([p.plan for p in plans])
    meas = np.array([p.measured_s for p in plans])
    layers = np.array([p.plan.model.num_layers for p in plans], dtype=float)
    mb = np.array([p.plan.micro_batch for p in plans], dtype=float)
    gy = np.array([p.plan.layout.gy for p in plans], dtype=float)
    heads = np.array([p.plan.model.num_heads for p in plans], dtype=float)
    hidden = np.array([p.plan.model.hidden for p in plans], dtype=float)
    seq = np.array([p.plan.options.seq_len for p in plans], dtype=float)
    n_micro = np.array([p.plan.grad_accum_steps for p in plans], dtype=float)
    base = with_values(load_machine("dgx-a100"), {"attention_efficiency": 1.0})
    flash_flops = 4.0 * mb * seq**2 * hidden / gy

    def model(x: np.ndarray) -> np.ndarray:
        machine = with_values(base, dict(zip(FITTED, x[:5], strict=True)))
        cols = predictor(machine)
        step = cols["t_optimizer_s"] + cols["t_exposed_data_s"] + cols["t_exposed_world_s"]
        per_micro = (cols["t_step_s"] - step) / n_micro
        per_micro -= PASSES * layers * attention_s(machine, flash_flops)  # take flash attention out ...
        per_micro += PASSES * layers * mb * heads / gy * seq**2 * x[5] * 1e-12  # ... put unfused scores in
        return n_micro * np.maximum(per_micro, layers * x[6] * 1e-3) + step

    train, hold = split_holdout(len(plans), 0.3, 0)
    x0 = np.array([0.8, 96.0, 0.75, 0.75, 5.0, 5.0, 1.0])
    low, high = np.array([0.02, 1, 0.01, 0.005, 0.01, 1e-3, 1e-3]), np.array([1, 16384, 1, 1, 1e5, 1e4, 100])
    fit = least_squares(lambda z: np.log(model(np.exp(z))[train] / meas[train]), np.log(x0),
                        bounds=(np.log(low), np.log(high)), diff_step=1e-3)
    x = np.exp(fit.x)
    pred = model(x)
    names = [*FITTED, "ps_per_score_element", "ms_per_layer_floor"]
    print("fitted:", {n: float(f"{v:.4g}") for n, v in zip(names, x, strict=True)})
    for label, idx in (("fitted on", train), ("held out", hold)):
        i, worst = metrics.worst_error(pred[idx], meas[idx])
        print(f"{label} ({len(idx)} plans): MAPE {metrics.mape(pred[idx], meas[idx]):.1f}%, worst {worst:+.1f}%, "
              f"Kendall tau {metrics.kendall_tau(pred[idx], meas[idx]):.3f}, "
              f"Spearman rho {metrics.spearman_rho(pred[idx], meas[idx]):.3f}")


if __name__ == "__main__":
    main()
