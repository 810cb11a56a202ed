"""Measure a training step's peak memory on CPU and hold axoplan's memory model against it.

What it measures: the peak of live tensor bytes over one training step (forward, backward, optimizer step,
the optimizer's states already made by an untraced first step) of a small Hugging Face model, as PyTorch's
profiler records every allocation and free (``torch.profiler._memory_profiler.MemoryProfile`` on the CPU
allocator, which neither caches nor rounds: the timeline is the tensors' own bytes). CUDA autocast's
fp32-list is emulated as ``benchmarks/derive_ledger.py`` does (``--precision autocast``), so the tensors a
GPU step keeps are the ones kept here; what a GPU adds beyond them (the CUDA context, communicators,
the caching allocator's fragmentation) is the reserve's (``machines/*.yaml`` ``device.reserve``), not this.

The step is the one AxoNN's Hugging Face path runs on one GPU: ``auto_parallelize`` replaces every ``nn.Linear``,
the LM head too, with a new one, so a tied head (GPT-2) has its own weight (``axonn/intra_layer/
automatic_parallelism.py``); here the head is replaced by a fresh ``nn.Linear`` of the same shape.

What it predicts: ``axoplan.cost.model.predict`` of the same model (read from the ``config.json`` transformers
writes) on one GPU of ``dgx-h100`` under the ledger framework of that precision, ``mem_total_bytes``.

The relative errors set ``MEMORY_MODEL_SIGMA`` for ledger frameworks (``axoplan/cost/memory.py``): the
root-mean-square of ``log(predicted/measured)`` over the cases. Run::

    python benchmarks/measure_peak_memory.py --out data/measured/cpu-peak-memory/peaks.jsonl

Each line keeps the model's ``config.json`` as transformers wrote it, so ``tests/test_peak_memory.py`` predicts
the same model without transformers.

Needs ``transformers`` (not a dependency of axoplan; ``pip install transformers==5.17.0``).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tracing.autocast import cuda_autocast_on_cpu  # noqa: E402
from tracing.hf import balanced_routing, build  # noqa: E402

# (family, precision, layers, dims): small enough to profile in seconds, unlike one another in what dominates
# (vocabulary, width, sequence, layers, micro-batch)
CASES: list[tuple[str, str, int, dict[str, int]]] = [
    ("gpt2", "autocast", 2, {"B": 2, "S": 256, "H": 256, "NH": 4, "KV": 4, "F": 1024, "V": 4096}),
    ("gpt2", "autocast", 4, {"B": 4, "S": 128, "H": 384, "NH": 6, "KV": 6, "F": 1536, "V": 2048}),
    ("gpt2", "bf16", 2, {"B": 2, "S": 256, "H": 256, "NH": 4, "KV": 4, "F": 1024, "V": 4096}),
    ("llama", "autocast", 2, {"B": 2, "S": 256, "H": 256, "NH": 4, "KV": 2, "F": 768, "V": 4096}),
    ("llama", "autocast", 4, {"B": 4, "S": 128, "H": 512, "NH": 8, "KV": 8, "F": 1408, "V": 2048}),
    ("llama", "bf16", 2, {"B": 2, "S": 256, "H": 256, "NH": 4, "KV": 2, "F": 768, "V": 4096}),
    ("gpt-neox", "autocast", 2, {"B": 2, "S": 256, "H": 256, "NH": 4, "KV": 4, "F": 1024, "V": 4096}),
    ("gpt-neox", "bf16", 3, {"B": 2, "S": 192, "H": 384, "NH": 6, "KV": 6, "F": 1536, "V": 2048}),
]

FRAMEWORK = {"autocast": "hf-transformers", "bf16": "hf-transformers-bf16"}


def _with_layers(model_dims: dict[str, int], layers: int, family: str, precision: str) -> Any:
    """`build`'s one-block model rebuilt with `layers` blocks (its config, one field changed)."""
    model = build(family, model_dims, precision)
    cfg = model.config
    cfg.num_hidden_layers = layers
    if family == "gpt2":
        cfg.n_layer = layers
    torch.manual_seed(0)
    out = type(model)(cfg)
    head = out.get_output_embeddings()
    if head.weight is out.get_input_embeddings().weight:  # AxoNN's auto_parallelize replaces the LM head's
        out.set_output_embeddings(torch.nn.Linear(head.in_features, head.out_features, bias=False))  # Linear: untied
    if precision == "bf16":
        out = out.to(torch.bfloat16)
    return out.train()


def peak_bytes(family: str, precision: str, layers: int, dims: dict[str, int]) -> tuple[int, Any]:
    """Peak live tensor bytes over the second training step, and the model's config."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action, MemoryProfile

    model = _with_layers(dims, layers, family, precision)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, dims["V"], (dims["B"], dims["S"]))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):  # on in both: frameworks/hf-transformers-bf16.yaml
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with balanced_routing(model), cuda_autocast_on_cpu():
        step()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                     with_stack=True) as prof:
            step()
    live = peak = 0
    for _, action, _, size in MemoryProfile(prof.profiler.kineto_results).timeline:
        if action in (Action.PREEXISTING, Action.CREATE):
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return peak, model.config


def predicted_bytes(config: Any, precision: str, micro_batch: int, seq_len: int) -> float:
    """axoplan's ``mem_total_bytes`` of the model on one GPU under the ledger framework of `precision`."""
    from axoplan.cost.model import predict
    from axoplan.inputs.machine import load_machine
    from axoplan.inputs.model import load_hf_config
    from axoplan.inputs.options import RunOptions
    from axoplan.space.candidates import Candidates
    from axoplan.space.layout import Layout

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        config.to_json_file(path)
        model = load_hf_config(path)
    options = RunOptions(global_batch=micro_batch, seq_len=seq_len, micro_batches=(micro_batch,), recompute="off",
                         cache_weights="off", framework=FRAMEWORK[precision])
    c = Candidates.single(Layout(1, 1, 1, 1), micro_batch, False, False)
    return float(predict(model, load_machine("dgx-h100"), options, c).columns["mem_total_bytes"][0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write one JSON line per case here")
    args = ap.parse_args(argv)
    import transformers

    rows = []
    for family, precision, layers, dims in CASES:
        measured, config = peak_bytes(family, precision, layers, dims)
        predicted = predicted_bytes(config, precision, dims["B"], dims["S"])
        rows.append({"family": family, "precision": precision, "layers": layers, **dims,
                     "measured_peak_bytes": measured, "config": json.loads(config.to_json_string()),
                     "ratio": predicted / measured})
        print(f"{family:9s} {precision:8s} L={layers} B={dims['B']} S={dims['S']:4d} H={dims['H']:4d} "
              f"V={dims['V']:5d}  measured {measured / 2**20:8.2f} MiB  predicted {predicted / 2**20:8.2f} MiB  "
              f"{predicted / measured - 1:+.1%}", flush=True)
    logs = [math.log(r["ratio"]) for r in rows]
    rms = math.sqrt(sum(x * x for x in logs) / len(logs))
    mean = sum(logs) / len(logs)
    print(f"log(predicted/measured): mean {mean:+.3f}, rms {rms:.3f} over {len(rows)} cases")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        made = {"torch": torch.__version__, "transformers": transformers.__version__,
                "python": platform.python_version(), "machine": platform.machine(),
                "tool": "benchmarks/measure_peak_memory.py"}
        with args.out.open("w") as fh:
            for r in rows:  # the measurement and the config.json it was made with; predictions are the tests'
                fh.write(json.dumps({k: v for k, v in r.items() if k != "ratio"} | {"made_by": made}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
