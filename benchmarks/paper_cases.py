"""The AxoNN paper's cases ranked with and without the options its record runs used.

    python benchmarks/paper_cases.py            # prints the markdown table of docs/paper-cases.md
    python benchmarks/paper_cases.py --issue24  # the tables issue 24 added: the two AxoNN paths, AxoNN's
                                                # overlap as coded, and the 405B fine-tune (docs/paper-cases.md)

For each case (model, GPUs, machine, global batch): the best layout and its predicted step
time, TFLOP/s per GPU and 80 % interval, first as AxoNN 0.2.0 runs (X innermost, one Z
communicator, untuned GEMMs), then with each option of the Gordon Bell branches alone, then all
together. Every figure is a prediction of the shipped, uncalibrated machine YAMLs.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import load_model
from axoplan.inputs.options import RunOptions
from axoplan.search.ranking import rank
from axoplan.uncertainty.intervals import with_intervals

CASES: tuple[tuple[str, int, str, int, str], ...] = (
    ("320B", 32768, "frontier", 2048, "the paper's 1.381 EFLOP/s run (batch not published; 2048 x 2048 assumed)"),
    ("320B", 6144, "alps", 3072, "6,144 = 3 x 2^11 GPUs: a batch with the factor 3 the layouts need"),
    ("80B", 4096, "perlmutter", 2048, "the Megatron-AxoNN launcher's example (4,096 GPUs, batch 2048)"),
    ("llama3.1-405B", 32768, "frontier", 2048, "Llama 3.1 405B on all 32,768 GCDs"),
)
BASE: dict[str, Any] = {"tp_order": "xyz", "concurrent_z": False}
VARIANTS: dict[str, dict[str, Any]] = {
    "AxoNN 0.2.0": {},
    "+ order search": {"tp_order": "search"},
    "+ concurrent Z": {"concurrent_z": True},
}
if "tuned_gemm" in RunOptions.model_fields:
    BASE["tuned_gemm"] = False
    VARIANTS["+ tuned GEMMs"] = {"tuned_gemm": True}
VARIANTS["all options"] = {k: v for d in list(VARIANTS.values())[1:] for k, v in d.items()}


def best(model: str, gpus: int, machine: str, batch: int, variant: dict[str, Any]) -> dict[str, Any]:
    opts = RunOptions(global_batch=batch, **{**BASE, **variant})
    r = with_intervals(rank(load_model(model), load_machine(machine), opts, gpus))
    row = r.row(int(r.order[0]))
    lay = r.candidates.layout(int(r.order[0]))
    return {"layout": f"{lay} mb{row['micro_batch']}", "t": row["t_step_s"], "tflops": row["tflops_per_gpu"],
            "low": row["t_low_s"], "high": row["t_high_s"]}


def _row(name: str, model: str, gpus: int, machine: str, batch: int, options: dict[str, Any]) -> str:
    opts = RunOptions(global_batch=batch, **options)
    r = with_intervals(rank(load_model(model), load_machine(machine), opts, gpus))
    if r.num_feasible == 0:
        return f"| {model}, {gpus:,} GPUs, {machine}, batch {batch} | {name} | none feasible | | | | |"
    i = int(r.order[0])
    row, lay = r.row(i), r.candidates.layout(i)
    return (f"| {model}, {gpus:,} GPUs, {machine}, batch {batch} | {name} | `{lay} mb{row['micro_batch']}` | "
            f"{row['t_step_s']:.2f} | {row['t_low_s']:.2f}-{row['t_high_s']:.2f} | {row['tflops_per_gpu']:.1f} | "
            f"{row['mem_need_bytes'] / 1e9:.1f} |")


ISSUE24_VARIANTS: dict[str, dict[str, Any]] = {
    "Megatron-AxoNN (default model)": {},
    "+ blocking backward gathers": {"backward_gather": "blocking"},
    "+ per-tensor gradient all-reduce": {"grad_sync": "per-tensor"},
    "+ both (AxoNN's code as read)": {"backward_gather": "blocking", "grad_sync": "per-tensor"},
    "Hugging Face / Lightning path": {"axonn_path": "hf"},
}
FINETUNE = ("llama3.1-405B", "frontier", ((4096, 4096), (8192, 8192), (16384, 16384)))


def issue24() -> None:
    """Issue 24's tables: each paper case on both paths and with AxoNN's overlap as coded; the hf path needs a
    sequence per GPU, so it runs at the larger of the case's batch and the GPU count; then the 405B fine-tune."""
    head = "| case | path and options | best layout | s/iter | 80 % interval | TFLOP/s/GPU | GB/GPU |"
    print(head)
    print("|---|---|---|---:|---:|---:|---:|")
    for model, gpus, machine, batch, _ in CASES:
        for name, variant in ISSUE24_VARIANTS.items():
            b = max(batch, gpus) if variant.get("axonn_path") == "hf" else batch
            print(_row(name, model, gpus, machine, b, variant))
    print()
    print(head)
    print("|---|---|---|---:|---:|---:|---:|")
    model, machine, points = FINETUNE
    for gpus, batch in points:
        for name, variant in (("Hugging Face / Lightning path", {"axonn_path": "hf"}),
                              ("Megatron-AxoNN path", {})):
            print(_row(name, model, gpus, machine, batch, variant))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--issue24", action="store_true", help="print issue 24's tables instead")
    if parser.parse_args().issue24:
        t0 = time.perf_counter()
        issue24()
        print(f"\n({time.perf_counter() - t0:.0f} s)")
        return
    t0 = time.perf_counter()
    print("| case | options | best layout | s/iter | 80 % interval | TFLOP/s/GPU |")
    print("|---|---|---|---:|---:|---:|")
    for model, gpus, machine, batch, _ in CASES:
        for name, variant in VARIANTS.items():
            b = best(model, gpus, machine, batch, variant)
            print(f"| {model}, {gpus:,} GPUs, {machine}, batch {batch} | {name} | `{b['layout']}` | {b['t']:.2f} | "
                  f"{b['low']:.2f}-{b['high']:.2f} | {b['tflops']:.1f} |")
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
