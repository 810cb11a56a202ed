"""Gather a GPU node's evidence with axoplan's own tools in one command (issue 4 item 7, issue 31 item 4).

    python benchmarks/measure_gpu.py --machine dgx-h100 --out data/measured/gpu-h100

On a node with N GPUs (one is enough) this does, in order:

1. ``axoplan probe --local N --machine MACHINE -o OUT/probe.yaml``: the host's cost per op, launch and sync,
   every op class the ledger prices (``kernels:``: element-wise, norms, activation, cast, row sums, fills, the
   loss, AdamW, attention per SDPA backend), the GEMM efficiency table (bf16) and the collectives' bus
   bandwidth for every group shape of N ranks (NCCL);
2. for every --hidden size, every power of two w <= N and every ordered layout Gx x Gy x Gz x Gdata of w
   ranks, ``axoplan run plan.json --local w`` of a GPT model under the executor's own framework profile
   (``axoplan-executor``, so ``validate`` prices each run as the executor runs it), --reps times, appending
   one measured-run record each to ``OUT/runs.jsonl`` (on one GPU the hidden sizes are what varies: GEMM
   shapes, hence efficiency);
3. ``OUT/trace-executor.json.gz``: a ``torch.profiler`` chrome trace (CPU and CUDA activities) of one
   executor step of the first one-rank plan, after --warmup untraced steps, marked ``ProfilerStep#N``
   (``axoplan trace`` reads it);
4. where ``transformers`` is installed, ``OUT/trace-hf-gpt2.json.gz`` and ``OUT/trace-hf-llama.json.gz``:
   one traced training step of a small GPT-2- and a small Llama-shaped model as
   ``data/measured/gpu-h100-h200/profile.py`` runs them (fp32 weights, bf16 autocast, SDPA, fused AdamW,
   ``labels=input_ids``), after three untraced steps; their shapes and the median of five timed steps
   go into environment.json;
5. writes ``OUT/environment.json``: device, the host CPU (model name, family / model / stepping, cores;
   ``axoplan.executor.hardware``) and the GPU's name, GPU count, Python / torch / CUDA / NCCL /
   transformers versions, host, start and end time, the command line, and for every file written how it
   was made (``files``), i.e. where and how the data was taken;
6. prints ``axoplan validate OUT/runs.jsonl`` against MACHINE, then on a GPU with ``--probe OUT/probe.yaml``
   (MACHINE as step 1 measured this host).

Nothing in OUT is overwritten: the script stops before any work if one of its files exists there. The
default models (4 layers, hidden 2048 and 4096, head dimension 128, sequence 2048, global batch 8,
micro-batch 1) have up to about 1 B parameters: they fit one 40 GB GPU at the executor's 8 bytes per
parameter and each run takes seconds; on one GPU the whole script is meant to take under 8 minutes
(``--quick-probe`` and ``--reps 1`` shorten it). ``--device cpu --gpus 2`` with a tiny model (``--layers 1
--hidden 64 --head-dim 16 --seq-len 16 --vocab 128 --hf-size tiny``) runs the same steps on CPU ranks with
gloo; the tests do that.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from axoplan.inputs.machine import load_machine
from axoplan.inputs.model import ModelSpec
from axoplan.inputs.options import RunOptions
from axoplan.records.plan import LaunchConfig
from axoplan.space.layout import Layout, ordered_factorizations

FRAMEWORK = "axoplan-executor"
"""The framework profile of the executor's runs (frameworks/axoplan-executor.yaml)."""

HF_MODELS = ("gpt2", "llama")
HF_SIZES: dict[str, dict[str, dict[str, Any]]] = {
    # GPT-2 small (124 M) and a 0.3 B Llama with grouped-query attention: seconds per step on one GPU
    "small": {"gpt2": {"config": {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": 3072, "vocab_size": 50257,
                                  "n_positions": 1024}, "seq": 1024, "micro_batch": 8},
              "llama": {"config": {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
                                   "num_key_value_heads": 8, "intermediate_size": 2816, "vocab_size": 32000,
                                   "max_position_embeddings": 2048}, "seq": 2048, "micro_batch": 4}},
    # the same families at a size a CPU runs in a second (the tests' rehearsal)
    "tiny": {"gpt2": {"config": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 256, "vocab_size": 1000,
                                 "n_positions": 64, "bos_token_id": 0, "eos_token_id": 0}, "seq": 32, "micro_batch": 2},
             "llama": {"config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 1000,
                                  "max_position_embeddings": 64}, "seq": 32, "micro_batch": 2}},
}


def plans(args: argparse.Namespace, hidden: int, world: int, devices_per_node: int) -> list[LaunchConfig]:
    """One plan per ordered layout of `world` ranks of the model of width `hidden`, under the executor's profile."""
    model = ModelSpec(name=f"gpt-l{args.layers}-h{hidden}", num_layers=args.layers, hidden=hidden,
                      num_heads=hidden // args.head_dim, vocab=args.vocab, max_positions=args.seq_len,
                      source="benchmarks/measure_gpu.py")
    options = RunOptions(global_batch=args.global_batch, seq_len=args.seq_len, micro_batches=(1,),
                         recompute="off", cache_weights="off", framework=FRAMEWORK)
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
        "cuda": torch.version.cuda if cuda else None, "nccl": nccl, "transformers": _transformers_version(),
        "host": platform.node(), "python": platform.python_version(), "machine_yaml": args.machine,
        "framework": FRAMEWORK, "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def main() -> None:
    if sys.argv[1:2] == ["trace"]:  # one traced step, in its own process (called by main below)
        trace_main(sys.argv[2:])
        return
    args = _parser().parse_args()
    gpus = args.gpus or _visible_gpus(args.device)
    out: Path = args.out
    runs, probe, env_path = out / "runs.jsonl", out / "probe.yaml", out / "environment.json"
    hf = [] if args.no_traces or _transformers_version() is None else list(HF_MODELS)
    traces = {} if args.no_traces else {"executor": out / "trace-executor.json.gz",
                                        **{m: out / f"trace-hf-{m}.json.gz" for m in hf}}
    for path in (runs, probe, env_path, *traces.values()):
        if path.exists():
            sys.exit(f"measure_gpu: {path} exists; choose another --out (nothing was changed)")
    out.mkdir(parents=True, exist_ok=True)
    env = environment(args, gpus)
    env["started"] = _now()
    files: dict[str, object] = {}
    device = ["--device", args.device]
    if not args.no_probe:
        _stage(f"probe: {gpus} ranks on {env['device_name']}")
        quick = ["--quick"] if args.quick_probe else []
        cmd = axoplan("probe", "--local", str(gpus), "--machine", args.machine, "-o", str(probe), *device, *quick)
        subprocess.run(cmd, check=True)
        files[probe.name] = {"how": shlex.join(["axoplan", *cmd[3:]]),
                             "what": "host per op, launch and sync; kernels: every op class the ledger prices; "
                                     "GEMM table; collectives of every group shape (docs/executor.md)"}
    per_node = load_machine(args.machine).devices_per_node
    widths = [int(h) for h in args.hidden.split(",")]
    todo = [p for h in widths for w in _powers_of_two(gpus) for p in plans(args, h, w, per_node)]
    with tempfile.TemporaryDirectory() as tmp:
        _run_every_plan(args, todo, Path(tmp), runs, device)
        files[runs.name] = {"how": f"axoplan run PLAN --local W --iterations {args.iterations} --warmup "
                                   f"{args.warmup} --runs {runs.name} {shlex.join(device)}, {args.reps} time(s) each",
                            "what": f"{len(todo)} plans (framework {FRAMEWORK}): every ordered layout of every power "
                                    f"of two up to {gpus} ranks at hidden {args.hidden}"}
        if "executor" in traces:
            one = next(p for p in todo if p.world_size == 1)
            path = Path(tmp) / f"{one.plan_id}.json"
            path.write_text(one.to_json())
            files[traces["executor"].name] = _trace("executor", traces["executor"], args, plan=path)
    if hf:  # both models in one process: transformers is imported once
        files.update(_trace("hf", out, args, models=hf))
    if not args.no_traces and not hf:
        files["trace-hf-*.json.gz"] = "not written: transformers is not installed"
    env["files"] = files
    env["finished"] = _now()
    env_path.write_text(json.dumps(env, indent=2) + "\n")
    rehearsal = ["--any-device"] if args.device == "cpu" else []  # CPU ranks standing in for the GPUs
    subprocess.run(axoplan("validate", str(runs), "--machine", args.machine, *rehearsal), check=True)
    if probe.exists() and args.device != "cpu":  # the same runs on the machine as this host measured it (a CPU
        # rehearsal's probe measured CPU ranks, which no GPU machine is)
        subprocess.run(axoplan("validate", str(runs), "--machine", args.machine, "--probe", str(probe), *rehearsal),
                       check=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--machine", required=True, help="machine YAML the plans and the probe refer to")
    parser.add_argument("--out", type=Path, required=True,
                        help="folder for runs.jsonl, probe.yaml, the traces and environment.json")
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
    parser.add_argument("--quick-probe", action="store_true", help="axoplan probe --quick: fewer shapes")
    parser.add_argument("--no-traces", action="store_true", help="skip steps 3 and 4")
    parser.add_argument("--hf-size", choices=sorted(HF_SIZES), default="small",
                        help="the Hugging Face models' size (tiny: for a CPU rehearsal)")
    return parser


def _run_every_plan(args: argparse.Namespace, todo: list[LaunchConfig], tmp: Path, runs: Path,
                    device: list[str]) -> None:
    for rep in range(args.reps):
        for i, plan in enumerate(todo, start=1):
            path = tmp / f"{plan.plan_id}.json"
            path.write_text(plan.to_json())
            t0 = time.perf_counter()
            subprocess.run(axoplan("run", str(path), "--local", str(plan.world_size), "--iterations",
                                   str(args.iterations), "--warmup", str(args.warmup), "--runs", str(runs),
                                   *device), check=True, stdout=subprocess.DEVNULL)
            _stage(f"rep {rep + 1}/{args.reps} run {i}/{len(todo)}: {plan.layout.to_layout()} on "
                   f"{plan.world_size} ranks, {time.perf_counter() - t0:.1f} s")


def _trace(what: str, path: Path, args: argparse.Namespace, plan: Path | None = None,
           models: list[str] | None = None) -> dict[str, Any]:
    """Run traced steps in a fresh process; what it reports, with how it was made."""
    cmd = [sys.executable, __file__, "trace", what, str(path), "--device", args.device, "--warmup", str(args.warmup),
           "--hf-size", args.hf_size, *(["--plan", str(plan)] if plan is not None else []),
           *(["--models", ",".join(models)] if models else [])]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    _stage(f"trace {what}: {path.name}, {time.perf_counter() - t0:.1f} s")
    how = shlex.join(["python", "benchmarks/measure_gpu.py", *cmd[2:]])
    info = json.loads(done.stdout.strip().splitlines()[-1])
    if what == "hf":
        return {name: {**one, "how": how} for name, one in info.items()}
    return {**info, "how": how}


def trace_main(argv: list[str]) -> None:
    """``measure_gpu.py trace executor FILE --plan PLAN`` or ``trace hf FOLDER --models gpt2,llama``: traced
    steps (``trace-hf-MODEL.json.gz`` in FOLDER); one JSON line on stdout says what was traced."""
    ap = argparse.ArgumentParser(prog="measure_gpu.py trace")
    ap.add_argument("what", choices=["executor", "hf"])
    ap.add_argument("file", type=Path, help="the executor's trace file, or the folder of the models' traces")
    ap.add_argument("--models", default=",".join(HF_MODELS))
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--hf-size", choices=sorted(HF_SIZES), default="small")
    ap.add_argument("--plan", type=Path)
    a = ap.parse_args(argv)
    if a.what == "executor":
        info = trace_executor_step(a.plan, a.file, a.device, a.warmup)
    else:
        info = {f"trace-hf-{m}.json.gz": trace_hf_step(m, HF_SIZES[a.hf_size][m], a.file / f"trace-hf-{m}.json.gz",
                                                       a.device) for m in a.models.split(",")}
    print(json.dumps(info))


def _profiler(path: Path, untraced: int) -> Any:
    """A profiler that traces the step after `untraced` ones (and one warm-up step of its own) to `path`."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    acts = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])]
    return profile(activities=acts, schedule=schedule(wait=untraced, warmup=1, active=1, repeat=1),
                   on_trace_ready=lambda p: p.export_chrome_trace(str(path)))


def trace_executor_step(plan_path: Path, path: Path, device: str, warmup: int) -> dict[str, Any]:
    """One step of the executor on one rank (``axoplan.executor.train.run_rank``), traced: the profiler steps
    after every call of the step function, so the trace holds the last of ``warmup + 2`` steps."""
    import torch
    import torch.distributed as dist

    from axoplan.executor import train
    from axoplan.executor.spec import ExecSettings
    from axoplan.executor.worker import init_group

    plan = LaunchConfig.load(plan_path)
    init_group(0, 1, 120.0, device, f"tcp://127.0.0.1:{_free_port()}")
    untraced = max(warmup, 1)
    step = train._step
    with _profiler(path, untraced) as prof:
        def traced_step(*args: Any, **kwargs: Any) -> Any:
            out = step(*args, **kwargs)
            if torch.cuda.is_available() and device != "cpu":
                torch.cuda.synchronize()
            prof.step()
            return out

        train._step = traced_step  # type: ignore[assignment]  # run_rank looks it up at each step
        try:
            result = train.run_rank(plan, ExecSettings(device=device, warmup=untraced + 1, iterations=1))
        finally:
            train._step = step  # type: ignore[assignment]
    dist.destroy_process_group()
    return {"what": f"one executor step of plan {plan.plan_id} (framework {plan.options.framework}) on "
                    f"{result.device_name}, {result.dtype}, after {untraced + 1} untraced steps",
            "step_s": result.iter_s[0] if result.iter_s else None}


def trace_hf_step(family: str, size: dict[str, Any], path: Path, device: str) -> dict[str, Any]:
    """One training step of a Hugging Face model as profile.py runs it, traced after three untraced steps;
    the median of five timed steps before."""
    import torch

    dev = torch.device("cuda" if device != "cpu" and torch.cuda.is_available() else "cpu")
    model = _hf_model(family, size["config"], dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, size["config"]["vocab_size"], (size["micro_batch"], size["seq"]), device=dev)

    def step() -> None:
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()

    times = []
    for _ in range(8):  # 3 warm-up steps, then 5 timed
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    with _profiler(path, 0) as prof:
        for _ in range(2):
            step()
            prof.step()
    return {"what": f"one training step of a {family}-shaped transformers model: fp32 weights, bf16 autocast, "
                    "SDPA, fused AdamW, labels=input_ids", "device": dev.type,
            "params": sum(p.numel() for p in model.parameters()), **size,
            "step_s_median_of_5": statistics.median(times[3:])}


def _hf_model(family: str, config: dict[str, Any], dev: Any) -> Any:
    import torch

    if family == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg: Any = GPT2Config(**config, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                              attn_pdrop=0.0)
        cls: Any = GPT2LMHeadModel
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg, cls = LlamaConfig(**config), LlamaForCausalLM
    cfg._attn_implementation = "sdpa"
    with torch.device(dev):
        return cls(cfg)


def _transformers_version() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return str(transformers.__version__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _visible_gpus(device: str) -> int:
    import torch

    count = torch.cuda.device_count() if device != "cpu" else 0
    if count == 0:
        sys.exit("measure_gpu: no GPU visible; give --gpus N with --device cpu to rehearse on CPU ranks")
    return count


def _powers_of_two(n: int) -> list[int]:
    return [1 << k for k in range(n.bit_length()) if 1 << k <= n]


def _stage(line: str) -> None:
    print(line, flush=True)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


if __name__ == "__main__":
    main()
