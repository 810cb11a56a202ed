"""Turn llm-foundry's published A100 benchmark tables into axoplan's measured-run CSV.

    python benchmarks/llm_foundry_runs.py            # rewrites data/measured/llm-foundry/runs-a100.csv
    python benchmarks/llm_foundry_runs.py --check    # exit 1 if the CSV differs from what the tables give

Each table row (``data/measured/llm-foundry/benchmarks-a100.md``, an unchanged excerpt of
mosaicml/llm-foundry ``scripts/train/benchmarking/README.md`` at commit 8c8dd48, Apache-2.0) is one
PyTorch FSDP training step of an MPT model, and becomes one CSV row:

* layout ``1 × 1 × G × 1``: FSDP ``FULL_SHARD`` shards every weight, gradient and optimizer state
  over all G GPUs and gathers each block's weights before its forward and again before its
  backward, which is AxoNN's Z axis with ``Gz = G`` and no weight caching;
* seconds per step = ``GlobalBatchSize (T) / Throughput (T/s)`` (tokens per step over tokens per
  second; this reproduces the table's MFU to 0.03 points);
* MPT shapes (family ``mpt``) from ``scripts/train/yamls/pretrain/mpt-*.yaml``: GeLU MLP of 4·d, vocabulary 50,368,
  learned positions up to the run's sequence length, biases, tied embeddings, flash attention;
* ``Precision``/``MP Mode``: ``PURE`` reduces gradients in bf16, ``DEFAULT`` in fp32 (Composer's
  ``get_mixed_precision``); ``Activation Checkpointing`` is full recompute of each block;
* machine ``dgx-a100`` for the 40 GB rows, ``dgx-a100-80gb`` for the 80 GB rows (8 GPUs a node).
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "data/measured/llm-foundry/benchmarks-a100.md"
OUT = REPO / "data/measured/llm-foundry/runs-a100.csv"

MPT_SHAPES: dict[str, tuple[int, int, int]] = {  # layers, d_model, heads [llm-foundry yamls/pretrain/mpt-*.yaml]
    "125m": (12, 768, 12), "350m": (24, 1024, 16), "760m": (24, 1536, 12), "1b": (24, 2048, 16),
    "3b": (32, 2560, 20), "7b": (32, 4096, 32), "13b": (40, 5120, 40), "30b": (48, 7168, 56),
    "70b": (80, 8192, 64),
}
MPT_VOCAB = 50368
MACHINES = {"a100_40gb": "dgx-a100", "a100_80gb": "dgx-a100-80gb"}
REDUCE_DTYPE = {"PURE": "bf16", "DEFAULT": "fp32"}  # Composer get_mixed_precision: reduce_dtype
FRAMEWORK = {"FULL_SHARD": "pytorch-fsdp"}

COLUMNS = ("model_name", "family", "machine", "devices_per_node", "framework", "layers", "hidden", "heads", "vocab",
           "max_positions", "tied_embeddings", "biases", "attention", "seq_len", "global_batch", "micro_batch",
           "gx", "gy", "gz", "gdata", "recompute", "cache_weights", "grad_reduce_dtype", "t_step_s", "num_params")


def table_rows(text: str) -> list[dict[str, str]]:
    """Every data row of the markdown tables in `text`, as {header: cell}."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.lstrip().startswith("|"):
            header = None
        elif header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


def csv_row(row: dict[str, str]) -> dict[str, str]:
    """One axoplan measured-run row of one table row (see the module docstring)."""
    layers, hidden, heads = MPT_SHAPES[row["Model"]]
    gpus, seq = int(row["# GPUs"]), int(row["SeqLen (T)"])
    seconds = int(row["GlobalBatchSize (T)"]) / int(row["Throughput (T/s)"])
    return {
        "model_name": f"mpt-{row['Model']}", "family": "mpt", "machine": MACHINES[row["GPU"]], "devices_per_node": "8",
        "framework": FRAMEWORK[row["Sharding Strategy"]], "layers": str(layers), "hidden": str(hidden),
        "heads": str(heads), "vocab": str(MPT_VOCAB), "max_positions": str(seq), "tied_embeddings": "true",
        "biases": "true", "attention": "flash-triton", "seq_len": str(seq), "global_batch": row["GlobalBatchSize"],
        "micro_batch": row["MicroBatchSize"], "gx": "1", "gy": "1", "gz": str(gpus), "gdata": "1",
        "recompute": row["Activation Checkpointing"].lower(), "cache_weights": "false",
        "grad_reduce_dtype": REDUCE_DTYPE[row["MP Mode"]], "t_step_s": f"{seconds:.6g}",
        "num_params": row["NumParams"],
    }


def render(text: str) -> str:
    out = io.StringIO()
    out.write("# PyTorch FSDP (Composer) training steps of MPT models on A100s, from llm-foundry's published\n"
              "# benchmark tables (Apache-2.0; see README.md beside this file).\n"
              "# Made by benchmarks/llm_foundry_runs.py from benchmarks-a100.md: do not edit by hand.\n")
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in table_rows(text):
        writer.writerow(csv_row(row))
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped CSV instead of writing it")
    args = parser.parse_args()
    text = render(SOURCE.read_text(encoding="utf-8"))
    if args.check:
        same = OUT.read_text(encoding="utf-8") == text
        print(f"{OUT.relative_to(REPO)}: {'up to date' if same else 'differs from the tables'}")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(REPO)} ({text.count(chr(10)) - 4} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
