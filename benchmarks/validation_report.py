"""Every figure of docs/validate.md ("Across sources"): the untuned machines on every shipped measured
data set, how much each figure rests on a constant, and what calibration on one source does to another.

    python benchmarks/validation_report.py                 # everything (about ten minutes on 2 cores)
    python benchmarks/validation_report.py --only llm-foundry-40gb
    python benchmarks/validation_report.py --skip-calibration
    python benchmarks/validation_report.py --slow             # and vTrain's 5-fold coverage (3 more minutes)
    python benchmarks/validation_report.py --skip-calibration --only-gpu   # the H100/H200 sources alone (seconds)

1. **Untuned**, per source (the shipped machine YAML, nothing fitted): MAPE, mean signed error
   (bias), worst plan, plans called "does not fit" (all of them ran) and "tight", the mean Kendall τ
   of throughput per GPU within groups of one model at several GPU counts, the share of plans
   inside their 80 % prediction interval (widened by each plan's reach beyond what was measured,
   ``axoplan.uncertainty.reach``), the best plan predicted first (sources with scenarios), and the
   sensitivity band (the error as each constant moves across its sourced range, one at a time;
   ``axoplan.validate.sensitivity``). The GPU sources of 2026-11-26: the Hugging Face GPT-2 1.3B
   profiles (``profile-gpt2-*.jsonl``: 3 steps, framework ``hf-transformers``, family ``gpt2``) and
   axoplan's executor's H100 records, read as ``axoplan validate`` reads them, on the shipped dgx-h100 and on
   dgx-h100 with the probe fragment the same ``measure_gpu.py`` run took on that host (``--probe``).
2. **Calibrated, held out**: fitted on one source and measured on the others (the fitted values
   carried to the other source's machine: the 80 GB DGX A100 is the 40 GB one's twin); fitted on
   some model sizes of a source and measured on the others; for the CPU runs, 5-fold
   cross-validated interval coverage. Never an error on the plans a fit saw.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from axoplan.inputs.machine import Machine, load_machine
from axoplan.inputs.machine_params import with_values
from axoplan.report import plural, text_table
from axoplan.validate.calibrate import calibrate, split_holdout
from axoplan.validate.compare import PlanRuns, Predictor, Summary, aggregate, plan_table, summarize
from axoplan.validate.coverage import coverage, cross_validated, plan_reach_sigma
from axoplan.validate.records import Measured, load_runs
from axoplan.validate.report import format_calibration
from axoplan.validate.sensitivity import sensitivity

REPO = Path(__file__).resolve().parent.parent
LLM_FOUNDRY = REPO / "data/measured/llm-foundry/runs-a100.csv"
GPU = REPO / "data/measured/gpu-h100-h200"


@dataclass(frozen=True)
class Source:
    path: Path
    machine: str
    keep: Callable[[Measured], bool] = lambda run: True
    read: Callable[[Path], list[Measured]] = lambda path: load_runs([path])
    probe: Path | None = None  # the probe fragment of the host the runs ran on (``axoplan validate --probe``)


GPT2_CSV_HEAD = ("model_name,machine,layers,hidden,heads,ffn_hidden,vocab,max_positions,tied_embeddings,biases,seq_len,"
                 "global_batch,micro_batch,gx,gy,gz,gdata,recompute,t_step_s,framework")


def gpt2_profiles(machine: str) -> Callable[[Path], list[Measured]]:
    """The measured GPT-2 1.3B steps of a ``profile-gpt2-*.jsonl`` (Hugging Face ``Trainer(bf16=True)`` on one
    GPU, one micro-batch per step, ``grad_ckpt`` as full recompute; tests/test_ledger.py's reading) as measured
    runs of framework ``hf-transformers``, through the measured-run CSV a user would write, with the model's
    family (GPT-2, which the CSV cannot name) set afterwards."""
    def read(path: Path) -> list[Measured]:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        body = [f"gpt2-1.3b,{machine},24,2048,16,8192,50257,2048,true,true,{r['seq']},{r['micro_batch']},"
                f"{r['micro_batch']},1,1,1,1,{str(r['grad_ckpt']).lower()},{r['step_s_median']},hf-transformers"
                for r in rows]
        with tempfile.TemporaryDirectory() as tmp:
            csv = Path(tmp) / f"{path.stem}.csv"
            csv.write_text("\n".join([GPT2_CSV_HEAD, *body]) + "\n")
            runs = load_runs([csv])
        return [dataclasses.replace(r, where=r.where.replace(str(csv), path.name), plan=r.plan.model_copy(
            update={"model": r.plan.model.model_copy(update={"family": "gpt2"})})) for r in runs]
    return read


def under_framework(framework: str) -> Callable[[Path], list[Measured]]:
    """A source's runs priced under another profile of the code that ran them (vTrain's Megatron-DeepSpeed runs
    under ``megatron-deepspeed-traced``, its traced ledger)."""
    def read(path: Path) -> list[Measured]:
        return [dataclasses.replace(r, plan=r.plan.model_copy(update={"options": r.plan.options.model_copy(
            update={"framework": framework})})) for r in load_runs([path])]
    return read


VTRAIN = REPO / "data/measured/vtrain_a100_single_node_pp1.csv"
SOURCES: dict[str, Source] = {
    "vtrain": Source(VTRAIN, "dgx-a100"),
    "vtrain-traced": Source(VTRAIN, "dgx-a100", read=under_framework("megatron-deepspeed-traced")),
    "llm-foundry-40gb": Source(LLM_FOUNDRY, "dgx-a100", lambda r: r.plan.machine == "dgx-a100"),
    "llm-foundry-80gb": Source(LLM_FOUNDRY, "dgx-a100-80gb", lambda r: r.plan.machine == "dgx-a100-80gb"),
    "cpu-gloo": Source(REPO / "data/measured/cpu-gloo/runs.jsonl", "local-cpu"),
    "gpt2-h100": Source(GPU / "profile-gpt2-h100.jsonl", "dgx-h100", read=gpt2_profiles("dgx-h100")),
    "gpt2-h200": Source(GPU / "profile-gpt2-h200.jsonl", "dgx-h200", read=gpt2_profiles("dgx-h200")),
    "executor-h100": Source(GPU / "axoplan-measure-gpu-h100/runs.jsonl", "dgx-h100"),
    "executor-h100-probed": Source(GPU / "axoplan-measure-gpu-h100/runs.jsonl", "dgx-h100",
                                   probe=GPU / "axoplan-measure-gpu-h100/probe.yaml"),
}
GPU_SOURCES = ("gpt2-h100", "gpt2-h200", "executor-h100", "executor-h100-probed")
MODEL_FOLDS: dict[str, dict[str, Callable[[PlanRuns], bool]]] = {
    "vtrain": {
        "hold out hidden 1024 (fit on 2048)": lambda p: p.plan.model.hidden == 1024,
        "hold out hidden 2048 (fit on 1024)": lambda p: p.plan.model.hidden == 2048,
        "hold out 12 and 20 layers (fit on 16, 24)": lambda p: p.plan.model.num_layers in (12, 20),
        "hold out 16 and 24 layers (fit on 12, 20)": lambda p: p.plan.model.num_layers in (16, 24),
    },
    "llm-foundry-40gb": {
        "hold out MPT 125M-1B (fit on 3B-70B)": lambda p: p.plan.model.hidden <= 2048,
        "hold out MPT 3B-70B (fit on 125M-1B)": lambda p: p.plan.model.hidden > 2048,
    },
}
CROSS = (("vtrain", "llm-foundry-40gb"), ("vtrain", "llm-foundry-80gb"), ("llm-foundry-40gb", "vtrain"),
         ("llm-foundry-40gb", "llm-foundry-80gb"))


def machine_of(name: str) -> Machine:
    """The machine a source is predicted on: its shipped YAML, with the source's probe fragment where it has one."""
    return load_machine(SOURCES[name].machine, SOURCES[name].probe)


def runs_of(name: str) -> list[Measured]:
    src = SOURCES[name]
    return [r for r in src.read(src.path) if src.keep(r)]


def untuned(names: list[str]) -> None:
    """Section 1: the shipped machines, nothing fitted."""
    rows, bands = [], []
    for name in names:
        src, t0 = SOURCES[name], time.perf_counter()
        plans, machine = aggregate(runs_of(name)), machine_of(name)
        s = summarize(plan_table(plans, Predictor([p.plan for p in plans])(machine)))
        cov, plain = coverage(plans, machine, 0.8), coverage(plans, _without_reach(machine), 0.8)
        sens = sensitivity(plans, machine)
        low, high = sens.band
        reach = plan_reach_sigma([p.plan for p in plans], machine)
        rows.append([name, src.machine, str(s.plans), f"{s.mape_pct:.1f}%", f"{low:.1f}-{high:.1f}%",
                     f"{s.bias_pct:+.1f}%", f"{s.worst_pct:+.1f}%", str(s.does_not_fit), str(s.tight),
                     _tau(s), f"{s.best_predicted_first}/{s.scenarios}" if s.scenarios else "n/a",
                     f"{float(np.median(reach)):.2f}", f"{cov.covered:.0%} ({int(cov.inside.sum())}/{cov.plans})",
                     f"{plain.covered:.0%}"])
        bands.append((name, sens, time.perf_counter() - t0))
    print("== untuned: the shipped machine YAMLs, nothing fitted ==\n")
    print(text_table(["source", "machine", "plans", "MAPE", "band", "bias", "worst", "does not fit", "tight",
                      "tau across GPUs", "best first", "reach sigma", "80% coverage", "without reach"], rows,
                     [False, False] + [True] * 12))
    print("\nband: lowest and highest MAPE as each constant moves across its sourced range (one at a time); "
          "reach sigma: the median plan's widening of the model error (axoplan.uncertainty.reach)\n")
    for name in names:
        _print_reaches(name)
    for name, sens, seconds in bands:
        moves = sorted(sens.moves, key=lambda m: -abs(m.mape_high_pct - m.mape_low_pct))
        print(f"{name}: MAPE {sens.mape_pct:.1f}% as shipped ({seconds:.0f} s); the constants that move it most:")
        print(text_table(["constant", "value", "range", "MAPE at low", "MAPE at high"], [
            [m.path, f"{m.value:.4g}", f"{m.low:.4g}-{m.high:.4g}" + ("" if m.sourced else " (prior)"),
             f"{m.mape_low_pct:.1f}%", f"{m.mape_high_pct:.1f}%"] for m in moves[:6]],
            [False, True, False, True, True]))
        print()


def _without_reach(machine: Machine) -> Machine:
    """`machine` with its model error marked measured at the default: intervals as before issue 29's reach."""
    from axoplan.inputs.machine import ParameterUncertainty
    from axoplan.uncertainty.intervals import DEFAULT_MODEL_SIGMA

    u = machine.uncertainty or ParameterUncertainty()
    if u.model_error is not None:
        return machine
    return machine.model_copy(update={"uncertainty": u.model_copy(update={"model_error": DEFAULT_MODEL_SIGMA})})


def _print_reaches(name: str) -> None:
    """Which reaches each source's plans take, with how many plans (docs/validate.md)."""
    from axoplan.uncertainty.reach import reaches

    counts: dict[str, int] = {}
    machine = machine_of(name)
    for p in aggregate(runs_of(name)):
        for r in reaches(p.plan.model, p.plan.options, machine):
            counts[r.what] = counts.get(r.what, 0) + 1
    told = "; ".join(f"{what} ({plural(n, 'plan')})" for what, n in counts.items()) or "none"
    print(f"{name}: reaches {told}")


def _tau(s: Summary) -> str:
    return "n/a" if not s.scaling_groups else f"{s.scaling_tau:.2f} ({s.scaling_groups})"


def carried(fitted: Machine, base: Machine, onto: Machine) -> Machine:
    """`onto` with the parameters `fitted` changed from `base` (a calibration carried to a twin machine)."""
    from axoplan.inputs.machine_params import parameter_value
    from axoplan.validate.calibrate import PARAMETERS

    changed = {p.path: parameter_value(fitted, p.path) for p in PARAMETERS
               if _has(base, p.path) and parameter_value(fitted, p.path) != parameter_value(base, p.path)}
    return with_values(onto, changed) if changed else onto


def _has(machine: Machine, path: str) -> bool:
    from axoplan.inputs.machine_params import has_value
    return has_value(machine, path)


def across_sources() -> None:
    """Section 2a: fit on all of one source, measure the error on another."""
    print("== calibrated on one source, measured on another (held out by source) ==\n")
    fits: dict[str, Machine] = {}
    rows = []
    for fit_on, test_on in CROSS:
        if fit_on not in fits:
            t0 = time.perf_counter()
            fits[fit_on] = calibrate(runs_of(fit_on), machine_of(fit_on), holdout=0.0).calibrated
            print(f"fitted on {fit_on} ({time.perf_counter() - t0:.0f} s)")
        plans = aggregate(runs_of(test_on))
        target = machine_of(test_on)
        machine = carried(fits[fit_on], machine_of(fit_on), target)
        predict = Predictor([p.plan for p in plans])
        before, after = (summarize(plan_table(plans, predict(m))) for m in (target, machine))
        verdict = "helps" if after.mape_pct < before.mape_pct else "hurts"
        rows.append([fit_on, test_on, f"{before.mape_pct:.1f}%", f"{after.mape_pct:.1f}%", f"{before.bias_pct:+.1f}%",
                     f"{after.bias_pct:+.1f}%", _tau(before), _tau(after), verdict])
    print()
    print(text_table(["fitted on", "measured on", "MAPE untuned", "MAPE calibrated", "bias untuned", "bias calibrated",
                      "tau untuned", "tau calibrated", "calibration"], rows, [False, False] + [True] * 6 + [False]))
    print()


def by_model_size(name: str) -> None:
    """Section 2b: fit on some model sizes of one source, measure on the others."""
    runs = runs_of(name)
    machine = machine_of(name)
    plans = aggregate(runs)
    by_where = {r.where: r for r in runs}
    print(f"== {name}: calibrated on some model sizes, measured on the others ==\n")
    for label, held in MODEL_FOLDS[name].items():
        fit = calibrate([by_where[p.where] for p in plans if not held(p)], machine, holdout=0.0)
        held_plans = [p for p in plans if held(p)]
        predict = Predictor([p.plan for p in held_plans])
        before, after = (summarize(plan_table(held_plans, predict(m))) for m in (machine, fit.calibrated))
        print(f"{label}: {after.plans} held out: MAPE {before.mape_pct:.1f}% untuned -> {after.mape_pct:.1f}% "
              f"calibrated, bias {before.bias_pct:+.1f}% -> {after.bias_pct:+.1f}%; best predicted first in "
              f"{after.best_predicted_first} of {after.scenarios} scenarios")
    print()


def random_split(name: str) -> None:
    """Section 2c: fitted on 70 % of a source's plans (seed 0), measured on the other 30 %, as
    `axoplan calibrate --holdout 0.3 --seed 0` does (the shipped `*-calibrated.yaml` files)."""
    t0 = time.perf_counter()
    result = calibrate(runs_of(name), machine_of(name), holdout=0.3, seed=0)
    print(f"== {name}: calibrated on 70 % of the plans (seed 0), {time.perf_counter() - t0:.0f} s ==\n")
    print(format_calibration(result), "\n")
    plans = aggregate(runs_of(name))
    _, hold = split_holdout(len(plans), 0.3, 0)
    held = coverage([plans[i] for i in hold], result.calibrated, 0.8)
    print(f"80% interval coverage of the held-out plans: {held.covered:.1%} of {held.plans}\n")


def cross_validation(name: str) -> None:
    """Section 2d: interval coverage when every plan is held out once (5-fold)."""
    t0 = time.perf_counter()
    cv = cross_validated(runs_of(name), machine_of(name), folds=5, level=0.8, seed=0)
    print(f"== {name}: 80% interval coverage, 5-fold cross-validation: {cv.covered:.1%} of {cv.plans} plans "
          f"({time.perf_counter() - t0:.0f} s) ==\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SOURCES), help="one source's untuned figures")
    parser.add_argument("--skip-calibration", action="store_true", help="untuned figures only")
    parser.add_argument("--slow", action="store_true", help="also vTrain's 5-fold cross-validated coverage (3 min)")
    parser.add_argument("--only-gpu", action="store_true", help="the H100/H200 sources' untuned figures only")
    args = parser.parse_args()
    untuned([args.only] if args.only else list(GPU_SOURCES) if args.only_gpu else list(SOURCES))
    if args.only_gpu:
        return
    if args.skip_calibration or args.only:
        return
    across_sources()
    for name in MODEL_FOLDS:
        by_model_size(name)
    for name in ("vtrain", "cpu-gloo"):
        random_split(name)
    cross_validation("cpu-gloo")
    if args.slow:
        cross_validation("vtrain")


if __name__ == "__main__":
    main()
