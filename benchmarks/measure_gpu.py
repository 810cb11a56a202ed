"""Measure this GPU node with axoplan's own tools: probe, then run every layout (issue 4, item 7).

    python benchmarks/measure_gpu.py --machine dgx-h100 --out data/measured/gpu-h100

On a node with N GPUs (one is enough) this does, in order:

1. ``axoplan probe --local N --machine MACHINE -o OUT/probe.yaml``: GEMM efficiency table
   (bf16) and the collectives' bus bandwidth for every group shape of N ranks (NCCL);
2. for every --hidden size, every power of two w <= N and every ordered layout
   Gx x Gy x Gz x Gdata of w ranks, ``axoplan run plan.json --local w`` of a GPT model,
   --reps times, appending one measured-run record each to ``OUT/runs.jsonl`` (on one
   GPU the hidden sizes are what varies: GEMM shapes, hence efficiency);
3. writes ``OUT/environment.json``: device, the host CPU (model name, family / model /
   stepping, cores; ``axoplan.executor.hardware``) and the GPU's name, GPU count, Python /
   torch / CUDA / NCCL versions, host, start and end time and the command line, i.e. where
   and how the data was taken;
4. prints ``axoplan validate OUT/runs.jsonl`` against MACHINE.

Nothing in OUT is overwritten: the script stops if OUT/runs.jsonl or OUT/probe.yaml exists.
The default models (4 layers, hidden 2048 and 4096, head dimension 128, sequence 2048,
global batch 8, micro-batch 1) have up to about 1 B parameters: they fit one 40 GB GPU at
the executor's 8 bytes per parameter and each run takes seconds. ``--device cpu --gpus 2``
with a tiny model (``--layers 1 --hidden 64 --head-dim 16 --seq-len 16 --vocab 128``)
runs the same steps on CPU ranks with gloo; the tests do that.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.records.plan import LaunchConfig
from axoplan.space.layout import Layout, ordered_factorizations


def plans(args: argparse.Namespace, hidden: int, world: int, devices_per_node: int) -> list[LaunchConfig]:
    """One plan per ordered layout of `world` ranks of the model of width `hidden`."""
    model = ModelSpec(name=f"gpt-l{args.layers}-h{hidden}", num_layers=args.layers, hidden=hidden,
                      num_heads=hidden // args.head_dim, vocab=args.vocab, max_positions=args.seq_len,
                      source="benchmarks/measure_gpu.py")
    options = RunOptions(global_batch=args.global_batch, seq_len=args.seq_len, micro_batches=(1,),
                         recompute="off", cache_weights="off")
    gx, gy, gz, gd = ordered_factorizations(world)
    return [LaunchConfig.build(machine=args.machine, devices_per_node=devices_per_node, model=model, options=options,
                               layout=Layout(int(a), int(b), int(c), int(d)), micro_batch=1, recompute=False,
                               cache_weights=False)
            for a, b, c, d in zip(gx, gy, gz, gd, strict=True)]


def axoplan(*argv: str) -> list[str]:
    return [sys.executable, "-m", "axoplan", *argv]


def environment(args: argparse.Namespace, gpus: int) -> dict[str, object]:
    """Where and how: the facts a reader of the data needs."""
    import torch

    from axoplan.executor.hardware import hardware_identity
    from axoplan.executor.train import device_name

    cuda = args.device != "cpu" and torch.cuda.is_available()
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
    return {
        "device_name": device_name(torch.device("cuda", 0) if cuda else torch.device("cpu")),
        **hardware_identity(gpu=cuda),  # the host CPU (host.op_us is per op on it) and the GPU, if one is used
        "ranks": gpus, "backend": "nccl" if cuda else "gloo", "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None, "nccl": nccl, "host": platform.node(),
        "python": platform.python_version(),
        "machine_yaml": args.machine, "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machine", required=True, help="machine YAML the plans and the probe refer to")
    parser.add_argument("--out", type=Path, required=True, help="folder for runs.jsonl, probe.yaml, environment.json")
    parser.add_argument("--gpus", type=int, help="ranks to use (default: every visible GPU)")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", default="2048,4096", help="comma-separated model widths")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--no-probe", action="store_true", help="skip step 1")
    args = parser.parse_args()

    gpus = args.gpus or _visible_gpus(args.device)
    runs, probe, env_path = args.out / "runs.jsonl", args.out / "probe.yaml", args.out / "environment.json"
    for path in (runs, probe, env_path):
        if path.exists():
            sys.exit(f"measure_gpu: {path} exists; choose another --out (nothing was changed)")
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment(args, gpus)
    env["started"] = _now()
    device = ["--device", args.device]
    if not args.no_probe:
        print(f"probe: {gpus} ranks on {env['device_name']}", flush=True)
        subprocess.run(axoplan("probe", "--local", str(gpus), "--machine", args.machine, "-o", str(probe), *device),
                       check=True)
    per_node = load_machine(args.machine).devices_per_node
    widths = [int(h) for h in args.hidden.split(",")]
    todo = [p for h in widths for w in _powers_of_two(gpus) for p in plans(args, h, w, per_node)]
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for i, plan in enumerate(todo, start=1):
                path = Path(tmp) / f"{plan.plan_id}.json"
                path.write_text(plan.to_json())
                t0 = time.perf_counter()
                subprocess.run(axoplan("run", str(path), "--local", str(plan.world_size), "--iterations",
                                       str(args.iterations), "--warmup", str(args.warmup), "--runs", str(runs),
                                       *device), check=True, stdout=subprocess.DEVNULL)
                print(f"rep {rep + 1}/{args.reps} run {i}/{len(todo)}: {plan.layout.to_layout()} on "
                      f"{plan.world_size} ranks, {time.perf_counter() - t0:.1f} s", flush=True)
    env["finished"] = _now()
    env_path.write_text(json.dumps(env, indent=2) + "\n")
    rehearsal = ["--any-device"] if args.device == "cpu" else []  # CPU ranks standing in for the GPUs
    subprocess.run(axoplan("validate", str(runs), "--machine", args.machine, *rehearsal), check=True)


def _visible_gpus(device: str) -> int:
    import torch

    count = torch.cuda.device_count() if device != "cpu" else 0
    if count == 0:
        sys.exit("measure_gpu: no GPU visible; give --gpus N with --device cpu to rehearse on CPU ranks")
    return count


def _powers_of_two(n: int) -> list[int]:
    return [1 << k for k in range(n.bit_length()) if 1 << k <= n]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


if __name__ == "__main__":
    main()
